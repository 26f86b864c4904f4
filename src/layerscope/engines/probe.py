"""``layerscope engines``: which engines really start on this machine, and why the others do not."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class EngineStatus:
    name: str
    works: bool
    detail: str


def probe_all(model=None) -> list[EngineStatus]:
    """Try each engine for real: start a session on each provider and check what it really got.

    ``model`` (an export dir or its ``ModelHandle``; export a plain model first with
    ``layerscope.export.open.ensure_export``) is also tried on each provider."""
    from layerscope.engines.registry import engines

    export_dir = None
    if model:
        from layerscope.errors import InputError
        from layerscope.model.handle import ModelHandle

        handle = model if isinstance(model, ModelHandle) else ModelHandle.resolve(model)
        if not handle.is_export:
            raise InputError(f"{handle.spec} is not an export; export it first (layerscope export)")
        export_dir = handle.export_dir
    statuses = []
    for name, spec in engines().items():
        if name != "auto":  # auto is what the others add up to, below
            works, detail = spec.factory.probe(export_dir)
            statuses.append(EngineStatus(name, works, detail))
    statuses.append(EngineStatus("auto", True, _auto_detail(statuses, export_dir)))
    return statuses


def _auto_detail(statuses: list[EngineStatus], export_dir) -> str:
    from layerscope.engines.auto import DEFAULT_MIN_COSINE, candidate_min_cosine
    from layerscope.engines.registry import auto_order, fallback_engine, gpu_engines

    works = {s.name: s.works for s in statuses}
    gpu = next((n for n in gpu_engines() if works.get(n)), None)
    if gpu:
        return f"picks {gpu} here"
    if export_dir is None:
        # an engine on the export's own fp32 graph has the export's parity: the first that starts
        fresh = next((n for n, variant, _ in auto_order(explicit_variant=False) if variant is None and works.get(n)),
                     fallback_engine().name)
        ov_detail = next((s.detail for s in statuses if s.name == "ov" and s.works), "")
        if ov_detail and "no bf16" not in ov_detail:
            return (f"picks ov bf16 here for a fresh export where its recorded cosine to fp32 meets --min-cosine "
                    f"({DEFAULT_MIN_COSINE:g}; an export on this CPU records it), else {fresh}; give --model to see "
                    "which")
        return (f"picks {fresh} here for a fresh export; the fastest CPU engine whose recorded cosine to fp32 meets "
                f"--min-cosine ({DEFAULT_MIN_COSINE:g}) once variants are recorded (give --model to see which)")
    from layerscope.model.manifest import read_manifest

    manifest = read_manifest(export_dir)
    ov_bf16 = "no bf16" not in next((s.detail for s in statuses if s.name == "ov"), "no bf16")
    from layerscope.engines.speed_order import ranked

    order, ranked_by = ranked(tuple(auto_order(explicit_variant=False)), manifest.onnx_sha256)
    for name, variant, key in order:
        cos, _ = candidate_min_cosine(manifest, key, variant)
        if not works.get(name) or cos is None or cos < DEFAULT_MIN_COSINE or (variant == "bf16" and not ov_bf16):
            continue
        return f"picks {name}{' ' + variant if variant else ''} here (recorded min cosine {cos:.6f}; order from {ranked_by})"
    return f"picks {fallback_engine().name} here"
