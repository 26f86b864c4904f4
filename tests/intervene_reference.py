"""The independent PyTorch computation interventions are held to: the plain Hugging Face model (with its head
where it has one) and forward hooks written here that replace or add a state at a layer, one run per cell, no
layerscope code. Layer j is hidden_states[j]: the input of block j+1 (j < L), the last hidden state (j = L)."""

from __future__ import annotations

import numpy as np
import torch

# where each tiny family keeps its blocks and the module whose output is the last hidden state (named here)
PARTS = {
    "bert": ("bert.encoder.layer", "bert.encoder.layer.1", "cls"),
    "gpt2": ("transformer.h", "transformer.ln_f", "lm_head"),
    "qwen2": ("model.layers", "model.norm", "lm_head"),
}


class Reference:
    """A with-head model and its hooks. ``run(ids, layer, change)``: the forward with ``change(x)`` applied to
    layer ``layer``'s state ``x`` ([1, T, H]); returns (every hidden state, logits)."""

    def __init__(self, model_dir, family: str, parts=None):
        from transformers import AutoModelForCausalLM, AutoModelForMaskedLM

        cls = AutoModelForMaskedLM if family == "bert" else AutoModelForCausalLM
        self.net = cls.from_pretrained(str(model_dir), attn_implementation="eager").eval()
        blocks, last, head = parts or PARTS[family]
        self.blocks = self.net.get_submodule(blocks)
        self.last = self.net.get_submodule(last)
        self.head = self.net.get_submodule(head)
        self.family = family
        self.num_layers = len(self.blocks)

    def run(self, inputs: dict, layer: int | None = None, change=None):
        handles = []
        if change is not None and layer < self.num_layers:
            def pre(module, args, kwargs):
                if args:
                    return (change(args[0]), *args[1:]), kwargs
                return args, {**kwargs, "hidden_states": change(kwargs["hidden_states"])}

            handles.append(self.blocks[layer].register_forward_pre_hook(pre, with_kwargs=True))
        elif change is not None:
            def post(module, args, output):
                if isinstance(output, tuple):
                    return (change(output[0]), *output[1:])
                return change(output)

            handles.append(self.last.register_forward_hook(post))
        try:
            with torch.inference_mode():
                out = self.net(**{k: torch.as_tensor(v) for k, v in inputs.items()}, output_hidden_states=True)
        finally:
            for h in handles:
                h.remove()
        logits = getattr(out, "logits", None)
        return [h.float().numpy() for h in out.hidden_states], None if logits is None else logits.float().numpy()

    def lens(self, h: np.ndarray, layer: int) -> np.ndarray:
        """Logits of states ``h`` [n, H] of layer ``layer``, as the logit lens reads them: a decoder's final norm
        below the last layer, then the head; an encoder's MLM head as is."""
        x = torch.from_numpy(np.asarray(h, dtype=np.float32))
        with torch.inference_mode():
            if self.family != "bert" and layer < self.num_layers:
                x = self.last(x)
            return self.head(x).float().numpy()


def replace_at(positions, values: np.ndarray):
    """A change writing ``values`` ([T, H] or [len(positions), H]) at ``positions`` of a [1, T, H] state."""
    positions = list(positions)
    given = torch.from_numpy(np.asarray(values, dtype=np.float32))

    def change(x):
        x = x.clone()
        x[:, positions] = given if given.shape[0] == len(positions) else given[positions]
        return x

    return change


def add_everywhere(vector: np.ndarray):
    given = torch.from_numpy(np.asarray(vector, dtype=np.float32))

    def change(x):
        return x + given

    return change


def mean_pool(h: np.ndarray) -> np.ndarray:
    return np.asarray(h, dtype=np.float64).mean(axis=-2)


def cosine(a, b) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


def log_softmax(z) -> np.ndarray:
    return torch.log_softmax(torch.as_tensor(np.asarray(z, dtype=np.float64)), dim=-1).numpy()
