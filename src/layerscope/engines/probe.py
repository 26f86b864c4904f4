"""``layerscope engines``: which engines really start on this machine, and why the others do not."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class EngineStatus:
    name: str
    works: bool
    detail: str
    off_here: tuple[str, ...] = ()  # variants it has but cannot run on this machine (Engine.variants_off_here)


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
        if not spec.picks_engine:  # an engine that picks another is what the others add up to, below
            works, detail = spec.factory.probe(export_dir)
            off = getattr(spec.factory, "variants_off_here", None)
            statuses.append(EngineStatus(name, works, detail, tuple(off()) if works and off else ()))
    pickers = [spec.name for spec in engines().values() if spec.picks_engine]
    return statuses + [EngineStatus(name, True, _auto_detail(statuses, export_dir)) for name in pickers]


def _auto_detail(statuses: list[EngineStatus], export_dir) -> str:
    from layerscope.engines.auto import DEFAULT_MIN_COSINE, candidate_min_cosine
    from layerscope.engines.registry import auto_order, fallback_engine, gpu_engines

    works = {s.name: s.works for s in statuses}
    off = {s.name: s.off_here for s in statuses}
    gpu = next((n for n in gpu_engines() if works.get(n)), None)
    if gpu:
        return f"picks {gpu} here"
    if export_dir is None:
        # an engine on the export's own fp32 graph has the export's parity: the first that starts
        fresh = next((n for n, variant, _ in auto_order(explicit_variant=False) if variant is None and works.get(n)),
                     fallback_engine().name)
        # a candidate whose accuracy the export records on the machine that runs it (export/cpu_precision.py)
        recorded = next(((name, variant) for name, variant, _ in auto_order(explicit_variant=False, at_export=True)
                         if works.get(name) and variant not in off[name]), None)
        if recorded:
            return (f"picks {recorded[0]} {recorded[1]} here for a fresh export where its recorded cosine to fp32 "
                    f"meets --min-cosine ({DEFAULT_MIN_COSINE:g}; an export on this CPU records it), else {fresh}; "
                    "give --model to see which")
        return (f"picks {fresh} here for a fresh export; the fastest CPU engine whose recorded cosine to fp32 meets "
                f"--min-cosine ({DEFAULT_MIN_COSINE:g}) once variants are recorded (give --model to see which)")
    from layerscope.model.manifest import read_manifest

    manifest = read_manifest(export_dir)
    from layerscope.engines.speed_order import ranked

    order, ranked_by = ranked(tuple(auto_order(explicit_variant=False)), manifest.onnx_sha256)
    for name, variant, key in order:
        cos, _ = candidate_min_cosine(manifest, key, variant)
        if not works.get(name) or cos is None or cos < DEFAULT_MIN_COSINE or variant in off[name]:
            continue
        return f"picks {name}{' ' + variant if variant else ''} here (recorded min cosine {cos:.6f}; order from {ranked_by})"
    return f"picks {fallback_engine().name} here"
