"""The command line: one clear error line and a non-zero exit for bad input, never a traceback."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from layerscope.cli import main


def run_cli(args, capsys):
    with pytest.raises(SystemExit) as exc:
        main(args)
    out = capsys.readouterr()
    return exc.value.code, out.out + out.err


def ok_cli(args, capsys):
    try:
        main(args)
    except SystemExit as exc:
        assert exc.code in (0, None), capsys.readouterr()
    out = capsys.readouterr()
    return out.out + out.err


def assert_one_error_line(code, text, *needles):
    assert code == 2, text
    assert "Traceback" not in text
    errors = [line for line in text.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, text
    for needle in needles:
        assert needle in " ".join(text.split()), (needle, text)


def test_help_is_fast_and_lists_commands():
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[1] / "src"))
    out = subprocess.run([sys.executable, "-m", "layerscope", "--help"], capture_output=True, text=True, env=env)
    assert out.returncode == 0
    for command in ("export", "engines", "extract", "run", "report"):
        assert command in out.stdout
    probe = subprocess.run([sys.executable, "-c", "import sys, layerscope.cli; "
                            "print(sorted(m for m in ('torch','onnxruntime','faiss','matplotlib') if m in sys.modules))"],
                           capture_output=True, text=True, env=env)
    assert probe.stdout.strip() == "[]"  # heavy libraries are imported lazily


def test_missing_model_path(capsys, tmp_path):
    code, text = run_cli(["export", str(tmp_path / "nope"), "-o", str(tmp_path / "o")], capsys)
    assert_one_error_line(code, text, "does not exist", "minilm")


def test_unreachable_hub(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    code, text = run_cli(["export", "some-org/not-a-model", "-o", str(tmp_path / "o")], capsys)
    assert_one_error_line(code, text, "some-org/not-a-model", "local directory", "minilm")
    assert not (tmp_path / "o").exists()


def test_export_dir_whose_manifest_does_not_match(capsys, bert_export, tmp_path):
    import shutil

    broken = tmp_path / "broken"
    shutil.copytree(bert_export, broken)
    manifest = json.loads((broken / "manifest.json").read_text())
    manifest["outputs"]["hidden_states.99"] = ["batch_size", "sequence_length", 32]
    (broken / "manifest.json").write_text(json.dumps(manifest))
    corpus = tmp_path / "c.txt"
    corpus.write_text("a\n")
    code, text = run_cli(["extract", "--model", str(broken), "--input", str(corpus), "--out",
                          str(tmp_path / "s"), "--engine", "ort"], capsys)
    assert_one_error_line(code, text, "does not match its manifest", "hidden_states.99")
    shutil.copy(bert_export / "manifest.json", broken / "manifest.json")
    with open(broken / "model.onnx", "ab") as fh:
        fh.write(b"\0")
    code, text = run_cli(["extract", "--model", str(broken), "--input", str(corpus), "--out",
                          str(tmp_path / "s"), "--engine", "ort"], capsys)
    assert_one_error_line(code, text, "sha256")


def test_not_utf8_names_the_line(capsys, bert_export, tmp_path):
    corpus = tmp_path / "c.txt"
    corpus.write_bytes(b"fine\nalso fine\ncaf\xe9 latin-1\n")
    code, text = run_cli(["extract", "--model", str(bert_export), "--input", str(corpus), "--out",
                          str(tmp_path / "s"), "--engine", "ort"], capsys)
    assert_one_error_line(code, text, "line 3", "UTF-8")
    assert not (tmp_path / "s" / "store.json").exists()


def test_missing_column_lists_columns(capsys, bert_export, tmp_path):
    corpus = tmp_path / "c.csv"
    corpus.write_text("id,sentence\n1,hello\n")
    code, text = run_cli(["extract", "--model", str(bert_export), "--input", str(corpus), "--out",
                          str(tmp_path / "s"), "--engine", "ort"], capsys)
    assert_one_error_line(code, text, "sentence")
    text_out = ok_cli(["extract", "--model", str(bert_export), "--input", str(corpus), "--out",
                       str(tmp_path / "s"), "--engine", "ort", "--column", "sentence"], capsys)
    assert "extracted 1 texts" in text_out


def test_unavailable_engine_is_one_clear_line(capsys, bert_export, tmp_path):
    corpus = tmp_path / "c.txt"
    corpus.write_text("a\n")
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    import onnxruntime as ort

    # the GPU build lists the providers and fails to load them here; the CPU build (the default install)
    # does not have them at all and says which package brings them
    gpu_build = "CUDAExecutionProvider" in ort.get_available_providers()
    for engine in ("cuda", "trt"):
        code, text = run_cli(["extract", "--model", str(bert_export), "--input", str(corpus), "--out",
                              str(tmp_path / engine), "--engine", engine], capsys)
        if gpu_build:
            assert_one_error_line(code, text, "did not load")
        else:
            assert_one_error_line(code, text, "not in this onnxruntime build", "install onnxruntime-gpu")
        assert "EP Error" not in text and "Falling back" not in text
        assert not (tmp_path / engine).exists()  # nothing left behind


def test_engines_tells_the_truth_without_a_gpu(capsys):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    text = " ".join(ok_cli(["engines"], capsys).split())
    assert "ort │ yes" in text
    assert "cuda │ no" in text and "trt │ no" in text
    # a CPU engine on the export's fp32 graph (ov where OpenVINO starts, declared ahead of ort; else ort), or
    # OpenVINO bf16 where this CPU computes in bf16 (an export here records it)
    fp32 = "ov" if "ov │ yes" in text else "ort"
    assert f"picks {fp32} here" in text or ("picks ov bf16" in text and f"else {fp32};" in text)


def test_extract_summary_from_the_cli(capsys, bert_export, tmp_path):
    corpus = tmp_path / "c.jsonl"
    corpus.write_text('{"text": "a cat"}\n{"text": ""}\n{"text": "a dog"}\n')
    text = ok_cli(["extract", "--model", str(bert_export), "--input", str(corpus), "--out", str(tmp_path / "s"),
                   "--engine", "ort", "--pooling", "mean,cls", "--layers", "0,-1"], capsys)
    assert "1 of 3 texts are empty" in text
    assert "extracted 3 texts" in text and "CPUExecutionProvider" in text


def test_run_refuses_to_replace_a_directory_that_is_not_a_result(capsys, tmp_path):
    precious = tmp_path / "mine"
    precious.mkdir()
    (precious / "notes.txt").write_text("keep me")
    code, text = run_cli(["run", "compositionality", "--model", "minilm", "--out", str(precious)], capsys)
    assert_one_error_line(code, text, "layerscope did not make", "notes.txt")
    assert (precious / "notes.txt").read_text() == "keep me"


def test_usage_errors_and_unexpected_errors_are_one_line(capsys):
    code, text = run_cli(["extract", "--bogus"], capsys)
    assert code == 2 and "No such option: --bogus" in text and "Traceback" not in text
    import layerscope.cli as cli

    def boom():
        raise RuntimeError("boom")

    cli.app.command("boom-for-test")(boom)
    code, text = run_cli(["boom-for-test"], capsys)
    assert code == 1 and "internal error: RuntimeError: boom" in text and "Traceback" not in text


@pytest.mark.parametrize("args", [
    ["export", "{model}", "--out", "{tmp}/e", "--pooled", "eos"],
    ["extract", "--model", "{export}", "--input", "{tmp}/c.txt", "--out", "{tmp}/s", "--pooling", "eos"],
    ["run", "sts", "--model", "{export}", "--pooling", "eos", "--out", "{tmp}/r"],
], ids=["export", "extract", "run"])
def test_eos_pooling_without_a_pooled_output_is_the_same_line_everywhere(capsys, bert_export, tiny_model, tmp_path,
                                                                          args):
    """Catches: one of the three places (export, extraction, analyses) losing the check or its hint."""
    (tmp_path / "c.txt").write_text("a sentence\n")
    args = [a.format(model=tiny_model("bert"), export=bert_export, tmp=tmp_path) for a in args]
    code, text = run_cli(args, capsys)
    assert_one_error_line(code, text, "pooling 'eos' needs a model with its own pooled output (CLIP); bert has none",
                          "use 'last' or 'mean'")
    assert not any((tmp_path / d).exists() for d in ("e", "s", "r"))
