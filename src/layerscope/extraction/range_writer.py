"""A worker that writes whole row ranges straight into a store's reserved arrays (``--shard`` and Ray actors).

For one range it reads the range's texts from ``texts.jsonl`` (seeking to the recorded offset), tokenizes
them with the run's prompt, cuts them into length-sorted token-budget batches, runs the engine, and holds
the range's vectors in memory (at most ``store_ranges.MAX_RANGE_BYTES``). Then, for every array file, it
writes the range's bytes with ``os.pwrite`` at the rows' own offset and ``fsync``s the file; only then is
the range marked done (``store_ranges.mark_done``).

The writer works for one store, the one it was opened on: before each range and again before writing, it
checks that ``store.json`` still names that store's identity and that every file it writes is the file it
first saw (device and inode). A store deleted and made again at the same path while a writer ran is
refused in one line, not filled with rows of another run; the done mark names the store too.

Why ``pwrite`` of exact byte ranges rather than writing through a memory map: two neighbouring ranges
usually share a page at their boundary, and a page written through a mapping goes back to a network
file system whole, so one machine could put back stale bytes of its neighbour's rows. A ``pwrite`` of
the range's own bytes touches nothing else, on a local disk or on shared storage.
"""

from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path

import numpy as np

from layerscope.errors import StoreError
from layerscope.store import store_dtype as sd
from layerscope.store import store_ranges
from layerscope.store.npy_files import npy_header
from layerscope.store.range_marks import DoneMark
from layerscope.store.store_layout import LENGTHS, TEXTS, array_rel, array_rels


WRITE_THREADS = 8


class RangeWriter:
    """One engine session; ``run(range)`` computes a range and makes it durable in the store."""

    def __init__(self, store_dir: str | Path, eng, *, layers: list[str], poolings: list[str], store_dtype: str,
                 max_length: int, prompt: str | None, batch_tokens: int | None, max_batch: int,
                 store_id: str | None = None):
        self.store_dir = Path(store_dir)
        self.store_id = store_id or _read_store_id(self.store_dir)
        self.eng = eng
        self.encoder = eng.encoder(max_length, prompt or "")
        self.layers, self.poolings, self.store_dtype = list(layers), list(poolings), sd.check(store_dtype)
        self.batch_tokens = int(batch_tokens or eng.preferred_batch_tokens)
        self.max_batch = int(max_batch)
        self.hidden = int(eng.manifest.width_of(self.layers))  # the store's one width (raw alone: its own)
        self._offsets: dict[str, int] = {}
        self._files: dict[str, tuple[int, int]] = {}  # (device, inode) of each file when the writer opened
        for rel in array_rels(self.poolings, self.layers) + [LENGTHS]:
            self._data_offset(rel)

    def _data_offset(self, rel: str) -> int:
        if rel not in self._offsets:
            try:
                self._offsets[rel] = npy_header(self.store_dir / rel)[3]
                st = (self.store_dir / rel).stat()
            except (OSError, ValueError) as exc:
                raise StoreError(f"{self.store_dir}: {rel} cannot be opened for writing ({exc}); the store was "
                                 "deleted or damaged while this writer started: run the shard again") from None
            self._files[rel] = (st.st_dev, st.st_ino)
        return self._offsets[rel]

    def check_store(self, r: store_ranges.Range) -> None:
        """Refuse to go on when the store at ``store_dir`` is no longer the one this writer opened."""
        if _read_store_id(self.store_dir) != self.store_id:
            raise StoreError(f"{self.store_dir} is no longer the store this writer opened (it was deleted, or "
                             f"deleted and made again, while the writer ran); range {r.k} was not written into "
                             "it. Run this shard again to write the store that is there now")

    def _texts(self, r: store_ranges.Range) -> list[str]:
        with open(self.store_dir / TEXTS, "rb") as fh:
            fh.seek(r.offset)
            return [json.loads(fh.readline())["text"] for _ in range(r.rows)]

    def compute(self, r: store_ranges.Range, claim: store_ranges.Claim | None = None
                ) -> tuple[dict[str, np.ndarray], np.ndarray, int]:
        """``({pooling: float32 [layers, rows, hidden]}, token lengths, tokens run)`` of range ``r``."""
        from layerscope.extraction.batching import check_finite, encode_plan

        texts = self._texts(r)
        lengths = np.asarray(self.encoder.token_lengths(texts), dtype=np.int32)
        out = {p: np.zeros((len(self.layers), r.rows, self.hidden), dtype=np.float32) for p in self.poolings}
        tokens = 0
        plan = encode_plan(self.encoder, texts, lengths, batch_tokens=self.batch_tokens, max_batch=self.max_batch,
                           index=np.arange(r.start, r.stop))
        for b, pooled in self.eng.run_stream(plan, self.layers, self.poolings):  # OpenVINO: two in flight
            pooled = check_finite(pooled, self.layers, b)  # rows named as stored
            for p in self.poolings:
                out[p][:, np.asarray(b.index) - r.start] = pooled[p]
            tokens += b.n_tokens
            if claim is not None:
                claim.touch()
        return out, lengths, tokens

    def write(self, r: store_ranges.Range, vectors: dict[str, np.ndarray],
              lengths: np.ndarray) -> dict[str, tuple[float, float]]:
        """Write the range's rows into every array (and lengths.npy), fsync each file; the half-size error."""
        errors: dict[str, tuple[float, float]] = {}
        item = sd.itemsize(self.store_dtype)
        jobs = []
        for p in self.poolings:
            for li, layer in enumerate(self.layers):
                rel, rows = array_rel(p, layer), vectors[p][li]
                if self.store_dtype != "float32":
                    err, cos = sd.error_stats(rows, self.store_dtype)
                    errors[f"{p}/{layer}"] = (float(err), float(cos))
                offset = self._data_offset(rel) + r.start * self.hidden * item
                jobs.append((self.store_dir / rel, sd.encode(rows, self.store_dtype).tobytes(), offset,
                             self._files[rel]))
        offset = self._data_offset(LENGTHS) + r.start * 4
        jobs.append((self.store_dir / LENGTHS, np.ascontiguousarray(lengths, dtype=np.int32).tobytes(), offset,
                     self._files[LENGTHS]))
        self.check_store(r)
        opened: list[int] = []
        # one file per thread: the disk sees the flushes together instead of one after another (fsync drops
        # the GIL); every fsync has returned before this method does
        from concurrent.futures import ThreadPoolExecutor

        try:
            for path, _, _, ident in jobs:
                opened.append(_open_same(path, ident, self.store_dir, r))
            with ThreadPoolExecutor(max_workers=min(WRITE_THREADS, len(jobs))) as pool:
                list(pool.map(lambda job: _pwrite_durable(job[0], job[1][1], job[1][2]), zip(opened, jobs)))
        finally:
            for fd in opened:
                os.close(fd)
        return errors

    def run(self, r: store_ranges.Range, claim: store_ranges.Claim | None = None) -> DoneMark:
        """Compute range ``r``, make its rows durable, then mark it done; the range's done mark."""
        t0 = time.perf_counter()
        self.check_store(r)
        vectors, lengths, tokens = self.compute(r, claim)
        t_write = time.perf_counter()
        errors = self.write(r, vectors, lengths)
        mark = DoneMark(k=r.k, start=r.start, stop=r.stop, tokens=int(tokens), host=socket.gethostname(),
                        pid=os.getpid(), seconds=round(time.perf_counter() - t0, 4),
                        write_s=round(time.perf_counter() - t_write, 4), batch_tokens=self.batch_tokens,
                        engine=self.eng.info.to_dict(), half_error=errors, variant=_variant(self.eng),
                        store=self.store_id)
        self.check_store(r)
        store_ranges.mark_done(self.store_dir, r.k, mark)  # only now: the rows above are on disk
        return mark


def _variant(eng) -> str | None:
    from layerscope.model.variants import run_variant

    return run_variant(getattr(eng, "variant", None))


def _read_store_id(store_dir: Path) -> str | None:
    from layerscope.store.store import recorded_store_id

    return recorded_store_id(store_dir)


def _open_same(path: Path, ident: tuple[int, int], store_dir: Path, r: store_ranges.Range) -> int:
    """A descriptor for ``path`` when it is still the file first seen there (else one line)."""
    try:
        fd = os.open(path, os.O_WRONLY)
    except FileNotFoundError:
        fd = -1
    if fd >= 0:
        st = os.fstat(fd)
        if (st.st_dev, st.st_ino) == ident:
            return fd
        os.close(fd)
    raise StoreError(f"{store_dir} is no longer the store this writer opened ({path.name} was replaced while the "
                     f"writer ran); range {r.k} was not written into it. Run this shard again to write the store "
                     "that is there now")


def _pwrite_durable(fd: int, data: bytes, offset: int) -> None:
    view = memoryview(data)
    while view:
        written = os.pwrite(fd, view, offset)
        view, offset = view[written:], offset + written
    os.fsync(fd)
