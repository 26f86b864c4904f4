"""Is a LayerStore what its ``store.json`` says?  Cheap checks on open, checksums when a run completes.

On open (``layout_problems``), from headers and file sizes only, nothing read in full:

* ``store.json``'s structural fields (n, layers, poolings, hidden size, dtype, model manifest,
  corpus hash) still hash to what was recorded when the store was created (an edited ``n`` or
  ``num_layers`` is caught here);
* every array file exists, is a ``.npy`` of shape ``[n, hidden_size]`` and the store's dtype, and
  its size is exactly its header plus ``n * hidden_size`` items (a truncated array is caught here);
* ``done.npy`` is ``uint8 [n]``; ``texts.jsonl`` has the size recorded when it was written.

When a run completes (``checksums``) every file gets a sha256 and a size in ``store.json``;
``verify`` re-hashes them all (flipped bytes are caught here) and counts the lines of ``texts.jsonl``.
"""

from __future__ import annotations

import os
import re
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from layerscope.hashing import file_sha256

from layerscope.store.npy_files import check_npy
from layerscope.store.store_layout import DONE, LENGTHS, TEXTS, array_rels
from layerscope.store.store_record import FileSum, StoreRecord


def structure_sha256(record: StoreRecord | Mapping[str, Any]) -> str:
    """Hash of the fields that say what the arrays hold (``StoreRecord.structure_hash``; a document read
    elsewhere is checked first)."""
    return StoreRecord.of(record).structure_hash()


def array_files(record: StoreRecord) -> list[str]:
    return array_rels(record.poolings, record.layers)


def _manifest_width(record: StoreRecord) -> int | None:
    """The width the model's manifest gives the store's layers: the word embeddings' for ``raw`` alone (narrower
    than the hidden states in ALBERT and ELECTRA), else its hidden size (None: it does not say)."""
    if record.manifest_hidden_size is None or tuple(record.layers) != ("raw",):
        return record.manifest_hidden_size
    from layerscope.errors import LayerscopeError
    from layerscope.model.manifest_type import Manifest

    try:
        return Manifest.from_dict(dict(record.manifest)).raw_width
    except LayerscopeError:  # a manifest that does not read: held to its hidden size, as any other store
        return record.manifest_hidden_size


def layout_problems(root: Path, record: StoreRecord) -> list[str]:
    """Everything the headers and sizes say is wrong with the store at ``root`` (empty when none); the
    record's own fields were checked when it was read (``StoreRecord.from_json``)."""
    from layerscope.store.store_dtype import disk_dtype

    root = Path(root)
    n, hidden, layers, num_layers = record.n, record.hidden_size, record.layers, record.num_layers
    dtype = disk_dtype(record.dtype)
    escape = outside_paths(root, record)
    if escape:  # nothing outside the store is read, not even its size
        return [escape]
    problems: list[str] = []
    recorded = record.structure_sha256
    if recorded and recorded != record.structure_hash():
        problems.append("store.json was edited after the store was made (n, layers, poolings, hidden size, "
                        "dtype or model manifest no longer match their recorded hash)")
    bad = [name for name in layers if name != "raw" and not (name.isdigit() and int(name) <= num_layers)]
    if bad:
        problems.append(f"store.json lists layers {bad} that a {num_layers}-layer model does not have")
    want = _manifest_width(record)
    if want is not None and want != hidden:
        problems.append(f"store.json says hidden_size {hidden}, its model manifest {want}")
    for rel in array_files(record):
        problem = check_npy(root, rel, (n, hidden), dtype)
        if problem:
            problems.append(problem)
    problem = check_npy(root, DONE, (n,), np.dtype(np.uint8))
    if problem:
        problems.append(problem)
    from layerscope.store.token_store import token_layout_problems

    problems += token_layout_problems(root, record.token_arrays, n=n, layers=layers,
                                      grid=record.modality == "image", check_npy=check_npy)
    texts = root / TEXTS
    if not texts.is_file():
        problems.append(f"{TEXTS} is missing")
    elif record.texts_bytes is not None and texts.stat().st_size != record.texts_bytes:
        problems.append(f"{TEXTS} is {texts.stat().st_size:,} bytes, {record.texts_bytes:,} were written "
                        "(cut or edited)")
    for rel, rec in (record.checksums or {}).items():
        path = root / rel
        if path.is_file() and path.stat().st_size != rec.bytes and not _names(problems, rel):
            problems.append(f"{rel} is {path.stat().st_size:,} bytes, {rec.bytes:,} were "
                            "recorded when the store was completed")
    return problems


def outside_paths(root: Path, record: StoreRecord) -> str | None:
    """A line naming the first path store.json leads outside the store (a pooling or layer that is not one
    plain name, a checksum key with ``..``, an absolute path or a symlink leading out); None when all stay in."""
    from layerscope.ownership import inside

    names = [("pooling", p) for p in record.poolings] + [("layer", l) for l in record.layers]
    for what, name in names:
        if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.+-]*", name):
            return f"store.json names {what} {name[:80]!r}, which is not a plain name inside the store"
    rels = array_files(record) + [DONE, TEXTS] + list(record.checksums or {})
    for rel in rels:
        if inside(root, rel) is None:
            return f"store.json names {rel[:80]!r}, a path outside the store"
    return None


def _names(problems: list[str], rel: str) -> bool:
    return any(p.startswith(rel + " ") for p in problems)



def checksum_files(record: StoreRecord, root: Path) -> list[str]:
    from layerscope.store.token_store import token_files

    rels = array_files(record) + [DONE, TEXTS] + token_files(record.token_arrays, grid=record.modality == "image",
                                                              complete=record.complete)
    return rels + ([LENGTHS] if (Path(root) / LENGTHS).is_file() else [])


def checksums(root: Path, record: StoreRecord | Mapping[str, Any]) -> dict[str, FileSum]:
    """``{relative path: FileSum}`` of every file of the store (hashed on a few threads)."""
    root = Path(root)
    rels = checksum_files(StoreRecord.of(record), root)
    with ThreadPoolExecutor(max_workers=min(4, os.cpu_count() or 1)) as pool:  # hashlib drops the GIL
        digests = list(pool.map(lambda rel: file_sha256(root / rel), rels))
    return {rel: FileSum(d, (root / rel).stat().st_size) for rel, d in zip(rels, digests)}


def _count_lines(path: Path) -> int:
    count = 0
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 22), b""):
            count += chunk.count(b"\n")
    return count


def _nonfinite_problems(root: Path, record: StoreRecord, problems: list[str]) -> list[str]:
    """A line for every vector array (pooled and token) that holds NaN or inf, read in chunks."""
    from layerscope.store.token_store import layer_file, nonfinite_count

    sec = record.token_arrays
    arrays = [(rel, record.dtype) for rel in array_files(record)]
    arrays += [(layer_file(layer), sec.dtype) for layer in sec.layers] if sec else []
    found = []
    for rel, dtype in arrays:
        if (root / rel).is_file() and not _names(problems, rel):
            try:
                bad = nonfinite_count(root / rel, dtype)
            except (ValueError, OSError):
                continue
            if bad:
                found.append(f"{rel} holds {bad:,} non-finite values (NaN or inf): those vectors are not usable")
    return found


def verify(root: Path, record: StoreRecord) -> tuple[int, list[str]]:
    """Re-hash every file against the checksums in ``store.json``: (files checked, problems)."""
    from layerscope.ownership import inside

    root = Path(root)
    problems = layout_problems(root, record)
    recorded = record.checksums or {}
    if not record.complete:
        problems.append("the store is incomplete (no checksums until it completes); finish it with "
                        "layerscope extract ... --resume")
    elif not recorded:
        problems.append("store.json records no checksums (made by an older layerscope); extract it again "
                        "into a new folder to get them")
    for rel, sha in record.internal_sha256.items():
        if rel in recorded or inside(root, rel) is None or not (root / rel).is_file():
            continue
        if file_sha256(root / rel) != sha:
            problems.append(f"{rel} does not match the sha256 recorded when the store was made (damaged or "
                            "edited); the store's writers rely on it")
    from layerscope.store.store_ranges import foreign_marks

    foreign = foreign_marks(root, record.store_id)
    if foreign:
        problems.append(f"ranges {foreign[:8]} were marked done by a writer of another store (deleted and made "
                        "again at this path while it ran): their rows are not this store's; run those shards again")
    checked = 0
    if outside_paths(root, record):
        return checked, problems  # layout_problems named it; nothing is read
    rels = [rel for rel in recorded if (root / rel).is_file()]
    with ThreadPoolExecutor(max_workers=min(4, os.cpu_count() or 1)) as pool:
        digests = dict(zip(rels, pool.map(lambda rel: file_sha256(root / rel), rels)))
    for rel, rec in recorded.items():
        if rel not in digests:
            if not _names(problems, rel):
                problems.append(f"{rel} is missing")
            continue
        checked += 1
        if digests[rel] != rec.sha256 and not _names(problems, rel):
            problems.append(f"{rel} does not match its checksum (sha256 differs): damaged or changed "
                            "after the store was completed")
    problems += _nonfinite_problems(root, record, problems)
    texts = root / TEXTS
    if texts.is_file() and not _names(problems, TEXTS):
        lines = _count_lines(texts)
        if lines != record.n:
            problems.append(f"{TEXTS} has {lines:,} lines, the store has {record.n} rows")
    return checked, problems
