"""``StoreLayout``: the one place that names a LayerStore's files and folders.

Every module that reads or writes a store (the store itself, its checks, the range writers, the index
and the exporters) asks this module for a path; none spells a file name of its own::

    store.json                       what is in it (format version, spec as settings, manifest, checksums)
    texts.jsonl                      {"id": ..., "text": ...} per row, in corpus order
    done.npy                         uint8 [n]: 1 once a row's vectors are on disk
    lengths.npy                      int32 [n]: each text's token count
    ray-offsets.npy                  byte offset of every GRANULE-th row of texts.jsonl (for range writers)
    arrays/<pooling>/<layer>.npy     [n, hidden] pooled vectors (arrays.partial/ while being reserved)
    tokens/...                       token-level arrays (``extract --tokens``; store/token_store.py)
    ranges/<k>.claim, <k>.done       per-range claims and done marks of range writers
    .layerscope                      the ownership record (``ownership.py``: which files layerscope wrote)

The checksums of a finished store are recorded in ``store.json`` (``checksums``), keyed by these relative names.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

STORE_JSON = "store.json"
TEXTS = "texts.jsonl"
DONE = "done.npy"
LENGTHS = "lengths.npy"
OFFSETS = "ray-offsets.npy"  # named when only Ray used it
ARRAYS = "arrays"
STAGING = "arrays.partial"
RANGES = "ranges"
TOKENS = "tokens"


def array_rel(pooling: str, layer: str, folder: str = ARRAYS) -> str:
    """The relative name of one (pooling, layer) array (pooling names are file-safe: mean, cls, mean-nobos)."""
    return f"{folder}/{pooling}/{layer}.npy"


def array_rels(poolings, layers, folder: str = ARRAYS) -> list[str]:
    return [array_rel(p, layer, folder) for p in poolings for layer in layers]


def range_mark_name(k: int, kind: str) -> str:
    """``<k>.claim`` or ``<k>.done`` of range ``k`` (zero-padded so the names sort by range)."""
    return f"{int(k):06d}.{kind}"


@dataclass(frozen=True)
class StoreLayout:
    """The paths of the store at ``root``."""

    root: Path

    def __post_init__(self) -> None:
        object.__setattr__(self, "root", Path(self.root))

    @property
    def store_json(self) -> Path:
        return self.root / STORE_JSON

    @property
    def texts(self) -> Path:
        return self.root / TEXTS

    @property
    def done(self) -> Path:
        return self.root / DONE

    @property
    def lengths(self) -> Path:
        return self.root / LENGTHS

    @property
    def offsets(self) -> Path:
        return self.root / OFFSETS

    @property
    def arrays(self) -> Path:
        return self.root / ARRAYS

    @property
    def staging(self) -> Path:
        return self.root / STAGING

    @property
    def ranges(self) -> Path:
        return self.root / RANGES

    def array(self, pooling: str, layer: str) -> Path:
        return self.root / array_rel(pooling, layer)

    def staged_array(self, pooling: str, layer: str) -> Path:
        return self.root / array_rel(pooling, layer, STAGING)

    def claim(self, k: int) -> Path:
        return self.ranges / range_mark_name(k, "claim")

    def done_mark(self, k: int) -> Path:
        return self.ranges / range_mark_name(k, "done")
