"""Spooling a corpus into a store: ``texts.jsonl`` (one row per text, atomically), its hash, token lengths.

``extract`` and the Ray driver both spool through ``spool_corpus``, so the bytes of ``texts.jsonl``
and the corpus hash that ``--resume`` compares are defined once, by ``record_line``.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any, Iterable

import numpy as np

from layerscope.errors import InputError
from layerscope.model.tokenize import Encoder
from layerscope.store.store_layout import LENGTHS, TEXTS, TEXTS_STAGING

LENGTH_CHUNK = 4096  # texts tokenized at a time for their lengths


def record_line(rec) -> str:
    """One row of texts.jsonl; the corpus hash that --resume checks is the sha256 of these lines."""
    return json.dumps({"id": rec.id, "text": rec.text}, ensure_ascii=False)


def corpus_sha256(records: Iterable) -> str:
    """The hash ``spool_corpus`` records for these records, without writing anything."""
    h = hashlib.sha256()
    for rec in records:
        h.update(record_line(rec).encode("utf-8") + b"\n")
    return h.hexdigest()


def spool_corpus(records: Iterable, out: Path, *, encoder: Encoder | None = None,
                 granule: int | None = None) -> dict[str, Any]:
    """Write ``out/texts.jsonl`` (built as ``.partial``, renamed when whole) from ``records``.

    Returns the counts (``n``, ``empty``, ``nul``) and ``sha256``. With ``encoder``, the token length
    of every text is saved as ``lengths.npy``; with ``granule``, ``offsets`` holds the byte offset of
    every ``granule``-th row (where a Ray shard starts reading).
    """
    from layerscope.ownership import note

    tmp = out / TEXTS_STAGING
    note(out, files=[tmp.name, TEXTS] + ([LENGTHS] if encoder is not None else []))  # before writing
    h = hashlib.sha256()
    offsets: list[int] = []
    lengths: list[np.ndarray] = []
    chunk: list[str] = []
    n = empty = nul = pos = 0
    try:
        with open(tmp, "wb") as fh:
            for rec in records:
                if granule and n % granule == 0:
                    offsets.append(pos)
                line = record_line(rec).encode("utf-8") + b"\n"
                fh.write(line)
                h.update(line)
                pos += len(line)
                n += 1
                empty += not rec.text.strip()
                nul += "\x00" in rec.text
                if encoder is not None:
                    chunk.append(rec.text)
                    if len(chunk) >= LENGTH_CHUNK:
                        lengths.append(encoder.token_lengths(chunk))
                        chunk.clear()
            if chunk:
                lengths.append(encoder.token_lengths(chunk))
            fh.flush()
            os.fsync(fh.fileno())
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    if n == 0:
        tmp.unlink()
        raise InputError("the corpus has no texts: nothing to extract")
    if encoder is not None:
        np.save(out / LENGTHS, np.concatenate(lengths).astype(np.int32))
    os.replace(tmp, out / TEXTS)
    return {"n": n, "empty": empty, "nul": nul, "sha256": h.hexdigest(),
            "offsets": np.asarray(offsets, dtype=np.int64)}
