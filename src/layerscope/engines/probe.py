"""``inspect engines``: which engines really start on this machine, and why the others do not."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class EngineStatus:
    name: str
    works: bool
    detail: str


def _torch_status() -> list[EngineStatus]:
    try:
        import torch
    except ImportError:
        return [EngineStatus("torch", False, "PyTorch is not installed")]
    out = [EngineStatus("torch", True, f"PyTorch {torch.__version__} on cpu")]
    if torch.cuda.is_available():
        out[0].detail = f"PyTorch {torch.__version__} on cuda ({torch.cuda.get_device_name(0)}) and cpu"
    return out


def probe_all(model: str | None = None) -> list[EngineStatus]:
    """Try each engine for real: start a session on each provider and check what it really got."""
    from layerscope.engines.ort import probe_providers

    export_dir = None
    if model:
        from layerscope.export.manifest import ModelHandle

        export_dir = ModelHandle.resolve(model).ensure_export().export_dir
    statuses = _torch_status()
    for name, (works, detail) in probe_providers(export_dir).items():
        statuses.append(EngineStatus(name, works, detail))
    order = ["trt", "cuda", "ort"]
    picked = next((s.name for n in order for s in statuses if s.name == n and s.works), "torch")
    statuses.append(EngineStatus("auto", True, f"picks {picked} here"))
    return statuses
