"""Figures in tables: no negative zero, and constant vectors are 'undefined' in every analysis that meets them."""

from __future__ import annotations

import io

import pytest

from layerscope.analyses.base import RunRequest, run_analysis


@pytest.fixture(autouse=True)
def _home(tmp_path, monkeypatch):
    monkeypatch.setenv("LAYERSCOPE_HOME", str(tmp_path / "home"))


def test_num_never_prints_a_negative_zero():
    from layerscope.report.writer import fmt, num

    assert num(-0.0001, 3) == "0.000"
    assert num(-0.0, 4) == "0.0000"
    assert num(-0.00004, 4) == "0.0000"
    assert num(-0.0015, 3) == "-0.002"  # a figure that does not round to zero keeps its sign
    assert num(-0.25, 2) == "-0.25" and num(0.25, 2, sign=True) == "+0.25"
    assert num(-0.00001, 4, sign=True) == "0.0000" and num(0.00001, 4, sign=True) == "0.0000"
    assert num(float("nan")) == "undefined" and num(None) == "undefined"
    assert fmt(-0.00003) == "0.0000" and fmt(3) == "3"


def _console(width=160):
    from rich.console import Console

    buf = io.StringIO()
    return Console(file=buf, width=width, color_system=None), buf


def test_constant_cls_vectors_are_undefined_in_compositionality_as_in_sts(tiny_model, tmp_path):
    """The raw embeddings' CLS vector is the same for every text: compositionality's win rate and mean diff
    there are undefined (with the reason), as sts's correlations are, not a measured 0.000."""
    from layerscope.analyses.base import get_analysis

    model = str(tiny_model("bert"))
    ctx = dict(models=[model], engine="torch", layers="raw,1", poolings=["cls"], seed=0, cache=False)
    _, comp = run_analysis("compositionality", RunRequest(out=tmp_path / "comp", **ctx))
    rows = {r["layer"]: r for r in next(iter(comp["per_model"].values()))["tables"]["layers"]}
    raw = rows["raw"]
    assert raw["ties"] == raw["n_items"]
    assert raw["win_rate"] is None and raw["mean_diff"] is None and raw["sign_p"] is None
    assert "same vector" in raw["undefined"]
    assert rows["1"]["win_rate"] is not None
    console, buf = _console()
    get_analysis("compositionality")().console_summary(comp, console)
    line = next(x for x in buf.getvalue().splitlines() if x.strip("│ ").startswith("raw"))
    assert "undefined" in line and "0.000" not in line, line
    md = (tmp_path / "comp" / "report.md").read_text()
    assert "undefined at layer raw, cls" in md

    _, sts = run_analysis("sts", RunRequest(out=tmp_path / "sts", **ctx))
    srows = {r["layer"]: r for r in next(iter(sts["per_model"].values()))["tables"]["layers"]}
    assert srows["raw"]["spearman"] is None and srows["raw"].get("undefined")
    console, buf = _console()
    get_analysis("sts")().console_summary(sts, console)
    line = next(x for x in buf.getvalue().splitlines() if x.strip("│ ").startswith("raw"))
    assert "undefined" in line and "0.000" not in line, line


def test_console_tables_print_no_negative_zero():
    """A side-by-side score of -0.00002, an interval end of -0.0004 at 3 decimals, a difference of -0.00003:
    the terminal shows 0.0000 / 0.000, never a minus before a zero."""
    import re

    from layerscope.analyses.base import get_analysis
    from layerscope.report.compare import print_comparison

    combined = {"comparison": {"models": ["a", "b"], "score": "win_rate", "score_label": "win rate",
                               "group_label": "pooling", "by": "layer", "n_items": 5, "n_resamples": 10},
                "tables": {"side_by_side": [{"pooling": "mean", "layer": "1", "a layer": "1", "a win_rate": -0.00002,
                                             "a ci_low": -0.0004, "a ci_high": 0.2, "b layer": "1",
                                             "b win_rate": 0.1, "b ci_low": None, "b ci_high": None}],
                           "model_comparison": [{"comparison": "same layer", "model_a": "a", "model_b": "b",
                                                 "pooling_a": "mean", "pooling_b": "mean", "layer_a": "1",
                                                 "layer_b": "1", "win_rate_a": -0.00002, "win_rate_b": 0.00001,
                                                 "difference": -0.00003, "ci_low": -0.00004, "ci_high": 0.2,
                                                 "p_value": 0.5, "p_holm": 0.5}]}}
    console, buf = _console()
    print_comparison({"combined": combined}, console)
    text = buf.getvalue()
    assert not re.search(r"-0\.0+(?!\d*[1-9])", text), text
    assert "0.0000" in text


def test_every_declared_console_table_fits_a_120_column_terminal():
    """The console summary's per-layer table of every declared analysis, filled with numbers as wide as its
    figures print (``-12.345``) and a pooling name as long as ``mean-nobos``, is no wider than the 120
    columns a pipe or log file gets: wider, Rich cuts every cell to ``0.2…``. Columns that come by prefix
    (one per position, per task) are unbounded, so such a table names the console's columns itself."""
    from rich.console import Console
    from rich.table import Table

    from layerscope.analyses import registry

    too_wide = []
    for name, cls in sorted(registry.registry().items()):
        decl = cls.metadata.figures
        if decl is None:
            continue
        for i, table in enumerate(decl.tables):
            if not (i == 0 or table.console is not None) or table.pivot is not None:
                continue
            if table.console is None and table.prefixes:
                too_wide.append(f"{name}.{table.name}: columns by prefix {table.prefixes} and no console columns")
                continue
            columns = table.console if table.console is not None else table.columns
            t = Table(title=f"{name} - some/model-name")
            for c in columns:
                t.add_column(c, justify="right")
            t.add_row(*("mean-nobos" if c in ("pooling", "variant", "method") else "-12.345" for c in columns))
            width = Console(width=1000).measure(t).maximum
            if width > 120:
                too_wide.append(f"{name}.{table.name}: {width} columns")
    assert not too_wide, too_wide
