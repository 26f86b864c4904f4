"""This CPU's fp32 compute peak, and the FLOPs a transformer encoder spends per text.

Peak = cores x clock x fp32 FLOPs per cycle per core, where FLOPs per cycle
come from the widest vector FMA the CPU reports in /proc/cpuinfo, assuming two
FMA units per core (true of the server cores these benches run on: Zen 2-4,
Skylake-SP and later with AVX-512; a one-FMA-unit part halves it):

- avx512f: 2 units x 16 fp32 lanes x 2 (multiply + add) = 64
- avx2 + fma: 2 x 8 x 2 = 32
- avx: 2 x 8 (separate add and multiply ports) = 16
- otherwise (SSE): 8

The clock is the highest the kernel reports (cpufreq's ``cpuinfo_max_freq``,
else the ``cpu MHz`` of /proc/cpuinfo, which is the nominal clock in a VM).

FLOPs per text of n tokens (useful work: padding and softmax/LayerNorm not counted),
per layer: the four h x h projections and the two h x i feed-forward matmuls
(2 n (4 h^2 + 2 h i)) plus attention scores and the weighted sum (4 n^2 h).
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

import numpy as np


def _cpu_flags_and_mhz(cpuinfo: str) -> tuple[set[str], float | None]:
    f = re.search(r"^flags\s*:\s*(.+)$", cpuinfo, re.M)
    m = re.search(r"^cpu MHz\s*:\s*([\d.]+)$", cpuinfo, re.M)
    return (set(f.group(1).split()) if f else set()), (float(m.group(1)) if m else None)


def flops_per_cycle(flags: set[str]) -> tuple[int, str]:
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
    flags, mhz = _cpu_flags_and_mhz(p.read_text(errors="replace"))
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
        try:
            cores = len(os.sched_getaffinity(0))
        except AttributeError:
            cores = os.cpu_count() or 1
    per_cycle, how = flops_per_cycle(flags)
    gflops = cores * mhz / 1000.0 * per_cycle
    return {"cores": cores, "ghz": round(mhz / 1000.0, 3), "clock_source": source, "flops_per_cycle": per_cycle,
            "vector_units": how, "gflops": round(gflops, 1),
            "text": f"{cores} cores x {mhz / 1000:.2f} GHz x {per_cycle} fp32 FLOPs/cycle ({how}) "
                    f"= {gflops:.1f} GFLOP/s"}


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
