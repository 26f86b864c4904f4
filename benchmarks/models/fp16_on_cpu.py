"""What ONNX Runtime's CPU provider does with an fp16 export: the dtypes of the MatMul weights after session start.

    python benchmarks/models/fp16_on_cpu.py [EXPORT_DIR]

Without EXPORT_DIR a tiny random Qwen2 is exported in fp16 first (seconds). The session is created with
``optimized_model_filepath`` so the graph ORT actually runs is written out and read back: the script prints
the initializer dtypes before and after, and which dtype each MatMul's weight has in the graph that runs.
"""

from __future__ import annotations

import collections
import sys
import tempfile
from pathlib import Path

import onnx
import onnxruntime as ort

REPO = Path(__file__).resolve().parents[2]


def dtypes(graph: onnx.GraphProto) -> dict[str, int]:
    return dict(collections.Counter(onnx.TensorProto.DataType.Name(i.data_type) for i in graph.initializer))


def main() -> None:
    tmp = Path(tempfile.mkdtemp())
    if len(sys.argv) > 1:
        export_dir = Path(sys.argv[1])
    else:
        sys.path.insert(0, str(REPO / "tests"))
        from tiny_models import build_tiny_model

        from layerscope.export.exporter import export_model
        from layerscope.model.source import resolve_source

        export_dir = tmp / "export"
        export_model(resolve_source(str(build_tiny_model("qwen2", tmp / "model", seed=0))), export_dir, dtype="fp16")
    before = onnx.load(str(export_dir / "model.onnx"), load_external_data=False)
    so = ort.SessionOptions()
    so.optimized_model_filepath = str(tmp / "optimized.onnx")
    so.add_session_config_entry("session.optimized_model_external_initializers_file_name", "optimized.onnx_data")
    ort.InferenceSession(str(export_dir / "model.onnx"), so, providers=["CPUExecutionProvider"])
    after = onnx.load(str(tmp / "optimized.onnx"), load_external_data=False)
    kinds = {i.name: onnx.TensorProto.DataType.Name(i.data_type) for i in after.graph.initializer}
    weights = collections.Counter(kinds.get(n.input[1], "computed") for n in after.graph.node
                                  if n.op_type in ("MatMul", "FusedMatMul", "Gemm"))
    print(f"export {export_dir}: initializers {dtypes(before.graph)}")
    print(f"graph ONNX Runtime runs (CPU): initializers {dtypes(after.graph)}")
    print(f"MatMul/FusedMatMul/Gemm second input: {dict(weights)}")


if __name__ == "__main__":
    main()
