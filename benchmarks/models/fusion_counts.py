"""Which fusions apply to each family's exported graph (tiny random models; fusion patterns do not depend on size).

    python benchmarks/models/fusion_counts.py > benchmarks/models/results/fusion-counts.json

Per family: the exported graph's most common ops, what ONNX Runtime fuses by itself at session start
(ORT_ENABLE_ALL, CPU), and what its offline transformer optimizer reports for model types bert, gpt2
and qwen3 (the type onnxruntime 1.31 added for RoPE + grouped KV heads + RMSNorm).
"""
import sys, json, tempfile, collections
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))

from tiny_models import build_tiny_model
from layerscope.export.exporter import export_model
from layerscope.model.source import resolve_source
from layerscope.export.variant_files import quiet as _quiet
from onnxruntime.transformers.optimizer import optimize_model
from onnxruntime.transformers.fusion_options import FusionOptions
import onnx, onnxruntime as ort
d = Path(tempfile.mkdtemp())
res = {}
for fam in ["qwen2", "qwen3", "bert", "gpt2"]:
    src = build_tiny_model(fam, d / fam)
    out = d / (fam + "-x")
    m = export_model(resolve_source(str(src)), out, pooled=["mean"])
    cfg = json.loads((out / "config.json").read_text())
    heads = cfg.get("num_attention_heads") or cfg.get("n_head")
    row = {}
    g = onnx.load(str(out / "model.onnx"))
    row["graph_ops"] = dict(collections.Counter(n.op_type for n in g.graph.node).most_common(12))
    # what ORT itself fuses at session start (ORT_ENABLE_ALL, CPU)
    so = ort.SessionOptions(); so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    so.optimized_model_filepath = str(d / f"{fam}-ort.onnx")
    ort.InferenceSession(str(out / "model.onnx"), so, providers=["CPUExecutionProvider"])
    go = onnx.load(str(d / f"{fam}-ort.onnx"))
    c = collections.Counter(n.op_type for n in go.graph.node)
    row["ort_session_fused"] = {k: v for k, v in c.items() if k in ("Attention", "MultiHeadAttention", "GroupQueryAttention", "RotaryEmbedding", "SimplifiedLayerNormalization", "SkipSimplifiedLayerNormalization", "SkipLayerNormalization", "LayerNormalization", "FusedMatMul", "Gelu", "FastGelu", "BiasGelu", "QuickGelu", "MatMul", "Softmax", "Expand")}
    for mt in ["bert", "gpt2", "qwen3"]:
        try:
            with _quiet():
                o = optimize_model(str(out / "model.onnx"), model_type=mt, num_heads=heads, hidden_size=m.hidden_size, opt_level=0, use_gpu=False, optimization_options=FusionOptions(mt))
            row[f"optimizer_{mt}"] = {k: int(v) for k, v in o.get_fused_operator_statistics().items() if v}
        except Exception as e:
            row[f"optimizer_{mt}"] = f"{type(e).__name__}: {str(e)[:120]}"
    res[fam] = row
print(json.dumps(res, indent=1))
