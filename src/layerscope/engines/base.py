"""The engine protocol and ``create_engine`` (the registry is registry.py; layer names: vocab/layers.py).

An engine takes a tokenized ``Batch`` and returns, per pooling, an array
``[len(layers), batch, hidden]`` (or token-level states).  Every engine
reports the execution provider that actually ran, not the one asked for.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from layerscope.errors import InputError
from layerscope.vocab.layers import layer_names

if TYPE_CHECKING:  # numpy and the tokenizer load when an engine runs, not when the registry is read
    import numpy as np

    from layerscope.model.tokenize import Batch, Encoder


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

    def run_with_tokens(self, batch: Batch, layers: list[str],
                        poolings: list[str]) -> tuple[dict[str, np.ndarray], list[np.ndarray]]:
        """``(run(...), run_tokens(...))`` from one forward pass: the pooled vectors are pooled here from
        the token states (engines whose graph pools in place override this to fetch both at once)."""
        import numpy as np

        from layerscope.model.stconfig import st_recipe
        from layerscope.vocab.pooling import ST, pool, with_st

        states = self.run_tokens(batch, layers)
        eos = self.manifest.get("eos_token_id")

        def compute(modes: list[str]) -> dict[str, np.ndarray]:
            return {m: np.stack([pool(s, batch.mask, m, input_ids=batch.input_ids, eos_token_id=eos)
                                 for s in states]) for m in modes}

        recipe = st_recipe(self.manifest) if ST in poolings else None
        return with_st(poolings, compute, recipe), states

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
                         "layerscope.export.open.open_engine (exports on first use), or run layerscope export first")
    if name != "auto" and options.pop("min_cosine", None) is not None:
        raise InputError("--min-cosine chooses among engines: use it with --engine auto")
    return spec.factory(handle, **options)
