"""Token-level activations in a LayerStore: every token's hidden state for the chosen layers, ragged.

Inside the store directory (``extract ... --tokens``)::

    tokens/offsets.npy     int64 [n + 1]: text i's tokens are rows offsets[i]:offsets[i+1] of every array
    tokens/<layer>.npy     [total_tokens, hidden] in the store's token dtype (float32, float16, or
                           bfloat16 kept as uint16: store/store_dtype.py)
    tokens/ids.npy         int32 [total_tokens]: token ids
    tokens/special.npy     uint8 [total_tokens]: 1 for special tokens (BOS, CLS, SEP, EOS, an empty text's
                           fallback token)
    tokens/spans.npy       int32 [total_tokens, 2]: character span [start, end) in the text (0, 0 for special
                           tokens and tokens of a prompt)
    tokens/strings.json    {"<id>": "<token string>"} for every id in ids.npy (written when the store completes)
    tokens/grid.npy        int32 [total_tokens, 2], image stores only: each patch token's (row, col) in the
                           patch grid, (-1, -1) for CLS and register tokens (extraction/image_tokens.py)

Every text's token count is known before the run (``lengths.npy``, capped at ``max_length``), so every array
is reserved at its final size up front and each batch writes its texts' tokens into their own ranges;
padding never reaches the store. The arrays are flushed before the rows are marked done (``TokenWriter.flush``
and ``LayerStore.commit``), so a killed run resumes by redoing exactly the rows not marked done.

``store.json`` records ``token_arrays``: ``{"layers", "total_tokens", "dtype", "hidden_size"}`` (its
``tokens`` field has long been the run's token count), and ``settings.tokens`` what resuming must match.
"""

from __future__ import annotations

import json
import os
import shutil
from abc import ABC, abstractmethod
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from layerscope.errors import StoreError
from layerscope.store import store_dtype
from layerscope.store.store_layout import (TOKEN_GRID, TOKEN_IDS, TOKEN_OFFSETS, TOKEN_SPANS, TOKEN_SPECIAL,
                                           TOKEN_STAGING, TOKEN_STRINGS, TOKENS, token_layer_name, token_rel)
from layerscope.store.store_space import FULL, allocate_npy, check_free, no_space

OFFSETS, IDS, SPECIAL, SPANS, STRINGS, GRID = (token_rel(n) for n in (TOKEN_OFFSETS, TOKEN_IDS, TOKEN_SPECIAL,
                                                                         TOKEN_SPANS, TOKEN_STRINGS, TOKEN_GRID))

@dataclass(frozen=True)
class TokenSection:
    """What ``store.json``'s ``token_arrays`` section says the token arrays hold (read by
    ``store_record.StoreRecord``)."""

    layers: list[str]
    total_tokens: int
    dtype: str  # storage type: float32, float16 or bfloat16
    hidden_size: int

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

def layer_file(layer: str) -> str:
    return token_rel(token_layer_name(layer))


def token_counts(lengths: np.ndarray, max_length: int) -> np.ndarray:
    """Tokens fed per text: its token length capped at ``max_length`` (an empty text is fed one token)."""
    return np.minimum(np.maximum(np.asarray(lengths, dtype=np.int64), 1), int(max_length))


def offsets_of(counts: np.ndarray) -> np.ndarray:
    return np.concatenate([[0], np.cumsum(counts, dtype=np.int64)]).astype(np.int64)


def bytes_needed(total_tokens: int, n: int, layers: list[str], hidden: int, dtype: str) -> int:
    """Disk the token arrays take: tokens x layers x hidden x bytes, plus ids, spans, special and offsets."""
    return (total_tokens * len(layers) * hidden * store_dtype.itemsize(dtype)
            + total_tokens * (4 + 8 + 1) + (n + 1) * 8)


def describe_cost(total_tokens: int, n: int, layers: list[str], hidden: int, dtype: str) -> str:
    size = bytes_needed(total_tokens, n, layers, hidden, dtype)
    return (f"token store: {total_tokens:,} tokens x {len(layers)} layers x {hidden} x "
            f"{store_dtype.itemsize(dtype)} bytes = {size / 1e9:.2f} GB")


def create_token_arrays(root: Path, lengths: np.ndarray, max_length: int, layers: list[str], hidden: int,
                        dtype: str) -> TokenSection:
    """Reserve every token array at its final size (space checked first), built in ``tokens.partial``
    and renamed to ``tokens`` when whole."""
    root = Path(root)
    counts = token_counts(lengths, max_length)
    offsets = offsets_of(counts)
    total = int(offsets[-1])
    needed = bytes_needed(total, len(counts), layers, hidden, dtype)
    check_free(root, needed)
    staging = root / TOKEN_STAGING
    from layerscope.ownership import note

    names = [token_layer_name(layer) for layer in layers] + [TOKEN_IDS, TOKEN_SPECIAL, TOKEN_SPANS, TOKEN_OFFSETS]
    note(root, files=[token_rel(n, d) for d in (TOKEN_STAGING, TOKENS) for n in names] + [STRINGS])  # before writing
    if staging.exists():
        shutil.rmtree(staging)
    staging.mkdir()
    try:
        for layer in layers:
            allocate_npy(staging / token_layer_name(layer), store_dtype.disk_dtype(dtype), (total, hidden))
        allocate_npy(staging / TOKEN_IDS, np.dtype(np.int32), (total,))
        allocate_npy(staging / TOKEN_SPECIAL, np.dtype(np.uint8), (total,))
        allocate_npy(staging / TOKEN_SPANS, np.dtype(np.int32), (total, 2))
        np.save(staging / TOKEN_OFFSETS, offsets)
        with open(staging / TOKEN_OFFSETS, "rb+") as fh:
            os.fsync(fh.fileno())
    except OSError as exc:
        shutil.rmtree(staging, ignore_errors=True)
        if exc.errno in FULL:
            raise no_space(root, needed, exc) from None
        raise
    if (root / TOKENS).exists():
        shutil.rmtree(root / TOKENS)
    os.replace(staging, root / TOKENS)
    return TokenSection(layers=list(layers), total_tokens=total, dtype=dtype, hidden_size=int(hidden))


# ---------------------------------------------------------------- integrity (store_check)

def token_files(sec: TokenSection | None, *, grid: bool, complete: bool) -> list[str]:
    """The files of the token section, for checksums (``grid``: an image store's; strings.json once the
    store completed)."""
    if sec is None:
        return []
    files = [layer_file(layer) for layer in sec.layers] + [OFFSETS, IDS, SPECIAL, SPANS]
    files += [GRID] if grid else []
    return files + ([STRINGS] if complete else [])


def token_layout_problems(root: Path, sec: TokenSection | None, *, n: int, layers, grid: bool,
                          check_npy) -> list[str]:
    """What the headers and sizes say is wrong with the token arrays of a store of ``n`` rows holding
    ``layers`` (``check_npy``: store_check's)."""
    if sec is None:
        return []
    total, hidden = sec.total_tokens, sec.hidden_size
    bad = [layer for layer in sec.layers if layer not in layers]
    problems = [f"store.json's token_arrays section lists layers {bad} the store does not hold"] if bad else []
    wanted = [(layer_file(layer), (total, hidden), store_dtype.disk_dtype(sec.dtype)) for layer in sec.layers]
    wanted += [(OFFSETS, (n + 1,), np.dtype(np.int64)), (IDS, (total,), np.dtype(np.int32)),
               (SPECIAL, (total,), np.dtype(np.uint8)), (SPANS, (total, 2), np.dtype(np.int32))]
    wanted += [(GRID, (total, 2), np.dtype(np.int32))] if grid else []
    for rel, shape, dtype in wanted:
        problem = check_npy(root, rel, shape, dtype)
        if problem:
            problems.append(problem)
    if not problems:
        offsets = np.load(Path(root) / OFFSETS, mmap_mode="r")
        if offsets[0] != 0 or offsets[-1] != total or bool(np.any(np.diff(offsets) < 1)):
            problems.append(f"{OFFSETS} does not run from 0 to {total:,} in steps of at least one token")
    return problems


# ---------------------------------------------------------------- writing

class TokenWriter(ABC):
    """The reserved token arrays of a store, open for writing, flushed and closed. What a store keeps of each
    layer (``keep``, called as the engine hands the layer over), where it goes (``write``) and how its ids are
    named (``write_strings``) are the text and image writers' own (``TextTokenWriter`` here, which also checks
    a batch against the spool before it runs; ``ImageTokenWriter`` in extraction/image_tokens.py)."""

    def __init__(self, root: Path, section: TokenSection):
        self.root = Path(root)
        self.section = section
        self._arrays: dict[str, np.ndarray] = {}

    def _array(self, rel: str) -> np.ndarray:
        if rel not in self._arrays:
            self._arrays[rel] = np.load(self.root / rel, mmap_mode="r+")
        return self._arrays[rel]

    def encode(self, values: np.ndarray, layer: str) -> np.ndarray:
        """``values`` (``[tokens, hidden]``) in the storage type, refused in one line where not finite or out
        of its range."""
        return _encode_finite(values, self.section.dtype, layer)

    @abstractmethod
    def keep(self, batch, layer: str, state: np.ndarray) -> np.ndarray:
        """What the store keeps of one layer's ``[batch, seq, hidden]`` states: ``[tokens, hidden]`` encoded."""

    @abstractmethod
    def write(self, batch, kept: list[np.ndarray]) -> None:
        """``kept``: per layer of the section, what ``keep`` made of it, written into the batch's rows."""

    @abstractmethod
    def write_strings(self, tokenizer) -> None:
        """``strings.json``: the token string of every id stored, so readers need no tokenizer."""

    def flush(self) -> None:
        """Everything written so far is on disk (call before the rows are marked done)."""
        from layerscope.store.npy_files import release_pages

        for arr in self._arrays.values():
            arr.flush()
            release_pages(arr)

    def close(self) -> None:
        self.flush()
        self._arrays.clear()


class TextTokenWriter(TokenWriter):
    """Writes a batch's real tokens (never padding) into their texts' ranges of the reserved arrays."""

    def __init__(self, root: Path, section: TokenSection):
        super().__init__(root, section)
        self.offsets = np.load(self.root / OFFSETS)

    def check(self, batch) -> None:
        """One line when ``batch`` cannot be written: tokenized without details, or a text whose token count
        differs from the one spooled (``TokenRun`` calls it before the batch runs)."""
        if batch.special is None or batch.spans is None:
            raise StoreError("token extraction needs batches tokenized with details (special mask, spans)")
        counts = (np.asarray(batch.mask) > 0).sum(axis=1)
        rows = np.asarray(batch.index, dtype=np.int64)
        want = self.offsets[rows + 1] - self.offsets[rows]
        if not np.array_equal(counts, want):
            i = int(np.nonzero(counts != want)[0][0])
            raise StoreError(f"text {int(rows[i])} has {int(counts[i])} tokens in its batch, {int(want[i])} "
                             "were counted when the corpus was spooled; re-run with --force")

    def keep(self, batch, layer: str, state: np.ndarray) -> np.ndarray:
        """The real tokens' vectors ``[tokens, hidden]`` of one layer's ``[batch, seq, hidden]`` states, in the
        storage type."""
        return self.encode(np.asarray(state)[np.asarray(batch.mask) > 0], layer)

    def write(self, batch, kept: list[np.ndarray]) -> None:
        """``kept``: per layer of the section, ``keep``'s ``[tokens, hidden]``; the ids, special mask and spans
        come from the batch (checked before it ran)."""
        valid = np.asarray(batch.mask) > 0
        rows = np.asarray(batch.index, dtype=np.int64)
        starts = np.concatenate([[0], np.cumsum(valid.sum(axis=1))])
        flat = {IDS: np.asarray(batch.input_ids)[valid].astype(np.int32),
                SPECIAL: np.asarray(batch.special)[valid].astype(np.uint8),
                SPANS: np.asarray(batch.spans)[valid].astype(np.int32)}
        flat.update((layer_file(layer), values) for layer, values in zip(self.section.layers, kept))
        for rel, values in flat.items():
            dst = self._array(rel)
            for i, row in enumerate(rows):
                dst[self.offsets[row]:self.offsets[row + 1]] = values[starts[i]:starts[i + 1]]

    def write_strings(self, tokenizer) -> None:
        from layerscope.atomic import write_json_atomic

        ids = np.load(self.root / IDS, mmap_mode="r")
        seen = np.zeros(0, dtype=np.int32)
        for start in range(0, len(ids), 1 << 22):
            seen = np.union1d(seen, ids[start:start + (1 << 22)])
        write_json_atomic(self.root / STRINGS, {str(int(i)): s for i, s in zip(seen, _id_strings(tokenizer, seen))})


def _encode_finite(values: np.ndarray, dtype: str, layer: str) -> np.ndarray:
    """``values`` in the storage type, refused (one line) where a vector is not finite or does not fit it:
    float16 turns an activation beyond 65504 into inf."""
    if not bool(np.isfinite(values).all()):
        raise StoreError(f"the engine gave non-finite token vectors at layer {layer} (NaN or inf); nothing of "
                         "them was stored: check the model, or run with --engine torch to compare")
    with np.errstate(over="ignore"):  # an overflow is refused just below, in one line
        encoded = store_dtype.encode(values, dtype)
    if dtype == "float16" and not bool(np.isfinite(encoded).all()):
        peak = float(np.abs(values).max())
        raise StoreError(f"token vectors of layer {layer} reach {peak:.4g}, beyond float16's range (65504): a "
                         "float16 token store would hold inf there; use --store-dtype bfloat16 (same size, "
                         "float32's range) or float32")
    return encoded


def nonfinite_count(path: Path, dtype: str, chunk: int = 1 << 16) -> int:
    """How many values of the stored array at ``path`` (storage type ``dtype``) are NaN or inf."""
    arr = np.load(path, mmap_mode="r")
    bad = 0
    for a in range(0, len(arr), chunk):
        block = np.asarray(arr[a:a + chunk])
        if dtype == "bfloat16":  # raw bits: exponent all ones is inf or NaN
            bad += int(((block & 0x7F80) == 0x7F80).sum())
        else:
            bad += int((~np.isfinite(block)).sum())
    return bad


def _id_strings(tokenizer, ids: np.ndarray) -> list[str]:
    inner = getattr(tokenizer, "tokenizer", None)  # the tokenizers-only FastTokenizer wraps a Tokenizer
    if inner is not None and hasattr(inner, "id_to_token"):
        return [inner.id_to_token(int(i)) or "" for i in ids]
    return [s or "" for s in tokenizer.convert_ids_to_tokens([int(i) for i in ids])]


# ---------------------------------------------------------------- reading

class TokenLayer:
    """One layer's token vectors of a store, memory-mapped; every read returns float32.

    ``offsets`` (int64 [n + 1]) cuts the token axis into texts; ``ids``, ``special`` and ``spans`` run
    along the same axis. ``text(i)`` gives text i's vectors, ``of_id(token_id)`` every occurrence of a
    token with its text and position, ``rows(a, b)`` a slice of the token axis.
    """

    def __init__(self, root: Path, section: TokenSection, layer: str):
        self.root, self.section, self.layer = Path(root), section, layer
        self.raw = np.load(self.root / layer_file(layer), mmap_mode="r")  # the stored dtype, as on disk
        self.offsets = np.load(self.root / OFFSETS, mmap_mode="r")
        self.ids = np.load(self.root / IDS, mmap_mode="r")
        self.special = np.load(self.root / SPECIAL, mmap_mode="r")
        self.spans = np.load(self.root / SPANS, mmap_mode="r")

    def grid(self) -> np.ndarray:
        """int32 [total_tokens, 2] of an image store: each patch token's (row, col) in the patch grid,
        (-1, -1) for CLS and register tokens (``special`` marks them; ``ids`` says which)."""
        path = self.root / GRID
        if not path.is_file():
            raise StoreError(f"{self.root} holds text tokens: they have spans, not grid positions")
        return np.load(path, mmap_mode="r")

    def __len__(self) -> int:
        return len(self.offsets) - 1

    @property
    def total_tokens(self) -> int:
        return int(self.offsets[-1])

    def _decode(self, a: np.ndarray) -> np.ndarray:
        return store_dtype.decode(a, self.section.dtype)

    def rows(self, start: int = 0, stop: int | None = None) -> np.ndarray:
        """float32 vectors of tokens ``start:stop`` of the token axis."""
        return self._decode(self.raw[start:stop])

    def take(self, index: np.ndarray) -> np.ndarray:
        """float32 vectors of the tokens at ``index`` (positions on the token axis)."""
        return self._decode(self.raw[np.asarray(index, dtype=np.int64)])

    def text_range(self, i: int) -> tuple[int, int]:
        if not -len(self) <= i < len(self):
            raise StoreError(f"text {i} is not in the store (it holds {len(self):,})")
        i %= len(self)
        return int(self.offsets[i]), int(self.offsets[i + 1])

    def text(self, i: int) -> np.ndarray:
        """float32 ``[tokens of text i, hidden]``."""
        return self.rows(*self.text_range(i))

    def text_of_token(self) -> np.ndarray:
        """int64 [total_tokens]: the text each token belongs to."""
        return np.repeat(np.arange(len(self), dtype=np.int64), np.diff(self.offsets))

    def positions(self) -> np.ndarray:
        """int64 [total_tokens]: each token's position in its text."""
        starts = np.repeat(np.asarray(self.offsets[:-1]), np.diff(self.offsets))
        return np.arange(self.total_tokens, dtype=np.int64) - starts

    def of_id(self, token_id: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(float32 vectors, text index, position) of every occurrence of ``token_id``."""
        where = np.nonzero(np.asarray(self.ids) == int(token_id))[0]
        text = np.searchsorted(np.asarray(self.offsets), where, side="right") - 1
        return self.take(where), text.astype(np.int64), (where - np.asarray(self.offsets)[text]).astype(np.int64)

    def strings(self) -> dict[int, str]:
        """Token id -> token string (``strings.json``)."""
        path = self.root / STRINGS
        if not path.is_file():
            raise StoreError(f"{path} is missing: the store is incomplete; finish it with layerscope extract "
                             "... --resume")
        try:
            table = json.loads(path.read_text(encoding="utf-8"))
            strings = {int(k): v for k, v in table.items()}
            if not all(isinstance(v, str) for v in strings.values()):
                raise ValueError("a token string is not text")
        except (ValueError, AttributeError, UnicodeDecodeError) as exc:
            raise StoreError(f"{path} is damaged ({str(exc)[:120]}); layerscope verify {self.root} "
                             "names every damaged file: extract the store again") from None
        return strings

    def id_strings(self, ids: np.ndarray, strings: dict[int, str]) -> list[str]:
        """The string of each token id in ``ids`` (``strings``: ``strings()``); one line for an id without one."""
        try:
            return [strings[int(i)] for i in ids]
        except KeyError as exc:
            raise StoreError(f"{self.root / IDS} holds token id {exc.args[0]}, which {STRINGS} does not name: one "
                             f"of them is damaged; layerscope verify {self.root} names which") from None


def open_token_layer(root: Path, sec: TokenSection | None, layer: str) -> TokenLayer:
    if sec is None:
        raise StoreError(f"{root} holds no token-level vectors; make it with layerscope extract ... --tokens")
    if layer not in sec.layers:
        raise StoreError(f"layer {layer} has no token vectors in {root} (it holds tokens of layers "
                         f"{', '.join(sec.layers)})")
    return TokenLayer(root, sec, layer)
