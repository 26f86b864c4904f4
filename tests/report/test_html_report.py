"""report.html: every analysis's page opens in headless Chromium with no console message and its charts drawn;
strings from a results file cannot inject markup or script; the page is made from results.json alone.

The analyses run once per module on tiny random models (their figures are checked elsewhere); the browser
tests skip, with the reason, only where no Chromium is installed (.ci/run installs Debian's package).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from layerscope.analyses.base import RunRequest, rerender, run_analysis
from tiny_models import first_block_of
from hang_guard import HANG_S  # noqa: E402

pytest.importorskip("plotly")

BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
ANALYSES = ("sts", "compositionality", "pooling", "alignment", "similarity", "lens", "saliency", "mteb",
            "token_alignment", "word_context")
PAYLOAD = "</script><script>alert(1)</script>"
LOUD = "</script><script>console.error('INJECTED-SCRIPT')</script><img src=x onerror=\"console.error('INJECTED-IMG')\">"


def chromium() -> str | None:
    return next((path for path in map(shutil.which, BROWSERS) if path), None)


def open_page(page: Path, profile: Path) -> tuple[str, list[str]]:
    """The page's DOM after its scripts ran, and every message its scripts wrote to the console
    (log, warning or error: a report writes none, and an uncaught exception is one)."""
    exe = chromium()
    if exe is None:
        pytest.skip(f"no Chromium found (looked for {', '.join(BROWSERS)}); .ci/run installs Debian's chromium")
    cmd = [exe, "--headless", "--disable-gpu", "--no-first-run", "--disable-dev-shm-usage", "--mute-audio",
           f"--user-data-dir={profile}", "--enable-logging=stderr", "--v=0", "--virtual-time-budget=20000",
           "--dump-dom", page.resolve().as_uri()]
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        cmd.insert(1, "--no-sandbox")  # Chromium refuses to start its sandbox as root
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=HANG_S)
    assert proc.returncode == 0, proc.stderr[-2000:]
    console = [line for line in proc.stderr.splitlines() if ":CONSOLE" in line]
    return proc.stdout, console


def outside_plotly_js(text: str) -> str:
    """The page without the plotly.js bundle it inlines (which names CDN addresses it never fetches here)."""
    from plotly.offline import get_plotlyjs

    bundle = get_plotlyjs()
    assert text.count(bundle) == 1, "plotly.js must be inlined exactly once"
    return text.replace(bundle, "")


def figures_drawn(dom: str) -> dict[str, str]:
    """Per figure div of the page (``fig-N``), what plotly drew into it: "lines", "bars", "heatmap" or ""."""
    drawn = {}
    starts = [(m.start(), m.group(1), m.group(2)) for m in
              re.finditer(r'<div class="lsfig[^"]*" id="(fig-\d+)" data-kind="(\w+)"', dom)]
    for i, (pos, fig_id, _) in enumerate(starts):
        chunk = dom[pos:starts[i + 1][0] if i + 1 < len(starts) else len(dom)]
        kinds = []
        if 'class="main-svg"' in chunk:
            if re.search(r'class="js-line" d="M', chunk):
                kinds.append("lines")
            if 'class="trace bars"' in chunk and re.search(r'class="point"><path d="M', chunk):
                kinds.append("bars")
            if 'class="hm"><image' in chunk:
                kinds.append("heatmap")
        drawn[fig_id] = ",".join(kinds)
    return drawn


# -- the runs ---------------------------------------------------------------------------------------------

def _pairs_file(path: Path, n: int = 40) -> Path:
    rng = np.random.default_rng(3)
    words = "the a cat dog man woman child plays runs reads eats in park house guitar book food river".split()
    lines = []
    for i in range(n):
        a = list(rng.choice(words, size=int(rng.integers(3, 9))))
        b = list(a) if i % 2 == 0 else list(rng.choice(words, size=int(rng.integers(3, 9))))
        if i % 2 == 0:
            b[int(rng.integers(len(b)))] = str(rng.choice(words))
        lines.append(f"g\tf\t2020\t{i:04d}\t{round(float(rng.uniform(0, 5)), 1)}\t{' '.join(a)}\t{' '.join(b)}")
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def runs(tiny_model, tmp_path_factory):
    """One result directory per analysis, made on tiny models (sts with two models of different depth)."""
    import torch

    root = tmp_path_factory.mktemp("html-runs")
    env = pytest.MonkeyPatch()
    env.setenv("LAYERSCOPE_HOME", str(root / "home"))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    bert = str(tiny_model("bert"))
    shallow = first_block_of(bert, root / "bert-1-layer")  # a model of another depth
    pairs = str(_pairs_file(root / "pairs.tsv"))
    texts = root / "texts.txt"
    texts.write_text("the cat sat on the mat\nwater boils at sea level\n", encoding="utf-8")
    labeled = root / "labeled.jsonl"
    labeled.write_text("".join(json.dumps({"text": t, "label": lab}) + "\n" for t, lab in (
        ("what a lovely warm day in the park", "pos"), ("the food is great and kind people", "pos"),
        ("what a cold grim day in the park", "neg"), ("the food is awful and rude people", "neg"))), encoding="utf-8")
    plans = {
        "sts": dict(models=[bert, str(shallow)], data=pairs, poolings=["mean", "cls"], options={"n_boot": 30}),
        "compositionality": dict(models=[bert], poolings=["mean"]),
        "pooling": dict(models=[bert], data=pairs, options={"n_boot": 30}),
        "alignment": dict(models=[bert], options={"generate": "zh-en", "n": 24, "permutations": 20, "examples": 6}),
        "similarity": dict(models=[bert], options={"n": 15, "knn": 4}),
        "lens": dict(models=[bert], data=str(texts), options={"top_k": 3, "show": 2, "batch": 2}),
        "saliency": dict(models=[bert], data=str(labeled), layers="1,2",
                         options={"k": 2, "ig_steps": 2, "random_draws": 1, "objective": "similarity",
                                  "reference": "a lovely day in the park", "decode": "logits", "eval_fraction": 0.5}),
        "mteb": dict(models=[bert], data=pairs, poolings=["mean"], options={"tasks": "STSBenchmark"}),
        "token_alignment": dict(models=[bert], options={"generate": "zh-en", "n": 8, "bins": 4}),
        "word_context": dict(models=[bert], options={"n": 30}),
    }
    out = {}
    try:
        for name, plan in plans.items():
            if name == "mteb":
                try:
                    import datasets  # noqa: F401
                    import mteb  # noqa: F401
                except ImportError:
                    continue
            plan.setdefault("layers", "all")
            out[name] = run_analysis(name, RunRequest(engine="torch", out=root / name, cache=False, **plan))[0]
    finally:
        torch.set_num_threads(threads)
        env.undo()
    return out


def _dir(runs, name: str) -> Path:
    if name not in runs:
        pytest.skip(f"{name} needs the mteb and datasets packages (pip install 'layerscope[mteb]')")
    return runs[name]


@pytest.fixture(scope="module")
def opened(runs, tmp_path_factory):
    """``opened(name) -> (dom, console)`` of an analysis's report.html, each page opened once per module."""
    seen: dict[str, tuple[str, list[str]]] = {}

    def get(name: str):
        if name not in seen:
            seen[name] = open_page(_dir(runs, name) / "report.html", tmp_path_factory.mktemp("profile"))
        return seen[name]

    return get


# -- the tests ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ANALYSES)
def test_report_renders_in_chromium_without_console_messages(runs, opened, name):
    out = _dir(runs, name)
    page = out / "report.html"
    text = page.read_text(encoding="utf-8")
    assert outside_plotly_js(text).count("<script>") >= 1 and not re.search(
        r"""src=|href=["']?(https?:)?//|url\(|@import|fetch\(|XMLHttpRequest""", outside_plotly_js(text)), \
        "the page must not load anything"
    dom, console = opened(name)
    assert console == [], console
    drawn = figures_drawn(dom)
    expected = dict(re.findall(r"<div class='lsfig' id='(fig-\d+)' data-kind='(\w+)'>", text))
    assert expected, "no chart on the page"
    for fig_id, kind in expected.items():
        got = drawn.get(fig_id, "")
        assert kind in got.split(","), f"{fig_id}: expected plotly to draw {kind}, got {got!r}"
    assert "Settings" in dom and "Models" in dom
    for model in json.loads((out / "results.json").read_text())["models"]:
        assert model in dom


def test_page_checker_sees_script_errors(tmp_path):
    """The console check above can fail: a page that throws is caught."""
    page = tmp_path / "bad.html"
    page.write_text("<!DOCTYPE html><html><body><script>undefinedFunction();</script></body></html>")
    _, console = open_page(page, tmp_path / "profile")
    assert any("undefinedFunction" in line for line in console), console


def test_sts_page_overlays_models_by_relative_depth(runs):
    """Two models of 2 and 1 blocks share one x axis: layer / number of layers."""
    out = _dir(runs, "sts")
    text = (out / "report.html").read_text(encoding="utf-8")
    data = json.loads(re.search(r"<script type='application/json' id='ls-data'>(.*?)</script>", text, re.S).group(1))
    fig = data["figures"][0]
    assert fig["layout"]["xaxis"]["title"]["text"].startswith("relative depth")
    lines = {t["name"]: t["x"] for t in fig["data"] if t.get("mode") == "lines+markers"}
    assert len(lines) == 4  # 2 models x 2 poolings
    deep = next(x for n, x in lines.items() if "bert-1-layer" not in n and n.endswith("mean"))
    shallow = next(x for n, x in lines.items() if "bert-1-layer" in n and n.endswith("mean"))
    assert deep == pytest.approx([0.0, 0.5, 1.0])  # raw is left out of the relative axis
    assert shallow == pytest.approx([0.0, 1.0])
    # the bootstrap band is drawn: a filled polygon per series, from the CI columns of results.json
    bands = {t["name"]: t for t in fig["data"] if t.get("fill") == "toself"}
    assert len(bands) == len(lines)
    results = json.loads((out / "results.json").read_text())
    model = next(k for k in results["per_model"] if "bert-1-layer" not in k)
    rows = [r for r in results["per_model"][model]["tables"]["layers"]
            if r["pooling"] == "mean" and r["layer"] != "raw"]
    band = next(t for n, t in bands.items() if "bert-1-layer" not in n and "/ mean:" in n)
    highs, lows = [r["spearman_ci_high"] for r in rows], [r["spearman_ci_low"] for r in rows]
    assert band["y"] == pytest.approx(highs + lows[::-1])


def test_alignment_page_holds_the_neighbour_browser(runs, opened):
    out = _dir(runs, "alignment")
    results = json.loads((out / "results.json").read_text())
    (fig,) = results["per_model"].values()
    nb = fig["neighbours"]
    assert len(nb["queries"]) == 6 and nb["k"] == 5
    dom, console = opened("alignment")
    assert console == []
    first = nb["queries"][0]
    # the browser shows the first source text and, per layer, its neighbours' texts
    assert json.dumps(nb["sources"][str(first)], ensure_ascii=False)[1:-1] in json.dumps(dom, ensure_ascii=False)
    browser = dom[dom.index('id="nb-root"'):]
    top = nb["by"][fig["poolings"][0]][fig["layers"][0]]["ids"][0][0]
    assert nb["targets"][str(top)] in browser
    assert browser.count("<tr>") >= len(fig["layers"])


def _tamper(results: dict) -> dict:
    """Hostile strings in every place a results file puts text on the page: names, settings, table cells,
    a table name that is a path, and the texts the neighbour browser shows."""
    model = next(iter(results["per_model"]))
    bad_model = model + LOUD + PAYLOAD
    results["per_model"] = {bad_model: results["per_model"][model]}
    results["models"] = {bad_model: results["models"][model]}
    results["description"] = LOUD
    results["settings"]["data"] = "../../etc/" + LOUD
    fig = results["per_model"][bad_model]
    rows = fig["tables"]["alignment_layers"]
    for r in rows[: len(rows) // 2]:
        r["pooling"] = LOUD
    rows[1]["layer"] = PAYLOAD
    fig["tables"]["../../escape" + LOUD] = [{"layer": "0", "note": LOUD}]
    fig["summary"]["pooling"] = LOUD
    nb = fig["neighbours"]
    for key in nb["sources"]:
        nb["sources"][key] = LOUD + PAYLOAD
    for key in nb["targets"]:
        nb["targets"][key] = PAYLOAD + LOUD
    return results


def test_results_strings_are_escaped(runs, tmp_path):
    src = _dir(runs, "alignment")
    work = tmp_path / "tampered"
    shutil.copytree(src, work)
    results = _tamper(json.loads((work / "results.json").read_text()))
    (work / "results.json").write_text(json.dumps(results), encoding="utf-8")
    before = set(p.name for p in tmp_path.iterdir())
    rerender(work)
    assert set(p.name for p in tmp_path.iterdir()) == before, "a file was written outside the result directory"
    text = (work / "report.html").read_text(encoding="utf-8")
    for raw in (PAYLOAD, "<script>console.error", "<img src=x"):
        assert raw not in text
    dom, console = open_page(work / "report.html", tmp_path / "profile")
    assert console == [], console  # neither an injected script nor an image's error handler ran
    assert dom.count("INJECTED-SCRIPT") >= 4  # the strings are on the page, as text (header, tables, browser)
    assert "<img src=\"x\"" not in dom and "<img src=x" not in dom
    browser = dom[dom.index('id="nb-root"'):]
    assert "alert(1)" in browser and "<script>alert(1)" not in browser


def test_report_is_made_from_results_json_alone(runs, tmp_path, monkeypatch):
    """Re-rendering a copied result directory with an empty cache (no model, no vectors) gives the same page."""
    src = _dir(runs, "alignment")
    work = tmp_path / "copy"
    shutil.copytree(src, work)
    (work / "report.html").unlink()
    monkeypatch.setenv("LAYERSCOPE_HOME", str(tmp_path / "empty-home"))
    rerender(work)
    assert (work / "report.html").read_bytes() == (src / "report.html").read_bytes()
    assert not (tmp_path / "empty-home").exists()


def test_report_html_is_named_in_report_md(runs):
    assert "report.html" in (_dir(runs, "compositionality") / "report.md").read_text(encoding="utf-8")


def test_declared_views_escape_strings_from_results(runs, tmp_path):
    """A declared analysis's sentence and listing (word_context) put strings from results.json on the page and
    in report.md as text only."""
    work = tmp_path / "tampered"
    shutil.copytree(_dir(runs, "word_context"), work)
    results = json.loads((work / "results.json").read_text())
    fig = next(iter(results["per_model"].values()))
    fig["summary"]["words"] = [LOUD, "plain"]
    fig["neighbours"][0]["word"] = LOUD
    fig["neighbours"][0]["neighbours"][0]["word"] = LOUD
    (work / "results.json").write_text(json.dumps(results), encoding="utf-8")
    rerender(work)
    text = (work / "report.html").read_text(encoding="utf-8")
    for raw in ("<script>console.error", "<img src=x"):
        assert raw not in text
        assert raw not in (work / "report.md").read_text(encoding="utf-8")
    dom, console = open_page(work / "report.html", tmp_path / "profile")
    assert console == [], console
    words = dom[dom.index('id="words"'):dom.index('id="figures"')]
    assert words.count("INJECTED-SCRIPT") >= 3  # the sentence, the occurrence and its neighbour, as text
