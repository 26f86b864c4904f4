"""The variants an export's manifest can hold, and which file an engine loads for one.

Making a variant is export/variants.py (and export/ov_variant.py); the names, the one-line
refusals of kinds that cannot be made, and reading the manifest's ``variants`` entry live here
so that the engines can open a variant without importing the exporter.
"""

from __future__ import annotations

from typing import Any

from layerscope.errors import InputError
from layerscope.model.manifest_type import Manifest

VARIANT_KINDS = ("opt", "gqa", "int8", "int8-block", "fp16", "bf16")
OV_KINDS = ("ov-fp32", "ov-bf16", "ov-int8")  # OpenVINO precisions of the same graphs (export/ov_variant.py)
ATTENTION_KIND = "attn"  # attention probabilities and summaries, not the export's outputs (export/attention.py)


def run_variant(variant: str | None) -> str | None:
    """The variant a run is recorded and compared by: None for the export's own fp32 graph, whichever engine
    runs it and however it was asked for (no variant, ``fp32``, OpenVINO's ``ov-fp32``); else the name given.
    Stores, results, resume checks and the engines all go by this one rule."""
    return None if variant in (None, "", "fp32", "ov-fp32") else str(variant)


def variant_file(kind: str) -> str:
    return f"model.{kind}.onnx"


def check_kind(kind: str) -> str:
    if kind == "opt-int8":
        raise InputError(
            "variant 'opt-int8' is not supported: onnxruntime 1.31's dynamic quantizer cannot infer the types of "
            "the optimizer's com.microsoft ops (Attention, SkipLayerNormalization); use 'int8' (ONNX Runtime "
            "fuses the quantized graph at session start)")
    if kind == "bf16":
        raise InputError(
            "variant 'bf16' is not supported: ONNX Runtime's CPU execution provider has no bf16 MatMul or Add "
            "kernels (a bf16 graph fails with NOT_IMPLEMENTED), although this CPU has avx512_bf16; use int8 on "
            "CPU, fp16 on GPU")
    if kind in OV_KINDS or kind == ATTENTION_KIND:
        return kind
    if kind not in VARIANT_KINDS:
        from layerscope.errors import unknown_name

        raise unknown_name("variant", kind, VARIANT_KINDS,
                           listed=[k for k in VARIANT_KINDS if k != "bf16"] + list(OV_KINDS) + [ATTENTION_KIND])
    return kind


def variant_onnx_file(manifest: Manifest, kind: str | None) -> str | None:
    """The file an engine should load for ``kind`` (None: the fp32 export)."""
    if kind in OV_KINDS:  # before the fp32 rule: no ONNX Runtime engine loads ov-fp32 as a file
        raise InputError(f"variant '{kind}' is an OpenVINO precision: run it with --engine ov --variant {kind[3:]}")
    if run_variant(kind) is None:
        return None
    check_kind(kind)
    if kind in OV_KINDS:
        raise InputError(f"variant '{kind}' is an OpenVINO precision: run it with --engine ov --variant {kind[3:]}")
    if kind == ATTENTION_KIND:
        raise InputError(f"variant '{kind}' has attention outputs, not hidden states: it is read by "
                         "layerscope run attention")
    entry = manifest.variant(kind)
    if not entry:
        raise InputError(f"this export has no '{kind}' variant yet; make it with: layerscope optimize EXPORT_DIR "
                         f"--variant {kind}")
    return entry.file
