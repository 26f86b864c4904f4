"""The engine a run opens, decided once: how deep it computes, which graph it fetches, and the batching plan.

``early_exit`` is the one rule for how deep an engine runs and whether it hands back pooled vectors only. Every
door that opens an engine for a run asks it, from what the run reads (``EngineReads``): the executors (in-process,
``--shard``, Ray, through ``engine_options``), ``embed``, the bench's rows (in-process and isolated) and
``layerscope run`` (analyses/base.py, from what each analysis declares it reads). An engine opened for a depth
computes no block after it (engines/truncate.py); one opened pooled-only keeps the token states inside its graph.

In-process, ``--shard`` and Ray open the engine with the options ``engine_options`` gives for the same
request, so an engine that builds for a shape (TensorRT's optimisation profile) builds the same one
whichever executor runs the store. The longest sequence (``max_seq``) is the spec's ``max_length``: the
request's ``--max-length``, else the model's limit; a corpus of short texts on a long-context model gets a
smaller profile with ``--max-length``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable

from layerscope.store.store_spec import StoreSpec


@dataclass(frozen=True)
class EngineReads:
    """What a run reads from its engine: the input of ``early_exit``."""

    layers: tuple[str, ...] | None  # canonical layer names ("raw", "0".."L"); None: the whole model (every
    # layer, or something only the last block makes: the model's own pooled output, a head on layer L)
    poolings: tuple[str, ...] = ()  # the poolings it asks for pooled vectors in
    tokens: bool = False  # token states leave the engine (a store's tokens, a token-level analysis)

    @classmethod
    def of(cls, layers: Iterable[str] | None, poolings: Iterable[str] = (), *, tokens: bool = False) -> "EngineReads":
        return cls(None if layers is None else tuple(str(x) for x in layers), tuple(poolings), bool(tokens))


@dataclass(frozen=True)
class EarlyExit:
    """How deep an engine runs and what it fetches, as ``early_exit`` decided."""

    depth: int  # the deepest layer computed (-1: the word embeddings alone; the model's depth: every block)
    pooled_only: bool  # only the graph's pooled outputs are fetched (no token states leave the engine)

    def as_kwargs(self) -> dict[str, Any]:
        """The engine options (``depth``, ``pooled_only``: hints every engine takes, engines/registry.py)."""
        return {"depth": self.depth, "pooled_only": self.pooled_only}


def early_exit(manifest, reads: EngineReads) -> EarlyExit:
    """The one early-exit decision: the engine runs to the deepest layer ``reads`` names (every block when it
    names none), and fetches pooled vectors only where nothing but the graph's pooled outputs is read: no token
    states, every pooling one the graph pools, every layer one it pools."""
    from layerscope.engines.truncate import depth_of

    num_layers = int(manifest.num_layers)
    if reads.layers is None:
        return EarlyExit(depth=num_layers, pooled_only=False)
    depth = min(depth_of(reads.layers), num_layers)
    pooled_only = (not reads.tokens and bool(manifest.pooled_modes) and bool(reads.poolings)
                   and set(reads.poolings) <= set(manifest.pooled_modes)
                   and set(reads.layers) <= set(manifest.pooled_layers))
    return EarlyExit(depth=depth, pooled_only=pooled_only)


@dataclass(frozen=True)
class EngineOptions:
    """What the engine is opened with: the batching plan, the depth it runs to, and what the user passed."""

    max_batch: int
    max_seq: int
    depth: int  # the deepest layer stored (early exit; -1: the word embeddings alone)
    pooled_only: bool  # only the graph's pooled outputs are fetched (no token states leave the engine)
    asked: tuple[tuple[str, Any], ...] = ()  # the request's --engine-option pairs, sorted; they win

    def as_kwargs(self) -> dict[str, Any]:
        return {"max_batch": self.max_batch, "max_seq": self.max_seq, "depth": self.depth,
                "pooled_only": self.pooled_only, **dict(self.asked)}

    def with_asked(self, **more: Any) -> "EngineOptions":
        """These options with ``more`` added where the request did not set them (an executor's resources)."""
        asked = dict(self.asked)
        for key, value in more.items():
            asked.setdefault(key, value)
        return EngineOptions(self.max_batch, self.max_seq, self.depth, self.pooled_only, tuple(sorted(asked.items())))


def engine_options(spec: StoreSpec, manifest, asked: dict[str, Any] | None = None) -> EngineOptions:
    """The engine options of a run of ``spec`` on the model ``manifest`` (the same for every executor)."""
    plan = early_exit(manifest, EngineReads.of(spec.layers, spec.poolings, tokens=bool(spec.tokens)))
    return EngineOptions(max_batch=int(spec.max_batch), max_seq=int(spec.max_length), depth=plan.depth,
                         pooled_only=plan.pooled_only, asked=tuple(sorted((asked or {}).items())))
