"""PyTorch eager: the reference engine (CPU, or CUDA where torch sees a GPU)."""

from __future__ import annotations

import inspect
from typing import TYPE_CHECKING

from layerscope.engines.base import Engine, pool_states
from layerscope.engines.parity_texts import PARITY_TEXTS
from layerscope.engines.registry import BenchRow, EngineOption, EngineSpec, Runtime, register
from layerscope.engines.truncate import check_depth
from layerscope.errors import EngineUnavailableError
from layerscope.model.stconfig import st_recipe
from layerscope.vocab.outputs import OWN_LAST
from layerscope.vocab.pooling import ST, with_st

if TYPE_CHECKING:  # numpy loads when an engine runs, not when the registry is read (the CLI's help)
    import numpy as np

    from layerscope.model.tokenize import Batch


def torch_forward(net, word_embeddings, inputs: dict[str, np.ndarray], device="cpu"):
    """Run a Hugging Face model with every hidden state: (raw embeddings, hidden states, outputs)."""
    import numpy as np
    import torch

    feed = {k: torch.from_numpy(np.ascontiguousarray(v)).to(device) for k, v in inputs.items()}
    if "use_cache" in inspect.signature(net.forward).parameters:  # a decoder's cache holds every block's
        feed["use_cache"] = False  # keys and values to the end of the forward, and nothing here reads them
    with torch.inference_mode():
        out = net(**feed, output_hidden_states=True, return_dict=True)
        # the rows of the word-embedding matrix, whatever the module adds (Gemma scales them in its forward)
        raw = torch.nn.functional.embedding(feed["input_ids"], word_embeddings.weight)
    return raw, out.hidden_states, out


PRECISIONS = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16"}


TORCH_OPTIONS = (
    EngineOption("device", str, None, "cpu, cuda or cuda:N (default: cuda where PyTorch sees a GPU)"),
    EngineOption("attention", str, None, "eager (each layer's whole [heads, T, T] attention, the reference), sdpa "
                 "(PyTorch's scaled-dot-product attention, computed in slices) or auto (default: sdpa in half "
                 "precision and where max_seq passes SLICE_FROM tokens, else eager)"),
)
ATTENTIONS = ("auto", "eager", "sdpa")
# From this many tokens (the run's max_seq) the fp32 engine computes attention in slices: one layer's whole
# attention of a 1,024-token text with 16 heads is already 128 MiB, and grows with the square of the length.
SLICE_FROM = 1024


def pick_attention(asked: str | None, precision: str, max_seq: int | None, sdpa_supported) -> str:
    """The attention the engine loads the model with: ``eager`` or ``sdpa`` (``asked``: the engine option;
    ``sdpa_supported``: a callable saying whether transformers implements SDPA for the model)."""
    from layerscope.errors import InputError

    asked = asked or "auto"
    if asked not in ATTENTIONS:
        raise InputError(f"engine option attention={asked!r}: use one of {', '.join(ATTENTIONS)}")
    if asked == "eager":
        return "eager"
    if asked == "auto" and precision == "fp32" and not (max_seq and int(max_seq) > SLICE_FROM):
        return "eager"
    if sdpa_supported():
        return "sdpa"
    if asked == "sdpa":
        raise InputError("engine option attention=sdpa: transformers has no scaled-dot-product attention for "
                         "this model; use attention=eager (or leave it out)")
    return "eager"


@register(EngineSpec(
    "torch", "PyTorch eager, the reference (CUDA where PyTorch sees a GPU, else the CPU)", needs_export=False,
    device="any", fallback=True, gradients=True, attention=True, runtime=Runtime.PYTORCH, reference=True,
    pools_as_made=True, options=TORCH_OPTIONS, precision="fp32",
    bench=(BenchRow(note="layerscope torch engine (sorted token-budget batches)"),)))
class TorchEngine(Engine):
    """PyTorch in fp32 with eager attention (scaled-dot-product attention, computed in slices, for runs of texts
    longer than ``SLICE_FROM`` tokens or when asked); subclasses run fp16/bf16 with scaled-dot-product attention.

    Off the CPU, or in half precision, poolings run on the device in fp32 (``pool_torch``) and only the
    pooled vectors are copied back; the fp32 CPU reference pools in numpy as it always has.
    """

    name = "torch"

    depth: int | None = None  # the deepest layer this engine computes (None: every layer; engines/truncate.py)

    def __init__(self, model, *, device: str | None = None, threads: int | None = None, depth: int | None = None,
                 attention: str | None = None, max_seq: int | None = None, spec: EngineSpec | None = None,
                 **_ignored):
        super().__init__(model, spec)
        import torch

        from layerscope.model.source import load_torch_model, supports_sdpa

        # what it computes in, as its declaration says (the memory plan reads the same: engines/memory.py)
        self.precision: str = self.spec.precision

        if device is None:
            device = "cuda" if torch.cuda.is_available() else "cpu"
        if device.startswith("cuda") and not torch.cuda.is_available():
            raise EngineUnavailableError(f"{self.name} on cuda: PyTorch sees no CUDA GPU on this machine; "
                                         "use --device cpu")
        if threads:
            torch.set_num_threads(int(threads))
        self.torch = torch
        self.device = torch.device(device)
        family = self.model.family()
        asked = attention
        attention = pick_attention(asked, self.precision, max_seq, lambda: supports_sdpa(
            self.model.source(), family, trust_remote_code=self.model.trust_remote_code))
        self.attention = attention
        self.attention_scores = attention == "eager"  # SDPA computes attention in slices (engines/memory.py)
        if attention == "sdpa" and self.precision == "fp32":
            why = "asked" if asked == "sdpa" else f"texts up to {int(max_seq or 0):,} tokens"
            self.info.notes.append(f"attention computed in slices (PyTorch scaled-dot-product attention; {why})")
        # Loaded in fp32 first: a half-precision engine measures itself against it, then casts in place
        # (one copy of the weights in memory, never two).
        self.vision = self.manifest.modality == "image"
        if self.vision:  # the tower the export traced, from its checkpoint (model/vision.py)
            from layerscope.model.vision import load_vision_tower

            self.net = load_vision_tower(self.model.source(), family,
                                         trust_remote_code=self.model.trust_remote_code).to(self.device)
            self.word_embeddings = None
            if self.precision != "fp32":
                raise EngineUnavailableError(f"{self.name}: vision towers run in fp32 for now; use --engine torch")
        else:
            self.net = load_torch_model(self.model.source(), family, trust_remote_code=self.model.trust_remote_code,
                                        attn_implementation=attention).to(self.device)
            self.word_embeddings = self.net.get_input_embeddings()
        num_layers = self.manifest.num_layers
        self._anatomy = None if self.vision else self._find_anatomy(family, num_layers)
        # the model's blocks, where pooled-only runs hook each layer (engines/torch_pooled.py); None: every
        # hidden state is requested and pooled after the forward
        self.block_slot = None
        if not self.vision:
            from layerscope.engines.truncate import block_slot

            try:
                self.block_slot = block_slot(self.net, self.anatomy, "to pool each layer as it is produced")
            except EngineUnavailableError as exc:
                self.info.notes.append(f"pooled runs keep every hidden state until pooled: {exc}")
        if depth is not None and int(depth) < num_layers and self.vision:
            self.info.notes.append("early exit off: a vision tower runs every block")
        elif depth is not None and int(depth) < num_layers:
            from layerscope.engines.truncate import truncate_blocks

            self.depth = max(int(depth), -1)
            try:
                kept = truncate_blocks(self.net, self.anatomy, self.depth,
                                       probe=lambda: self.forward(self.encoder()(["a"])))
            except EngineUnavailableError as exc:  # no block list found: every block runs
                self.depth = None
                self.info.notes.append(f"early exit off: {exc}")
            else:
                top = "raw embeddings only" if self.depth < 0 else f"layers up to {self.depth}"
                self.info.notes.append(f"early exit: {top} (the first {kept} of {num_layers} blocks)")
        self.info.provider = f"torch-{self.device.type}"
        self.info.device = str(self.device)
        self.info.precision = self.precision
        self.parity: dict[str, dict[str, float]] = {}
        if self.precision != "fp32":
            self._become_half()

    @property
    def carries_own_last(self) -> bool:
        return not self.vision  # the model's forward returns it

    def _find_anatomy(self, family, num_layers: int):
        """The model's anatomy (model/anatomy.py): as its export recorded it, else found on the loaded model and
        held to a forward pass here (a plain model, or an export made before anatomies were recorded); None
        where the forward pass contradicts every rule (the engine then keeps every hidden state)."""
        recorded = self.manifest.anatomy_record
        if recorded is not None:
            return recorded
        from layerscope.errors import ExportError
        from layerscope.model.anatomy import resolve_anatomy
        from layerscope.model.anatomy_rules import probe_inputs

        feed = {k: v.to(self.device) if hasattr(v, "to") else v for k, v in probe_inputs(self.net).items()}
        try:
            return resolve_anatomy(self.net, family, num_layers, inputs=feed)
        except ExportError as exc:
            self.info.notes.append(f"the model's anatomy could not be found ({exc})")
            return None

    @property
    def top_norm(self) -> str | None:
        """The module whose output is the last layer where layer L carries the final norm (the anatomy's final
        norm; an identity below L once truncated), else None: the last block's own output is layer L."""
        anatomy = self.anatomy
        return anatomy.final_norm if anatomy is not None and anatomy.final_norm_in_hidden_states else None

    @property
    def pools_as_made(self) -> bool:
        """As declared, where the hooks have blocks to sit on: none found (a vision tower, a model's own block
        layout), none kept (an early exit at layer 0 or raw), or a hook that missed its layer: every state is kept."""
        return self.spec.pools_as_made and self.block_slot is not None and (self.depth is None or self.depth > 0)

    def _become_half(self) -> None:
        """Cast to the engine's half type and record each layer's max |diff| and min cosine against fp32."""
        torch = self.torch
        encoder = self.encoder()
        batches = [encoder(list(PARITY_TEXTS[:4])), encoder([PARITY_TEXTS[4]])]
        layers = [n for n in self.layer_names if self.depth is None or n == "raw" or int(n) <= self.depth]
        ref = [self.run_tokens(b, layers) for b in batches]
        self.net.to(getattr(torch, PRECISIONS[self.precision]))
        got = [self.run_tokens(b, layers) for b in batches]
        self.parity = half_parity(ref, got, [b.mask for b in batches], layers)
        worst = min(self.parity, key=lambda k: self.parity[k]["min_cos"])
        w = self.parity[worst]
        self.info.notes.append(f"{self.precision} ({self.attention} attention) against fp32 on {self.device.type}: "
                               f"worst layer {worst}, min cosine {w['min_cos']:.6f}, max |diff| {w['max_abs']:.3g}")

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
        """(raw embeddings, tuple of hidden states, model outputs) as torch tensors, no grad (a vision tower:
        no raw embeddings, and the outputs hold ``image_embeds``, its joint embedding, or None)."""
        if self.vision:
            from types import SimpleNamespace

            import numpy as np

            pixels = self.torch.from_numpy(np.ascontiguousarray(batch.inputs["pixel_values"])).to(self.device)
            with self.torch.inference_mode():
                hidden, embeds = self.net(pixels)
            return None, hidden, SimpleNamespace(image_embeds=embeds)
        raw, hidden, out = torch_forward(self.net, self.word_embeddings, batch.inputs, self.device)
        if hidden is None and self.depth is not None and self.depth <= 0:
            # no block ran, so a model that records hidden states on its blocks recorded none: layer 0 is the
            # blocks' input, which the model hands back as its last hidden state (the final norm is an identity)
            hidden = (out.last_hidden_state,)
        return raw, hidden, out

    @staticmethod
    def _state(raw, hidden, out, name: str):
        """One layer's states from a forward (``OWN_LAST``: the model's own last hidden state)."""
        return raw if name == "raw" else out.last_hidden_state if name == OWN_LAST else hidden[int(name)]

    def _select(self, raw, hidden, out, layers: list[str]) -> list[np.ndarray]:
        return [self._state(raw, hidden, out, name).float().cpu().numpy() for name in layers]

    def run_tokens(self, batch: Batch, layers: list[str]) -> list[np.ndarray]:
        check_depth(layers, self.depth, self.name)
        raw, hidden, out = self.forward(batch)
        return self._select(raw, hidden, out, layers)

    def run(self, batch: Batch, layers: list[str], poolings: list[str]) -> dict[str, np.ndarray]:
        recipe = st_recipe(self.manifest) if ST in poolings else None
        run, own_row = self.st_plan(layers, poolings)
        return with_st(poolings, lambda modes: self._run_pooled(batch, run, modes), recipe, own_row=own_row)

    def _run_pooled(self, batch: Batch, layers: list[str], poolings: list[str]) -> dict[str, np.ndarray]:
        import numpy as np

        blocks = getattr(*self.block_slot) if self.block_slot is not None else None
        if blocks:  # a stack truncated to no block (depth <= 0) has one layer: the path below keeps just it
            from layerscope.engines.torch_pooled import HookMissed, pooled_by_layer

            check_depth(layers, self.depth, self.name)
            try:
                return pooled_by_layer(self, batch, layers, poolings, blocks)
            except HookMissed as exc:
                self.block_slot = None
                self.info.notes.append(f"pooled runs keep every hidden state until pooled: {exc}")
        if (self.device.type != "cpu" or self.precision != "fp32") and not self.vision:
            return self._pool_on_device(batch, layers, poolings)
        states = self.run_tokens(batch, layers)
        return {mode: np.stack([pool_states(self.manifest, batch, s, mode) for s in states]) for mode in poolings}

    def run_keeping_tokens(self, batch: Batch, layers: list[str], poolings: list[str], token_layers: list[str],
                           keep):
        """As ``Engine.run_keeping_tokens``, each layer handed over by the block hooks as it is produced
        (engines/torch_pooled.py): the model is never asked for every hidden state at once."""
        blocks = getattr(*self.block_slot) if self.block_slot is not None and not self.vision else None
        if not blocks:
            return super().run_keeping_tokens(batch, layers, poolings, token_layers, keep)
        from layerscope.engines.torch_pooled import HookMissed, pooled_and_kept

        check_depth(layers, self.depth, self.name)
        kept: list = []
        run, own_row = self.st_plan(layers, poolings)

        def compute(modes: list[str]) -> dict[str, np.ndarray]:
            pooled, got = pooled_and_kept(self, batch, run, modes, token_layers, keep, blocks)
            kept.extend(got)
            return pooled

        recipe = st_recipe(self.manifest) if ST in poolings else None
        try:
            return with_st(poolings, compute, recipe, own_row=own_row), kept
        except HookMissed as exc:
            self.block_slot = None
            self.info.notes.append(f"pooled runs keep every hidden state until pooled: {exc}")
            return super().run_keeping_tokens(batch, layers, poolings, token_layers, keep)

    def _pool_on_device(self, batch: Batch, layers: list[str], poolings: list[str]) -> dict[str, np.ndarray]:
        """Pool on the device in fp32 and copy back only ``[layers, batch, hidden]`` per pooling."""
        import numpy as np

        from layerscope.vocab.pooling import pool_torch

        torch = self.torch
        check_depth(layers, self.depth, self.name)
        raw, hidden, out = self.forward(batch)
        with torch.inference_mode():
            states = torch.stack([self._state(raw, hidden, out, n).float() for n in layers])
            mask = torch.from_numpy(np.ascontiguousarray(batch.mask)).to(self.device)
            ids = torch.from_numpy(np.ascontiguousarray(batch.input_ids)).to(self.device)
            eos = self.manifest.eos_token_id
            return {mode: pool_torch(states, mask, mode, input_ids=ids, eos_token_id=eos).cpu().numpy()
                    for mode in poolings}

    def pooled_output(self, batch: Batch) -> np.ndarray | None:
        """The model's own pooled output (CLIP's EOS vector after the final norm), where it has one."""
        name = self.manifest.pooled_output
        if not name or self.depth is not None:  # the pooler reads the last layer, which this engine skips
            return None
        _, _, out = self.forward(batch)
        return getattr(out, name).float().cpu().numpy()

    def _resume(self, batch: Batch, layer: int, state, layers: list[int]) -> list[np.ndarray]:
        """A forward pre-hook on block ``layer + 1`` hands it ``state`` in place of its input (engines/resume.py);
        the blocks before it still run, their output discarded."""
        import numpy as np

        from layerscope.errors import InputError

        torch = self.torch
        if self.depth is not None:
            raise InputError(f"engine '{self.name}' was opened for layers up to {self.depth} and cannot write a "
                             "state; open it without depth")
        anatomy = self.manifest.anatomy  # where the blocks are, as the export recorded it
        if anatomy is not None and anatomy.blocks is not None:
            blocks = self.net.get_submodule(anatomy.blocks)
        elif anatomy is None and self.block_slot is not None:  # a manifest copy without its anatomy: found here
            blocks = getattr(*self.block_slot)
        else:
            raise InputError(f"engine '{self.name}': this model keeps no list of blocks (one block shared by every "
                             "layer), so a hook cannot write a state at one layer; use --engine ort")
        given = torch.from_numpy(np.ascontiguousarray(np.asarray(state, dtype=np.float32))).to(self.device)

        def swap(module, args, kwargs):
            value = given.to(args[0].dtype if args else kwargs["hidden_states"].dtype)
            if args:
                return (value, *args[1:]), kwargs
            return args, {**kwargs, "hidden_states": value}

        hook = blocks[layer].register_forward_pre_hook(swap, with_kwargs=True)
        try:
            _, hidden, _ = self.forward(batch)
        finally:
            hook.remove()
        return [hidden[k].float().cpu().numpy() for k in layers]

    def close(self) -> None:
        self.net = None


def half_parity(ref: list[list[np.ndarray]], got: list[list[np.ndarray]], masks: list[np.ndarray],
                layers: list[str]) -> dict[str, dict[str, float]]:
    """Per layer: max |ref - got| and min cosine over the real (unpadded) token vectors of every batch."""
    import numpy as np

    out: dict[str, dict[str, float]] = {}
    for li, layer in enumerate(layers):
        r = np.concatenate([b[li][m.astype(bool)] for b, m in zip(ref, masks)]).astype(np.float64)
        g = np.concatenate([b[li][m.astype(bool)] for b, m in zip(got, masks)]).astype(np.float64)
        nr, ng = np.linalg.norm(r, axis=1), np.linalg.norm(g, axis=1)
        cos = np.sum(r * g, axis=1) / np.maximum(nr * ng, 1e-300)
        cos = np.where((nr == 0) & (ng == 0), 1.0, cos)
        out[layer] = {"max_abs": float(np.max(np.abs(r - g))), "min_cos": float(np.min(cos))}
    return out


@register(EngineSpec(
    "torch-fp16", "PyTorch in float16 with scaled-dot-product attention (the GPU baseline; checks itself "
    "against fp32 at start)", needs_export=False, device="any", options=TORCH_OPTIONS, precision="fp16",
    runtime=Runtime.PYTORCH, pools_as_made=True,
    bench=(BenchRow(note="PyTorch fp16 + SDPA, poolings on the device"),)))
class TorchFp16Engine(TorchEngine):
    name = "torch-fp16"


@register(EngineSpec(
    "torch-bf16", "PyTorch in bfloat16 with scaled-dot-product attention (checks itself against fp32 at "
    "start)", needs_export=False, device="any", options=TORCH_OPTIONS, precision="bf16",
    runtime=Runtime.PYTORCH, pools_as_made=True,
    bench=(BenchRow(note="PyTorch bf16 + SDPA, poolings on the device"),)))
class TorchBf16Engine(TorchEngine):
    name = "torch-bf16"
