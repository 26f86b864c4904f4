"""Where nearest-neighbour search runs: FAISS on the GPU(s), FAISS on the CPU, or an exact PyTorch top-k on the GPU.

:func:`select_backend` picks FAISS on the GPU when the installed faiss has GPU
support and a GPU is present (sharded over all GPUs when there are several),
FAISS on the CPU otherwise. Where faiss has no GPU build but PyTorch sees a
GPU, exact k-NN (``flat``) runs as a blocked matrix product on the GPU
(:func:`layerscope.metrics.neighbors_torch.topk_inner`). The backend actually used is recorded and printed.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from layerscope.errors import InputError, MissingExtraError


def _faiss():
    try:
        import faiss
    except ImportError:
        raise MissingExtraError("faiss-cpu", "faiss") from None
    return faiss


# ---------------------------------------------------------------- backend

@dataclass(frozen=True)
class Backend:
    """Where nearest-neighbour search runs: ``faiss-gpu``, ``faiss-cpu`` or ``torch-cuda`` (exact only)."""

    name: str
    gpus: int = 0
    reason: str = ""

    def describe(self) -> str:
        where = {"faiss-gpu": f"FAISS on {self.gpus} GPU(s)" + (" (sharded)" if self.gpus > 1 else ""),
                 "faiss-cpu": "FAISS on the CPU",
                 "torch-cuda": f"exact blocked matrix product on {self.gpus} GPU(s) with PyTorch"}[self.name]
        return f"{where}{' - ' + self.reason if self.reason else ''}"


def faiss_gpu_count() -> int:
    faiss = _faiss()
    get = getattr(faiss, "get_num_gpus", None)
    if get is None:
        return 0
    try:
        return int(get())
    except Exception:  # a CPU build may expose the symbol and still fail
        return 0


def torch_gpu_count() -> int:
    try:
        import torch
    except ImportError:
        return 0
    try:
        return torch.cuda.device_count() if torch.cuda.is_available() else 0
    except Exception:
        return 0


def select_backend(kind: str = "flat", prefer: str = "auto") -> Backend:
    """Pick where ``kind`` searches run. ``prefer``: auto, cpu, gpu."""
    if prefer not in ("auto", "cpu", "gpu"):
        raise InputError(f"--device must be auto, cpu or gpu, not {prefer!r}")
    if prefer == "cpu":
        return Backend("faiss-cpu", 0, "asked for the CPU")
    ngpu = faiss_gpu_count()
    if ngpu > 0 and kind != "binary" and kind != "hnsw":
        return Backend("faiss-gpu", ngpu)
    tgpu = torch_gpu_count()
    if tgpu > 0 and kind == "flat":
        return Backend("torch-cuda", 1, "the installed faiss has no GPU support")
    if prefer == "gpu":
        why = ("faiss has no GPU build and PyTorch sees no GPU" if tgpu == 0 else
               f"a {kind} index has no GPU path here (faiss has no GPU build)")
        raise InputError(f"--device gpu: {why}; use --device auto or cpu")
    if ngpu > 0:
        return Backend("faiss-cpu", 0, f"FAISS has no GPU {kind} index")
    if tgpu > 0:
        return Backend("faiss-cpu", 0, f"the installed faiss has no GPU support and a {kind} index needs it")
    return Backend("faiss-cpu", 0, "no GPU found" if ngpu == 0 and tgpu == 0 else "")
