"""``StoreLayout``: the one place that names a LayerStore's files and folders.

Every module that reads or writes a store (the store itself, its checks, the range writers, the index
and the exporters) asks this module for a path; none spells a file name of its own::

    store.json                       what is in it (format version, spec as settings, manifest, checksums)
    texts.jsonl                      {"id": ..., "text": ...} per row, in corpus order
    done.npy                         uint8 [n]: 1 once a row's vectors are on disk
    lengths.npy                      int32 [n]: each text's token count
    ray-offsets.npy                  byte offset of every GRANULE-th row of texts.jsonl (for range writers)
    arrays/<pooling>/<layer>.npy     [n, hidden] pooled vectors (arrays.partial/ while being reserved)
    texts.jsonl.partial              texts.jsonl while it is being spooled
    tokens/<layer>.npy               token-level arrays (``extract --tokens``; store/token_store.py): every
    tokens/ids.npy, special.npy,     token's vector per layer, its id, special-token mask, character span,
      spans.npy, offsets.npy,        each text's first token, the strings of the ids seen
      strings.json                   (tokens.partial/ while being reserved)
    ranges/<k>.claim, <k>.done       per-range claims and done marks of range writers
    .layerscope.json                 the ownership record (``owned_record.MARKER``, the name every folder
                                     layerscope writes shares: which files layerscope wrote)

The checksums of a finished store are recorded in ``store.json`` (``checksums``), keyed by these relative names.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from layerscope.owned_record import MARKER

STORE_JSON = "store.json"
TEXTS = "texts.jsonl"
DONE = "done.npy"
LENGTHS = "lengths.npy"
OFFSETS = "ray-offsets.npy"  # named when only Ray used it
ARRAYS = "arrays"
STAGING = "arrays.partial"
RANGES = "ranges"
TOKENS = "tokens"
PARTIAL = ".partial"  # the suffix of a file or folder while it is being written
TEXTS_STAGING = TEXTS + PARTIAL
TOKEN_STAGING = TOKENS + PARTIAL
# the token arrays beside each layer's (token_rel names them inside tokens/ or its staging folder)
TOKEN_IDS, TOKEN_SPECIAL, TOKEN_SPANS, TOKEN_OFFSETS = "ids.npy", "special.npy", "spans.npy", "offsets.npy"
TOKEN_STRINGS = "strings.json"
TOKEN_GRID = "grid.npy"  # image token stores: each patch's (row, col), (-1, -1) for CLS and registers
RANGE_KINDS = ("claim", "done")


def token_layer_name(layer: str) -> str:
    """The file of one layer's token vectors inside ``tokens/``."""
    return f"{layer}.npy"


def token_rel(name: str, folder: str = TOKENS) -> str:
    """The relative name of a token file (``TOKEN_IDS``, ``token_layer_name(layer)``, ...) in ``folder``."""
    return f"{folder}/{name}"


def array_rel(pooling: str, layer: str, folder: str = ARRAYS) -> str:
    """The relative name of one (pooling, layer) array (pooling names are file-safe: mean, cls, mean-nobos)."""
    return f"{folder}/{pooling}/{layer}.npy"


def array_rels(poolings, layers, folder: str = ARRAYS) -> list[str]:
    return [array_rel(p, layer, folder) for p in poolings for layer in layers]


def range_mark_name(k: int, kind: str) -> str:
    """``<k>.claim`` or ``<k>.done`` of range ``k`` (zero-padded so the names sort by range)."""
    if kind not in RANGE_KINDS:
        raise ValueError(f"a range mark is one of {RANGE_KINDS}, not {kind!r}")
    return f"{int(k):06d}.{kind}"


def range_mark_glob(kind: str) -> str:
    """The pattern of every ``kind`` mark in ``ranges/``."""
    return range_mark_name(0, kind).replace("000000", "*")


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
    def texts_staging(self) -> Path:
        return self.root / TEXTS_STAGING

    @property
    def marker(self) -> Path:
        return self.root / MARKER

    @property
    def tokens(self) -> Path:
        return self.root / TOKENS

    @property
    def token_staging(self) -> Path:
        return self.root / TOKEN_STAGING

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
