"""The engine an extraction runs, decided once from its ``StoreSpec``: one rule for every executor.

In-process, ``--shard`` and Ray open the engine with the options ``engine_options`` gives for the same
request, so an engine that builds for a shape (TensorRT's optimisation profile) builds the same one
whichever executor runs the store. The longest sequence (``max_seq``) is the spec's ``max_length``: the
request's ``--max-length``, else the model's limit; a corpus of short texts on a long-context model gets a
smaller profile with ``--max-length``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from layerscope.store.store_spec import StoreSpec


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
    from layerscope.engines.truncate import depth_of, pooled_only_run

    return EngineOptions(max_batch=int(spec.max_batch), max_seq=int(spec.max_length), depth=depth_of(spec.layers),
                         pooled_only=pooled_only_run(manifest, spec.layers, spec.poolings, tokens=bool(spec.tokens)),
                         asked=tuple(sorted((asked or {}).items())))
