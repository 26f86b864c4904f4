"""``--engine auto``: the fastest engine here whose recorded accuracy meets ``--min-cosine``.

Accuracy is what the manifest recorded against PyTorch fp32: the export's own
parity for the fp32 graph, each variant's parity for ``int8`` and the OpenVINO
precisions (``layerscope optimize --variant int8,ov-fp32,ov-bf16``); an engine
whose accuracy was never recorded is not picked.  A candidate that runs the
export's own graph at fp32 (no variant: ``ort``, ``ov`` fp32, ``cuda``, ``trt``)
has the export's parity unless its own was recorded, so the fp32 engines on one
export are ranked by speed alone.  The accuracy of a candidate is its worst
cosine over every hidden-state and pooled output.

Speed: the texts/s the last ``layerscope bench`` measured on this CPU
(engines/speed_order.py) order the engines it measured; engines never measured
here keep the rank each engine declares for its candidates (engines/registry.py
``AutoRank``: the order they came in on benchmarks/README.md's machine, GPU engines
first).  The note on the engine says which figures the pick went by.
"""

from __future__ import annotations


from layerscope.engines.registry import EngineSpec, auto_order, engines, fallback_engine, register
from layerscope.errors import EngineUnavailableError, InputError
from layerscope.model.manifest_type import Manifest

DEFAULT_MIN_COSINE = 0.9999


def recorded_min_cosine(manifest: Manifest, key: str) -> float | None:
    """Worst cosine to torch fp32 over every hidden-state and pooled output, or None if not recorded (or NaN)."""
    return manifest.min_cosine(key)


def candidate_min_cosine(manifest: Manifest, key: str, variant: str | None) -> tuple[float | None, str]:
    """A candidate's recorded worst cosine and where it comes from.  One with no variant runs the export's
    fp32 graph, so without a record of its own it has the export's parity (same graph, fp32 kernels)."""
    cos = recorded_min_cosine(manifest, key)
    if cos is None and variant is None and key != "fp32":
        cos = recorded_min_cosine(manifest, "fp32")
        return cos, ("the export's fp32 parity" if cos is not None else "")
    return cos, ""


@register(EngineSpec("auto", "the fastest engine that starts here and whose recorded cosine to PyTorch fp32 meets "
                            "--min-cosine", needs_export=True, device="any", gradients=True, picks_engine=True))
def pick_engine(handle, *, spec: EngineSpec | None = None, min_cosine: float | None = None, **options):
    """The first candidate that starts and meets ``min_cosine``, made from its own declaration (``spec``, auto's,
    is not the engine's: the engine handed back carries the one it was made from)."""
    min_cos = DEFAULT_MIN_COSINE if min_cosine is None else float(min_cosine)
    if not 0.0 < min_cos <= 1.0:
        raise InputError(f"--min-cosine {min_cosine} must be in (0, 1], e.g. 0.9999")
    tried: list[str] = []
    declared = engines()
    # an explicit variant: the engines that load a variant's file, in rank order, with that variant
    explicit = bool(options.get("variant"))
    order, ranked_by = auto_order(explicit_variant=explicit), ""
    if not explicit:
        from layerscope.engines.speed_order import ranked

        order, ranked_by = ranked(tuple(order), handle.manifest.onnx_sha256)
    for name, variant, key in order:
        label = name + (f" {variant}" if variant else "")
        if key:
            cos, inherited = candidate_min_cosine(handle.manifest, key, variant)
            if cos is None:
                tried.append(f"{label}: accuracy not recorded")
                continue
            if cos < min_cos:
                tried.append(f"{label}: min cosine {cos:.6f} < {min_cos:g}")
                continue
        opts = dict(options)
        if variant:
            opts["variant"] = variant
        try:
            engine = declared[name].make(handle, **opts)
        except EngineUnavailableError as exc:
            tried.append(f"{label}: {exc}")
            continue
        from layerscope.engines.speed_order import speed_of

        source = f" ({inherited})" if key and inherited else ""
        why = (f"min cosine {cos:.6f}{source} >= {min_cos:g}, fastest such engine{speed_of(ranked_by, name, variant)}; "
               f"order from {ranked_by}" if key else "the requested variant")
        engine.info.notes.append(f"auto picked {label} ({why})" + (f"; passed over {'; '.join(tried)}"
                                                                      if tried else ""))
        return engine
    last = fallback_engine()
    engine = last.make(handle, **options)
    engine.info.notes.append(f"auto picked {last.name} after {'; '.join(tried)}")
    return engine
