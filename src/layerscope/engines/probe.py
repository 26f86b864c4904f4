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
    statuses.append(_ov_status())
    statuses.append(EngineStatus("auto", True, _auto_detail(statuses, export_dir)))
    return statuses


def _ov_status() -> EngineStatus:
    from layerscope.errors import EngineUnavailableError

    try:
        from layerscope.engines.ov import cpu_capabilities, ov_module

        version = ov_module().__version__.split("-")[0]
        caps = cpu_capabilities()
    except EngineUnavailableError as exc:
        return EngineStatus("ov", False, str(exc))
    bf16 = "bf16 too" if "BF16" in caps else "no bf16 on this CPU"
    return EngineStatus("ov", True, f"OpenVINO {version} on CPU ({', '.join(caps)}; {bf16})")


def _auto_detail(statuses: list[EngineStatus], export_dir) -> str:
    from layerscope.engines.auto import CPU_RANK, DEFAULT_MIN_COSINE, GPU_ORDER, recorded_min_cosine

    works = {s.name: s.works for s in statuses}
    gpu = next((n for n in GPU_ORDER if works.get(n)), None)
    if gpu:
        return f"picks {gpu} here"
    if export_dir is None:
        return ("picks ort here for a fresh export; the fastest CPU engine whose recorded cosine to fp32 meets "
                f"--min-cosine ({DEFAULT_MIN_COSINE:g}) once variants are recorded (give --model to see which)")
    from layerscope.export.manifest import read_manifest

    manifest = read_manifest(export_dir)
    ov_bf16 = "no bf16" not in next((s.detail for s in statuses if s.name == "ov"), "no bf16")
    from layerscope.engines.speed_order import ranked

    order, ranked_by = ranked(CPU_RANK, manifest)
    for name, variant, key in order:
        cos = recorded_min_cosine(manifest, key)
        if not works.get(name) or cos is None or cos < DEFAULT_MIN_COSINE or (variant == "bf16" and not ov_bf16):
            continue
        return f"picks {name}{' ' + variant if variant else ''} here (recorded min cosine {cos:.6f}; order from {ranked_by})"
    return "picks torch here"
