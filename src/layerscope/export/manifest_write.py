"""The manifest an export writes: its saved tokenizer's facts, the recorded versions and files, and the fp32 parity
verdict (each output's tolerance and the worst output)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

import layerscope
from layerscope.export import external
from layerscope.export.graph import opset_of
from layerscope.export.validate import VALIDATION_TEXTS
from layerscope.hashing import file_sha256
from layerscope.model.manifest import FORMAT_VERSION, ONNX_FILE
from layerscope.model.manifest_type import Manifest

FP32_RTOL = 1e-5  # fp32 outputs: |onnx - torch| <= atol + FP32_RTOL x the output's largest |value| (recorded)


def save_tokenizer(source, work: Path, trust_remote_code: bool, max_length: int) -> dict[str, Any]:
    """Save the tokenizer; say whether the ``tokenizers``-only path reproduces it exactly."""
    from layerscope.model.source import load_tokenizer
    from layerscope.model.fast_tokenizer import FastTokenizer, matches_hf, special_ids

    tok = load_tokenizer(source, trust_remote_code=trust_remote_code)
    tok.save_pretrained(str(work))
    ids = special_ids(tok)
    fast_ok = False
    if (work / "tokenizer.json").exists() and getattr(tok, "is_fast", False):
        try:
            fast = FastTokenizer(work / "tokenizer.json", ids)
            texts = VALIDATION_TEXTS + ["", "   ", "x " * (max_length + 10)]
            fast_ok = matches_hf(fast, tok, texts, (8, max_length))
        except Exception:  # any doubt keeps the Hugging Face tokenizer at run time
            fast_ok = False
    return {"fast": fast_ok, "special_ids": ids}


def build_manifest(model: Manifest, onnx_info, pooled_modes, parity, opset, atol, seconds,
                   work: Path) -> dict[str, Any]:
    """The manifest of the export in ``work`` (not yet written): the model's facts, the ONNX file's outputs,
    hashes and sizes, the parity verdict and the versions that made it."""
    import onnxruntime

    import torch
    import transformers

    manifest = model.to_dict()
    manifest.update({
        "format_version": FORMAT_VERSION,
        "layerscope_version": layerscope.__version__,
        "onnx_file": ONNX_FILE,
        "onnx_sha256": file_sha256(work / ONNX_FILE),
        "external_data": onnx_info["external_data"],
        "onnx_bytes": sum(f.stat().st_size for f in [work / ONNX_FILE, *external.data_files(work / ONNX_FILE)]),
        "inputs": onnx_info["inputs"],
        "outputs": onnx_info["outputs"],
        "pooled_modes": pooled_modes,
        "pooled_layers": onnx_info["pooled_layers"],
        "dtype": "float32",
        "precision": "fp32",
        "opset": opset,
        "parity": {"tolerance_abs": atol, **parity},
        "export_seconds": round(seconds, 2),
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__,
                     "optimum": _dist_version("optimum"), "optimum-onnx": _dist_version("optimum-onnx"), "onnxruntime": onnxruntime.__version__,
                     "numpy": np.__version__},
    })
    return manifest


def _dist_version(name: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(name)
    except PackageNotFoundError:
        return "not installed"


def fp32_worst(parity: dict[str, Any], atol: float, rtol: float = FP32_RTOL) -> tuple[str, dict[str, Any]]:
    """Record each output's fp32 tolerance in ``parity`` and return the output furthest over (or nearest) it.

    Deep decoders' hidden states grow to magnitudes in the hundreds, where float32 summed in another order
    differs by 1e-4 with cosine 1.000000 (Qwen2.5-3B shape, layer 35: 1.6e-4): the absolute ``atol`` alone
    would refuse a correct graph, so the tolerance grows with the output's own scale, and says so."""
    parity["tolerance_rel"] = rtol
    for stats in parity["outputs"].values():
        stats["tolerance"] = atol + rtol * float(stats.get("ref_max_abs") or 0.0)
    return max(parity["outputs"].items(),
               key=lambda kv: float("inf") if np.isnan(kv[1]["max_abs"]) else kv[1]["max_abs"] / kv[1]["tolerance"])


def opset_of_file(path: Path) -> int:
    import onnx

    return opset_of(onnx.load(str(path), load_external_data=False))
