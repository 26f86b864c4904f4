"""Shards of a corpus for Ray extraction: where each shard starts in the spooled corpus, the actor that
turns a shard into vectors on disk, and the driver's merge of a finished shard into the LayerStore.

A shard is ``shard_rows`` consecutive rows of ``texts.jsonl``; its directory
``shards/<k>/`` holds ``<pooling>.npy`` (``[layers, rows, hidden]``), ``lengths.npy`` and
``shard.json``. It is built beside its final name and renamed into place, so a shard that
exists is whole, and a retried task (after an actor was killed) rewrites it whole.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import time
from pathlib import Path
from typing import Any

import numpy as np

from layerscope.errors import StoreError

GRANULE = 256  # rows between recorded byte offsets of texts.jsonl; shard sizes are multiples of it
MAX_SHARD_ROWS = 8192
OFFSETS = "ray-offsets.npy"
SHARDS = "shards"


# ---------------------------------------------------------------- offsets

def scan_offsets(out: Path) -> np.ndarray:
    """Offsets of a texts.jsonl spooled without them (a store begun by plain ``extract``)."""
    from layerscope.runtime.store import TEXTS

    offsets, pos = [], 0
    with open(out / TEXTS, "rb") as fh:
        for i, line in enumerate(fh):
            if i % GRANULE == 0:
                offsets.append(pos)
            pos += len(line)
    arr = np.asarray(offsets, dtype=np.int64)
    np.save(out / OFFSETS, arr)
    return arr


def default_shard_rows(n: int, workers: int) -> int:
    """About four shards per worker (so a retried shard costs little), in GRANULE steps."""
    rows = math.ceil(n / max(1, 4 * workers))
    return int(min(MAX_SHARD_ROWS, max(GRANULE, math.ceil(rows / GRANULE) * GRANULE)))


# ---------------------------------------------------------------- the actor

def shard_dir(store_dir: Path, k: int) -> Path:
    return Path(store_dir) / SHARDS / f"{int(k):08d}"


def shard_ready(store_dir: Path, k: int) -> bool:
    return (shard_dir(store_dir, k) / "shard.json").exists()


class ShardWorker:
    """One engine session; each call turns shard descriptors into shard directories on disk."""

    def __init__(self, *, model: str, engine: str, engine_options: dict, layers: list[str],
                 poolings: list[str], dtype: str, max_length: int, batch_tokens: int | None,
                 max_batch: int, store_dir: str, kill_once: dict | None = None, trust_remote_code: bool = False):
        from layerscope.export.open import open_engine

        self.eng = open_engine(model, engine, trust_remote_code=trust_remote_code, **engine_options)
        self.encoder = self.eng.encoder(max_length)
        self.layers, self.poolings, self.dtype = layers, poolings, np.dtype(dtype)
        self.batch_tokens = int(batch_tokens or self.eng.preferred_batch_tokens)
        self.max_batch = max_batch
        self.store_dir = Path(store_dir)
        self.kill_once = kill_once  # test hook: SIGKILL this process once, on that shard

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        rows = [self._one(int(k), int(s), int(e), int(o))
                for k, s, e, o in zip(batch["shard"], batch["start"], batch["stop"], batch["offset"])]
        return {key: np.asarray([r[key] for r in rows]) for key in rows[0]}

    def _read(self, start: int, stop: int, offset: int) -> list[str]:
        from layerscope.runtime.store import TEXTS

        with open(self.store_dir / TEXTS, "rb") as fh:
            fh.seek(offset)
            texts = [json.loads(fh.readline())["text"] for _ in range(start, stop)]
        return texts

    def _one(self, k: int, start: int, stop: int, offset: int) -> dict[str, Any]:
        from layerscope.runtime.batching import check_finite, encode_plan

        final = shard_dir(self.store_dir, k)
        if shard_ready(self.store_dir, k):  # a retry after the shard was already written
            meta = json.loads((final / "shard.json").read_text(encoding="utf-8"))
            return {**meta, "computed": False}
        if self.kill_once and self.kill_once["shard"] == k and not Path(self.kill_once["marker"]).exists():
            import signal

            Path(self.kill_once["marker"]).write_text(str(os.getpid()), encoding="utf-8")
            os.kill(os.getpid(), signal.SIGKILL)
        t0 = time.perf_counter()
        texts = self._read(start, stop, offset)
        t_read = time.perf_counter()
        lengths = self.encoder.token_lengths(texts)
        t_tok = time.perf_counter() - t_read
        t_engine = 0.0
        hidden = self.eng.manifest.hidden_size
        out = {p: np.zeros((len(self.layers), stop - start, hidden), dtype=self.dtype) for p in self.poolings}
        tokens = 0
        t = time.perf_counter()
        for b in encode_plan(self.encoder, texts, lengths, batch_tokens=self.batch_tokens, max_batch=self.max_batch):
            t_run = time.perf_counter()  # the batch was tokenized while the loop asked for it
            t_tok += t_run - t
            pooled = check_finite(self.eng.run(b, self.layers, self.poolings), self.layers, b)
            t_engine += time.perf_counter() - t_run
            for p in self.poolings:
                out[p][:, b.index] = pooled[p]
            tokens += b.n_tokens
            t = time.perf_counter()
        t_write = time.perf_counter()
        tmp = final.with_name(f"{final.name}.partial-{os.getpid()}")
        if tmp.exists():
            shutil.rmtree(tmp)
        tmp.mkdir(parents=True)
        for p in self.poolings:
            np.save(tmp / f"{p}.npy", out[p])
        np.save(tmp / "lengths.npy", lengths.astype(np.int32))
        meta = {"shard": k, "start": start, "stop": stop, "tokens": int(tokens), "pid": os.getpid(),
                "seconds": round(time.perf_counter() - t0, 4), "read_s": round(t_read - t0, 4),
                "tokenize_s": round(t_tok, 4), "engine_s": round(t_engine, 4),
                "write_s": round(time.perf_counter() - t_write, 4), "batch_tokens": self.batch_tokens,
                "engine": json.dumps(self.eng.info.to_dict())}
        (tmp / "shard.json").write_text(json.dumps(meta), encoding="utf-8")
        try:
            os.replace(tmp, final)
        except OSError:  # another attempt finished it first: theirs is as good as ours
            shutil.rmtree(tmp, ignore_errors=True)
        return {**meta, "computed": True}


# ---------------------------------------------------------------- the driver

_TIMES = ("read_s", "tokenize_s", "engine_s", "write_s")


def merge_shard(store, k: int, lengths_out: np.ndarray, timing: dict[str, float]) -> tuple[int, int]:
    """Copy shard ``k`` into the store at its rows, mark them done, delete the shard."""
    t0 = time.perf_counter()
    d = shard_dir(store.path, k)
    meta = json.loads((d / "shard.json").read_text(encoding="utf-8"))
    start, stop = int(meta["start"]), int(meta["stop"])
    for p in store.poolings:
        arr = np.load(d / f"{p}.npy", mmap_mode="r", allow_pickle=False)
        if arr.shape != (len(store.layers), stop - start, int(store.meta["hidden_size"])):
            raise StoreError(f"{d} holds an array of shape {arr.shape}, not the store's; delete it and resume")
        for li, layer in enumerate(store.layers):
            store[p, layer][start:stop] = arr[li]
    lengths_out[start:stop] = np.load(d / "lengths.npy", allow_pickle=False)
    lengths_out.flush()
    store.commit(np.arange(start, stop))
    shutil.rmtree(d)
    for key in _TIMES:  # where the workers' time went, summed over shards
        timing[key] = round(timing.get(key, 0.0) + float(meta.get(key, 0.0)), 4)
    timing["merge_s"] = round(timing.get("merge_s", 0.0) + time.perf_counter() - t0, 4)
    return stop - start, int(meta["tokens"])
