"""The executor seam: every way of running an ``ExtractionRequest`` is an ``Executor`` with one method,
``run(request) -> ExtractReport``.

Three executors implement it: ``InProcess`` (extraction/pipeline.py: one process runs the whole store),
``Shard`` (extraction/shard_extract.py: shard ``i`` of ``N`` independent processes) and ``RayExecutor``
(extraction/ray_extract.py: a driver and a pool of actors). Each prepares the same ``StoreSpec`` from the
request and opens its engine with the options ``engine_plan.engine_options`` gives, so a store is the same
whichever runs it. The report is one type; what a range executor did with the store's ranges is its typed
``ranges`` field (``RangeWork``), None for the in-process run.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from layerscope.extraction.request import ExtractionRequest
    from layerscope.store.store import LayerStore


@dataclass(frozen=True)
class RangeWork:
    """What a range executor (``--shard``, Ray) did with the store's ranges in this run."""

    ranges: int  # the ranges this executor was given (a shard: its own; Ray: the store's)
    computed: int  # written by this run
    done_before: int  # already done when the run began (an earlier run, or a driver that died)
    held_elsewhere: int = 0  # claimed by a live writer elsewhere and left to it (--shard)
    found_done: int = 0  # a retried task found its range written already (Ray)
    shard: tuple[int, int] | None = None  # (i, N) of ``--shard i/N``
    finished: bool = False  # this run finished the store (checks and checksums)


@dataclass
class ExtractReport:
    store: "LayerStore"
    n: int  # rows in the store
    empty: int
    truncated: int | None  # texts cut to the max length (None: known once a sharded store is finished)
    tokens: int  # tokens this run extracted
    seconds: float  # the whole call: engine start, reading the corpus, extraction
    engine: dict[str, Any]  # what ran (EngineInfo.to_dict(); empty when this run started no engine)
    run_seconds: float = 0.0  # the extraction loop alone
    resumed_rows: int = 0  # rows done before this run
    warnings: list[str] = field(default_factory=list)
    complete: bool = True  # the store is finished (a shard's may wait for the others)
    rows: int | None = None  # rows this run computed (None: every row not resumed)
    ranges: RangeWork | None = None  # range executors only

    @property
    def computed_rows(self) -> int:
        return self.n - self.resumed_rows if self.rows is None else self.rows

    @property
    def texts_per_s(self) -> float:
        """Throughput of the extraction loop over the rows this run computed."""
        return self.computed_rows / self.run_seconds if self.run_seconds > 0 else float("nan")

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.run_seconds if self.run_seconds > 0 else float("nan")


class Executor(Protocol):
    """Runs one extraction request into its store."""

    def run(self, request: "ExtractionRequest") -> ExtractReport: ...
