"""What the numbers were measured on: CPU model and flags, cores, memory, GPU, library versions."""

from __future__ import annotations

import os
import platform
import re
import threading
import time
from pathlib import Path
from typing import Any

# The CPU flags that matter for these engines (the full list is hundreds long).
_FLAGS_OF_INTEREST = ("avx2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx_vnni",
                      "avx512_bf16", "avx512_fp16", "amx_tile", "amx_int8", "amx_bf16")


def describe_machine() -> dict[str, Any]:
    import psutil

    info: dict[str, Any] = {"platform": platform.platform(), "python": platform.python_version()}
    cpuinfo = Path("/proc/cpuinfo")
    model, flags = platform.processor() or "unknown", set()
    if cpuinfo.exists():
        text = cpuinfo.read_text(errors="replace")
        m = re.search(r"^model name\s*:\s*(.+)$", text, re.M)
        model = m.group(1).strip() if m else model
        f = re.search(r"^flags\s*:\s*(.+)$", text, re.M)
        flags = set(f.group(1).split()) if f else set()
    info["cpu_model"] = model
    info["cpu_flags"] = [f for f in _FLAGS_OF_INTEREST if f in flags]
    info["cpu_flags_missing"] = [f for f in _FLAGS_OF_INTEREST if f not in flags]
    info["physical_cores"] = psutil.cpu_count(logical=False)
    info["logical_cores"] = psutil.cpu_count(logical=True)
    try:
        info["usable_cores"] = len(os.sched_getaffinity(0))
    except AttributeError:
        info["usable_cores"] = info["logical_cores"]
    info["memory_gib"] = round(psutil.virtual_memory().total / 2**30, 1)
    info["gpu"] = _gpu()
    info["versions"] = _versions()
    return info


def _gpu() -> str:
    try:
        import torch

        if torch.cuda.is_available():
            return ", ".join(torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count()))
    except ImportError:
        pass
    return "none"


def _versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    import layerscope

    out = {"layerscope": layerscope.__version__}
    for name in ("torch", "transformers", "onnx", "onnxruntime", "onnxruntime-gpu", "optimum-onnx",
                 "sentence-transformers", "tokenizers", "numpy", "openvino", "optimum", "optimum-intel"):
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            continue
    return out


def current_rss() -> int:
    import psutil

    return int(psutil.Process().memory_info().rss)


def _anon_rss() -> int | None:
    """Private (anonymous) resident memory: RSS without file pages such as a memory-mapped store."""
    try:
        with open("/proc/self/status", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("RssAnon:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


class PeakMemory:
    """Samples host RSS (and anonymous RSS, and GPU memory where a GPU is present) on a thread."""

    def __init__(self, interval: float = 0.02, gpu: bool = False):
        self.interval = interval
        self.peak_rss = 0
        self.peak_anon: int | None = None
        self.peak_gpu: int | None = None
        self._gpu = _gpu_reader() if gpu else None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="layerscope-memory", daemon=True)

    def sample(self) -> None:
        self.peak_rss = max(self.peak_rss, current_rss())
        anon = _anon_rss()
        if anon is not None:
            self.peak_anon = max(self.peak_anon or 0, anon)
        if self._gpu is not None:
            used = self._gpu()
            if used is not None:
                self.peak_gpu = max(self.peak_gpu or 0, used)

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.sample()
            time.sleep(self.interval)

    def __enter__(self) -> "PeakMemory":
        self.sample()
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self.sample()


def _gpu_reader():
    """A callable giving used GPU memory in bytes (device 0), or None where it cannot be read."""
    try:
        import pynvml

        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        return lambda: int(pynvml.nvmlDeviceGetMemoryInfo(handle).used)
    except Exception:  # pynvml missing or no driver: no GPU figure rather than a wrong one
        return None
