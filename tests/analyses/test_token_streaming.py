"""Token analyses on a corpus: only the texts that matter pass through the model, a chunk at a time, with a
progress line on a clock; what is held at once is bounded by a chunk, not by the corpus."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

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


@pytest.fixture()
def lines(monkeypatch, caplog):
    """The progress lines logged while a step runs for minutes on a fake clock (in a log file, not a terminal)."""
    import layerscope.progress as progress

    monkeypatch.setattr(progress, "time", FakeTime())
    monkeypatch.setattr(progress, "mode", lambda: "lines")
    caplog.set_level(logging.INFO, logger="layerscope")
    return lambda label: [r.getMessage() for r in caplog.records if r.getMessage().startswith(label)]


@pytest.fixture()
def fed(monkeypatch) -> list[str]:
    """Every text a token analysis passes through the model."""
    import layerscope.extraction.token_embed as token_embed

    seen: list[str] = []
    real = token_embed.embed_tokens

    def embed_tokens(eng, texts, layers, **kw):
        seen.extend(texts)
        return real(eng, texts, layers, **kw)

    monkeypatch.setattr(token_embed, "embed_tokens", embed_tokens)
    return seen


def test_word_context_runs_only_the_texts_with_the_words_and_says_how_far_it_is(tiny_model, tmp_path, lines, fed):
    with_words = ["the cat sat on the mat", "a cat and a river", "the river by the mat", "my cat likes the mat"]
    others = [f"nothing here number {i} at all" for i in range(40)]
    texts = others[:20] + with_words[:2] + others[20:] + with_words[2:]
    data = tmp_path / "corpus.txt"
    data.write_text("\n".join(texts) + "\n")
    ctx = RunRequest(models=[str(tiny_model("bert"))], engine="torch", layers="all", out=tmp_path / "wc", seed=0,
                     data=str(data), options={"words": "cat,river,mat", "knn": 2}, cache=False, batch_tokens=16)
    _, res = run_analysis("word_context", ctx)
    assert sorted(fed) == sorted(with_words)  # the 40 texts without the words never reach the model
    said = lines("word_context: 4 texts with the words")
    assert len(said) >= 2 and said[-1].startswith("word_context: 4 texts with the words, through the model: 4/4")
    assert next(iter(res["per_model"].values()))["summary"]["occurrences"] == 8  # cat 3, mat 3, river 2


def test_token_alignment_says_how_far_it_is_on_every_batch(tiny_model, tmp_path, lines, fed):
    ctx = RunRequest(models=[str(tiny_model("bert"))], engine="torch", layers="all", out=tmp_path / "ta", seed=0,
                     options={"generate": "zh-en", "n": 6}, cache=False, batch_tokens=32)
    run_analysis("token_alignment", ctx)
    said = lines("token_alignment: texts through the model")
    assert len(fed) == 12
    done = [int(line.split(": ")[2].split("/")[0]) for line in said]
    assert len(done) >= 3 and done == sorted(done) and done[-1] == 12  # one line per batch on a 31 s clock
    assert said[-1].endswith("elapsed") and "12/12 (100%)" in said[-1]


_CHILD = """
import json, sys, tracemalloc
from layerscope.analyses.base import RunRequest, get_analysis, run_analysis
import layerscope.extraction.token_embed as token_embed
token_embed.CHUNK_BYTES = int(sys.argv[3])
spec = json.loads(sys.argv[2])
cls = get_analysis(spec["name"])
compute, peaks = cls.compute, []

def traced(self, *args, **kwargs):  # what the analysis allocates while it computes (numpy arrays included)
    tracemalloc.start()
    try:
        return compute(self, *args, **kwargs)
    finally:
        peaks.append(tracemalloc.get_traced_memory()[1])
        tracemalloc.stop()

cls.compute = traced
run_analysis(spec["name"], RunRequest(models=[sys.argv[1]], engine="torch", layers="all", seed=0, cache=False,
                                      **spec["ctx"]))
print("PEAK", max(peaks))
"""


def _peak(model: Path, name: str, ctx: dict, chunk_bytes: int, home: Path) -> int:
    env = {**os.environ, "PYTHONPATH": SRC, "LAYERSCOPE_HOME": str(home)}
    done = subprocess.run([sys.executable, "-c", _CHILD, str(model), json.dumps({"name": name, "ctx": ctx}),
                           str(chunk_bytes)], env=env, capture_output=True, text=True, timeout=HANG_S)
    line = next((ln for ln in done.stdout.splitlines() if ln.startswith("PEAK ")), None)
    assert line is not None, done.stdout[-2000:] + done.stderr[-4000:]
    return int(line.split()[1])


def _aligned(tmp_path: Path, n: int) -> dict:
    words = "alpha beta gamma delta epsilon zeta theta kappa lambda sigma omega".split()
    src, tgt = tmp_path / f"src{n}.txt", tmp_path / f"tgt{n}.txt"
    src.write_text("".join(" ".join(words[(i + j) % len(words)] for j in range(40)) + f" {i}\n" for i in range(n)))
    tgt.write_text("".join(" ".join(words[(i * 3 + j) % len(words)] for j in range(40)) + f" {i}\n" for i in range(n)))
    return {"source_file": str(src), "target_file": str(tgt)}


@pytest.mark.slow
def test_token_alignment_memory_is_bounded_by_a_chunk_not_the_corpus(tiny_model, tmp_path):
    """5 times the pairs: the token vectors of the corpus would take 5 times the memory (some 11 MB more at
    this size; tracemalloc's peak while the analysis computes, in a child process); read a chunk at a time,
    the peak grows only by the pairs' pooled vectors (4 x 32 float32 per pair and layer) and their tokens'
    lengths and figures."""
    model = tiny_model("bert")
    small, large = 60, 300
    peaks = {}
    for n in (small, large):
        opts = {**_aligned(tmp_path, n), "bins": 4}
        peaks[n] = _peak(model, "token_alignment", {"options": opts, "out": str(tmp_path / f"ta{n}")},
                         64 * 1024, tmp_path / "home")
    tokens_more = (large - small) * 2 * 60 * 3 * 32 * 4  # pairs x sides x ~tokens x layers x hidden x float32
    pooled_more = (large - small) * 4 * 3 * 32 * 4
    growth = peaks[large] - peaks[small]
    assert growth < pooled_more + tokens_more / 4, (peaks, tokens_more, pooled_more)


@pytest.mark.slow
def test_word_context_memory_does_not_grow_with_texts_without_the_words(tiny_model, tmp_path):
    model = tiny_model("bert")
    peaks = {}
    filler = " ".join(["plain filler words"] * 20)
    for n in (200, 1000):
        data = tmp_path / f"corpus{n}.txt"
        texts = [f"{filler} {i}" for i in range(n)]
        texts[::max(n // 20, 1)] = [f"the cat by the river {i}" for i in range(len(texts[::max(n // 20, 1)]))]
        data.write_text("\n".join(texts) + "\n")
        peaks[n] = _peak(model, "word_context", {"data": str(data), "out": str(tmp_path / f"wc{n}"),
                                                 "options": {"words": "cat,river", "knn": 3, "max_per_word": 20}},
                         64 * 1024, tmp_path / "home")
    # embedding all 1,000 texts (about 65 tokens each, 3 layers of 32 floats) would hold some 20 MB more
    assert peaks[1000] - peaks[200] < 4 * 2**20, peaks
