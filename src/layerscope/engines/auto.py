"""``--engine auto``: the fastest engine here whose recorded accuracy meets ``--min-cosine``.

Accuracy is what the manifest recorded against PyTorch fp32: the export's own
parity for the fp32 graph, each variant's parity for ``int8`` and the OpenVINO
precisions (``inspect optimize --variant int8,ov-fp32,ov-bf16``); an engine
whose accuracy was never recorded is not picked.  The accuracy of a candidate
is its worst cosine over every hidden-state and pooled output.

Speed is a recorded rank that each engine declares for its candidates
(engines/registry.py ``AutoRank``): the order the CPU engines came in on the
benchmarks (benchmarks/README.md), fastest first, with the GPU engines (TensorRT,
CUDA) ranked before every CPU engine.  ``registry.auto_order`` reads the ranks.
"""

from __future__ import annotations

from typing import Any

from layerscope.engines.registry import EngineSpec, auto_order, engines, fallback_engine, register
from layerscope.errors import EngineUnavailableError, InputError

DEFAULT_MIN_COSINE = 0.9999


def recorded_min_cosine(manifest: dict[str, Any], key: str) -> float | None:
    """Worst cosine to torch fp32 over every hidden-state and pooled output, or None if not recorded."""
    parity = manifest.get("parity") if key == "fp32" else (manifest.get("variants", {}).get(key) or {}).get("parity")
    outputs = (parity or {}).get("outputs") or {}
    values = [s["min_cos"] for name, s in outputs.items()
              if name.startswith(("hidden_states.", "pooled.")) and s.get("min_cos") is not None]
    if not values:
        return None
    worst = min(values)
    return None if worst != worst else float(worst)  # NaN: not a usable record


@register(EngineSpec("auto", "the fastest engine that starts here and whose recorded cosine to PyTorch fp32 meets "
                            "--min-cosine", needs_export=True, device="any", gradients=True))
def pick_engine(handle, *, min_cosine: float | None = None, **options):
    min_cos = DEFAULT_MIN_COSINE if min_cosine is None else float(min_cosine)
    if not 0.0 < min_cos <= 1.0:
        raise InputError(f"--min-cosine {min_cosine} must be in (0, 1], e.g. 0.9999")
    tried: list[str] = []
    registry = {name: spec.factory for name, spec in engines().items()}
    # an explicit variant: the engines that load a variant's file, in rank order, with that variant
    for name, variant, key in auto_order(explicit_variant=bool(options.get("variant"))):
        label = name + (f" {variant}" if variant else "")
        if key:
            cos = recorded_min_cosine(handle.manifest, key)
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
            engine = registry[name](handle, **opts)
        except EngineUnavailableError as exc:
            tried.append(f"{label}: {exc}")
            continue
        why = (f"min cosine {cos:.6f} >= {min_cos:g}, fastest such engine by the recorded rank"
               if key else "the requested variant")
        engine.info.notes.append(f"auto picked {label} ({why})" + (f"; passed over {'; '.join(tried)}"
                                                                      if tried else ""))
        return engine
    last = fallback_engine()
    engine = last.factory(handle, **options)
    engine.info.notes.append(f"auto picked {last.name} after {'; '.join(tried)}")
    return engine
