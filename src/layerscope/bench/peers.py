"""sentence-transformers backends as bench peers: what each needs, and its ONNX files made once.

sentence-transformers 5.x loads ``backend="onnx"`` from ``onnx/model.onnx`` inside
the model folder; a local folder without it is exported by Optimum on load
(offline is fine) and nothing is saved unless ``save_pretrained`` is called.
The O3 and int8 files are made with its own ``export_optimized_onnx_model`` and
``export_dynamic_quantized_onnx_model``.  The installed model folder is never
written to: it is copied into ``<export>/peers/sentence-transformers`` (made by
layerscope, re-made with the bench's ``--force``) and the files go there.

Run as ``python -m layerscope.bench.peers MODEL_DIR PEER_DIR QUANT_CONFIG [--trust-remote-code]`` so the
export's torch/ONNX Runtime state stays out of the bench's parent process.  The model's own code (its
``.py`` files) is copied and run only with the user's ``--trust-remote-code``.
"""

from __future__ import annotations

import importlib.util
import shutil
import sys
from pathlib import Path
from typing import Any

PEERS: dict[str, dict[str, Any]] = {
    "st-torch": {"backend": "torch", "file": None, "precision": "fp32"},
    "st-onnx": {"backend": "onnx", "file": "onnx/model.onnx", "precision": "fp32"},
    "st-onnx-O3": {"backend": "onnx", "file": "onnx/model_O3.onnx", "precision": "fp32 (O3: GELU approximated)"},
    "st-onnx-qint8": {"backend": "onnx", "file": "quantized", "precision": "int8"},
    "st-openvino": {"backend": "openvino", "file": None, "precision": "fp32"},
    # on a CUDA GPU: what a sentence-transformers user runs there (model.half() on the GPU)
    "st-cuda-fp16": {"backend": "torch", "file": None, "precision": "fp16", "device": "cuda"},
}
PEER_DIR = Path("peers") / "sentence-transformers"


def quant_config(flags: set[str]) -> str:
    """sentence-transformers' dynamic-quantization preset for this CPU's vector units."""
    if "avx512_vnni" in flags:
        return "avx512_vnni"
    if "avx512f" in flags:
        return "avx512"
    if "avx2" in flags:
        return "avx2"
    return "arm64"


def missing(peer: str) -> str | None:
    """Why a peer cannot run in this environment, or None."""
    if importlib.util.find_spec("sentence_transformers") is None:
        return "sentence-transformers is not installed (pip install 'layerscope[compare]')"
    backend = PEERS[peer]["backend"]
    if PEERS[peer].get("device") == "cuda":
        import torch

        if not torch.cuda.is_available():
            return "needs a CUDA GPU, and PyTorch sees none here"
    if backend == "onnx" and (importlib.util.find_spec("optimum") is None
                              or importlib.util.find_spec("optimum.onnxruntime") is None):
        return "sentence-transformers' ONNX backend needs optimum[onnxruntime], which is not installed"
    if backend == "openvino" and (importlib.util.find_spec("optimum") is None
                                  or importlib.util.find_spec("optimum.intel") is None):
        return ("sentence-transformers' OpenVINO backend needs optimum-intel, which is not installed "
                "(see benchmarks/README.md)")
    return None


def quantized_file(peer_dir: Path) -> str | None:
    found = sorted((peer_dir / "onnx").glob("model_q*.onnx"))
    return f"onnx/{found[0].name}" if found else None


def prepare(model_dir: Path, peer_dir: Path, config: str, *, trust_remote_code: bool = False) -> None:
    """Copy the model folder and write onnx/model.onnx, model_O3.onnx and the dynamic int8 file
    (``trust_remote_code``: the model's own code comes along and runs)."""
    import logging

    from sentence_transformers import SentenceTransformer
    from sentence_transformers.backend import export_dynamic_quantized_onnx_model, export_optimized_onnx_model

    logging.getLogger("sentence_transformers").setLevel(logging.ERROR)
    if not (peer_dir / "modules.json").exists():
        tmp = peer_dir.with_name(peer_dir.name + ".partial")
        shutil.rmtree(tmp, ignore_errors=True)
        code = () if trust_remote_code else ("*.py",)
        shutil.copytree(model_dir, tmp, ignore=shutil.ignore_patterns("onnx", "openvino", "__pycache__", *code))
        tmp.rename(peer_dir)
    kwargs = {"model_kwargs": {"provider": "CPUExecutionProvider"}, "trust_remote_code": trust_remote_code}
    if not (peer_dir / "onnx" / "model.onnx").exists():
        model = SentenceTransformer(str(peer_dir), backend="onnx", device="cpu", **kwargs)
        model.save_pretrained(str(peer_dir))
    model = SentenceTransformer(str(peer_dir), backend="onnx", device="cpu", trust_remote_code=trust_remote_code,
                                model_kwargs={"provider": "CPUExecutionProvider", "file_name": "onnx/model.onnx"})
    if not (peer_dir / "onnx" / "model_O3.onnx").exists():
        export_optimized_onnx_model(model, "O3", str(peer_dir))
    if quantized_file(peer_dir) is None:
        export_dynamic_quantized_onnx_model(model, config, str(peer_dir))


if __name__ == "__main__":
    from layerscope.signals import child_start

    child_start()  # Ctrl-C is the bench's to answer: it stops this process
    prepare(Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3], trust_remote_code="--trust-remote-code" in sys.argv[4:])
