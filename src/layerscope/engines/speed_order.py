"""The CPU speed order ``auto`` uses: measured by ``layerscope bench`` on this CPU where it was, else declared.

Every bench run records its engine rows' texts/s in ``<cache root>/bench-speeds.json``, keyed by
this CPU (model name, the vector flags the engines use and the cores this process may use).  ``ranked`` then orders the candidates
``auto`` may pick: the engines a bench measured here take the places the measured ones hold in the
declared order, fastest first; an engine never measured keeps its declared place.  The run used is
the latest one on the same export (its ``onnx_sha256``) if there is one, else the latest on this CPU. The file is
shared by every version and environment on the machine: a run whose shape or figures do not validate
(``valid_run``) is ignored, with a note.
"""

from __future__ import annotations

import hashlib
import math
import os
import re
import time
from pathlib import Path
from typing import Any

from layerscope.jsonfile import read_json_dict, write_json_atomic

SPEEDS_FILE = "bench-speeds.json"
KEEP_RUNS = 20  # per CPU
MIN_TEXTS = 200  # a shorter bench is too noisy to rank engines by (and keeps test runs out of the record)
# The CPU flags that change which engine is fastest (vector widths, int8 and bf16 dot products).
FLAGS = ("avx2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx_vnni", "avx512_bf16",
         "avx512_fp16", "amx_tile", "amx_int8", "amx_bf16")


def _root() -> Path:
    from layerscope.model.home import cache_root  # the model floor is below the engines

    return cache_root()


def usable_cores() -> int:
    """The cores this process may run on: its CPU affinity, lowered by a cgroup CPU quota (a container's
    ``cpu.max``) where one is set."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # no affinity on this platform
        cores = os.cpu_count() or 1
    try:
        quota, period = Path("/sys/fs/cgroup/cpu.max").read_text().split()[:2]
        if quota != "max":
            cores = min(cores, max(1, -(-int(quota) // int(period))))
    except (OSError, ValueError):
        pass
    return max(1, cores)


def cpu_identity(cpuinfo: str | None = None, cores: int | None = None) -> tuple[str, str]:
    """(key, description) of this CPU: its model name, the engine-relevant flags it has and the cores this
    process may use (a speed measured on 2 cores says nothing about 16)."""
    if cpuinfo is None:
        path = Path("/proc/cpuinfo")
        cpuinfo = path.read_text(errors="replace") if path.exists() else ""
    m = re.search(r"^model name\s*:\s*(.+)$", cpuinfo, re.M)
    f = re.search(r"^flags\s*:\s*(.+)$", cpuinfo, re.M)
    model = m.group(1).strip() if m else os.uname().machine
    flags = [x for x in FLAGS if f and x in f.group(1).split()]
    cores = usable_cores() if cores is None else int(cores)
    desc = f"{model} ({', '.join(flags) or 'no AVX2'}), {cores} core{'s' if cores != 1 else ''}"
    return hashlib.sha256(desc.encode()).hexdigest()[:16], desc


def bench_name(engine: str, variant: str | None) -> str:
    """The bench row that measured ``engine`` with ``variant`` (ort + int8 -> ort-int8)."""
    return engine + (f"-{variant}" if variant else "")


def _speed(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value > 0


def valid_run(run: object) -> bool:
    """One recorded bench run as ``record`` writes it: a ``texts_per_s`` object of row name -> a finite positive
    texts/s, and text or null where it names its time, model, export and files. The file is the user's cache,
    shared by every layerscope version and environment on the machine, so anything else is not read."""
    if not isinstance(run, dict) or not isinstance(run.get("texts_per_s"), dict) or not run["texts_per_s"]:
        return False
    if not all(isinstance(k, str) and _speed(v) for k, v in run["texts_per_s"].items()):
        return False
    return all(run.get(k) is None or isinstance(run.get(k), str)
               for k in ("when", "model", "onnx_sha256", "corpus", "bench_json"))


def _entry(data: dict[str, Any], key: str, path: Path) -> tuple[dict[str, Any] | None, list]:
    """This CPU's entry of the speeds file and its runs that validate (``valid_run``); what does not validate is
    ignored, with a note saying so (once per process)."""
    entry = data.get(key)
    if entry is None:
        return None, []
    runs = entry.get("runs") if isinstance(entry, dict) else None
    good = [r for r in runs if valid_run(r)] if isinstance(runs, list) else []
    if not isinstance(runs, list) or len(good) != len(runs):
        bad = len(runs) - len(good) if isinstance(runs, list) else None
        note = (f"{path}: {bad} recorded bench run(s) of this CPU do not validate" if bad is not None else
                f"{path}: the entry of this CPU is not a record of bench runs")
        if note not in _NOTED:
            _NOTED.add(note)
            import logging

            logging.getLogger("layerscope").warning("%s; ignored (the next layerscope bench records anew)", note)
    return (entry if isinstance(entry, dict) else None), good


_NOTED: set[str] = set()


def record(bench: dict[str, Any], bench_json: str | Path | None = None, *, root: Path | None = None) -> int:
    """Remember a process-isolated bench run's engine speeds for this CPU; returns how many rows were recorded.

    In-process benches are not recorded (engines' thread pools distort each other there), nor runs
    over fewer than ``MIN_TEXTS`` texts.
    """
    if bench.get("kind") != "layerscope-bench-isolated" or (bench.get("corpus") or {}).get("texts", 0) < MIN_TEXTS:
        return 0
    speeds = {r["engine"]: float(r["texts_per_s"]) for r in bench.get("results", [])
              if r.get("available") and r.get("kind") == "engine" and r.get("texts_per_s")}
    if not speeds:
        return 0
    key, desc = cpu_identity()
    path = (root or _root()) / SPEEDS_FILE
    data = read_json_dict(path)
    _, runs = _entry(data, key, path)
    entry = data[key] = {"cpu": desc, "runs": runs}  # what did not validate is not kept
    model = bench.get("model") or {}
    entry["runs"].append({"when": time.strftime("%Y-%m-%d %H:%M", time.gmtime()), "model": model.get("source"),
                          "onnx_sha256": model.get("onnx_sha256"), "corpus": (bench.get("corpus") or {}).get("name"),
                          "bench_json": str(bench_json) if bench_json else None, "texts_per_s": speeds})
    entry["runs"] = entry["runs"][-KEEP_RUNS:]
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(path, data)
    return len(speeds)



def measured_run(onnx_sha256: str | None, *, root: Path | None = None) -> dict[str, Any] | None:
    """The bench run on this CPU that ``auto`` goes by (the same export, by its graph's sha256, first; else the
    latest), or None."""
    key, _ = cpu_identity()
    path = (root or _root()) / SPEEDS_FILE
    _, runs = _entry(read_json_dict(path), key, path)  # only runs that validate: others are ignored, with a note
    same = [r for r in runs if onnx_sha256 and r.get("onnx_sha256") == onnx_sha256]
    return (same or runs or [None])[-1]


IN_FLIGHT_SUFFIX = "-x2"  # a bench row of an engine with two batches in flight (ov-x2, ov-bf16-x2)


def with_in_flight(speeds: dict[str, float]) -> dict[str, float]:
    """``speeds`` where a row measured with two batches in flight raises its engine's figure: an engine whose
    one- and two-in-flight rows were both measured runs the faster one (engines/ov.py ``in_flight``)."""
    out = dict(speeds)
    for name, value in speeds.items():
        base = name[: -len(IN_FLIGHT_SUFFIX)]
        if name.endswith(IN_FLIGHT_SUFFIX) and base in out:
            out[base] = max(float(out[base]), float(value))
    return out


def ranked(declared: tuple, onnx_sha256: str | None, *, root: Path | None = None) -> tuple[list, str]:
    """``declared`` ((engine, variant, key) fastest first) reordered by this CPU's measured speeds.

    Returns the order and one sentence saying which figures it came from.
    """
    run = measured_run(onnx_sha256, root=root)
    speeds = with_in_flight((run or {}).get("texts_per_s") or {})
    slots = [i for i, c in enumerate(declared) if bench_name(c[0], c[1]) in speeds]
    if not slots:
        return list(declared), "the declared order (no layerscope bench of these engines on this CPU yet)"
    measured = sorted((declared[i] for i in slots), key=lambda c: -speeds[bench_name(c[0], c[1])])
    order = list(declared)
    for i, cand in zip(slots, measured):
        order[i] = cand
    figures = ", ".join(f"{bench_name(c[0], c[1])} {speeds[bench_name(c[0], c[1])]:,.0f}" for c in measured)
    source = (f"texts/s measured on this CPU by layerscope bench ({run.get('when')} UTC, {run.get('model')}"
              f"{', same export' if run.get('onnx_sha256') == onnx_sha256 else ''}): {figures}")
    return order, source


def speed_of(order_source: str, engine: str, variant: str | None) -> str:
    """' (N texts/s measured here)' for a picked engine when the order came from a bench, else ''."""
    m = re.search(rf"(?:: |, ){re.escape(bench_name(engine, variant))} (\d+(?:,\d{{3}})*)", order_source)
    return f", {m.group(1)} texts/s measured here" if m else ""
