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

import hashlib
import json
import os
import re
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from layerscope.hashing import file_sha256

from layerscope.store.npy_files import check_npy
from layerscope.store.store_layout import DONE, LENGTHS, TEXTS, array_rels

STRUCTURE_KEYS = ("format_version", "n", "layers", "poolings", "hidden_size", "dtype", "manifest")


def structure_sha256(meta: dict[str, Any]) -> str:
    """Hash of the fields that say what the arrays hold; recorded at creation, checked on every open."""
    fields = {k: meta.get(k) for k in STRUCTURE_KEYS}
    fields["corpus_sha256"] = (meta.get("settings") or {}).get("corpus_sha256")
    if meta.get("token_arrays"):  # token-level arrays (store/token_store.py); absent from pooled-only stores
        fields["token_arrays"] = meta["token_arrays"]
    fields = json.loads(json.dumps(fields))  # as store.json will hold them (keys as strings, tuples as lists)
    blob = json.dumps(fields, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()


def array_files(meta: dict[str, Any]) -> list[str]:
    return array_rels(meta["poolings"], meta["layers"])


def layout_problems(root: Path, meta: dict[str, Any]) -> list[str]:
    """Everything the headers and sizes say is wrong with the store at ``root`` (empty when none)."""
    root = Path(root)
    try:
        n, hidden = int(meta["n"]), int(meta["hidden_size"])
        layers, poolings = list(meta["layers"]), list(meta["poolings"])
        from layerscope.store.store_dtype import disk_dtype

        dtype = disk_dtype(meta["dtype"])
        num_layers = int(meta["manifest"]["num_layers"])
    except (KeyError, TypeError, ValueError) as exc:
        return [f"store.json lacks or garbles a field the store needs ({exc})"]
    escape = outside_paths(root, meta)
    if escape:  # nothing outside the store is read, not even its size
        return [escape]
    problems: list[str] = []
    recorded = meta.get("structure_sha256")
    if recorded and recorded != structure_sha256(meta):
        problems.append("store.json was edited after the store was made (n, layers, poolings, hidden size, "
                        "dtype or model manifest no longer match their recorded hash)")
    bad = [name for name in layers if name != "raw" and not (name.isdigit() and int(name) <= num_layers)]
    if bad:
        problems.append(f"store.json lists layers {bad} that a {num_layers}-layer model does not have")
    if int(meta["manifest"].get("hidden_size", hidden)) != hidden:
        problems.append(f"store.json says hidden_size {hidden}, its model manifest "
                        f"{meta['manifest'].get('hidden_size')}")
    for rel in array_files(meta):
        problem = check_npy(root, rel, (n, hidden), dtype)
        if problem:
            problems.append(problem)
    problem = check_npy(root, DONE, (n,), np.dtype(np.uint8))
    if problem:
        problems.append(problem)
    from layerscope.store.token_store import token_layout_problems

    problems += token_layout_problems(root, meta, check_npy)
    texts = root / TEXTS
    if not texts.is_file():
        problems.append(f"{TEXTS} is missing")
    elif meta.get("texts_bytes") is not None and texts.stat().st_size != int(meta["texts_bytes"]):
        problems.append(f"{TEXTS} is {texts.stat().st_size:,} bytes, {meta['texts_bytes']:,} were written "
                        "(cut or edited)")
    for rel, rec in (meta.get("checksums") or {}).items():
        path = root / rel
        if path.is_file() and path.stat().st_size != int(rec.get("bytes", -1)) and not _names(problems, rel):
            problems.append(f"{rel} is {path.stat().st_size:,} bytes, {int(rec.get('bytes', -1)):,} were "
                            "recorded when the store was completed")
    return problems


def outside_paths(root: Path, meta: dict[str, Any]) -> str | None:
    """A line naming the first path store.json leads outside the store (a pooling or layer that is not one
    plain name, a checksum key with ``..``, an absolute path or a symlink leading out); None when all stay in."""
    from layerscope.ownership import inside

    names = [("pooling", p) for p in meta.get("poolings") or []] + [("layer", l) for l in meta.get("layers") or []]
    for what, name in names:
        if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.+-]*", name):
            return f"store.json names {what} {str(name)[:80]!r}, which is not a plain name inside the store"
    sums = meta.get("checksums") or {}
    rels = array_files(meta) + [DONE, TEXTS] + (list(sums) if isinstance(sums, dict) else [])
    for rel in rels:
        if inside(root, rel) is None:
            return f"store.json names {str(rel)[:80]!r}, a path outside the store"
    if not isinstance(sums, dict) or not all(isinstance(rec, dict) for rec in sums.values()):
        return "store.json's checksums are not a table of files"
    return None


def _names(problems: list[str], rel: str) -> bool:
    return any(p.startswith(rel + " ") for p in problems)



def checksum_files(meta: dict[str, Any], root: Path) -> list[str]:
    from layerscope.store.token_store import token_files

    rels = array_files(meta) + [DONE, TEXTS] + token_files(meta)
    return rels + ([LENGTHS] if (Path(root) / LENGTHS).is_file() else [])


def checksums(root: Path, meta: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """``{relative path: {"sha256", "bytes"}}`` of every file of the store (hashed on a few threads)."""
    root = Path(root)
    rels = checksum_files(meta, root)
    with ThreadPoolExecutor(max_workers=min(4, os.cpu_count() or 1)) as pool:  # hashlib drops the GIL
        digests = list(pool.map(lambda rel: file_sha256(root / rel), rels))
    return {rel: {"sha256": d, "bytes": (root / rel).stat().st_size} for rel, d in zip(rels, digests)}


def _count_lines(path: Path) -> int:
    count = 0
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 22), b""):
            count += chunk.count(b"\n")
    return count


def _nonfinite_problems(root: Path, meta: dict[str, Any], problems: list[str]) -> list[str]:
    """A line for every vector array (pooled and token) that holds NaN or inf, read in chunks."""
    from layerscope.store.token_store import TokenSection, layer_file, nonfinite_count

    try:
        sec = TokenSection.of(meta)
    except Exception:  # noqa: BLE001 - named by layout_problems already
        sec = None
    arrays = [(rel, str(meta.get("dtype"))) for rel in array_files(meta)]
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


def verify(root: Path, meta: dict[str, Any]) -> tuple[int, list[str]]:
    """Re-hash every file against the checksums in ``store.json``: (files checked, problems)."""
    from layerscope.ownership import inside

    root = Path(root)
    problems = layout_problems(root, meta)
    recorded = meta.get("checksums") or {}
    if not meta.get("complete"):
        problems.append("the store is incomplete (no checksums until it completes); finish it with "
                        "layerscope extract ... --resume")
    elif not recorded:
        problems.append("store.json records no checksums (made by an older layerscope); extract it again "
                        "into a new folder to get them")
    internal = meta.get("internal_sha256") if isinstance(meta.get("internal_sha256"), dict) else {}
    for rel, sha in internal.items():
        if rel in recorded or inside(root, rel) is None or not (root / rel).is_file():
            continue
        if file_sha256(root / rel) != sha:
            problems.append(f"{rel} does not match the sha256 recorded when the store was made (damaged or "
                            "edited); the store's writers rely on it")
    from layerscope.store.store_ranges import foreign_marks

    sid = meta.get("store_id") if isinstance(meta.get("store_id"), str) else None
    foreign = foreign_marks(root, sid)
    if foreign:
        problems.append(f"ranges {foreign[:8]} were marked done by a writer of another store (deleted and made "
                        "again at this path while it ran): their rows are not this store's; run those shards again")
    checked = 0
    if outside_paths(root, meta):
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
        if digests[rel] != rec.get("sha256") and not _names(problems, rel):
            problems.append(f"{rel} does not match its checksum (sha256 differs): damaged or changed "
                            "after the store was completed")
    problems += _nonfinite_problems(root, meta, problems)
    texts = root / TEXTS
    if texts.is_file() and not _names(problems, TEXTS):
        lines = _count_lines(texts)
        if lines != int(meta.get("n", -1)):
            problems.append(f"{TEXTS} has {lines:,} lines, the store has {meta.get('n')} rows")
    return checked, problems
