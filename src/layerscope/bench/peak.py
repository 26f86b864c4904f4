"""This CPU's fp32 compute peak, and the FLOPs a transformer encoder spends per text.

The peak a bench row is a fraction of is **measured** (``cpu_peak``): the fp32 GEMM rate numpy's BLAS reaches on
this process's cores (two 1536 x 1536 float32 matrices, the best of several products after a warm one), taken
when the bench's rows are done. A GEMM is what a transformer's time goes to, and the measurement runs at the
clock the cores really run at, which a VM's /proc/cpuinfo does not tell (its ``cpu MHz`` is the nominal clock:
2.6 GHz on the Zen 4 these benches ran on, whose cores run near 3.6 under load).

The peak derived from the CPU's flags is recorded beside it (``machine_peak``): cores x clock x fp32 FLOPs per
cycle per core, the FLOPs per cycle from the widest vector FMA /proc/cpuinfo reports, assuming two FMA units per
core (the server cores these benches run on; a one-unit part halves it):

- avx512f: 2 units x 16 fp32 lanes x 2 (multiply + add) = 64; on AMD's Zen 4 (family 25) AVX-512 runs on its two
  256-bit units, so 2 x 8 x 2 = 32 (Zen 5, family 26, has 512-bit units: 64)
- avx2 + fma: 2 x 8 x 2 = 32
- avx: 2 x 8 (separate add and multiply ports) = 16
- otherwise (SSE): 8

The clock is the highest the kernel reports (cpufreq's ``cpuinfo_max_freq``, else the ``cpu MHz`` of
/proc/cpuinfo).

FLOPs per text of n tokens (useful work: padding and softmax/LayerNorm not counted),
per layer: the four h x h projections and the two h x i feed-forward matmuls
(2 n (4 h^2 + 2 h i)) plus attention scores and the weighted sum (4 n^2 h).
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

import numpy as np


def _cpu_fields(cpuinfo: str) -> tuple[set[str], float | None, str, int | None]:
    """The first processor's flags, ``cpu MHz``, vendor and family from /proc/cpuinfo's text."""
    def field(name: str) -> str | None:
        m = re.search(rf"^{name}\s*:\s*(.+?)\s*$", cpuinfo, re.M)
        return m.group(1) if m else None

    flags, mhz, family = field("flags"), field("cpu MHz"), field("cpu family")
    return (set(flags.split()) if flags else set(), float(mhz) if mhz and re.fullmatch(r"[\d.]+", mhz) else None,
            field("vendor_id") or "", int(family) if family and family.isdigit() else None)


ZEN4_FAMILY = 25  # AMD family 19h: Zen 3 (no AVX-512) and Zen 4 (AVX-512 on 256-bit units)


def flops_per_cycle(flags: set[str], vendor: str = "", family: int | None = None) -> tuple[int, str]:
    if "avx512f" in flags and vendor == "AuthenticAMD" and family == ZEN4_FAMILY:
        return 32, "AVX-512 on Zen 4's 256-bit FMA units: 2 units x 8 fp32 lanes x 2"
    if "avx512f" in flags:
        return 64, "AVX-512 FMA: 2 units x 16 fp32 lanes x 2"
    if "avx2" in flags and "fma" in flags:
        return 32, "AVX2 FMA: 2 units x 8 fp32 lanes x 2"
    if "avx" in flags:
        return 16, "AVX: 8-lane add + 8-lane multiply"
    return 8, "SSE: 4-lane add + 4-lane multiply"


def machine_peak(cpuinfo_path: str = "/proc/cpuinfo", cores: int | None = None) -> dict[str, Any] | None:
    """fp32 peak of the cores this process may use, with how it was worked out; None off Linux."""
    p = Path(cpuinfo_path)
    if not p.exists():
        return None
    flags, mhz, vendor, family = _cpu_fields(p.read_text(errors="replace"))
    max_khz = Path("/sys/devices/system/cpu/cpu0/cpufreq/cpuinfo_max_freq")
    source = "cpu MHz in /proc/cpuinfo"
    if max_khz.exists():
        try:
            mhz, source = int(max_khz.read_text().strip()) / 1000.0, "cpufreq cpuinfo_max_freq"
        except ValueError:
            pass
    if not mhz:
        return None
    if cores is None:
        from layerscope.engines.speed_order import usable_cores

        cores = usable_cores()
    per_cycle, how = flops_per_cycle(flags, vendor, family)
    gflops = cores * mhz / 1000.0 * per_cycle
    return {"cores": cores, "ghz": round(mhz / 1000.0, 3), "clock_source": source, "flops_per_cycle": per_cycle,
            "vector_units": how, "gflops": round(gflops, 1),
            "text": f"{cores} cores x {mhz / 1000:.2f} GHz x {per_cycle} fp32 FLOPs/cycle ({how}) "
                    f"= {gflops:.1f} GFLOP/s"}


GEMM_N = 1536  # 7.2 GFLOP a product: tens of ms on a few cores, large enough for BLAS to reach its rate
GEMM_REPEATS = 8


def gemm_rate(n: int = GEMM_N, repeats: int = GEMM_REPEATS, clock=None) -> dict[str, Any]:
    """The fp32 GEMM rate numpy's BLAS reaches here: ``2 n^3`` FLOPs over the fastest of ``repeats`` products of
    two ``n x n`` float32 matrices, after one product that starts BLAS's threads and touches the pages."""
    import time

    clock = clock or time.perf_counter
    rng = np.random.default_rng(0)
    a = rng.standard_normal((n, n), dtype=np.float32)
    b = rng.standard_normal((n, n), dtype=np.float32)
    np.matmul(a, b)
    best = math.inf
    for _ in range(int(repeats)):
        start = clock()
        np.matmul(a, b)
        best = min(best, clock() - start)
    gflops = 2.0 * n ** 3 / best / 1e9
    return {"n": n, "repeats": int(repeats), "best_s": best, "gflops": round(gflops, 1)}


def cpu_peak(cpuinfo_path: str = "/proc/cpuinfo", cores: int | None = None, measure=gemm_rate) -> dict[str, Any]:
    """The peak a CPU row's speed is a fraction of: the GEMM rate measured now (``measure``), with the peak derived
    from the CPU's flags beside it (``derived``; None off Linux)."""
    from layerscope.engines.speed_order import usable_cores

    cores = usable_cores() if cores is None else cores
    derived = machine_peak(cpuinfo_path, cores)
    got = measure()
    text = (f"measured: numpy float32 GEMM {got['n']} x {got['n']} on {cores} cores, best of {got['repeats']} = "
            f"{got['gflops']:.1f} GFLOP/s")
    if derived is not None:
        text += f" (from the CPU's flags and clock: {derived['text']})"
    return {"gflops": got["gflops"], "cores": cores, "measured": got, "derived": derived, "text": text}


def model_shapes(export_dir: str | Path) -> dict[str, int] | None:
    """Layers, hidden and feed-forward sizes from the export's config.json (BERT-style names)."""
    cfg_path = Path(export_dir) / "config.json"
    if not cfg_path.exists():
        return None
    cfg = json.loads(cfg_path.read_text())
    cfg = cfg.get("text_config", cfg)
    h = cfg.get("hidden_size") or cfg.get("n_embd") or cfg.get("d_model")
    n_layers = cfg.get("num_hidden_layers") or cfg.get("n_layer") or cfg.get("num_layers")
    if not h or not n_layers:
        return None
    inter = cfg.get("intermediate_size") or cfg.get("n_inner") or cfg.get("d_ff") or 4 * h
    return {"layers": int(n_layers), "hidden": int(h), "intermediate": int(inter)}


def corpus_flops(shapes: dict[str, int], lengths: np.ndarray) -> float:
    """Useful FLOPs of one forward pass over texts of ``lengths`` tokens (every layer)."""
    n = np.asarray(lengths, dtype=np.float64)
    h, i, layers = shapes["hidden"], shapes["intermediate"], shapes["layers"]
    per_layer = 2.0 * n * (4 * h * h + 2 * h * i) + 4.0 * n * n * h
    return float(layers * per_layer.sum())
