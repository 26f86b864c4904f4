"""The manifest an export writes: its saved tokenizer's facts and the recorded versions, files and parity."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

import layerscope
from layerscope.export import external
from layerscope.export.validate import VALIDATION_TEXTS
from layerscope.hashing import file_sha256
from layerscope.model.manifest import FORMAT_VERSION, ONNX_FILE
from layerscope.model.manifest_type import Manifest


def _save_tokenizer(source, work: Path, trust_remote_code: bool, max_length: int) -> dict[str, Any]:
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


def _manifest(model: Manifest, onnx_info, pooled_modes, parity, opset, atol, seconds, work: Path) -> dict[str, Any]:
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
