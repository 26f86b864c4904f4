"""An export made on a CPU with bf16 compute records OpenVINO bf16's accuracy, so ``--engine auto`` can pick
it unasked; ``auto`` follows the recorded accuracy, and the bench's default rows include it there."""

from __future__ import annotations

import json

import pytest

from cli_helpers import run_cli
from layerscope.export import cpu_precision

pytest.importorskip("openvino")


def _auto_note(export_dir, **options):
    from layerscope.engines.base import create_engine
    from layerscope.model.handle import ModelHandle

    engine = create_engine("auto", ModelHandle.resolve(str(export_dir)), **options)
    note = next(n for n in engine.info.notes if n.startswith("auto picked"))
    engine.close()
    return note


def test_export_records_ov_bf16_on_a_bf16_cpu_and_auto_picks_it(tiny_model, tmp_path, capsys, monkeypatch):
    if cpu_precision.bf16_cpu():
        pytest.skip(cpu_precision.bf16_cpu())
    monkeypatch.setenv("LAYERSCOPE_HOME", str(tmp_path / "home"))  # no bench speeds of this machine
    out = tmp_path / "exp"
    code, text = run_cli(["-v", "export", str(tiny_model("bert")), "--out", str(out)], capsys)
    assert code == 0, text
    assert "ov-bf16 recorded (OpenVINO bf16 on this CPU): worst cosine to PyTorch fp32 0.99" in text
    entry = json.loads((out / "manifest.json").read_text())["variants"]["ov-bf16"]
    assert entry["compiled_precision"].lower().startswith("bf16")
    worst = min(s["min_cos"] for s in entry["parity"]["outputs"].values())
    # the bar between what bf16 reached and 1: auto takes it; above what it reached: auto passes over it
    assert "auto picked ov bf16" in _auto_note(out, min_cosine=worst - 1e-6)
    above = _auto_note(out, min_cosine=min(1.0, worst + 1e-6))
    assert "auto picked ov bf16" not in above and f"ov bf16: min cosine {worst:.6f} <" in above


def test_no_record_where_the_cpu_has_no_bf16(tiny_model, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(cpu_precision, "bf16_cpu", lambda: "this CPU has no bf16 compute (OpenVINO reports FP32)")
    out = tmp_path / "exp"
    code, text = run_cli(["-v", "export", str(tiny_model("bert")), "--out", str(out)], capsys)
    assert code == 0, text
    assert "ov-bf16 not recorded: this CPU has no bf16 compute (OpenVINO reports FP32)" in text
    assert "ov-bf16" not in json.loads((out / "manifest.json").read_text()).get("variants", {})


@pytest.mark.parametrize("cpu", ["bf16", "fp32"])
def test_an_export_says_nothing_of_openvino_unless_asked(cpu, tiny_model, tmp_path, capsys, monkeypatch):
    """The check runs for --engine auto either way; without -v the user who never named OpenVINO reads no
    line about it (recorded, not recorded, compiling)."""
    calls = []

    def record(*args, **kw):
        calls.append(kw)
        if cpu == "fp32":
            return ["ov-bf16 not recorded: this CPU has no bf16 compute (OpenVINO reports FP32)"]
        if kw.get("progress"):
            kw["progress"]("compiling model.onnx with OpenVINO (bf16)")
        return ["ov-bf16 recorded (OpenVINO bf16 on this CPU): worst cosine to PyTorch fp32 0.999900"]

    monkeypatch.setattr(cpu_precision, "record_cpu_precisions", record)
    code, text = run_cli(["export", str(tiny_model("bert")), "--out", str(tmp_path / "e")], capsys)
    assert code == 0, text
    assert len(calls) == 1 and "openvino" not in text.lower() and "ov-bf16" not in text, text
    code, text = run_cli(["-v", "export", str(tiny_model("bert")), "--out", str(tmp_path / "v")], capsys)
    assert code == 0 and "ov-bf16" in text


def test_no_cpu_precisions_flag_skips_the_check(tiny_model, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(cpu_precision, "record_cpu_precisions", lambda *a, **k: pytest.fail("must not run"))
    code, text = run_cli(["export", str(tiny_model("bert")), "--out", str(tmp_path / "e"), "--no-cpu-precisions"],
                         capsys)
    assert code == 0, text


def test_bench_default_rows_follow_the_cpu(monkeypatch):
    from layerscope.bench.runner import parse_engines

    monkeypatch.setattr(cpu_precision, "bf16_cpu", lambda: None)
    assert parse_engines("default") == ["ort", "ort-int8", "ov", "ov-x2", "ov-bf16", "ov-bf16-x2"]
    monkeypatch.setattr(cpu_precision, "bf16_cpu", lambda: "no bf16")
    assert parse_engines("default") == ["ort", "ort-int8", "ov", "ov-x2"]


def test_engines_table_says_what_auto_picks_for_a_fresh_export():
    """An export made on a CPU with bf16 compute records ov-bf16, so the table must not promise ort there."""
    from layerscope.engines.probe import EngineStatus, _auto_detail

    base = [EngineStatus("ort", True, "onnxruntime"), EngineStatus("torch", True, "PyTorch")]
    with_bf16 = _auto_detail(base + [EngineStatus("ov", True, "OpenVINO on CPU (BF16, FP32; bf16 too)")], None)
    # ov at fp32 runs the export's own graph (the export's parity) and is declared ahead of ort at fp32
    assert with_bf16.startswith("picks ov bf16 here for a fresh export") and "else ov;" in with_bf16
    without = _auto_detail(base + [EngineStatus("ov", True, "OpenVINO on CPU (FP32; no bf16 on this CPU)",
                                                ("bf16",))], None)
    assert without.startswith("picks ov here for a fresh export")
    # what the engine can run here is its typed answer, not words in its detail line
    typed = _auto_detail(base + [EngineStatus("ov", True, "OpenVINO on CPU", ("bf16",))], None)
    assert typed.startswith("picks ov here for a fresh export")
    no_ov = _auto_detail(base + [EngineStatus("ov", False, "openvino is not installed")], None)
    assert no_ov.startswith("picks ort here for a fresh export")
