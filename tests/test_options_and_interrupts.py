"""Options checked before anything is written; failed extractions leave nothing behind; NUL bytes are
counted; Ctrl-C exits 130 with how far the run got, and --resume finishes it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from layerscope.errors import InputError
from layerscope.extraction.pipeline import embed, extract
from layerscope.store.store import LayerStore
from cli_helpers import run_cli as cli
from hang_guard import HANG_S  # noqa: E402

WORDS = "the cat dog man woman bites sees a quick brown fox over lazy river runs".split()


def corpus(n: int, seed: int = 0) -> list[str]:
    rng = np.random.default_rng(seed)
    return [" ".join(rng.choice(WORDS, size=int(rng.integers(1, 40)))) for _ in range(n)]


# ---------------------------------------------------------------- options

@pytest.mark.parametrize("option, needle", [
    (["--max-length", "0"], "--max-length must be at least 1"),
    (["--max-length", "100000"], "--max-length 100000 is above what"),
    (["--batch-tokens", "0"], "--batch-tokens must be at least 1"),
    (["--batch-tokens", "-5"], "--batch-tokens must be at least 1"),
    (["--max-batch", "0"], "--max-batch must be at least 1"),
    (["--max-batch", "-1"], "--max-batch must be at least 1"),
    (["--threads", "0"], "--threads must be at least 1"),
])
def test_extract_checks_options_before_writing_anything(option, needle, bert_export, tmp_path, capsys):
    path = tmp_path / "c.txt"
    path.write_text("a\nb\n", encoding="utf-8")
    out = tmp_path / "never"
    code, text = cli(["extract", "--model", bert_export, "--engine", "ort", "--input", path, "--out", out] + option,
                     capsys)
    assert code == 2 and "Traceback" not in text, text
    assert needle in " ".join(text.split()), text
    assert not out.exists()


def test_max_length_at_the_model_limit_is_accepted(bert_export, tmp_path):
    from layerscope.model.manifest import read_manifest

    limit = read_manifest(bert_export).max_length
    assert extract(bert_export, ["a b c"], tmp_path / "s", engine="ort", max_length=limit).n == 1
    with pytest.raises(InputError, match=f"use at most {limit}"):
        extract(bert_export, ["a b c"], tmp_path / "t", engine="ort", max_length=limit + 1)


@pytest.mark.parametrize("kw, needle", [
    ({"batch_tokens": 0}, "--batch-tokens"), ({"batch_tokens": -3}, "--batch-tokens"),
    ({"max_length": 0}, "--max-length"), ({"max_length": 10 ** 6}, "above what"),
    ({"engine_options": {"threads": 0}}, "--threads"),
])
def test_embed_checks_options(kw, needle, bert_export):
    with pytest.raises(InputError, match=needle):
        embed(bert_export, ["a cat"], engine="ort", **kw)


@pytest.mark.parametrize("option, needle", [
    (["--threads", "0"], "--threads"), (["--batch-tokens", "0"], "--batch-tokens"),
    (["--max-batch", "-2"], "--max-batch"),
])
def test_bench_checks_options(option, needle, bert_export, tmp_path, capsys):
    code, text = cli(["bench", "--model", bert_export, "--synthetic", "4", "--engines", "ort",
                      "--out", tmp_path / "b"] + option, capsys)
    assert code == 2 and needle in text and "Traceback" not in text, text
    assert not (tmp_path / "b").exists()


# ---------------------------------------------------------------- failed extractions leave nothing

def test_bad_input_while_spooling_leaves_no_directory(bert_export, tmp_path):
    bad = tmp_path / "c.jsonl"
    bad.write_text('{"text": "a"}\n{"text": "b"}\n{"text": \n', encoding="utf-8")
    out = tmp_path / "deep" / "store"
    with pytest.raises(InputError, match="line 3"):
        extract(bert_export, str(bad), out, engine="ort")
    assert not out.exists()
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(InputError):
        extract(bert_export, str(bad), empty, engine="ort")
    assert empty.is_dir() and not any(empty.iterdir())  # it was there before: kept, and empty again


def _failing_engine(bert_export, after: int):
    from layerscope.engines.base import create_engine
    from layerscope.model.handle import ModelHandle

    eng = create_engine("ort", ModelHandle.resolve(bert_export))
    real = eng.run
    calls = {"n": 0}

    def run(batch, layers, poolings):
        calls["n"] += 1
        if calls["n"] > after:
            raise RuntimeError("engine fell over")
        return real(batch, layers, poolings)

    eng.run = run
    return eng


def test_engine_error_before_any_row_leaves_no_directory(bert_export, tmp_path):
    out = tmp_path / "store"
    with pytest.raises(RuntimeError, match="fell over"):
        extract(bert_export, corpus(50), out, engine=_failing_engine(bert_export, 0))
    assert not out.exists()
    assert not list(tmp_path.glob("*partial*"))


def test_engine_error_after_some_rows_keeps_a_resumable_store(bert_export, tmp_path):
    texts = corpus(200, seed=3)
    out = tmp_path / "store"
    with pytest.raises(RuntimeError, match="fell over"):
        extract(bert_export, texts, out, engine=_failing_engine(bert_export, 5), batch_tokens=64)
    kept = int(LayerStore.open(out, allow_incomplete=True).done_mask().sum())
    assert 0 < kept < 200
    report = extract(bert_export, texts, out, engine="ort", batch_tokens=64, resume=True)
    assert report.resumed_rows == kept and LayerStore.open(out).complete


# ---------------------------------------------------------------- NUL bytes

@pytest.mark.parametrize("family, fate, same", [("bert", "drops them", True), ("gpt2", "encodes them as tokens", False)])
def test_nul_bytes_are_counted_and_kept(family, fate, same, tiny_export, tmp_path):
    export = tiny_export(family, pooled=["mean"], to=tmp_path / "exp")
    texts = ["ab cd", "a\x00b cd", "plain text", "x\x00\x00y"]
    report = extract(export, texts, tmp_path / "s", engine="ort", poolings=["mean"])
    warning = next(w for w in report.warnings if "NUL" in w)
    assert warning.startswith("2 of 4 texts contain NUL bytes") and fate in warning
    store = LayerStore.open(tmp_path / "s")
    assert store.texts() == texts  # kept as is
    v = store["mean", -1]
    assert np.allclose(v[0], v[1], atol=1e-6) is same  # what the warning says happens to the vectors


def test_nul_warning_reaches_the_command_line(bert_export, tmp_path, capsys):
    path = tmp_path / "c.jsonl"
    path.write_text('{"text": "a\\u0000b"}\n{"text": "c"}\n', encoding="utf-8")
    code, text = cli(["extract", "--model", bert_export, "--engine", "ort", "--input", path, "--out", tmp_path / "s",
                      "--text-field", "text"], capsys)
    assert code == 0, text
    assert "1 of 2 texts contain NUL bytes" in " ".join(text.split())


# ---------------------------------------------------------------- Ctrl-C

def test_ctrl_c_during_extract_exits_130_and_resume_finishes(bert_export, tmp_path):
    texts = corpus(4000, seed=5)
    path = tmp_path / "c.txt"
    path.write_text("\n".join(texts) + "\n", encoding="utf-8")
    out = tmp_path / "interrupted"
    cmd = [sys.executable, "-m", "layerscope", "extract", "--model", str(bert_export), "--engine", "ort",
           "--input", str(path), "--out", str(out), "--batch-tokens", "64", "--pooling", "mean", "--threads", "1"]
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[1] / "src"))
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 120
    while time.time() < deadline and proc.poll() is None:
        done = out / "done.npy"
        if done.exists():
            try:
                if int(np.load(done, mmap_mode="r").sum()) > 0:
                    break
            except (ValueError, OSError):
                pass
        time.sleep(0.05)
    assert proc.poll() is None, "the run finished before it could be interrupted"
    proc.send_signal(signal.SIGINT)
    stdout, stderr = proc.communicate(timeout=HANG_S)
    assert proc.returncode == 130, (stdout, stderr)
    kept = int(LayerStore.open(out, allow_incomplete=True).done_mask().sum())
    assert 0 < kept < 4000
    assert f"interrupted: {kept:,} of 4,000 rows done; continue with --resume" in " ".join(stderr.split()), stderr
    assert "Traceback" not in stderr
    report = extract(bert_export, str(path), out, engine="ort", poolings=["mean"], batch_tokens=64, resume=True)
    assert report.resumed_rows == kept
    reference = extract(bert_export, str(path), tmp_path / "ref", engine="ort", poolings=["mean"],
                        batch_tokens=64).store
    resumed = LayerStore.open(out)
    assert resumed.texts() == reference.texts() and resumed.ids() == reference.ids()
    for layer in reference.layers:
        np.testing.assert_allclose(resumed["mean", layer], reference["mean", layer], rtol=0, atol=1e-6)


def test_other_commands_interrupted_exit_130(capsys):
    import layerscope.cli as cli_module

    def wait_for_test():
        raise KeyboardInterrupt

    cli_module.app.command("wait-for-test")(wait_for_test)
    code, text = cli(["wait-for-test"], capsys)
    assert code == 130 and "interrupted" in text and "Traceback" not in text


def test_sigterm_during_extract_is_handled_like_ctrl_c(bert_export, tmp_path):
    texts = corpus(4000, seed=6)
    path = tmp_path / "c.txt"
    path.write_text("\n".join(texts) + "\n", encoding="utf-8")
    out = tmp_path / "terminated"
    cmd = [sys.executable, "-m", "layerscope", "extract", "--model", str(bert_export), "--engine", "ort",
           "--input", str(path), "--out", str(out), "--batch-tokens", "64", "--pooling", "mean", "--threads", "1"]
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[1] / "src"))
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 120
    while time.time() < deadline and proc.poll() is None:
        try:
            if int(np.load(out / "done.npy", mmap_mode="r").sum()) > 0:
                break
        except (ValueError, OSError):
            pass
        time.sleep(0.05)
    assert proc.poll() is None, "the run finished before it could be terminated"
    proc.send_signal(signal.SIGTERM)
    stdout, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 143, (stdout, stderr)
    kept = int(LayerStore.open(out, allow_incomplete=True).done_mask().sum())
    assert 0 < kept < 4000
    assert f"interrupted: {kept:,} of 4,000 rows done; continue with --resume" in " ".join(stderr.split()), stderr
    assert "Traceback" not in stderr
    report = extract(bert_export, str(path), out, engine="ort", poolings=["mean"], batch_tokens=64, resume=True)
    assert report.resumed_rows == kept and report.store.complete
