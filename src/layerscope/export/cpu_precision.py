"""Reduced CPU precisions recorded when an export is made, so ``--engine auto`` can pick them unasked.

On a CPU that computes in bf16 (AVX-512 BF16 or AMX, as OpenVINO reports it) with OpenVINO installed, an
export also records ``ov-bf16``: OpenVINO running the fp32 graph at bf16 inference precision, checked
output by output against PyTorch fp32 like every variant (export/ov_variant.py). No file is written.
``auto`` then picks it where its worst cosine meets ``--min-cosine`` (default 0.9999) and passes over it,
saying so, where it does not. A precision outside its variant tolerance is not recorded.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path


def bf16_cpu() -> str | None:
    """None where this CPU computes in bf16 under OpenVINO, else why not (one phrase)."""
    if importlib.util.find_spec("openvino") is None:
        return "OpenVINO is not installed (pip install 'layerscope[openvino]')"
    from layerscope.engines.ov import cpu_capabilities

    caps = cpu_capabilities()
    return None if "BF16" in caps else f"this CPU has no bf16 compute (OpenVINO reports {', '.join(caps)})"


def record_cpu_precisions(export_dir: str | Path, *, progress=None, trust_remote_code: bool = False) -> list[str]:
    """Record ``ov-bf16`` for the export where this CPU has it; one line per precision saying what happened
    (``trust_remote_code``: the export ran the model's own code, and so may its parity check)."""
    from layerscope.errors import EngineUnavailableError, ExportError, ModelNotFoundError
    from layerscope.export.ov_variant import make_ov_variant

    why = bf16_cpu()
    if why:
        return [f"ov-bf16 not recorded: {why}"]
    try:
        entry = make_ov_variant(export_dir, "ov-bf16", progress=progress, trust_remote_code=trust_remote_code)
    except (ExportError, EngineUnavailableError, ModelNotFoundError) as exc:
        return [f"ov-bf16 not recorded: {exc}"]
    from layerscope.model.manifest_type import Variant

    cos = Variant.from_dict("ov-bf16", entry).parity.min_cosine()  # make_ov_variant records it with its parity
    return [f"ov-bf16 recorded (OpenVINO bf16 on this CPU): worst cosine to PyTorch fp32 {cos:.6f}"]
