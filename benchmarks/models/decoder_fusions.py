"""Why ONNX Runtime is not faster than torch on Qwen-style decoders: fusions and speed per optimizer mode.

    python benchmarks/models/decoder_fusions.py EXPORT_DIR [--texts 64] [--repeat 3]

For an export (fp32, single file) this runs ONNX Runtime's transformer optimizer with each model type
that could apply to a Qwen2/Qwen3 graph ("bert": what `inspect optimize --variant opt` uses for the
family; "gpt2"; "qwen3": the type onnxruntime added for RoPE + grouped KV heads + RMSNorm), prints the
fused-operator counts the optimizer reports, and times plain ORT, each optimized graph and torch on
the same padded batches. Output: one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

import numpy as np

TEXT = "The committee reviewed the figures for the northern office and asked for a second count."


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("export_dir", type=Path)
    ap.add_argument("--texts", type=int, default=32)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    from onnxruntime.transformers.fusion_options import FusionOptions
    from onnxruntime.transformers.optimizer import optimize_model

    from layerscope.model.tokenize import Encoder
    from layerscope.vocab.layers import layer_names
    from layerscope.engines.ort import make_session
    from layerscope.model.handle import ModelHandle
    from layerscope.export.variant_files import quiet as _quiet

    handle = ModelHandle.resolve(args.export_dir)
    m = handle.manifest
    cfg = json.loads((args.export_dir / "config.json").read_text())
    texts = [" ".join([TEXT] * (1 + i % 3)) for i in range(args.texts)]
    enc = Encoder(handle.encoding_tokenizer(), m["inputs"], 256)(texts)
    feed = {k: enc.inputs[k] for k in m["inputs"]}
    tokens = int(enc.mask.sum())
    result = {"export": str(args.export_dir), "hidden": m["hidden_size"], "layers": m["num_layers"],
              "heads": cfg["num_attention_heads"], "kv_heads": cfg.get("num_key_value_heads"),
              "texts": len(texts), "tokens": tokens, "padded": int(enc.mask.size),
              "loadavg": open("/proc/loadavg").read().split()[:3], "runs": {}}

    def timed(session_path: Path) -> float:
        s = make_session(session_path, "CPUExecutionProvider")
        outs = ["pooled.mean"] if "pooled.mean" in [o.name for o in s.get_outputs()] else None
        s.run(outs, feed)
        best = float("inf")
        for _ in range(args.repeat):
            t = time.perf_counter()
            s.run(outs, feed)
            best = min(best, time.perf_counter() - t)
        return best

    result["runs"]["ort"] = {"seconds": timed(handle.onnx_path)}
    with tempfile.TemporaryDirectory() as tmp:
        for model_type in ("bert", "gpt2", "qwen3"):
            dst = Path(tmp) / f"{model_type}.onnx"
            try:
                with _quiet():
                    opt = optimize_model(str(handle.onnx_path), model_type=model_type,
                                         num_heads=cfg["num_attention_heads"], hidden_size=m["hidden_size"],
                                         opt_level=0, use_gpu=False, optimization_options=FusionOptions(model_type))
                stats = {k: int(v) for k, v in opt.get_fused_operator_statistics().items() if v}
                opt.save_model_to_file(str(dst))
                result["runs"][f"opt-{model_type}"] = {"fusions": stats, "seconds": timed(dst)}
            except Exception as exc:  # record why an optimizer mode fails; the study goes on
                result["runs"][f"opt-{model_type}"] = {"error": f"{type(exc).__name__}: {str(exc)[:200]}"}
    import torch

    from layerscope.engines.base import create_engine

    eng = create_engine("torch", handle)
    layers = layer_names(int(m["num_layers"]))
    eng.run(enc, layers, ["mean"])
    best = float("inf")
    for _ in range(args.repeat):
        t = time.perf_counter()
        eng.run(enc, layers, ["mean"])
        best = min(best, time.perf_counter() - t)
    result["runs"]["torch"] = {"seconds": best, "threads": torch.get_num_threads()}
    for r in result["runs"].values():
        if "seconds" in r:
            r["tokens_per_s"] = round(tokens / r["seconds"], 1)
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    main()
