"""``StoreSpec``: what a LayerStore holds and how it was asked for, typed once.

Made by ``prepare`` from the request and the resolved model, completed with the corpus hash once the
corpus is spooled (and, in-process, with what ``--engine auto`` picked), and written as ``store.json``'s
``settings`` once, when the store is created. Every writer of a store (in-process, ``--shard``, Ray) reads
the same spec back with :meth:`StoreSpec.load`; resuming compares :meth:`StoreSpec.identity` and nothing
else. Finishing a store records completion beside the settings, never in them.

Format versions of ``store.json``: 1 wrote the settings as a loose mapping (rewritten as the run went);
2 writes this spec once. Both load here; a field a version-1 store lacks gets its default.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from layerscope.errors import StoreError
from layerscope.store.store_layout import STORE_JSON

FORMAT_VERSION = 2  # the store.json layout this version writes
READS = (1, 2)  # the store.json layouts this version opens

# the fields a resumed store must share with the run continuing it (engine, batch plan: free to change)
IDENTITY = ("model_key", "layers", "poolings", "dtype", "max_length", "input", "variant", "prompt", "tokens",
            "corpus_sha256")


@dataclass(frozen=True)
class TokensSpec:
    """The token-level half of a store (``extract --tokens``): how its token vectors are stored."""

    dtype: str

    def to_json(self) -> dict[str, Any]:
        return {"dtype": self.dtype}


@dataclass(frozen=True)
class StoreSpec:
    model: str  # the model as asked for (name, path or export dir)
    model_key: str  # the model's identity (weights and config)
    engine: str  # the engine asked for (``auto`` or a registered name)
    variant: str | None  # the precision variant as run (None: the model's own fp32)
    layers: tuple[str, ...]
    poolings: tuple[str, ...]
    prompt: str | None
    max_length: int
    max_batch: int
    batch_tokens: int | None  # None: each engine's own budget
    dtype: str  # the pooled (and token) vectors on disk
    tokens: TokensSpec | None
    input: str  # how the corpus was named (a path, a dataset spec, "<n texts in memory>")
    corpus_sha256: str | None  # None until the corpus is spooled (and in stores made before it was recorded)
    layerscope_version: str = ""

    # -- identity ---------------------------------------------------------------
    def identity(self, *, skip: tuple[str, ...] = ()) -> dict[str, Any]:
        """The fields a resumed store must share with the run continuing it (``skip``: not known yet)."""
        return {k: getattr(self, k) for k in IDENTITY if k not in skip}

    def mismatch(self, made: "StoreSpec", *, skip: tuple[str, ...] = ()) -> tuple[str, Any, Any] | None:
        """``(field, as made, as asked)`` of the first identity field ``made`` differs in, else None.
        A corpus hash ``made`` does not record (an older store) is not compared."""
        if made.corpus_sha256 is None or self.corpus_sha256 is None:
            skip = (*skip, "corpus_sha256")
        mine, theirs = self.identity(skip=skip), made.identity(skip=skip)
        for key in mine:
            if mine[key] != theirs[key]:
                return key, theirs[key], mine[key]
        return None

    @classmethod
    def bare(cls, layers, poolings, dtype: str = "float32", *, model: str = "", max_length: int = 0) -> "StoreSpec":
        """The spec of a store made outside an extraction (a benchmark's scratch store, a test's): arrays only."""
        return cls(model=model, model_key=model, engine="", variant=None, layers=tuple(map(str, layers)),
                   poolings=tuple(poolings), prompt=None, max_length=max_length, max_batch=0, batch_tokens=None,
                   dtype=dtype, tokens=None, input="", corpus_sha256=None)

    def replace(self, **changes: Any) -> "StoreSpec":
        return dataclasses.replace(self, **changes)

    # -- JSON -------------------------------------------------------------------
    def to_json(self) -> dict[str, Any]:
        """``store.json``'s ``settings`` (the key names version 1 used, so readers of both agree)."""
        return {"model": self.model, "model_key": self.model_key, "engine_requested": self.engine,
                "variant": self.variant, "layers": list(self.layers), "poolings": list(self.poolings),
                "prompt": self.prompt, "max_length": self.max_length, "max_batch": self.max_batch,
                "batch_tokens": self.batch_tokens, "dtype": self.dtype,
                "tokens": self.tokens.to_json() if self.tokens else None, "input": self.input,
                "corpus_sha256": self.corpus_sha256, "layerscope_version": self.layerscope_version}

    @classmethod
    def load(cls, settings: Any, *, format_version: int, where: str = STORE_JSON) -> "StoreSpec":
        """The spec recorded in a ``store.json`` of ``format_version``; one line when it cannot be read."""
        if format_version not in READS:
            raise StoreError(f"{where} has store format {format_version!r}, this layerscope reads "
                             f"{', '.join(map(str, READS))}; re-run layerscope extract")
        if not isinstance(settings, dict):
            raise StoreError(f"{where} records no settings; re-run layerscope extract")
        required = ("model_key", "layers", "poolings", "dtype", "max_length")
        if format_version >= 2:
            required += ("model", "engine_requested", "max_batch", "input")
        missing = [k for k in required if settings.get(k) is None]
        if missing:
            raise StoreError(f"{where}'s settings lack {', '.join(missing)}; re-run layerscope extract")
        tokens = settings.get("tokens")
        try:
            return cls(model=str(settings.get("model") or settings["model_key"]), model_key=str(settings["model_key"]),
                       engine=str(settings.get("engine_requested") or "auto"),
                       variant=_optional_str(settings.get("variant")),
                       layers=tuple(str(x) for x in settings["layers"]),
                       poolings=tuple(str(x) for x in settings["poolings"]),
                       prompt=_optional_str(settings.get("prompt")), max_length=int(settings["max_length"]),
                       max_batch=int(settings.get("max_batch") or 0),
                       batch_tokens=None if settings.get("batch_tokens") is None else int(settings["batch_tokens"]),
                       dtype=str(settings["dtype"]),
                       tokens=TokensSpec(str(tokens["dtype"])) if isinstance(tokens, dict) else None,
                       input=str(settings.get("input") or ""),
                       corpus_sha256=_optional_str(settings.get("corpus_sha256")),
                       layerscope_version=str(settings.get("layerscope_version") or ""))
        except (KeyError, TypeError, ValueError) as exc:
            raise StoreError(f"{where}'s settings cannot be read ({exc!r}); re-run layerscope extract") from None


def _optional_str(value: Any) -> str | None:
    return None if value in (None, "") else str(value)
