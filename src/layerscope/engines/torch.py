"""PyTorch eager: the reference engine (CPU, or CUDA where torch sees a GPU)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from layerscope.engines.base import Engine

from layerscope.engines.registry import BenchRow, EngineOption, EngineSpec, register
from layerscope.errors import EngineUnavailableError
from layerscope.model.stconfig import st_recipe
from layerscope.vocab.pooling import ST, pool, with_st

if TYPE_CHECKING:  # numpy loads when an engine runs, not when the registry is read (the CLI's help)
    import numpy as np

    from layerscope.model.tokenize import Batch


def torch_forward(net, word_embeddings, inputs: dict[str, np.ndarray], device="cpu"):
    """Run a Hugging Face model with every hidden state: (raw embeddings, hidden states, outputs)."""
    import numpy as np
    import torch

    feed = {k: torch.from_numpy(np.ascontiguousarray(v)).to(device) for k, v in inputs.items()}
    with torch.inference_mode():
        out = net(**feed, output_hidden_states=True, return_dict=True)
        raw = word_embeddings(feed["input_ids"])
    return raw, out.hidden_states, out


@register(EngineSpec(
    "torch", "PyTorch eager, the reference (CUDA where PyTorch sees a GPU, else the CPU)", needs_export=False,
    device="any", fallback=True, gradients=True,
    options=(EngineOption("device", str, None, "cpu, cuda or cuda:N (default: cuda where PyTorch sees a GPU)"),),
    bench=(BenchRow(note="layerscope torch engine (sorted token-budget batches)"),)))
class TorchEngine(Engine):
    name = "torch"

    def __init__(self, model, *, device: str | None = None, threads: int | None = None, **_ignored):
        super().__init__(model)
        import torch

        from layerscope.model.families import get_submodule

        from layerscope.model.source import load_torch_model

        if device is None:
            device = "cuda" if torch.cuda.is_available() else "cpu"
        if device.startswith("cuda") and not torch.cuda.is_available():
            raise EngineUnavailableError("torch on cuda: PyTorch sees no CUDA GPU on this machine; use --device cpu")
        if threads:
            torch.set_num_threads(int(threads))
        self.torch = torch
        self.device = torch.device(device)
        self.net = load_torch_model(self.model.source(), self.model.family(),
                                    trust_remote_code=self.model.trust_remote_code).to(self.device)
        self.word_embeddings = get_submodule(self.net, self.model.family().word_embeddings)
        self.info.provider = f"torch-{self.device.type}"
        self.info.device = str(self.device)

    @classmethod
    def probe(cls, export_dir=None) -> tuple[bool, str]:
        """(works, detail): whether PyTorch imports, and the devices it sees."""
        try:
            import torch
        except ImportError:
            return False, "PyTorch is not installed"
        if torch.cuda.is_available():
            return True, f"PyTorch {torch.__version__} on cuda ({torch.cuda.get_device_name(0)}) and cpu"
        return True, f"PyTorch {torch.__version__} on cpu"

    def forward(self, batch: Batch):
        """(raw embeddings, tuple of hidden states, model outputs) as torch tensors, no grad."""
        return torch_forward(self.net, self.word_embeddings, batch.inputs, self.device)

    def _select(self, raw, hidden, layers: list[str]) -> list[np.ndarray]:
        arrays = []
        for name in layers:
            t = raw if name == "raw" else hidden[int(name)]
            arrays.append(t.float().cpu().numpy())
        return arrays

    def run_tokens(self, batch: Batch, layers: list[str]) -> list[np.ndarray]:
        raw, hidden, _ = self.forward(batch)
        return self._select(raw, hidden, layers)

    def run(self, batch: Batch, layers: list[str], poolings: list[str]) -> dict[str, np.ndarray]:
        recipe = st_recipe(self.manifest) if ST in poolings else None
        return with_st(poolings, lambda modes: self._run_pooled(batch, layers, modes), recipe)

    def _run_pooled(self, batch: Batch, layers: list[str], poolings: list[str]) -> dict[str, np.ndarray]:
        import numpy as np

        states = self.run_tokens(batch, layers)
        eos = self.manifest.eos_token_id
        out = {}
        for mode in poolings:
            out[mode] = np.stack([pool(s, batch.mask, mode, input_ids=batch.input_ids, eos_token_id=eos)
                                  for s in states])
        return out

    def pooled_output(self, batch: Batch) -> np.ndarray | None:
        """The model's own pooled output (CLIP's EOS vector after the final norm), where it has one."""
        name = self.manifest.pooled_output
        if not name:
            return None
        _, _, out = self.forward(batch)
        return getattr(out, name).float().cpu().numpy()

    def close(self) -> None:
        self.net = None
