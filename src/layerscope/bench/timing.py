"""Timing one bench row: its result record, the clock (wall, CPU, load average) and the figures."""

from __future__ import annotations

import time
from typing import Any

import numpy as np


class Run:
    """One engine's measurements."""

    def __init__(self, name: str, kind: str, note: str = ""):
        self.result: dict[str, Any] = {"engine": name, "kind": kind, "note": note, "available": True}

    def fail(self, reason: str) -> dict[str, Any]:
        self.result.update(available=False, reason=reason)
        return self.result


class Clock:
    """Wall time, this process's CPU time and the machine's load average over one timed run.

    On a machine shared with other work, wall-clock throughput drifts with the load;
    texts per CPU-second of this process is the steadier figure, so both are recorded.
    """

    def __enter__(self):
        import os

        self.load_before = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
        self.cpu0 = time.process_time()
        self.t0 = time.perf_counter()
        return self

    def __exit__(self, *exc):
        import os

        self.seconds = time.perf_counter() - self.t0
        self.cpu = time.process_time() - self.cpu0
        self.load_after = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
        return False


def timing(n: int, tokens: int, clock: Clock, lat: list[float], setup: float, mem) -> dict[str, Any]:
    seconds = clock.seconds
    return {
        "texts": n, "tokens": tokens, "seconds": seconds,
        "texts_per_s": n / seconds, "tokens_per_s": tokens / seconds,
        "cpu_s": round(clock.cpu, 3), "texts_per_cpu_s": n / clock.cpu if clock.cpu > 0 else None,
        "load_avg_1m": [clock.load_before, clock.load_after],
        "latency_p50_ms": None if not lat else percentile(lat, 50) * 1000,
        "latency_p95_ms": None if not lat else percentile(lat, 95) * 1000,
        "batches": len(lat) or None,
        "setup_s": round(setup, 3),
        "peak_rss_mib": mem.peak_rss / 2**20,
        "peak_anon_rss_mib": None if mem.peak_anon is None else mem.peak_anon / 2**20,
        "peak_gpu_mib": None if mem.peak_gpu is None else mem.peak_gpu / 2**20,
    }


def percentile(values: list[float], q: float) -> float | None:
    return float(np.percentile(np.asarray(values), q)) if values else None
