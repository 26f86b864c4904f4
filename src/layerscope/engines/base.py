"""The engine protocol, the registry, tokenized batches and layer names.

An engine takes a tokenized ``Batch`` and returns, per pooling, an array
``[len(layers), batch, hidden]`` (or token-level states).  Every engine
reports the execution provider that actually ran, not the one asked for.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from layerscope.errors import EngineUnavailableError, InputError

ENGINE_NAMES = ("torch", "ort", "ov", "cuda", "trt", "auto")


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


# ---------------------------------------------------------------- tokenized batches

@dataclass
class Batch:
    inputs: dict[str, np.ndarray]  # int64 arrays named as the model's inputs
    index: np.ndarray  # row positions of these texts in the corpus
    truncated: np.ndarray  # bool per text: longer than max length

    @property
    def mask(self) -> np.ndarray:
        return self.inputs["attention_mask"]

    @property
    def input_ids(self) -> np.ndarray:
        return self.inputs["input_ids"]

    @property
    def size(self) -> int:
        return int(self.mask.shape[0])

    @property
    def n_tokens(self) -> int:
        return int(self.mask.sum())


class Encoder:
    """Tokenizes texts into the inputs a model expects, right-padded, truncated at ``max_length``."""

    def __init__(self, tokenizer, input_names: list[str], max_length: int, prompt: str = ""):
        self.tokenizer = tokenizer
        self.input_names = list(input_names)
        self.max_length = int(max_length)
        self.prompt = prompt or ""  # put before every text, as sentence-transformers' prompts are

    def _prompted(self, texts) -> list[str]:
        return [self.prompt + t for t in texts] if self.prompt else list(texts)

    @property
    def fallback_token_id(self) -> int:
        tok = self.tokenizer
        for value in (tok.eos_token_id, tok.bos_token_id, tok.sep_token_id, tok.pad_token_id, tok.unk_token_id):
            if value is not None:
                return int(value)
        return 0

    def token_lengths(self, texts: list[str]) -> np.ndarray:
        """Token counts without truncation (special tokens included), for sorting and warnings."""
        enc = self.tokenizer(self._prompted(texts), add_special_tokens=True, truncation=False,
                             return_attention_mask=False, return_token_type_ids=False, verbose=False)
        return np.fromiter((max(len(ids), 1) for ids in enc["input_ids"]), dtype=np.int64, count=len(texts))

    def __call__(self, texts: list[str], index: np.ndarray | None = None,
                 lengths: np.ndarray | None = None) -> Batch:
        texts = list(texts)
        if lengths is None:
            lengths = self.token_lengths(texts)
        enc = self.tokenizer(self._prompted(texts), padding=True, truncation=True, max_length=self.max_length,
                             return_tensors="np", verbose=False)
        enc = {k: np.asarray(v) for k, v in enc.items()}
        if enc["input_ids"].shape[1] == 0:  # every text in the batch tokenized to nothing
            enc = {k: np.zeros((len(texts), 1), dtype=np.int64) for k in enc}
        mask = enc["attention_mask"].astype(np.int64)
        empty = np.nonzero(mask.sum(1) == 0)[0]
        if len(empty):
            # A text with no tokens at all (an empty line, for a tokenizer that adds no special
            # tokens, e.g. GPT-2) is fed as the model's EOS token alone, so every row gets a vector.
            enc["input_ids"][empty, 0] = self.fallback_token_id
            mask[empty, 0] = 1
        inputs: dict[str, np.ndarray] = {}
        for name in self.input_names:
            if name == "position_ids":
                inputs[name] = np.clip(np.cumsum(mask, axis=1) - 1, 0, None).astype(np.int64)
            elif name == "token_type_ids" and name not in enc:
                inputs[name] = np.zeros_like(mask)
            elif name in enc:
                inputs[name] = enc[name].astype(np.int64)
            else:
                raise InputError(f"the model wants an input '{name}' that its tokenizer does not make")
        inputs["attention_mask"] = mask
        idx = np.arange(len(texts)) if index is None else np.asarray(index)
        return Batch(inputs=inputs, index=idx, truncated=np.asarray(lengths) > self.max_length)


# ---------------------------------------------------------------- the protocol

@dataclass
class EngineInfo:
    name: str  # torch, ort, cuda, trt
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
        from layerscope.export.manifest import ModelHandle

        self.model: ModelHandle = model
        self.info = EngineInfo(self.name, "unknown", "cpu")

    @property
    def manifest(self) -> dict[str, Any]:
        return self.model.manifest

    @property
    def layer_names(self) -> list[str]:
        return layer_names(self.manifest["num_layers"])

    def encoder(self, max_length: int | None = None, prompt: str = "") -> Encoder:
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


_REGISTRY: dict[str, Callable[..., Engine]] = {}


def register(name: str):
    def deco(factory):
        _REGISTRY[name] = factory
        return factory

    return deco


def _ensure_registered() -> None:
    # Importing the modules fills the registry; they import torch/onnxruntime lazily themselves.
    from layerscope.engines import ort as _ort  # noqa: F401
    from layerscope.engines import ov as _ov  # noqa: F401
    from layerscope.engines import torch as _torch  # noqa: F401


def check_engine_name(name: str) -> str:
    if name not in ENGINE_NAMES:
        from layerscope.errors import unknown_name

        raise unknown_name("engine", name, ENGINE_NAMES)
    return name


def create_engine(name: str, model: str | Any, **options) -> Engine:
    """Create an engine by name for a model (export dir, model dir, hub id or alias)."""
    from layerscope.export.manifest import ModelHandle

    check_engine_name(name)
    _ensure_registered()
    handle = model if isinstance(model, ModelHandle) else ModelHandle.resolve(model)
    if name != "auto" and options.pop("min_cosine", None) is not None:
        raise InputError("--min-cosine chooses among engines: use it with --engine auto")
    if name == "auto":
        return _auto(handle, **options)
    return _REGISTRY[name](handle, **options)


def _auto(handle, **options) -> Engine:
    from layerscope.engines.auto import pick_engine

    return pick_engine(handle, _REGISTRY, **options)
