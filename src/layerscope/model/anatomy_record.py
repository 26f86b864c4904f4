"""The model's anatomy as a record: ``Anatomy`` and ``AttentionAnatomy`` (frozen), their JSON form in
manifest.json and the check of every field when it is read back (one line naming the field).

What each field means and how it is found: ``model/anatomy.py`` and docs/ARCHITECTURE.md ("The model
anatomy").  Imports nothing heavy: the manifest reads it.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

from layerscope.errors import ManifestError

QK_NORMS = ("none", "per_head", "flat")
POSITIONS = ("learned", "rotary", "alibi", "relative", "none")
LAST_STATES = ("layer", "final_norm", "projection")
HEAD_READS = ("layer", "final_norm")
TOWERS = ("text", "vision")


@dataclass(frozen=True)
class AttentionAnatomy:
    """One block's attention, as every block has it (``layer_windows`` where the layers' windows differ)."""

    module: str  # the attention module inside one block ("attention.self", "self_attn", "attn")
    heads: int
    kv_heads: int
    head_dim: int
    qk_norm: str = "none"  # "none" | "per_head" | "flat": RMS/Layer norms on q and k, per head or over all heads
    scale: float | None = None  # the softmax scale; None: 1/sqrt(head_dim) (or none declared: T5 scales by 1)
    window: int | None = None  # the sliding window of every layer (the keys a query sees, itself included)
    layer_windows: tuple[int | None, ...] | None = None  # each layer's window, where they differ
    positions: str = "learned"  # "learned" | "rotary" | "alibi" | "relative" | "none"
    rotary: str | None = None  # the rotary module on the base model, where there is one

    @classmethod
    def from_dict(cls, d: Any, where: str) -> "AttentionAnatomy":
        d = _mapping(d, where)
        windows = d.get("layer_windows")
        if windows is not None and not isinstance(windows, list):
            raise ManifestError(f"{where}.layer_windows is not a list; {_AGAIN}")
        got = cls(module=_text(d, "module", where), heads=_count(d, "heads", where),
                  kv_heads=_count(d, "kv_heads", where), head_dim=_count(d, "head_dim", where),
                  qk_norm=_choice(d, "qk_norm", QK_NORMS, where), scale=_opt_number(d, "scale", where),
                  window=_opt_count(d, "window", where),
                  layer_windows=None if windows is None else tuple(
                      _opt_count({"w": w}, "w", f"{where}.layer_windows") for w in windows),
                  positions=_choice(d, "positions", POSITIONS, where), rotary=_opt_text(d, "rotary", where))
        if got.heads % got.kv_heads:
            raise ManifestError(f"{where}: {got.heads} heads cannot share {got.kv_heads} key/value heads; {_AGAIN}")
        return got

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["layer_windows"] = None if self.layer_windows is None else list(self.layer_windows)
        return out


@dataclass(frozen=True)
class Anatomy:
    """Where a model keeps what every floor reads (see the module docstring and docs/ARCHITECTURE.md)."""

    tower: str  # "text" | "vision"
    embeddings: str  # the input embeddings module (get_input_embeddings; a vision tower's embeddings)
    embedding_scale: float | None  # layer 0 = raw rows x this (Gemma sqrt(hidden), Granite, 1.0 for Qwen); else None
    blocks: str | None  # the ModuleList of blocks ("encoder.layer", "layers", "h"); None: no list (ALBERT)
    num_blocks: int  # = manifest.num_layers
    attention: AttentionAnatomy | None
    final_norm: str | None
    final_norm_in_hidden_states: bool  # hidden_states[L] already has the final norm (decoders) or not
    last_hidden_state: str  # what the model returns as its token embeddings: "layer" (= hidden_states[L]),
    # "final_norm" (= final_norm(hidden_states[L]): ModernBERT, CLIP text, ViT) or "projection" (OPT's project_out)
    base_prefix: str = ""  # the with-head model's attribute that holds the base model ("model", "bert")
    head: tuple[str, ...] = ()  # module paths on the with-head model, applied in order; () where none
    head_reads: str = "layer"  # the head's input: layer L as hidden_states holds it, or its final norm
    hidden_projection: str | None = None  # a module after the final norm to another width (OPT's project_out)
    check_max_abs: float = 0.0  # the forward-pass check's largest difference (NaN: not checked, derived on load)
    derived_on_load: bool = False  # an export made before the anatomy existed: derived when it was opened

    # -- what readers ask ---------------------------------------------------------
    @property
    def head_norm(self) -> str | None:
        """The final norm's path on the with-head model (where the lens finds it), or None."""
        return _join(self.base_prefix, self.final_norm) if self.final_norm else None

    @property
    def norm_below_last(self) -> bool:
        """Whether a decoding head reads layers below L through the final norm: the head reads normed states,
        which layer L holds already (decoders) or which the head's own input is (ModernBERT)."""
        return self.final_norm is not None and (self.final_norm_in_hidden_states or self.head_reads == "final_norm")

    @property
    def norm_on_last(self) -> bool:
        """Whether the lens applies the final norm to layer L too (it is not in hidden_states[L])."""
        return self.final_norm is not None and self.head_reads == "final_norm"

    @property
    def own_last_differs(self) -> bool:
        """Whether the model's own last hidden state (what sentence-transformers pools) is not layer L."""
        return self.last_hidden_state != "layer"

    @property
    def note(self) -> str:
        """What a reader says of an anatomy derived on load (empty for one recorded at export)."""
        if not self.derived_on_load:
            return ""
        return ("the model's anatomy was derived when its export was opened (the export was made before layerscope "
                "recorded it): paths from its config.json, the rest from what its manifest recorded; export it "
                "again to have it checked by a forward pass")

    def block_path(self, index: int) -> str:
        """The path of block ``index`` on the base model."""
        if self.blocks is None:
            raise ManifestError("this model keeps no list of blocks (one block shared by every layer)")
        return f"{self.blocks}.{int(index)}"

    def last_layer_note(self, *, carried: bool = False) -> str:
        """What layer L is, and what the model's own last hidden state is, in one sentence (the manifest's);
        ``carried``: the export carries that state as its output ``last_hidden_state``."""
        n = self.num_blocks
        if self.final_norm and self.final_norm_in_hidden_states:
            layer = f"layer {n} is the last block's output after the final norm ({self.final_norm})"
        elif self.final_norm:
            layer = f"layer {n} is the last block's output before the final norm ({self.final_norm})"
        else:
            layer = f"layer {n} is the last block's output"
        if self.last_hidden_state == "final_norm":
            own = f"{layer}; the model's own last hidden state (its token embeddings) is the final norm of it"
            return own + (f", which the export carries as its output last_hidden_state and which pooling 'st' reads "
                          f"at layer {n}, as sentence-transformers does" if carried else "")
        if self.last_hidden_state == "projection":
            return f"{layer}; the model's own last hidden state is {self.hidden_projection} of it"
        return f"{layer}, which is also the model's own last hidden state"

    # -- JSON -------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["attention"] = None if self.attention is None else self.attention.to_dict()
        out["head"] = list(self.head)
        out["check_max_abs"] = None if math.isnan(self.check_max_abs) else self.check_max_abs
        return out

    @classmethod
    def from_dict(cls, d: Any, where: str = "the manifest's anatomy") -> "Anatomy":
        """The anatomy of ``d`` (manifest.json's ``anatomy``), every field checked: one line naming the field."""
        d = _mapping(d, where)
        head = d.get("head", [])
        if not isinstance(head, list) or not all(isinstance(h, str) and _is_path(h) for h in head):
            raise ManifestError(f"{where}.head is not a list of module paths; {_AGAIN}")
        attention = d.get("attention")
        flags = {}
        for key in ("final_norm_in_hidden_states", "derived_on_load"):
            value = d.get(key, False)
            if not isinstance(value, bool):
                raise ManifestError(f"{where}.{key} is not true or false; {_AGAIN}")
            flags[key] = value
        checked = _opt_number(d, "check_max_abs", where)
        prefix = d.get("base_prefix", "")
        if not isinstance(prefix, str) or (prefix and not _is_path(prefix)):
            raise ManifestError(f"{where}.base_prefix is not a module path; {_AGAIN}")
        return cls(tower=_choice(d, "tower", TOWERS, where), embeddings=_text(d, "embeddings", where),
                   embedding_scale=_opt_number(d, "embedding_scale", where), blocks=_opt_text(d, "blocks", where),
                   num_blocks=_count(d, "num_blocks", where),
                   attention=None if attention is None else AttentionAnatomy.from_dict(attention, f"{where}.attention"),
                   final_norm=_opt_text(d, "final_norm", where),
                   final_norm_in_hidden_states=flags["final_norm_in_hidden_states"],
                   last_hidden_state=_choice(d, "last_hidden_state", LAST_STATES, where), base_prefix=prefix,
                   head=tuple(head), head_reads=_choice(d, "head_reads", HEAD_READS, where),
                   hidden_projection=_opt_text(d, "hidden_projection", where),
                   check_max_abs=float("nan") if checked is None else checked,
                   derived_on_load=flags["derived_on_load"])


_AGAIN = "export the model again into a new folder (layerscope export MODEL --out NEW_DIR)"


def _mapping(d: Any, where: str) -> dict:
    if not isinstance(d, dict):
        raise ManifestError(f"{where} is not a JSON object; {_AGAIN}")
    return d


def _is_path(value: str) -> bool:
    """A dotted module path of plain attribute names (nothing a reader would resolve outside the model)."""
    return bool(value) and all(part.isidentifier() or part.isdigit() for part in value.split("."))


def _text(d: dict, key: str, where: str) -> str:
    value = d.get(key)
    if not isinstance(value, str) or not _is_path(value):
        raise ManifestError(f"{where}.{key} is not a module path ({value!r}); {_AGAIN}")
    return value


def _opt_text(d: dict, key: str, where: str) -> str | None:
    return None if d.get(key) is None else _text(d, key, where)


def _count(d: dict, key: str, where: str) -> int:
    value = d.get(key)
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ManifestError(f"{where}.{key} is not a count ({value!r}); {_AGAIN}")
    return value


def _opt_count(d: dict, key: str, where: str) -> int | None:
    return None if d.get(key) is None else _count(d, key, where)


def _opt_number(d: dict, key: str, where: str) -> float | None:
    value = d.get(key)
    if value is None:
        return None
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value):
        raise ManifestError(f"{where}.{key} is not a number ({value!r}); {_AGAIN}")
    return float(value)


def _choice(d: dict, key: str, allowed: tuple[str, ...], where: str) -> str:
    value = d.get(key)
    if value not in allowed:
        raise ManifestError(f"{where}.{key} is {value!r}, not one of {', '.join(allowed)}; {_AGAIN}")
    return value


def _join(prefix: str, path: str) -> str:
    return f"{prefix}.{path}" if prefix else path


