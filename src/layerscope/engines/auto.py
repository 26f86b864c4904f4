"""``--engine auto``: the fastest engine here whose recorded accuracy meets ``--min-cosine``.

Accuracy is what the manifest recorded against PyTorch fp32: the export's own
parity for the fp32 graph, each variant's parity for ``int8`` and the OpenVINO
precisions (``inspect optimize --variant int8,ov-fp32,ov-bf16``); an engine
whose accuracy was never recorded is not picked.  The accuracy of a candidate
is its worst cosine over every hidden-state and pooled output.

Speed: the CPU engines' texts/s measured on this CPU by the last ``inspect bench``
(engines/speed_order.py); engines never measured here keep their place in the
declared order below (the order they came in on benchmarks/README.md's machine).
The note on the engine says which figures the pick went by.  GPU engines
(TensorRT, CUDA) go before every CPU engine when they start.
"""

from __future__ import annotations

from typing import Any

from layerscope.errors import EngineUnavailableError, InputError

DEFAULT_MIN_COSINE = 0.9999

# (engine, variant, manifest key of its recorded parity); fastest first on CPU as measured in
# benchmarks/README.md (OpenVINO bf16 only runs where the CPU has bf16 compute).
CPU_RANK: tuple[tuple[str, str | None, str], ...] = (
    ("ov", "bf16", "ov-bf16"),
    ("ov", "int8", "ov-int8"),
    ("ort", "int8", "int8"),
    ("ov", None, "ov-fp32"),
    ("ort", None, "fp32"),
)
GPU_ORDER = ("trt", "cuda")


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


def pick_engine(handle, registry, *, min_cosine: float | None = None, **options):
    min_cos = DEFAULT_MIN_COSINE if min_cosine is None else float(min_cosine)
    if not 0.0 < min_cos <= 1.0:
        raise InputError(f"--min-cosine {min_cosine} must be in (0, 1], e.g. 0.9999")
    tried: list[str] = []
    if not (handle.is_export or handle.can_export):
        engine = registry["torch"](handle, **options)
        engine.info.notes.append("auto picked torch (the model cannot be exported to ONNX)")
        return engine
    if options.get("variant"):  # an explicit variant: the old order, that variant
        order: list[tuple[str, str | None, str]] = [(n, None, "") for n in GPU_ORDER] + [("ort", None, "")]
        ranked_by = ""
    else:
        handle = handle.ensure_export()
        from layerscope.engines.speed_order import ranked

        cpu_order, ranked_by = ranked(CPU_RANK, handle.manifest)
        order = [(n, None, "fp32") for n in GPU_ORDER] + cpu_order
    handle = handle.ensure_export()
    for name, variant, key in order:
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
        from layerscope.engines.speed_order import speed_of

        why = (f"min cosine {cos:.6f} >= {min_cos:g}, fastest such engine"
               + (" (GPU first)" if name in GPU_ORDER else f"{speed_of(ranked_by, name, variant)}; order from {ranked_by}")
               if key else "the requested variant")
        engine.info.notes.append(f"auto picked {label} ({why})" + (f"; passed over {'; '.join(tried)}"
                                                                      if tried else ""))
        return engine
    engine = registry["torch"](handle, **options)
    engine.info.notes.append(f"auto picked torch after {'; '.join(tried)}")
    return engine
