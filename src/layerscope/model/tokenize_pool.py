"""A pool of tokenizer processes that keeps an engine fed when one tokenizer thread cannot, switched on by measurement.

On a CPU engine tokenizing is a few percent of the time and the one background thread (extraction/batching.py)
stays ahead; on a GPU the engine can outrun it. ``measure`` times tokenizing alone (the extraction's own
length-sorted batches, no engine) at 1, 2 and 4 processes; ``record`` keeps those figures with the engine's
tokens/s for this CPU and model (its weights' sha256) in ``<cache root>/tokenizer-pool.json`` (``benchmarks/tokens/pool.py``
measures both). ``processes_for`` reads them back: 1 (the thread) unless the recorded engine outran one
tokenizer, then the fewest processes recorded to keep up with it (the fastest count where none did).
Nothing is assumed without a record: a run never starts processes it was not measured to need. The file is the
user's cache, shared by every version and environment: a record whose shape or figures do not validate
(``valid_record``) is ignored, with a note.
"""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

from layerscope.jsonfile import read_json_dict, write_json_atomic

POOL_FILE = "tokenizer-pool.json"
COUNTS = (1, 2, 4)
KEEP = 20  # records per CPU

_ENCODER = None  # the worker process's encoder


def _start(encoder) -> None:
    global _ENCODER
    _ENCODER = encoder


def _start_worker(encoder) -> None:
    from layerscope.signals import child_start

    child_start()
    _start(encoder)


def _encode(job):
    texts, index, lengths = job
    return _ENCODER(texts, index=index, lengths=lengths)


class TokenizerPool:
    """``processes`` spawned workers, each holding a copy of ``encoder``; ``map`` tokenizes jobs
    ``(texts, index, lengths)`` into batches, in order, several at once."""

    def __init__(self, encoder, processes: int):
        import multiprocessing

        # spawned, not forked: the parent holds engine thread pools a fork would copy mid-flight
        self.processes = int(processes)
        self._pool = multiprocessing.get_context("spawn").Pool(self.processes, _start_worker, (encoder,))

    def map(self, jobs: Iterable[tuple]) -> Iterator:
        return self._pool.imap(_encode, jobs, chunksize=1)

    def close(self) -> None:
        self._pool.terminate()
        self._pool.join()

    def __enter__(self) -> TokenizerPool:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def measure(encoder, jobs: list[tuple], counts: Iterable[int] = COUNTS, *,
            clock: Callable[[], float] = time.perf_counter) -> dict[int, float]:
    """Tokens/s of tokenizing ``jobs`` alone with 1 (this process, as the background thread does) and more
    processes (a pool started before the clock)."""
    tokens = sum(int(sum(min(int(n), encoder.max_length) for n in job[2])) for job in jobs)
    out: dict[int, float] = {}
    for count in counts:
        if count == 1:
            _start(encoder)
            t = clock()
            for job in jobs:
                _encode(job)
            out[1] = tokens / max(clock() - t, 1e-9)
            continue
        with TokenizerPool(encoder, count) as pool:
            list(pool.map(jobs[: count * 2]))  # every worker started and warm
            t = clock()
            for _ in pool.map(jobs):
                pass
            out[count] = tokens / max(clock() - t, 1e-9)
    return out


def record(model_key: str, engine: str, engine_tokens_per_s: float, tokenize: dict[int, float], *,
           cpu: str, root: Path | None = None) -> Path:
    """Remember one measurement (``cpu``: this CPU's identity) under ``root`` (default: the cache root)."""
    from layerscope.model.home import cache_root

    path = (root or cache_root()) / POOL_FILE
    data = read_json_dict(path)
    runs = [r for r in data.get(cpu) or [] if valid_record(r)] if isinstance(data.get(cpu), list) else []
    runs.append({"when": time.strftime("%Y-%m-%d %H:%M", time.gmtime()), "model": model_key,
                 "engine": engine, "engine_tokens_per_s": float(engine_tokens_per_s),
                 "tokenize_tokens_per_s": {str(k): float(v) for k, v in tokenize.items()}})
    data[cpu] = runs[-KEEP:]
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(path, data)
    return path



_NOTED: set[str] = set()


def _rate(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value > 0


def valid_record(run: object) -> bool:
    """One measurement as ``record`` writes it: the engine's finite positive tokens/s, and tokens/s per process
    count, every count one ``measure`` takes (``COUNTS``, 1 among them) and every figure finite and positive.
    The file is the user's cache: anything else is ignored, so no run starts processes no one measured."""
    rates = run.get("tokenize_tokens_per_s") if isinstance(run, dict) else None
    return isinstance(rates, dict) and _rate(run.get("engine_tokens_per_s")) and "1" in rates \
        and all(k in {str(c) for c in COUNTS} and _rate(v) for k, v in rates.items())


def processes_for(model_key: str | None, engine: str, *, cpu: str,
                  root: Path | None = None) -> tuple[int, str | None]:
    """(tokenizer processes, the note saying why) for ``engine`` with this model on this CPU: 1 without a
    record, or where one tokenizer kept up with the engine; else the fewest recorded to keep up."""
    from layerscope.model.home import cache_root

    if not model_key:
        return 1, None
    path = (root or cache_root()) / POOL_FILE
    recorded = read_json_dict(path).get(cpu) or []
    mine = [r for r in recorded if isinstance(r, dict) and r.get("model") == model_key
            and r.get("engine") == engine] if isinstance(recorded, list) else []
    runs = [r for r in mine if valid_record(r)]
    if len(runs) != len(mine) or not isinstance(recorded, list):
        note = f"{path}: a record of this CPU does not validate; ignored"
        if note not in _NOTED:  # the user's cache, shared by every version: said once, never a failed run
            _NOTED.add(note)
            import logging

            logging.getLogger("layerscope").warning("%s", note)
    if not runs:
        return 1, None
    last = runs[-1]
    need = float(last["engine_tokens_per_s"])
    rates = {int(k): float(v) for k, v in last["tokenize_tokens_per_s"].items()}
    if rates.get(1, 0.0) >= need:
        return 1, None
    enough = sorted(n for n, v in rates.items() if v >= need)
    pick = enough[0] if enough else max(rates, key=rates.get)
    if pick == 1:
        return 1, None
    return pick, (f"{pick} tokenizer processes: one tokenizes {rates[1]:,.0f} tokens/s here and {engine} runs "
                  f"{need:,.0f} (recorded {last.get('when')} UTC)")
