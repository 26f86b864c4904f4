"""A big model is loaded and traced in a child process (its memory goes back to the OS when it exits):
the export equals the in-process one bit for bit, and a child's failure is one clear line."""

from __future__ import annotations

import json

import numpy as np
import pytest

from layerscope.errors import ExportError, ModelNotFoundError
from layerscope.export import exporter
from layerscope.export.exporter import checkpoint_weight_bytes, export_model, trace_in_child
from layerscope.model.source import resolve_source
from hang_guard import HANG_S  # noqa: E402


def test_weight_bytes_from_the_safetensors_headers(tiny_model):
    import torch
    from safetensors.torch import load_file

    src = resolve_source(str(tiny_model("qwen2")))
    tensors = load_file(str(tiny_model("qwen2") / "model.safetensors"))
    numel = sum(t.numel() for t in tensors.values())
    assert checkpoint_weight_bytes(src, "fp32") == 4 * numel  # by hand: every tensor's elements x 4 bytes
    assert checkpoint_weight_bytes(src, "fp16") == 2 * numel
    assert all(t.dtype == torch.float32 for t in tensors.values())


def test_child_trace_equals_the_in_process_export(tiny_model, tmp_path, monkeypatch):
    """Catches: the child tracing with other arguments (threshold, dtype, opset) than the parent asked for,
    files not landing in the staging directory, and the parent going on before the child finished."""
    monkeypatch.setattr(exporter, "EXTERNAL_DATA_BYTES", 10_000)  # streamed, in both
    monkeypatch.setattr(exporter, "TRACE_IN_CHILD_BYTES", None)
    said_in = []
    here = export_model(resolve_source(str(tiny_model("qwen2"))), tmp_path / "here", pooled=["mean"], progress=said_in.append)
    monkeypatch.setattr(exporter, "TRACE_IN_CHILD_BYTES", 10_000)
    said = []
    child = export_model(resolve_source(str(tiny_model("qwen2"))), tmp_path / "child", pooled=["mean"], progress=said.append)
    assert any("in a child process" in s for s in said) and not any("in a child process" in s for s in said_in)
    assert child.external_data is here.external_data is True
    assert (tmp_path / "child" / "model.onnx_data").read_bytes() == (tmp_path / "here" / "model.onnx_data").read_bytes()
    assert child.parity.outputs.keys() == here.parity.outputs.keys()
    for name, stats in here.parity.outputs.items():
        np.testing.assert_allclose(child.parity.outputs[name].max_abs, stats.max_abs, rtol=0, atol=0)
    assert json.loads((tmp_path / "child" / "manifest.json").read_text())["outputs"] == here.to_dict()["outputs"]


def test_a_child_killed_by_the_kernel_is_one_clear_error(tmp_path):
    with pytest.raises(ExportError, match="killed by the kernel, most likely out of memory.*4 GB of free memory"):
        from trace_child_helpers import killed_by_the_kernel

        trace_in_child({}, tmp_path, 2_000_000_000, target=killed_by_the_kernel)


def test_an_error_in_the_child_comes_back_as_the_same_error(tmp_path, monkeypatch):
    nowhere = str(tmp_path / "nowhere")
    trace = dict(source=dict(spec=nowhere, path_or_id=nowhere, is_local=True), family="qwen2", num_layers=2, dtype="fp32", opset=17,
                 trust_remote_code=False, threshold=10_000)
    with pytest.raises(ModelNotFoundError, match="nowhere"):
        trace_in_child(trace, tmp_path, 1)


def test_fp32_tolerance_grows_with_the_outputs_scale_by_hand():
    """Catches: an absolute-only tolerance refusing a deep decoder whose layer-35 values reach the hundreds
    (1.6e-4 apart with cosine 1.000000), and a tolerance that is not recorded per output."""
    from layerscope.export.exporter import FP32_RTOL, fp32_worst

    parity = {"outputs": {
        "hidden_states.35": {"max_abs": 1.59e-4, "min_cos": 1.0, "ref_max_abs": 120.0},  # tol 1e-4 + 1.2e-3
        "hidden_states.1": {"max_abs": 9e-5, "min_cos": 1.0, "ref_max_abs": 2.0},  # tol 1e-4 + 2e-5 = 1.2e-4
        "raw_embeddings": {"max_abs": 0.0, "min_cos": 1.0, "ref_max_abs": 0.1}}}
    name, worst = fp32_worst(parity, 1e-4)
    assert FP32_RTOL == 1e-5 and parity["tolerance_rel"] == 1e-5
    assert parity["outputs"]["hidden_states.35"]["tolerance"] == pytest.approx(1.3e-3)
    assert parity["outputs"]["hidden_states.1"]["tolerance"] == pytest.approx(1.2e-4)
    assert name == "hidden_states.1" and worst["max_abs"] <= worst["tolerance"]  # 9e-5/1.2e-4 = 0.75 > 0.12
    parity["outputs"]["hidden_states.1"]["max_abs"] = 1.3e-4  # over 1.2e-4: refused
    name, worst = fp32_worst(parity, 1e-4)
    assert name == "hidden_states.1" and not worst["max_abs"] <= worst["tolerance"]
    parity["outputs"]["raw_embeddings"]["max_abs"] = float("nan")  # NaN is always the worst, and refused
    name, worst = fp32_worst(parity, 1e-4)
    assert name == "raw_embeddings" and not worst["max_abs"] <= worst["tolerance"]


def test_weights_under_the_external_data_limit_stream_in_a_child_from_their_own_threshold(tiny_model, tmp_path,
                                                                                          monkeypatch):
    """A model below the 2 GiB external-data limit but over ``lean.STREAM_BYTES`` (GPT-2-medium's 1.42 GB) is
    traced in a child and streamed, not held twice by torch.onnx in this process. Catches: the streamed path
    keyed on the external-data limit alone, and the child threshold left at that limit."""
    from layerscope.export import lean

    weights = checkpoint_weight_bytes(resolve_source(str(tiny_model("qwen2"))), "fp32")
    assert exporter.EXTERNAL_DATA_BYTES > weights  # the external-data limit alone would take the ordinary path
    calls = []
    real = lean.attach_weights
    monkeypatch.setattr(lean, "attach_weights", lambda *a, **k: calls.append(1) or real(*a, **k))
    monkeypatch.setattr(lean, "STREAM_BYTES", weights - 1)
    monkeypatch.setattr(exporter, "TRACE_IN_CHILD_BYTES", None)  # in-process, so the spy sees the call
    manifest = export_model(resolve_source(str(tiny_model("qwen2"))), tmp_path / "streamed", pooled=["mean"])
    assert calls == [1] and manifest.external_data is True
    monkeypatch.setattr(lean, "STREAM_BYTES", 2 * weights)  # over the weights and buffers in memory
    manifest = export_model(resolve_source(str(tiny_model("qwen2"))), tmp_path / "ordinary", pooled=["mean"])
    assert calls == [1] and manifest.external_data is False


def test_a_gpt2_medium_checkpoint_streams_in_a_child_by_default():
    """GPT-2-medium: 354,823,168 parameters (24 x 12,596,224 per block + 52,511,744 token and position embeddings + 2,048 final
    norm), 4 bytes each in fp32; its export must take the child process and the streamed path by default."""
    from layerscope.export import lean

    weights = 4 * (24 * 12_596_224 + 50_257 * 1_024 + 1_024 * 1_024 + 2_048)
    assert weights == 4 * 354_823_168 < exporter.EXTERNAL_DATA_BYTES
    assert exporter.TRACE_IN_CHILD_BYTES is not None and weights >= exporter.TRACE_IN_CHILD_BYTES
    assert weights >= exporter.stream_threshold() == lean.STREAM_BYTES


def test_a_script_without_a_main_guard_exports_through_the_child(tiny_model, tmp_path):
    """A user's script calling export_model at top level (no ``if __name__ == "__main__":``): the spawned child
    must not run the script again. Catches: the child re-running it and dying in multiprocessing's
    bootstrapping check, reported as a failed export."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    script = tmp_path / "user_script.py"
    script.write_text("from layerscope.export import exporter\n"
                      "from layerscope.model.source import resolve_source\n"
                      "exporter.TRACE_IN_CHILD_BYTES = 1\n"
                      f"exporter.export_model(resolve_source({str(tiny_model('bert'))!r}), {str(tmp_path / 'out')!r}, "
                      "pooled=['mean'])\n"
                      "print('EXPORTED')\n")
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2] / "src")}
    done = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=HANG_S)
    assert done.returncode == 0 and done.stdout.count("EXPORTED") == 1, done.stderr[-2000:]
    assert json.loads((tmp_path / "out" / "manifest.json").read_text())["parity"]["outputs"]
