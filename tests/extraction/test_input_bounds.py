"""Reading a corpus holds memory flat whatever the source: a device is refused, a pipe that never ends a line
is refused at the line bound, and a very long line is cut to what the model can read before it is tokenized
(with the same vectors as the whole line). Peak memory is measured on real processes (psutil)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import psutil
import pytest

from cli_helpers import run_cli as cli
from layerscope.extraction.pipeline import embed

SRC = str(Path(__file__).resolve().parents[2] / "src")
MiB = 2 ** 20


def _peak(cmd: list[str], *, stdin=None, kill_above: int, timeout: float = 120) -> tuple[int | None, int, str]:
    """(exit code, peak RSS of the process and its children, stderr); the process is killed once its RSS
    passes ``kill_above`` bytes (exit code None then), so a run that would grow without end fails fast."""
    env = dict(os.environ, PYTHONPATH=SRC)
    proc = subprocess.Popen(cmd, stdin=stdin, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    ps = psutil.Process(proc.pid)
    top, t0, killed = 0, time.time(), False
    while proc.poll() is None:
        try:
            rss = sum(p.memory_info().rss for p in [ps, *ps.children(recursive=True)])
        except psutil.Error:
            rss = 0
        top = max(top, rss)
        if top > kill_above or time.time() - t0 > timeout:
            proc.kill()
            killed = True
            break
        time.sleep(0.02)
    _, err = proc.communicate(timeout=60)
    return (None if killed else proc.returncode), top, err.decode("utf-8", "replace")


def _extract(model, source: str, out: Path) -> list[str]:
    return [sys.executable, "-m", "layerscope", "extract", "--model", str(model), "--engine", "torch",
            "--input", source, "--out", str(out), "--pooling", "mean"]


@pytest.fixture(scope="module")
def baseline(tiny_model, tmp_path_factory) -> int:
    """Peak RSS of a two-line extraction: what the interpreter, torch and the model cost alone."""
    where = tmp_path_factory.mktemp("baseline")
    (where / "c.txt").write_text("a cat\nthe dog runs\n", encoding="utf-8")
    code, top, err = _peak(_extract(tiny_model("bert"), str(where / "c.txt"), where / "s"), kill_above=4096 * MiB)
    assert code == 0, err
    return top


def test_a_device_is_refused_by_path(bert_export, tmp_path, capsys):
    code, text = cli(["extract", "--model", bert_export, "--engine", "ort", "--input", "/dev/zero", "--format", "txt",
                      "--out", tmp_path / "s"], capsys)
    assert code == 2 and "/dev/zero is a device, not a file" in " ".join(text.split()), text
    assert not (tmp_path / "s").exists()


def test_stdin_from_a_device_is_refused(tiny_model, tmp_path, baseline):
    with open("/dev/zero", "rb") as zero:
        code, top, err = _peak(_extract(tiny_model("bert"), "-", tmp_path / "s"), stdin=zero,
                               kill_above=baseline + 600 * MiB)
    assert code == 2, (top / MiB, err)
    assert "stdin (-) is a character device" in " ".join(err.split()), err
    assert not (tmp_path / "s").exists()


def test_a_pipe_without_line_ends_is_refused_at_the_bound(tiny_model, tmp_path, baseline):
    cat = subprocess.Popen(["cat", "/dev/zero"], stdout=subprocess.PIPE)
    try:
        code, top, err = _peak(_extract(tiny_model("bert"), "-", tmp_path / "s"), stdin=cat.stdout,
                               kill_above=baseline + 600 * MiB)
    finally:
        cat.kill()
        cat.wait()
    assert code == 2, (top / MiB, err)
    assert "stdin line 1 is longer than 64 MiB without a line end" in " ".join(err.split()), err
    # the 64 MiB line bound and little more: an unbounded read grows by gigabytes in seconds
    assert top - baseline < 300 * MiB, (top / MiB, baseline / MiB)


def test_a_very_long_line_is_cut_before_tokenizing(tiny_model, tmp_path, baseline):
    rng = np.random.default_rng(0)
    words = "the cat dog man sits runs quick brown fox".split()
    line = " ".join(rng.choice(words, 800_000))  # about 3.7 MB: tokenized whole it took ~700 MB more
    corpus = tmp_path / "c.txt"
    corpus.write_text(f"a cat\n{line}\nthe dog runs\n", encoding="utf-8")
    code, top, err = _peak(_extract(tiny_model("bert"), str(corpus), tmp_path / "s"),
                           kill_above=baseline + 2048 * MiB)
    assert code == 0, err
    assert top - baseline < 200 * MiB, (top / MiB, baseline / MiB)
    from layerscope.store.store import LayerStore

    store = LayerStore.open(tmp_path / "s")
    assert store.texts()[1] == line  # the text itself is kept whole
    assert store.record.truncated_texts == 1


@pytest.mark.parametrize("text", [
    " ".join(["brown fox jumps over"] * 5_000),  # cut at a space: same tokens as the whole text
    "word " + " " * 100_000 + "end of it",  # the cut part holds too few tokens: the whole text is read
    "x" * 100_000,  # no space at all
])
def test_the_cut_gives_the_vectors_of_the_whole_text(text, bert_export, monkeypatch):
    import layerscope.model.tokenize as tokenize

    got = embed(bert_export, [text, "short"], engine="ort", layers="0,2", poolings=["mean", "cls"])
    monkeypatch.setattr(tokenize, "TEXT_CHARS_PER_TOKEN", 10 ** 9)  # nothing cut
    whole = embed(bert_export, [text, "short"], engine="ort", layers="0,2", poolings=["mean", "cls"])
    for key in whole:
        np.testing.assert_allclose(got[key], whole[key], rtol=0, atol=1e-6, err_msg=str(key))


def test_the_encoder_counts_what_it_cut(bert_export):
    from layerscope.model.handle import ModelHandle
    from layerscope.model.tokenize import TEXT_CHARS_PER_TOKEN, Encoder

    handle = ModelHandle.resolve(bert_export)
    enc = Encoder(handle.encoding_tokenizer(), list(handle.manifest.inputs), 16)
    long = "the cat " * (TEXT_CHARS_PER_TOKEN * 16)
    lengths = enc.token_lengths([long, "a cat", " " * (TEXT_CHARS_PER_TOKEN * 16 + 5) + "cat"])
    assert enc.cut == 1  # the spaces-only head would leave too few tokens: read whole, not cut
    plain = Encoder(handle.encoding_tokenizer(), list(handle.manifest.inputs), 16).token_lengths(["a cat", "cat"])
    assert lengths[0] > 16 and lengths[1] == plain[0] and lengths[2] == plain[1]
