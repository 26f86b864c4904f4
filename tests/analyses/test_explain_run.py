"""``run explain``: bad input is one line before any model is read; the page escapes token text and draws in
Chromium; on real STS pairs the hiding game separates the token-pair ranking from random deletions."""

from __future__ import annotations

import json

import pytest

from cli_helpers import one_error, run_cli

PAYLOAD = "</script><img src=x onerror=\"console.error('INJECTED')\">"


@pytest.fixture
def no_model(monkeypatch):
    """Anything that would read, export or start a model fails the test."""
    import layerscope.engines.base as engines_base
    import layerscope.export.exporter as exporter
    import layerscope.model.source as source

    def spy(name):
        def called(*args, **kwargs):
            raise AssertionError(f"{name} was called before the request was checked")
        return called

    monkeypatch.setattr(exporter, "export_model", spy("export_model"))
    monkeypatch.setattr(engines_base, "create_engine", spy("create_engine"))
    monkeypatch.setattr(source, "load_torch_model", spy("load_torch_model"))


@pytest.mark.parametrize("extra,needles", [
    (["--data", "/nonexistent/pairs.tsv"], ["pairs file /nonexistent/pairs.tsv does not exist"]),
    (["--pair", "", "a cat"], ["--pair: the first text is empty"]),
    (["--pair", "a cat", "   "], ["--pair: the second text is empty"]),
    (["--pair", "a", "b", "--engine", "ort"], ["needs gradients", "--engine torch"]),
    ([], ["give --pair"]),
    (["--pair", "a", "b", "--steps", "0"], ["--steps must be at least 1"]),
    (["--pair", "a", "b", "--pooling", "st"], ["--pooling st"]),
])
def test_bad_input_is_one_line_before_the_model(extra, needles, no_model, tiny_model, tmp_path, capsys):
    code, text = run_cli(["run", "explain", "--model", tiny_model("bert"), "--out", tmp_path / "r", *extra], capsys)
    one_error(code, text, *needles)
    assert not (tmp_path / "r").exists()


def test_an_empty_text_in_a_pairs_file_names_its_line(no_model, tiny_model, tmp_path, capsys):
    pairs = tmp_path / "pairs.tsv"
    pairs.write_text("a cat sat\ta dog sat\nthe sun\t \n", encoding="utf-8")
    code, text = run_cli(["run", "explain", "--model", tiny_model("bert"), "--data", pairs, "--out", tmp_path / "r"],
                         capsys)
    one_error(code, text, f"{pairs}:2: the second text is empty")


def test_report_escapes_tokens_and_draws_in_chromium(tiny_model, tmp_path, capsys):
    from report.test_html_report import figures_drawn, open_page

    out = tmp_path / "r"
    code, text = run_cli(["run", "explain", "--model", tiny_model("bert"), "--engine", "torch", "--pair",
                          f"a cat {PAYLOAD} sat", "a dog sat", "--at", "raw,1", "--steps", "4", "--k", "2",
                          "--curve", "2,4", "--out", out], capsys)
    assert code == 0, text
    results = json.loads((out / "results.json").read_text())
    fig = next(iter(results["per_model"].values()))
    shown = fig["pairs"]
    assert [p["layer"] for p in shown] == ["raw", "1"]
    for p in shown:  # the saved matrix is the one whose sum the table reports
        assert sum(map(sum, p["matrix"])) == pytest.approx(p["matrix_sum"], abs=1e-4)
    assert len(list(out.glob("pair1_at_raw_*.png"))) == 1 and len(list(out.glob("pair1_at_1_*.png"))) == 1
    page = (out / "report.html").read_text()
    assert "onerror=\"console.error('INJECTED')\"" not in page
    assert "&lt;img" in page or "\\u003cimg" in page
    assert "data: one pair given with --pair" in page and "built in" not in page  # the header names --pair
    dom, console = open_page(out / "report.html", tmp_path / "profile")
    assert console == [], console
    drawn = figures_drawn(dom)
    assert sum(kind == "heatmap" for kind in drawn.values()) == 2, drawn


@pytest.mark.slow
def test_hiding_game_separates_pairs_from_random_on_sts(sts_dir, tmp_path):
    from layerscope.analyses.base import RunRequest, run_analysis

    ctx = RunRequest(models=["minilm"], engine="torch", data=str(sts_dir / "sts-test.csv"), out=tmp_path / "r",
                     options={"max_pairs": 14, "steps": 6, "k": 3, "curve": "2", "show": 1})
    _, results = run_analysis("explain", ctx)
    fig = next(iter(results["per_model"].values()))
    test = next(t for t in fig["tables"]["explain_tests"] if t["method_b"] == "random")
    assert test["pairs"] == 14
    assert test["difference"] > 0 and test["ci_low"] > 0, test
    rows = {r["method"]: r for r in fig["tables"]["explain_hiding"]}
    assert rows["pairs"]["hide_aopc_ci_low"] > rows["random"]["hide_aopc"]
