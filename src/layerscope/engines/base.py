"""The engine protocol, layer names and ``create_engine`` (the registry is registry.py).

An engine takes a tokenized ``Batch`` and returns, per pooling, an array
``[len(layers), batch, hidden]`` (or token-level states).  Every engine
reports the execution provider that actually ran, not the one asked for.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from layerscope.errors import InputError

if TYPE_CHECKING:  # numpy and the tokenizer load when an engine runs, not when the registry is read
    import numpy as np

    from layerscope.model.tokenize import Batch, Encoder

# ---------------------------------------------------------------- layer names

def layer_names(num_layers: int, *, with_raw: bool = True) -> list[str]:
    """Canonical names: ``raw`` (word embeddings), ``0`` (embedding output), ``1``..``L``."""
    return (["raw"] if with_raw else []) + [str(i) for i in range(num_layers + 1)]


def resolve_layers(spec: str | list | tuple | None, num_layers: int, *, with_raw: bool = True) -> list[str]:
    """Parse ``all``, ``last``, ``raw,0,3,-1`` or ``2:5`` into canonical layer names (in the order given)."""
    names = layer_names(num_layers, with_raw=with_raw)
    if spec is None or spec == "all" or spec == ["all"]:
        return names
    items: list[str] = []
    parts = spec.split(",") if isinstance(spec, str) else [str(s) for s in spec]
    for part in (p.strip() for p in parts):
        if not part:
            continue
        if part == "all":
            items.extend(names)
        elif part == "last":
            items.append(str(num_layers))
        elif part == "raw":
            if not with_raw:
                raise InputError("layer 'raw' is not available here")
            items.append("raw")
        elif ":" in part:
            lo, hi = part.split(":", 1)
            start = _layer_int(lo or "0", num_layers, part)
            stop = _layer_int(hi, num_layers, part) if hi else num_layers
            items.extend(str(i) for i in range(start, stop + 1))
        else:
            items.append(str(_layer_int(part, num_layers, part)))
    out: list[str] = []
    for it in items:
        if it not in out:
            out.append(it)
    if not out:
        raise InputError("--layers selected no layer; use 'all', 'raw', or indices such as 0,3,-1")
    return out


def _layer_int(text: str, num_layers: int, part: str) -> int:
    try:
        i = int(text)
    except ValueError:
        raise InputError(
            f"layer '{part}' is not a layer; use 'all', 'raw', 'last', an index 0..{num_layers} "
            "(negative counts from the end) or a range like 2:5"
        ) from None
    if i < 0:
        i += num_layers + 1
    if not 0 <= i <= num_layers:
        raise InputError(
            f"layer {text} is out of range: this model has layers raw, 0..{num_layers} "
            f"(or -1..-{num_layers + 1} from the end)"
        )
    return i


# ---------------------------------------------------------------- the protocol

@dataclass
class EngineInfo:
    name: str  # the engine's registered name (engines/registry.py)
    provider: str  # what actually ran: "torch-cpu", "CPUExecutionProvider", ...
    device: str
    precision: str = "fp32"
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"engine": self.name, "provider": self.provider, "device": self.device,
                "precision": self.precision, "notes": list(self.notes)}


class Engine(ABC):
    """One backend that runs a model and hands back per-layer outputs as numpy arrays."""

    name: str = ""
    preferred_batch_tokens: int = 16384  # padded tokens per batch when the caller does not say

    def __init__(self, model):
        from layerscope.model.handle import ModelHandle

        self.model: ModelHandle = model
        self.info = EngineInfo(self.name, "unknown", "cpu")

    @property
    def manifest(self) -> dict[str, Any]:
        return self.model.manifest

    @property
    def layer_names(self) -> list[str]:
        return layer_names(self.manifest["num_layers"])

    def encoder(self, max_length: int | None = None, prompt: str = "") -> Encoder:
        from layerscope.model.tokenize import Encoder

        return Encoder(self.model.encoding_tokenizer(), self.manifest["inputs"],
                       max_length or self.manifest["max_length"], prompt)

    @abstractmethod
    def run(self, batch: Batch, layers: list[str], poolings: list[str]) -> dict[str, np.ndarray]:
        """Per pooling: float32 ``[len(layers), batch, hidden]``."""

    @abstractmethod
    def run_tokens(self, batch: Batch, layers: list[str]) -> list[np.ndarray]:
        """Per layer: float32 ``[batch, seq, dim]`` token-level states."""

    def close(self) -> None:
        """Release sessions and memory."""


def check_engine_name(name: str) -> str:
    """``name`` if an engine declared it (engines/registry.py), else one line naming the closest one."""
    from layerscope.engines.registry import engine_spec

    return engine_spec(name).name


def needs_export(name: str) -> bool:
    """Whether engine ``name`` runs an ONNX export (a plain model must be exported first)."""
    from layerscope.engines.registry import engine_spec

    return engine_spec(name).needs_export


def create_engine(name: str, model: str | Any, **options) -> Engine:
    """Engine ``name`` for a resolved model: a ``ModelHandle``, or an export dir / model that is resolved
    here.  Nothing is exported here: ``layerscope.export.open.open_engine`` exports on first use."""
    from layerscope.engines.registry import engine_spec
    from layerscope.model.handle import ModelHandle

    spec = engine_spec(name)
    handle = model if isinstance(model, ModelHandle) else ModelHandle.resolve(model)
    if spec.needs_export and not handle.is_export:
        raise InputError(f"engine '{name}' runs an ONNX export and {handle.spec} is not one: open it with "
                         "layerscope.export.open.open_engine (exports on first use), or run inspect export first")
    if name != "auto" and options.pop("min_cosine", None) is not None:
        raise InputError("--min-cosine chooses among engines: use it with --engine auto")
    return spec.factory(handle, **options)
