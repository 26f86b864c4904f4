"""The anatomy's rules: where a loaded model's blocks, attention, final norm and embeddings are, found by rule,
and the forward pass that says what each path produces (``measure``: a path that does not produce what its
name claims is one line naming it).  Used by ``model/anatomy.py``; torch is imported inside the functions.
"""

from __future__ import annotations

from typing import Any

from layerscope.errors import ExportError
from layerscope.model.anatomy_head import FINAL_NORM_NAMES, module_name
from layerscope.model.anatomy_record import AttentionAnatomy

def block_input(args: tuple, kwargs: dict):
    """The hidden states a block is called with: its first positional argument, or ``hidden_states=``
    (None where neither is there)."""
    if args:
        return args[0]
    return kwargs.get("hidden_states")


def block_output(out):
    """A block's hidden states: the output itself, or ``[0]`` of a tuple (attention weights, caches follow)."""
    return out[0] if isinstance(out, (tuple, list)) else out


def find_blocks(base, num_blocks: int) -> str | None:
    """The outermost ``ModuleList`` of ``num_blocks`` modules on ``base`` (the first of the outermost), or
    None where there is none (ALBERT calls one shared block at every layer)."""
    import torch

    lists = [name for name, m in base.named_modules()
             if name and isinstance(m, torch.nn.ModuleList) and len(m) == num_blocks]
    return min(lists, key=lambda n: n.count(".")) if lists else None


def find_final_norm(base, family) -> str | None:
    """The final norm of ``base``: the family's (a vision tower's ``post_layernorm``), found as a path or as
    the end of one, else the last module named like a final norm outside the numbered blocks."""
    if family.final_norm:
        names = [name for name, _ in base.named_modules()
                 if name == family.final_norm or name.endswith("." + family.final_norm)]
        if names:
            return min(names, key=lambda n: n.count("."))
    found = None
    for name, _ in base.named_modules():
        parts = name.split(".")
        if name and parts[-1] in FINAL_NORM_NAMES and not any(p.isdigit() for p in parts):
            found = name
    return found


def embeddings_path(base) -> str:
    """The input embeddings module: ``get_input_embeddings()`` where the model has it, else its ``embeddings``."""
    try:
        emb = base.get_input_embeddings()
    except (AttributeError, NotImplementedError):
        emb = None
    name = module_name(base, emb) if emb is not None else None
    if name:
        return name
    return "embeddings" if hasattr(base, "embeddings") else ""


def _declared(obj, *names: str) -> int | None:
    for name in names:
        value = getattr(obj, name, None)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


def _width(module) -> int | None:
    weight = getattr(module, "weight", None)
    return int(weight.shape[-1]) if weight is not None and getattr(weight, "ndim", 0) >= 1 else None


_QK_NORMS = ("q_norm", "q_layernorm", "query_layernorm", "q_ln")


def _qk_norm(module, head_dim: int) -> str:
    norm = next((m for n, m in module.named_children() if n in _QK_NORMS), None)
    if norm is None:
        return "none"
    return "per_head" if hasattr(norm, "norms") or _width(norm) == head_dim else "flat"


def _window(module, config, index: int) -> int | None:
    """Layer ``index``'s sliding window (keys a query sees, itself included), or None (every key)."""
    if hasattr(module, "sliding_window"):
        value = module.sliding_window
        return int(value) if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None
    local = getattr(module, "local_attention", None)
    if isinstance(local, tuple) and len(local) == 2:  # a window on both sides (ModernBERT)
        return None if local[0] < 0 else int(local[0] + local[1] + 1)
    types = getattr(config, "layer_types", None) or getattr(config, "attention_layers", None)
    if isinstance(types, (list, tuple)) and index < len(types):
        sliding = str(types[index]) in ("sliding_attention", "local")
        size = getattr(config, "sliding_window", None) or getattr(config, "window_size", None)
        return int(size) if sliding and isinstance(size, int) else None
    size = getattr(config, "sliding_window", None)
    if isinstance(size, int) and not isinstance(size, bool) and getattr(config, "use_sliding_window", True) is not False:
        return size  # passed to every layer's attention (Mistral, Mixtral, Phi-3)
    return None


_ROTARY_CONFIG = ("rotary_dim", "rotary_pct", "rotary_emb_base", "rope_theta", "partial_rotary_factor")


def _positions(base, config) -> tuple[str, str | None]:
    """(how positions reach the attention, the rotary module's path or None)."""
    import sys

    rotary = next((name for name, m in base.named_modules() if "Rotary" in type(m).__name__), None)
    alibi = getattr(config, "alibi", None)
    if alibi is True:
        return "alibi", None
    if rotary is not None or any(getattr(config, k, None) is not None for k in _ROTARY_CONFIG):
        return "rotary", rotary
    code = sys.modules.get(type(base).__module__)
    if alibi is not False and callable(getattr(code, "build_alibi_tensor", None)):
        return "alibi", None
    kind = getattr(config, "position_embedding_type", None)
    if getattr(config, "relative_attention_num_buckets", None) or getattr(config, "relative_attention", False) is True \
            or (isinstance(kind, str) and kind.startswith("relative")):
        return "relative", None
    for name, weight in base.named_parameters():  # a table of position vectors (a module's, or a bare one: ViT)
        parts = name.split(".")
        owner = parts[-2] if parts[-1] == "weight" and len(parts) > 1 else parts[-1]
        if ("position" in owner or owner in ("wpe", "embed_positions")) and weight.ndim >= 2:
            return "learned", None
    return "none", None


def find_attention(base, blocks: str | None, num_blocks: int, config) -> AttentionAnatomy | None:
    """The attention of every block (see the module docstring), or None where block 0 has no module whose
    class name ends in ``Attention``."""
    owner = base.get_submodule(f"{blocks}.0") if blocks else base
    found = [(n, m) for n, m in owner.named_modules() if n and type(m).__name__.endswith("Attention")]
    if not found:
        return None
    deepest = max(n.count(".") for n, _ in found)
    name, module = next((n, m) for n, m in found if n.count(".") == deepest)
    heads = _declared(module, "num_heads", "num_attention_heads", "n_head", "n_heads") or \
        _declared(config, "num_attention_heads", "n_head", "num_heads", "n_heads", "encoder_attention_heads")
    if not heads:
        return None
    groups = _declared(module, "num_key_value_groups")
    kv = _declared(module, "num_key_value_heads", "num_kv_heads", "kv_heads", "n_kv_heads") or \
        (heads // groups if groups else None) or _declared(config, "num_key_value_heads") or heads
    hidden = _declared(config, "hidden_size", "d_model", "n_embd", "dim") or 0
    head_dim = _declared(module, "head_dim", "attention_head_size", "head_size", "key_value_proj_dim", "dim_per_head") \
        or _declared(config, "head_dim", "d_kv") or hidden // heads
    scaling = getattr(module, "scaling", None)
    default = head_dim ** -0.5
    scale = float(scaling) if isinstance(scaling, (int, float)) and not isinstance(scaling, bool) \
        and abs(scaling - default) > 1e-6 * default else None
    if blocks:
        modules = [base.get_submodule(f"{blocks}.{i}.{name}") for i in range(num_blocks)]
        windows = tuple(_window(m, config, i) for i, m in enumerate(modules))
    else:
        windows = (_window(module, config, 0),)
    same = len(set(windows)) == 1
    positions, rotary = _positions(base, config)
    return AttentionAnatomy(module=name, heads=int(heads), kv_heads=int(kv), head_dim=int(head_dim),
                            qk_norm=_qk_norm(module, head_dim), scale=scale, window=windows[0] if same else None,
                            layer_windows=None if same else windows, positions=positions, rotary=rotary)


def probe_inputs(base, config=None) -> dict[str, Any]:
    """A small input the forward-pass check runs: eight token ids (a vision tower: one random image at the
    config's size)."""
    import inspect

    import torch

    config = config if config is not None else base.config
    params = inspect.signature(base.forward).parameters
    if "pixel_values" in params and "input_ids" not in params:
        size = getattr(config, "image_size", 224)
        height, width = (size, size) if isinstance(size, int) else tuple(size)
        gen = torch.Generator().manual_seed(0)
        return {"pixel_values": torch.rand(1, int(getattr(config, "num_channels", 3)), height, width, generator=gen)}
    vocab = int(getattr(config, "vocab_size", 2) or 2)
    ids = torch.arange(1, 9).clamp(max=vocab - 1).unsqueeze(0)
    feed: dict[str, Any] = {"input_ids": ids}
    if "attention_mask" in params:
        feed["attention_mask"] = torch.ones_like(ids)
    if "use_cache" in params:
        feed["use_cache"] = False
    return feed


def measure(base, *, blocks: str | None, num_blocks: int, final_norm: str | None, embeddings: str,
            projection: str | None, inputs: dict[str, Any]) -> dict[str, Any]:
    """Run ``base`` once on ``inputs`` with hooks on the given paths and say what they produce:
    ``{"final_norm_in_hidden_states", "last_hidden_state", "embedding_scale", "max_abs"}``; a path that does
    not produce what its name claims is one ExportError naming it."""
    import torch

    seen: dict[Any, Any] = {}
    hooks = []
    stack = base.get_submodule(blocks) if blocks else None
    if stack is not None:
        if len(stack) != num_blocks:
            raise ExportError(f"the anatomy's blocks ({blocks}) hold {len(stack)} modules where the model has "
                              f"{num_blocks} layers")
        hooks.append(stack[0].register_forward_pre_hook(
            lambda _m, args, kwargs: keep_first(seen, "in", block_input(args, kwargs)), with_kwargs=True))
        for i, block in enumerate(stack):
            hooks.append(block.register_forward_hook(
                lambda _m, _a, out, i=i: seen.__setitem__(("out", i), block_output(out))))
    if final_norm:
        hooks.append(base.get_submodule(final_norm).register_forward_hook(
            lambda _m, args, out: seen.__setitem__("norm", (args[0] if args else None, out))))
    if projection:
        hooks.append(base.get_submodule(projection).register_forward_hook(
            lambda _m, _a, out: seen.__setitem__("projection", out)))
    try:
        with torch.inference_mode():
            out = base(**inputs, **_asking_states(base))
    finally:
        for hook in hooks:
            hook.remove()
    states = getattr(out, "hidden_states", None)
    if states is None or len(states) != num_blocks + 1:
        raise ExportError(f"the model returned {len(states) if states is not None else 'no'} hidden states for "
                          f"{num_blocks} layers (expected {num_blocks + 1})")
    worst = [0.0]

    def same(a, b) -> bool:
        if a is None or b is None or not hasattr(a, "shape") or tuple(a.shape) != tuple(b.shape):
            return False
        diff = float((a.double() - b.double()).abs().max()) if a.numel() else 0.0
        if diff <= 1e-5 * max(1.0, float(b.double().abs().max()) if b.numel() else 0.0):
            worst[0] = max(worst[0], diff)
            return True
        return False

    last = None
    if stack is not None:
        if not same(seen.get("in"), states[0]):
            raise ExportError(f"the anatomy's blocks ({blocks}): block 0 does not read hidden_states[0]")
        for i in range(num_blocks - 1):
            if not same(seen.get(("out", i)), states[i + 1]):
                raise ExportError(f"the anatomy's blocks ({blocks}): block {i}'s output is not hidden_states[{i + 1}]")
        last = seen.get(("out", num_blocks - 1))
    norm_in, norm_out = seen.get("norm", (None, None))
    if final_norm:
        if norm_out is None:
            raise ExportError(f"the anatomy's final norm ({final_norm}) is not called by the model's forward pass")
        reads = last if last is not None else states[-1]
        if not (same(norm_in, reads) or (hasattr(norm_in, "ndim") and norm_in.ndim == reads.ndim - 1
                                         and same(norm_in, reads[:, 0]))):
            raise ExportError(f"the anatomy's final norm ({final_norm}) does not read the last block's output")
    if last is not None and same(last, states[-1]):
        in_hidden = False
    elif norm_out is not None and same(norm_out, states[-1]):
        in_hidden = True
    elif last is not None:
        raise ExportError(f"the last block's output ({blocks}.{num_blocks - 1}) is neither hidden_states[{num_blocks}] "
                          "nor its final norm")
    else:
        in_hidden = False
    own = getattr(out, "last_hidden_state", None) if out is not None else None
    if own is None or same(own, states[-1]):
        last_state = "layer"
    elif norm_out is not None and same(own, norm_out):
        last_state = "final_norm"
    elif seen.get("projection") is not None and same(own, seen["projection"]):
        last_state = "projection"
    else:
        raise ExportError(f"the model's own last_hidden_state is neither hidden_states[{num_blocks}] nor its final "
                          f"norm{' (' + final_norm + ')' if final_norm else ''}")
    return {"final_norm_in_hidden_states": in_hidden, "last_hidden_state": last_state,
            "embedding_scale": _embedding_scale(base, embeddings, inputs, states[0]), "max_abs": worst[0]}


def keep_first(seen: dict, key: str, value) -> None:
    """Remember the first value a hook sees under ``key`` (a hook that returns nothing changes nothing)."""
    seen.setdefault(key, value)


def _asking_states(base) -> dict[str, bool]:
    """The keywords that make ``base`` hand back every hidden state as a ``ModelOutput``."""
    import inspect

    params = inspect.signature(base.forward).parameters
    takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    return {k: True for k in ("output_hidden_states", "return_dict") if k in params or takes_any}


def _embedding_scale(base, embeddings: str, inputs: dict[str, Any], layer0) -> float | None:
    """c where layer 0 is c x the word-embedding rows (Gemma: sqrt(hidden_size); Qwen: 1), else None."""
    import torch

    ids = inputs.get("input_ids")
    weight = getattr(base.get_submodule(embeddings), "weight", None) if embeddings else None
    if ids is None or weight is None:
        return None
    with torch.no_grad():
        raw = torch.nn.functional.embedding(ids, weight).double()
    zero = layer0.double()
    if tuple(raw.shape) != tuple(zero.shape) or not float((raw * raw).sum()):
        return None
    c = float((zero * raw).sum() / (raw * raw).sum())
    if float((zero - c * raw).abs().max()) > 1e-5 * max(1.0, float(zero.abs().max())):
        return None
    return float(f"{c:.7g}")




def own_last_differs(base, inputs: dict[str, Any] | None = None) -> bool:
    """Whether the model's own last hidden state (what it returns as its token embeddings) is, at the width of
    the layers, not its last hidden state (ModernBERT and CLIP's text tower apply their final norm after it):
    the export then carries it as an output of its own.  One forward pass on :func:`probe_inputs`."""
    import torch

    inputs = inputs if inputs is not None else probe_inputs(base)
    with torch.inference_mode():
        out = base(**inputs, **_asking_states(base))
    own, states = getattr(out, "last_hidden_state", None), getattr(out, "hidden_states", None)
    if own is None or not states:
        return False
    last = states[-1]
    return tuple(own.shape) == tuple(last.shape) and not torch.equal(own, last)
