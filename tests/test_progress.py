"""layerscope.progress: one helper counts every long step; it draws only on a terminal and never under --quiet."""

from __future__ import annotations

import io
import logging
import sys

import numpy as np
import pytest

import layerscope.progress as progress
from layerscope.progress import steps, track


@pytest.fixture()
def finished(monkeypatch):
    """(label, done, total) of every progress count, recorded as it closes."""
    seen = []
    original = progress.Steps.close

    def close(self):
        if not getattr(self, "_recorded", False):  # once per count, however often it is closed
            seen.append((self.label, self.done, self.total))
            self._recorded = True
        original(self)

    monkeypatch.setattr(progress.Steps, "close", close)
    return seen


def test_counts_without_drawing_when_not_a_terminal(capsys):
    with steps("work", 5) as bar:
        for _ in range(3):
            bar.advance()
        bar.advance(2)
    assert (bar.done, bar.total, bar.shown) == (5, 5, False)  # pytest's stdout is not a terminal
    assert capsys.readouterr().out == ""


def test_track_yields_everything_and_counts_it(finished):
    assert list(track(iter(["a", "b", "c"]), "letters", total=3)) == ["a", "b", "c"]
    assert list(track([1, 2], "numbers")) == [1, 2]  # a sized iterable gives its own total
    assert finished == [("letters", 3, 3), ("numbers", 2, 2)]


def test_drawn_bar_shows_done_of_total():
    from rich.console import Console

    buf = io.StringIO()
    console = Console(file=buf, force_terminal=True, width=100)
    bar = steps("training probes", 7, show=True, console=console)
    for _ in range(4):
        bar.advance()
    bar._progress.refresh()
    bar.close()
    text = buf.getvalue()
    assert "training probes" in text and "4/7" in text


@pytest.mark.parametrize("tty,level,shown,how", [(True, logging.INFO, True, "bar"), (True, logging.WARNING, False, None),
                                                 (False, logging.INFO, False, "lines"),
                                                 (False, logging.WARNING, False, None)])
def test_auto_shows_only_on_a_terminal_without_quiet(monkeypatch, tty, level, shown, how):
    class Out(io.StringIO):
        def isatty(self):
            return tty

    monkeypatch.setattr(sys, "stdout", Out())
    logger = logging.getLogger("layerscope")
    old = logger.level
    logger.setLevel(level)  # setLevel, not the attribute: loggers cache isEnabledFor answers
    try:
        assert progress.mode() == how
        bar = steps("x", 2)
        bar.close()
        assert bar.shown is shown
        assert (bar._lines is not None) is (how == "lines")  # a log file gets lines, never a bar
    finally:
        logger.setLevel(old)


@pytest.fixture()
def info_logs(monkeypatch, caplog):
    """layerscope at INFO with stdout not a terminal (a batch job's log), a progress line on every step."""
    monkeypatch.setattr(progress, "LINE_EVERY_S", 0.0)
    caplog.set_level(logging.INFO, logger="layerscope")
    return caplog


def test_clock_and_the_line_read_by_hand():
    assert progress.clock(3723.4) == "1:02:03" and progress.clock(59.6) == "0:01:00"
    lines = progress.Lines("alignment, mean pooling: layers", 100, every=1e9)
    # 25 of 100 after 100 s: 75 left at 4 s each = 300 s
    assert lines.line(25, 100.0) == "alignment, mean pooling: layers: 25/100 (25%), 0:01:40 elapsed, about 0:05:00 left"
    assert lines.line(3, 10.0, fraction=0.5, extra="2 texts/s") == (
        "alignment, mean pooling: layers: 3/100 (50%), 2 texts/s, 0:00:10 elapsed, about 0:00:10 left")
    assert progress.Lines("count", None).line(7, 5.0) == "count: 7, 0:00:05 elapsed"  # no total: no estimate
    assert lines.due() is None  # not due before `every` seconds


def test_a_step_in_a_log_file_logs_lines_not_a_bar(info_logs, capsys):
    with steps("training probes", 4) as bar:
        for _ in range(4):
            bar.advance()
    assert bar.shown is False and capsys.readouterr().out == ""
    got = [r.getMessage() for r in info_logs.records if r.name == "layerscope"]
    assert len(got) == 4 and got[1].startswith("training probes: 2/4 (50%), 0:00:00 elapsed")
    assert got[-1].startswith("training probes: 4/4 (100%)") and "left" not in got[-1]


def test_extraction_lines_estimate_from_tokens(info_logs):
    bar = progress.progress_bar("lines", 10, 200)
    bar.advance(4, 50)  # 4 of 10 texts but only 50 of 200 tokens: a quarter of the work
    bar.advance(2, 70)  # 6 texts, 120 tokens: 60%
    got = [r.getMessage() for r in info_logs.records if r.name == "layerscope"]
    assert got[0].startswith("extracting: 4/10 texts (25%), ") and " texts/s, " in got[0] and "tokens/s" in got[0]
    assert got[1].startswith("extracting: 6/10 texts (60%), ")
    assert isinstance(progress.progress_bar(False, 1, 1), progress._NoBar)


def test_extract_in_a_log_file_says_how_far_it_is(info_logs, capsys, bert_export, tmp_path):
    """Catches: the CLI passing a bool that turns progress off whenever stdout is not a terminal (an hour-long
    extraction under nohup or Slurm then logged nothing until it ended)."""
    from cli_helpers import cli_output

    corpus = tmp_path / "c.txt"
    corpus.write_text("".join(f"sentence number {i} is here\n" for i in range(40)))
    code, out, err = cli_output(["extract", "--model", bert_export, "--input", corpus, "--out", tmp_path / "s",
                                 "--engine", "ort", "--batch-tokens", "64"], capsys)
    assert code == 0, out + err
    got = [r.getMessage() for r in info_logs.records if r.getMessage().startswith("extracting: ")]
    assert got and got[-1].startswith("extracting: 40/40 texts (100%)")


def test_quiet_flag_turns_bars_off(monkeypatch, capsys):
    """`layerscope --quiet` logs at WARNING, which is what the helper reads."""
    from cli_helpers import cli_output

    class Out(io.StringIO):
        def isatty(self):
            return True

    root = logging.getLogger()
    old_level, old_handlers = root.level, root.handlers[:]
    root.handlers[:] = []  # basicConfig only configures a root logger without handlers
    try:
        cli_output(["--quiet", "analyses"], capsys)
        monkeypatch.setattr(sys, "stdout", Out())
        bar = steps("x", 1)
        bar.close()
        assert bar.shown is False
    finally:
        root.handlers[:] = old_handlers
        root.setLevel(old_level)


def test_cka_reports_its_row_blocks_and_layer_pairs(finished):
    from layerscope.analyses.similarity import cka_matrix, knn_matrix

    rng = np.random.default_rng(0)
    arrays = {layer: rng.normal(size=(25, 4)) for layer in ("0", "1", "2")}
    get = arrays.__getitem__
    cka_matrix(get, list(arrays), get, list(arrays), 25, block=10)
    knn_matrix(get, list(arrays), get, list(arrays), k=3)
    by = {label: (done, total) for label, done, total in finished}
    assert by["linear CKA: row blocks"] == (3, 3)  # 25 rows in blocks of 10
    assert by["unbiased CKA: layer pairs"] == (6, 6)  # the upper triangle of 3 x 3
    assert by["mutual k-NN: layers"] == (3, 3)


def test_model_comparison_counts_its_bootstraps(finished):
    from layerscope.analyses.base import ModelOutput, PerModel
    from layerscope.analyses.compare import ScoreRow, compare_models, model_rows
    from layerscope.metrics.paired import win_rate_scorer

    rng = np.random.default_rng(1)
    outputs = {}
    for name in "ABC":  # three models of two layers: 3 pairs x (best of each + 3 layers) = 12 bootstraps
        outputs[name] = ModelOutput({}, compare=model_rows(2, 20, [
            ScoreRow("mean", str(x), 0.5, None, win_rate_scorer(rng.normal(size=20)), bootstrap_ci=True)
            for x in range(3)]))
    compare_models(PerModel(outputs), score="win_rate", score_label="win rate", n_resamples=20)
    by = {label: (done, total) for label, done, total in finished}
    assert by["comparing models (paired bootstrap)"] == (12, 12)
    assert by["intervals of the side-by-side table"] == (9, 9)  # 3 layers x 3 models, none had an interval


def test_probe_training_counts_its_epochs(finished):
    pytest.importorskip("torch")
    from layerscope.analyses.probe import PairSplit, ProbeConfig, train_probe

    rng = np.random.default_rng(2)

    def split(n):
        a = rng.normal(size=(3, n, 8)).astype(np.float32)
        return PairSplit(a, a + rng.normal(scale=0.5, size=a.shape).astype(np.float32), rng.uniform(0, 5, n))

    train_probe(split(40), split(10), ProbeConfig(kind="cosine-mlp", epochs=4, seed=0))
    assert ("probe cosine-mlp: epochs (at most)", 4, 4) in finished


def test_index_build_counts_its_blocks(finished, monkeypatch):
    pytest.importorskip("faiss")
    import layerscope.index.vector_index as fi

    monkeypatch.setattr(fi, "_ADD_BLOCK", 40)
    x = np.random.default_rng(3).normal(size=(100, 8)).astype(np.float32)
    index = fi.VectorIndex.build(x, "hnsw", device="cpu")
    assert index.n == 100 and index.index.ntotal == 100  # every vector added, in blocks of 40
    assert ("index build (hnsw): vectors added", 3, 3) in finished


def test_still_says_a_line_while_one_long_call_runs_and_stops_after_it():
    """Catches: a single long call (tracing a graph, a check against torch) that leaves the user without a line
    for minutes, and a heartbeat that goes on after the call returned."""
    import threading

    from layerscope.progress import still

    said: list[str] = []
    three = threading.Event()

    def say(line: str) -> None:
        said.append(line)
        if len(said) >= 3:
            three.set()

    with still(say, "tracing the head graph", every=0.01):
        assert three.wait(10), "no line came while the call ran"
    after = len(said)
    three.clear()
    assert not three.wait(0.1) and len(said) == after  # nothing once the call is over
    assert all(line.startswith("still tracing the head graph (0:00:0") and line.endswith(" elapsed)") for line in said)


def test_still_says_nothing_for_a_short_call():
    from layerscope.progress import still

    said: list[str] = []
    with still(said.append, "loading", every=60):
        pass
    assert said == []
