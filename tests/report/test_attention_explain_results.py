"""``run attention`` and ``run explain`` results, typed: a results.json made by hand round-trips through
``to_disk``/``from_disk`` with its typed records (the viewer's texts, the pairs shown), the declarations draw
PNG, report.md, report.html and the console from it, and a malformed record is one line naming its field."""

from __future__ import annotations

import copy
import io
import json

import pytest

from layerscope.analyses.base import rerender
from layerscope.analyses.rendering import load_results
from layerscope.cli import main
from layerscope.errors import InputError
from layerscope.report.attention_html import VIEWER, ViewerText
from layerscope.report.explain_figs import PAIRS, ExplainPair
from layerscope.report.results import Results

SUMMARIES = ("entropy", "first", "special", "distance", "previous")
PATTERNS = [[[[1.0, 0.0], [0.25, 0.75]], [[0.5, 0.5], [0.5, 0.5]]],
            [[[0.75, 0.25], [0.125, 0.875]], [[1.0, 0.0], [0.0, 1.0]]]]  # 2 layers x 2 heads x 2 x 2
ROLLOUT = [[[0.875, 0.125], [0.25, 0.75]], [[0.8, 0.2], [0.3, 0.7]]]
TEXT = {"index": 0, "text": "hi <b>there</b>", "tokens": ["[CLS]", "hi"], "special": [True, False], "causal": False,
        "patterns": PATTERNS, "rollout": ROLLOUT, "flow_query": 0, "flow": [0.625, 0.375]}
GRID = [[0.5, None], [0.25, 0.125]]  # layer x head; None: a head no text defines


def _base(analysis: str, per_model: dict) -> dict:
    return {"format": 1, "analysis": analysis, "description": "by hand", "main_score": None, "seconds": 1.0,
            "settings": {}, "models": {"m": {"spec": "m", "manifest": {"num_layers": 2}, "engine": {}}},
            "per_model": {"m": per_model}, "combined": {}}


def attention_doc() -> dict:
    layers = [{"layer": str(i + 1), "texts": 2, **{s: 0.1 * (i + 1) + 0.01 * j for j, s in enumerate(SUMMARIES)}}
              for i in range(2)]
    summary = {"first_share_last_layer": 0.21, "texts": 2, "layers": 2, "heads": 2, "causal": False, "engine": "ort",
               "intervals": "95% bootstrap over texts"}
    return _base("attention", {"summary": summary, "grids": {s: copy.deepcopy(GRID) for s in SUMMARIES},
                               "viewer": [copy.deepcopy(TEXT)],
                               "tables": {"attention_layers": layers, "attention_heads": []}})


PAIR = {"pair": 1, "layer": "raw", "text_a": "a cat", "text_b": "a dog", "tokens_a": ["[CLS]", "<b>", "[SEP]"],
        "tokens_b": ["[CLS]", "dog", "[SEP]"], "special_a": [True, False, True], "special_b": [True, False, True],
        "matrix": [[0.0, 0.0, 0.0], [0.0, 0.5, -0.125], [0.0, 0.0, 0.0]], "rows": [0.0, 0.375, 0.0],
        "cols": [0.0, 0.5, -0.125], "similarity": 0.9, "target": 0.375, "matrix_sum": 0.375}


def explain_doc() -> dict:
    curve = [{"pair": p, "layer": "raw", "steps": s, "relative_error": 0.5 / s / p} for p in range(1, 14)
             for s in (2, 4)]
    hiding = [{"layer": "raw", "method": m, "pairs": 13, "hide_aopc": v, "hide_aopc_ci_low": v - 0.05,
               "hide_aopc_ci_high": v + 0.05} for m, v in (("pairs", 0.3), ("random", 0.1), ("one-sided", 0.2))]
    tests = [{"layer": "raw", "method_a": "pairs", "method_b": "random", "pairs": 13, "difference": 0.2,
              "ci_low": 0.1, "ci_high": 0.3, "p_value": 0.002}]
    rows = [{"pair": 1, "layer": "raw", "similarity": 0.9, "reference_similarity": 0.525, "target": 0.375,
             "matrix_sum": 0.375, "completeness_error": 0.0, "relative_error": 0.0}]
    summary = {"pairs_hide_aopc": 0.3, "random_hide_aopc": 0.1, "one_sided_hide_aopc": 0.2, "n_pairs": 13,
               "at": ["raw"], "steps": 4, "pooling": "mean", "similarity": "cosine", "baseline": "pad",
               "baseline_text": "the pad token's embedding", "k_max": 1, "completeness_relative_error_mean": 0.01,
               "completeness_relative_error_max": 0.02, "intervals": "95% bootstrap over pairs", "data": "pairs.tsv"}
    return _base("explain", {"summary": summary, "pairs": [copy.deepcopy(PAIR)],
                             "tables": {"explain_pairs": rows, "explain_completeness": curve,
                                        "explain_hiding": hiding, "explain_tests": tests}})


def _write(tmp_path, doc, name="r"):
    out = tmp_path / name
    out.mkdir()
    Results.from_document(doc, "by hand").to_disk(out)
    return out


def _page_data(out) -> dict:
    page = (out / "report.html").read_text(encoding="utf-8")
    return json.loads(page.split("<script type='application/json' id='ls-data'>")[1].split("</script>")[0])


def test_attention_results_round_trip_with_typed_viewer_texts(tmp_path):
    doc = attention_doc()
    saved = load_results(_write(tmp_path, doc))
    again = tmp_path / "again"
    again.mkdir()
    saved.to_disk(again)
    assert json.loads((again / "results.json").read_text(encoding="utf-8")) == doc  # the on-disk shape is kept
    (text,) = saved.per_model["m"].records(VIEWER)
    assert text == ViewerText(index=0, text="hi <b>there</b>", tokens=("[CLS]", "hi"), special=(True, False),
                              causal=False, patterns=PATTERNS, rollout=ROLLOUT, flow_query=0, flow=[0.625, 0.375])
    assert text.to_json() == TEXT


def test_attention_results_drawn_from_the_declaration(tmp_path):
    out = _write(tmp_path, attention_doc())
    done = rerender(out)
    assert sorted(done.plots) == sorted(f"attention_{s}.png" for s in SUMMARIES)
    md = (out / "report.md").read_text(encoding="utf-8")
    assert "2 texts, 2 layers x 2 heads, engine ort; causal (decoder) attention: False." in md
    assert "| layer | entropy | first | special | distance | previous |" in md
    assert "| 2 | 0.200 | 0.210 | 0.220 | 0.230 | 0.240 |" in md
    data = _page_data(out)
    assert data["attention_viewer"] == {"m": [TEXT]}  # the viewer's texts, as typed records hand them on
    heat = [f for f in data["figures"] if f["data"][0].get("type") == "heatmap"]
    assert len(heat) == len(SUMMARIES)
    for fig in heat:  # layers counted from 1, heads from 0; an undefined head stays empty
        assert fig["data"][0]["y"] == ["1", "2"] and fig["data"][0]["x"] == ["0", "1"]
        assert fig["data"][0]["z"] == GRID
    page = (out / "report.html").read_text(encoding="utf-8")
    assert "hi <b>there</b>" not in page  # the text is data: escaped in the page's JSON block


def test_explain_results_round_trip_and_drawn_from_the_declaration(tmp_path):
    doc = explain_doc()
    out = _write(tmp_path, doc)
    saved = load_results(out)
    (pair,) = saved.per_model["m"].records(PAIRS)
    assert pair == ExplainPair(pair=1, layer="raw", text_a="a cat", text_b="a dog", tokens_a=("[CLS]", "<b>", "[SEP]"),
                               tokens_b=("[CLS]", "dog", "[SEP]"), special_a=(True, False, True),
                               special_b=(True, False, True),
                               matrix=((0.0, 0.0, 0.0), (0.0, 0.5, -0.125), (0.0, 0.0, 0.0)), rows=(0.0, 0.375, 0.0),
                               cols=(0.0, 0.5, -0.125), similarity=0.9, target=0.375, matrix_sum=0.375)
    assert pair.to_json() == PAIR and pair.scale == 0.5
    done = rerender(out)
    assert sorted(done.plots) == ["completeness_m.png", "hiding.png", "pair1_at_raw_m.png"]
    md = (out / "report.md").read_text(encoding="utf-8")
    assert "13 pair(s) from pairs.tsv; cosine of mean-pooled embeddings, attributed at raw" in md
    assert "relative completeness error: mean 1.000%, largest 2.000%" in md
    assert "| raw | random | 0.1000 | 0.0500 | 0.1500 |" in md
    data = _page_data(out)
    curves = [f for f in data["figures"] if f["layout"]["xaxis"].get("type") == "log"]
    (curve,) = curves
    names = [t["name"] for t in curve["data"]]
    assert names == [f"pair {p} at raw" for p in range(1, 13)]  # the first 12 of 13 pairs, each named
    assert curve["data"][1]["x"] == [2, 4] and curve["data"][1]["y"] == [0.125, 0.0625]
    heat = [f for f in data["figures"] if f["data"][0].get("type") == "heatmap"]
    assert len(heat) == 1 and heat[0]["data"][0]["z"] == PAIR["matrix"]
    assert heat[0]["data"][0]["y"] == ["0:[CLS]", "1:&lt;b&gt;", "2:[SEP]"]  # a token label is text, escaped
    page = (out / "report.html").read_text(encoding="utf-8")
    assert ">&lt;b&gt;</span>" in page and "><b></span>" not in page  # a token is text on the page
    from rich.console import Console

    from layerscope.analyses.rendering import print_summary
    from layerscope.analyses.registry import get_analysis

    buf = io.StringIO()
    print_summary(get_analysis("explain")(), saved, Console(file=buf, width=160, color_system=None))
    assert "13 pair(s) from pairs.tsv" in buf.getvalue() and "one-sided" in buf.getvalue()


def test_results_written_before_typed_records_still_open(tmp_path):
    """A result folder from before results carried a format (format 0) opens and draws its heat maps."""
    doc = {k: v for k, v in attention_doc().items() if k != "format"}
    out = tmp_path / "old"
    out.mkdir()
    (out / "results.json").write_text(json.dumps(doc), encoding="utf-8")
    saved = load_results(out)
    assert saved.format == 0 and len(saved.per_model["m"].records(VIEWER)) == 1
    assert "attention_first.png" in rerender(out).plots


def _set(path: str, value):
    def change(doc):
        *parts, last = path.split(".")
        target = doc["per_model"]["m"]
        for part in parts:
            target = target[int(part)] if part.isdigit() else target[part]
        target[int(last) if last.isdigit() else last] = value
    return change


@pytest.mark.parametrize("make, change, field", [
    (attention_doc, _set("viewer.0.patterns.1.0", [[1.0, 0.0]]), "per_model.m.viewer[0].patterns"),
    (attention_doc, _set("viewer.0.rollout", [[[1.0]]]), "per_model.m.viewer[0].rollout is 1 x 1 x 1, not 2 x 2 x 2"),
    (attention_doc, _set("viewer.0.tokens.1", 7), "per_model.m.viewer[0].tokens[1] is int"),
    (attention_doc, _set("viewer.0.flow_query", 5), "per_model.m.viewer[0].flow_query is 5"),
    (attention_doc, _set("viewer.0.flow", [0.5]), "per_model.m.viewer[0].flow has 1 values for 2 tokens"),
    (attention_doc, _set("viewer", {"text": "x"}), "per_model.m.viewer is dict"),
    (attention_doc, _set("grids.entropy.0.1", "high"), "per_model.m.grids.entropy[0][1] is str"),
    (explain_doc, _set("pairs.0.matrix", [[0.5]]), "per_model.m.pairs[0].matrix is not 3 x 3"),
    (explain_doc, _set("pairs.0.special_b.1", "no"), "per_model.m.pairs[0].special_b[1] is str"),
    (explain_doc, _set("pairs.0.rows", [0.0]), "per_model.m.pairs[0].rows and .cols"),
    (explain_doc, _set("pairs.0.similarity", None), "per_model.m.pairs[0].similarity is NoneType"),
    (explain_doc, _set("summary.n_pairs", "13"), "per_model.m.summary.n_pairs is str"),
])
def test_a_malformed_record_is_one_line_naming_the_field(tmp_path, capsys, make, change, field):
    doc = make()
    change(doc)
    out = tmp_path / "r"
    out.mkdir()
    (out / "results.json").write_text(json.dumps(doc), encoding="utf-8")
    with pytest.raises(InputError, match="re-run layerscope run") as exc:
        load_results(out)
    assert field in str(exc.value)
    with pytest.raises(SystemExit) as stop:
        main(["report", str(out)])
    err = capsys.readouterr().err.strip().splitlines()
    assert stop.value.code == 2 and len(err) == 1 and field in err[0], err
