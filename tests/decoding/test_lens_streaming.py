"""The lens on every engine: a progress line per run of positions on a clock, and memory bounded by the head's
run of positions, not by the batch times the vocabulary."""

from __future__ import annotations

import io
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest
from rich.console import Console

from layerscope.analyses.base import RunRequest, run_analysis
from hang_guard import HANG_S  # noqa: E402

SRC = str(Path(__file__).resolve().parents[2] / "src")


class FakeTime:
    """``time`` for layerscope.progress: every reading of the clock is 31 s after the last one."""

    def __init__(self):
        self.now = 0.0

    def perf_counter(self) -> float:
        self.now += 31.0
        return self.now


@pytest.mark.parametrize("engine", ["ort", "torch"])
def test_lens_says_how_far_it_is_within_every_batch(engine, tiny_model, tmp_path, monkeypatch, caplog):
    """A run of positions through the head at a time (one here), each advancing the count: on a clock that
    moves 31 s per reading, a line per run, so a batch that takes minutes is not silent. Catches: an engine
    that decodes a whole batch at once, or advances the count once per batch."""
    import layerscope.progress as progress
    from layerscope.model.handle import ModelHandle

    monkeypatch.setattr("layerscope.decoding.lens_onnx.HEAD_BYTES", 1)
    monkeypatch.setenv("LAYERSCOPE_HOME", str(tmp_path / "home"))
    monkeypatch.setattr(progress, "time", FakeTime())
    monkeypatch.setattr(progress, "mode", lambda: "lines")  # a log file, not a terminal
    caplog.set_level(logging.INFO, logger="layerscope")
    data = tmp_path / "texts.txt"
    data.write_text("".join(f"text number {i} about a cat\n" for i in range(5)))
    console = Console(file=io.StringIO(), width=200)
    ctx = RunRequest(models=[str(tiny_model("bert"))], engine=engine, data=str(data), cache=False, out=tmp_path / "out",
                     options={"top_k": 3, "show": 0, "batch": 2}, console=console)
    run_analysis("lens", ctx)
    said = [r.getMessage() for r in caplog.records if r.getMessage().startswith("lens: tokens decoded")]
    tok = ModelHandle.resolve(tiny_model("bert")).tokenizer()
    total = sum(len(ids) for ids in tok(data.read_text().splitlines())["input_ids"])
    counts = [line.split(": ")[2].split(" ")[0] for line in said]
    assert counts == [f"{i}/{total}" for i in range(1, total + 1)]  # every position, in three batches
    if engine == "torch":
        assert f"loading {tiny_model('bert')} and its decoding head in PyTorch" in console.file.getvalue()


def _big_vocab_gpt2(tiny_model, out: Path, vocab: int) -> Path:
    """The tiny GPT-2 with a vocabulary of ``vocab`` rows (its tokenizer uses the first few): the head's logits
    are what takes memory, as in a real decoder."""
    import shutil

    from transformers import AutoModelForCausalLM

    src = tiny_model("gpt2")
    shutil.copytree(src, out)
    net = AutoModelForCausalLM.from_pretrained(str(src))
    net.resize_token_embeddings(vocab)
    net.save_pretrained(str(out), safe_serialization=True)
    return out


_CHILD = """
import resource, sys
import layerscope.decoding.lens_onnx as lens_onnx
lens_onnx.HEAD_BYTES = 8 * 2**20
from layerscope.analyses.base import RunRequest, run_analysis
export, data, batch, out, engine = sys.argv[1:6]
run_analysis("lens", RunRequest(models=[export], engine=engine, data=data, cache=False, out=out,
                                options={"top_k": 5, "show": 0, "batch": int(batch)}))
print("PEAK_KIB", resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
"""


BIG_VOCAB = 60_000


@pytest.fixture(scope="module")
def big_vocab_export(tiny_model, tmp_path_factory):
    """The 60,000-row GPT-2 checkpoint and its export with the top-5 lens head, made once for both engines
    (neither run writes into them: each child has a home and an output folder of its own)."""
    from layerscope.decoding.lens_onnx import export_lens
    from layerscope.export.exporter import export_model
    from layerscope.model.source import resolve_source

    root = tmp_path_factory.mktemp("big-vocab")
    export = root / "exp"
    ckpt = _big_vocab_gpt2(tiny_model, root / "ckpt", BIG_VOCAB)
    export_model(resolve_source(str(ckpt)), export, pooled=["mean"])
    return ckpt, export, export_lens(export, 5)


@pytest.mark.slow
@pytest.mark.parametrize("engine", ["ort", "torch"])
def test_lens_memory_does_not_grow_with_the_batch_times_the_vocabulary(engine, big_vocab_export, tmp_path):
    """32 texts of ~120 tokens at once with a 60,000-row vocabulary: every layer's logits of the batch would be
    32 x 120 x 60,000 x 4 bytes = 920 MB (and its softmax as much again); decoded a run of positions at a time
    (8 MiB of logits here), the peak RSS of a child process is within 150 MB of the same run 2 texts at a time."""
    vocab = BIG_VOCAB
    ckpt, export, meta = big_vocab_export
    assert not (export / "lens-k5.onnx_data").exists()  # the head's 7.7 MB matrix is read from lm_head.safetensors
    assert (export / "lens-k5.onnx").stat().st_size < vocab * 32 * 4 // 10 and meta.shared_bytes >= vocab * 32 * 4
    data = tmp_path / "texts.txt"
    data.write_text("".join(f"{i} the cat sat on the mat while the dog ran by the river bank {i}\n" for i in range(32)))
    env = {**os.environ, "PYTHONPATH": SRC, "LAYERSCOPE_HOME": str(tmp_path / "home")}
    peaks = {}
    for batch in (2, 32):
        model = export if engine == "ort" else ckpt  # torch runs the checkpoint
        done = subprocess.run([sys.executable, "-c", _CHILD, str(model), str(data), str(batch), str(tmp_path / f"o{batch}"),
                               engine],
                              env=env, capture_output=True, text=True, timeout=HANG_S)
        line = next((ln for ln in done.stdout.splitlines() if ln.startswith("PEAK_KIB ")), None)
        assert line is not None, done.stdout[-2000:] + done.stderr[-4000:]
        peaks[batch] = int(line.split()[1]) * 1024
    assert peaks[32] - peaks[2] < 150 * 2**20, peaks


class _Recorder:
    """A progress count that keeps every advance."""

    made: list["_Recorder"] = []

    def __init__(self, label, total, **_):
        self.label, self.total, self.advances = label, total, []
        _Recorder.made.append(self)

    def advance(self, n: int = 1) -> None:
        self.advances.append(int(n))

    def close(self) -> None:
        pass


@pytest.mark.parametrize("engine", ["ort", "torch"])
def test_lens_runs_of_positions_are_bounded_by_the_head_work(engine, tiny_model, tmp_path, monkeypatch):
    """The count advances once per run of the head; a run's multiply-adds (positions x layers x vocabulary x
    hidden) stay within ``HEAD_MACS``, so a run is seconds long at real size even where the logits of a few
    hundred positions fit the memory budget. With the budget set to 3 positions' work: runs of 3 (the last of
    a batch fewer), every position counted once. Catches: runs sized by memory alone (one run per batch here),
    and the head's export not passing its stage lines to the user."""
    from layerscope.model.handle import ModelHandle

    model = tiny_model("gpt2")
    m = ModelHandle.resolve(model).manifest
    per_position = (m.num_layers + 1) * m.vocab_size * m.hidden_size
    monkeypatch.setattr("layerscope.decoding.lens_onnx.HEAD_MACS", 3 * per_position)
    monkeypatch.setattr("layerscope.progress.steps", _Recorder)
    monkeypatch.setenv("LAYERSCOPE_HOME", str(tmp_path / "home"))
    _Recorder.made = []
    texts = [f"text number {i} about a cat that sat on the mat" for i in range(5)]
    data = tmp_path / "texts.txt"
    data.write_text("".join(t + "\n" for t in texts))
    console = Console(file=io.StringIO(), width=200)
    ctx = RunRequest(models=[str(model)], engine=engine, data=str(data), cache=False, out=tmp_path / "out",
                     options={"top_k": 3, "show": 0, "batch": 2}, console=console)
    run_analysis("lens", ctx)
    if engine == "ort":  # the head's export says its stages to the user, not only to a caller that asks
        assert "lens head 4/4: checking the graph against torch" in console.file.getvalue()
    bar = next(b for b in _Recorder.made if b.label.startswith("lens: tokens decoded"))
    lengths = [len(ids) for ids in ModelHandle.resolve(model).tokenizer()(texts)["input_ids"]]
    batches = [sum(lengths[i:i + 2]) for i in range(0, len(texts), 2)]
    expected = [min(3, n - a) for n in batches for a in range(0, n, 3)]
    assert bar.advances == expected and sum(expected) == bar.total == sum(lengths)


def test_lens_head_export_says_each_stage(tiny_export, tmp_path):
    """Exporting the lens head (minutes on a real-size model) says a line as each stage starts, in order:
    loading, tracing, writing, the check against torch. Catches: a stage run with nothing said before it."""
    from layerscope.decoding.lens_onnx import PARITY_TEXTS, export_lens

    out = tiny_export("gpt2", pooled=["mean"], to=tmp_path / "exp")
    said: list[str] = []
    export_lens(out, 3, say=said.append)
    assert [line.split(":")[0] for line in said] == [f"lens head {i}/4" for i in range(1, 5)]
    assert said[1].endswith("top-3)") and said[3].endswith(f"on {len(PARITY_TEXTS)} texts")


def test_forward_runs_bound_texts_and_padded_tokens():
    """Runs of consecutive texts, each at most ``batch`` texts and at most ``tokens`` padded tokens (texts x the
    longest), a text longer than the budget alone; worked out by hand."""
    from layerscope.decoding.lens import forward_runs

    assert forward_runs([3, 3, 3, 3, 3], 2, 100) == [(0, 2), (2, 4), (4, 5)]  # the batch bounds
    # 3,5 -> 2 x 5 = 10; adding 2 -> 3 x 5 = 15 > 12; 2,10 -> 20 > 12; 10 alone; 10,1 -> 20 > 12
    assert forward_runs([3, 5, 2, 10, 1], 10, 12) == [(0, 2), (2, 3), (3, 4), (4, 5)]
    assert forward_runs([20, 1, 1], 10, 12) == [(0, 1), (1, 3)]  # over the budget alone, then 2 x 1
    assert forward_runs([], 4, 10) == []


@pytest.mark.parametrize("engine", ["ort", "torch"])
def test_lens_forward_is_bounded_by_its_work(engine, tiny_model, tmp_path, monkeypatch):
    """A forward of the model holds at most ``FORWARD_MACS`` of work (padded tokens x 12 hidden^2 x layers), however
    large ``--batch``: with five texts of L tokens, ``--batch 32`` and the budget set to 2 L + 1 tokens' work, the
    positions counted come per forward of two texts (the head decodes a forward's positions in one run here).
    Catches: a forward of the whole batch, minutes long at real size with nothing said."""
    from layerscope.decoding.lens import forward_macs_per_token
    from layerscope.model.handle import ModelHandle

    model = tiny_model("gpt2")
    m = ModelHandle.resolve(model).manifest
    texts = [f"text {c} about a cat that sat on the mat" for c in "abcde"]
    lengths = {len(ids) for ids in ModelHandle.resolve(model).tokenizer()(texts)["input_ids"]}
    assert len(lengths) == 1, lengths
    n = lengths.pop()
    monkeypatch.setattr("layerscope.decoding.lens.FORWARD_MACS",
                        (2 * n + 1) * forward_macs_per_token(m.hidden_size, m.num_layers))
    monkeypatch.setattr("layerscope.progress.steps", _Recorder)
    monkeypatch.setenv("LAYERSCOPE_HOME", str(tmp_path / "home"))
    _Recorder.made = []
    data = tmp_path / "texts.txt"
    data.write_text("".join(t + "\n" for t in texts))
    ctx = RunRequest(models=[str(model)], engine=engine, data=str(data), cache=False, out=tmp_path / "out",
                     options={"top_k": 3, "show": 0, "batch": 32}, console=Console(file=io.StringIO(), width=200))
    run_analysis("lens", ctx)
    bar = next(b for b in _Recorder.made if b.label.startswith("lens: tokens decoded"))
    assert bar.advances == [2 * n, 2 * n, n]


def test_head_run_counts_every_layers_logits(monkeypatch):
    """A run of the head holds the logits of every layer it decodes (ONNX Runtime keeps them all until the run
    ends), so the positions per run shrink with the layers: 4 MiB at 11 bytes a logit over a 1,000-row vocabulary
    is 381 positions for one layer, 15 for 25 layers; the work bound (3 positions' multiply-adds) caps it lower;
    never below one position. Catches: a budget over positions x vocabulary alone (381 for every layer count)."""
    from layerscope.decoding import lens_onnx

    assert lens_onnx.LOGIT_BYTES == 11
    assert lens_onnx.positions_per_run(1000, 2**22) == 381  # 4,194,304 // 11,000
    assert lens_onnx.positions_per_run(1000, 2**22, layers=25) == 15  # 4,194,304 // 275,000
    monkeypatch.setattr(lens_onnx, "HEAD_MACS", 3 * 25 * 1000 * 64)
    assert lens_onnx.positions_per_run(1000, 2**40, layers=25, hidden=64) == 3
    assert lens_onnx.positions_per_run(50_257, 1, layers=25) == 1
