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


@pytest.mark.parametrize("tty,level,shown", [(True, logging.INFO, True), (True, logging.WARNING, False),
                                             (False, logging.INFO, False)])
def test_auto_shows_only_on_a_terminal_without_quiet(monkeypatch, tty, level, shown):
    class Out(io.StringIO):
        def isatty(self):
            return tty

    monkeypatch.setattr(sys, "stdout", Out())
    logger = logging.getLogger("layerscope")
    old = logger.level
    logger.setLevel(level)  # setLevel, not the attribute: loggers cache isEnabledFor answers
    try:
        bar = steps("x", 2)
        bar.close()
        assert bar.shown is shown
    finally:
        logger.setLevel(old)


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
    from layerscope.analyses.compare import ScoreRow, compare_models, keep_rows
    from layerscope.metrics.paired import win_rate_scorer

    class Holder:
        pass

    holder = Holder()
    rng = np.random.default_rng(1)
    for _ in range(3):  # three models of two layers: 3 pairs x (best of each + 3 layers) = 12 bootstraps
        keep_rows(holder, 2, 20, [ScoreRow("mean", str(x), 0.5, None, win_rate_scorer(rng.normal(size=20)),
                                           bootstrap_ci=True) for x in range(3)])
    compare_models(holder, {"A": {}, "B": {}, "C": {}}, score="win_rate", score_label="win rate", n_resamples=20)
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
