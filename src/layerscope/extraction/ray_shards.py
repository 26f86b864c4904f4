"""The Ray actor of range extraction: one engine session writing whole ranges straight into the store.

Each call takes range descriptors (``k``, ``start``, ``stop``, ``offset`` in texts.jsonl), claims each range
(``store_ranges``), computes it and writes it into the store's arrays (``range_writer``), and hands back a
small report; the vectors never leave the actor except into the store's files.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np

from layerscope.store import store_ranges


class RangeActor:
    """One engine session; each call turns range descriptors into durable rows of the store."""

    def __init__(self, *, model: str, engine: str, engine_options: dict, layers: list[str], poolings: list[str],
                 store_dtype: str, max_length: int, prompt: str | None, batch_tokens: int | None, max_batch: int,
                 store_dir: str, trust_remote_code: bool = False, store_id: str | None = None):
        from layerscope.export.open import open_engine
        from layerscope.extraction.range_writer import RangeWriter

        eng = open_engine(model, engine, trust_remote_code=trust_remote_code, **engine_options)
        self.writer = RangeWriter(store_dir, eng, layers=layers, poolings=poolings, store_dtype=store_dtype,
                                  max_length=max_length, prompt=prompt, batch_tokens=batch_tokens, max_batch=max_batch,
                                  store_id=store_id)
        self.store_dir = Path(store_dir)
        self.store_id = self.writer.store_id

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        rows = [self._one(store_ranges.Range(int(k), int(s), int(e), int(o)))
                for k, s, e, o in zip(batch["k"], batch["start"], batch["stop"], batch["offset"])]
        return {key: np.asarray([r[key] for r in rows]) for key in rows[0]}

    def _one(self, r: store_ranges.Range) -> dict[str, Any]:
        import time

        t0 = time.perf_counter()
        claim = None
        while claim is None:
            if store_ranges.is_done(self.store_dir, r.k, self.store_id):  # a retry after the range was written
                mark = store_ranges.done_mark(self.store_dir, r.k)
                return _row(r, mark.tokens, os.getpid(), time.perf_counter() - t0, 0.0, False)
            self.writer.check_store(r)
            claim = store_ranges.try_claim(self.store_dir, r.k, self.store_id)
            if claim is None:  # a live actor holds it (a retried task beside the original): wait for it
                time.sleep(0.5)
        try:
            mark = self.writer.run(r, claim)
        finally:
            claim.release()
        return _row(r, mark.tokens, os.getpid(), time.perf_counter() - t0, mark.write_s, True)


def _row(r: store_ranges.Range, tokens: int, pid: int, seconds: float, write_s: float, computed: bool) -> dict:
    return {"k": r.k, "start": r.start, "stop": r.stop, "tokens": int(tokens), "pid": pid,
            "seconds": round(seconds, 4), "write_s": round(write_s, 4), "computed": computed}
