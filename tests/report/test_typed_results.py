"""results.json, typed (report/results.py): read back checked field by field, a bad one is one line naming the
field; a declared analysis's figures are drawn from its declaration alone (report/declared.py)."""

from __future__ import annotations

import html
import json
from pathlib import Path

import pytest

from layerscope.analyses import registry as analyses_registry
from layerscope.analyses.base import Analysis, AnalysisMetadata, rerender
from layerscope.analyses.rendering import load_results
from layerscope.cli import main
from layerscope.errors import InputError
from layerscope.report.declared import fill
from layerscope.report.figures import Curve, Figures, Line, Listing, Table
from layerscope.report.results import Results

ROWS = [{"layer": "raw", "score": 0.25, "score_ci_low": 0.2, "score_ci_high": 0.3},
        {"layer": "0", "score": 0.5, "score_ci_low": 0.4, "score_ci_high": 0.6},
        {"layer": "1", "score": 0.75, "score_ci_low": 0.7, "score_ci_high": 0.8}]


class _Declared(Analysis):
    """An analysis with nothing but a declaration: no plots, report or console code of its own."""

    metadata = AnalysisMetadata(
        name="declared-probe", description="test only", inputs=(), main_score="score",
        figures=Figures(sentence="{n:,} items, best {score:.2f} ({note})", summary_numbers=("score", "n"),
                        curves=(Curve("by_layer", (Line("score", "score"),), file="score_by_layer",
                                      title="score by layer", ylabel="score", chance="chance"),),
                        tables=(Table("by_layer", ("layer", "score")),),
                        listings=(Listing("examples", "Examples", item="{name}: {near}", sub="near",
                                          each="{name}"),)))

    def compute(self, ctx, run, data):
        return {}


def _doc(**summary) -> dict:
    return {"format": 1, "analysis": "declared-probe", "description": "probe", "main_score": "score",
            "layerscope_version": "0", "created": "now", "seconds": 1.5, "settings": {"layers": "all"},
            "models": {"m": {"spec": "m", "manifest": {"num_layers": 1, "family": "bert"}, "engine": {}}},
            "per_model": {"m": {"summary": {"score": 0.75, "n": 1200, "chance": 0.5, "note": "ok", **summary},
                                "tables": {"by_layer": [dict(r) for r in ROWS]},
                                "examples": [{"name": "a<b>", "near": [{"name": "c"}, {"name": "d&e"}]}]}},
            "combined": {}}


@pytest.fixture
def declared(monkeypatch):
    analyses_registry.registry()
    monkeypatch.setitem(analyses_registry._REGISTRY, "declared-probe", _Declared)


def _write(tmp_path: Path, doc) -> Path:
    out = tmp_path / "r"
    out.mkdir(exist_ok=True)
    (out / "results.json").write_text(doc if isinstance(doc, str) else json.dumps(doc), encoding="utf-8")
    return out


def test_results_read_back_as_written(tmp_path, declared):
    saved = load_results(_write(tmp_path, _doc()))
    assert saved.analysis == "declared-probe" and saved.seconds == 1.5 and saved.settings.layers == "all"
    assert saved.per_model["m"].summary["score"] == 0.75
    assert saved.per_model["m"].table("by_layer") == tuple(ROWS) and saved.per_model["m"].table("none") == ()
    assert saved.num_layers("m") == 1 and saved.models["m"].facts["family"] == "bert"
    again = tmp_path / "again"
    again.mkdir()
    saved.to_disk(again)
    assert json.loads((again / "results.json").read_text()) == _doc()  # the JSON shape is kept as it was


def test_results_without_a_format_still_load(tmp_path):
    """A results.json from before the run spec (format 0: no format, spec, spec_hash or identity) opens."""
    doc = {k: v for k, v in _doc().items() if k != "format"}
    saved = Results.from_disk(_write(tmp_path, doc))
    assert saved.format == 0 and saved.older and saved.spec_hash is None and saved.complete


@pytest.mark.parametrize("change, field", [
    (lambda d: d.update(per_model=[1]), "per_model is list"),
    (lambda d: d["per_model"]["m"].update(tables={"by_layer": [1, 2]}), "per_model.m.tables.by_layer[0] is int"),
    (lambda d: d["per_model"]["m"].update(summary="x"), "per_model.m.summary is str"),
    (lambda d: d["models"]["m"].update(manifest=[]), "models.m.manifest is list"),
    (lambda d: d.update(settings="all"), "settings is str"),
    (lambda d: d.update(seconds="1"), "seconds is str"),
    (lambda d: d["per_model"]["m"].update(mteb_files={"../../outside.json": {}}), "'../../outside.json'"),
    (lambda d: d["per_model"]["m"].update(mteb_files={"/etc/x.json": {}}), "'/etc/x.json'"),
    (lambda d: d["per_model"]["m"]["summary"].update(score="<b>1</b>"), "per_model.m.summary.score is str"),
    (lambda d: d["per_model"]["m"]["tables"]["by_layer"][1].update(score=[0.5]),
     "per_model.m.tables.by_layer[1].score is list"),
])
def test_a_hostile_results_json_is_one_line_naming_the_field(tmp_path, declared, capsys, change, field):
    doc = _doc()
    change(doc)
    out = _write(tmp_path, doc)
    with pytest.raises(InputError, match="re-run layerscope run") as exc:
        load_results(out)
    assert field in str(exc.value)
    with pytest.raises(SystemExit) as stop:
        main(["report", str(out)])
    err = capsys.readouterr().err.strip().splitlines()
    assert stop.value.code == 2 and len(err) == 1 and field in err[0], err


def test_non_finite_numbers_are_refused(tmp_path):
    out = _write(tmp_path, json.dumps(_doc()).replace('"score": 0.75', '"score": NaN', 1))
    with pytest.raises(InputError, match="not valid JSON"):
        Results.from_disk(out)


def test_fill_formats_numbers_and_escapes_text():
    assert fill("{n:,} at {x:.2f}: {w}", {"n": 12345, "x": 0.456, "w": "<i>"}, html.escape) == "12,345 at 0.46: &lt;i&gt;"
    assert fill("{x:.2f} {missing} {w:.1%}", {"x": "text", "w": ["a", "b"]}, str) == "text undefined a, b"


def test_a_declared_analysis_gets_png_markdown_html_and_console_from_its_declaration(tmp_path, declared):
    out = _write(tmp_path, _doc())
    done = rerender(out)
    assert done.plots == ("score_by_layer.png",) and (out / "score_by_layer.png").stat().st_size > 0
    md = (out / "report.md").read_text(encoding="utf-8")
    assert "1,200 items, best 0.75 (ok)" in md
    assert "| layer | score |" in md and "| 0 | 0.500 |" in md
    assert "- a&lt;b&gt;: c; d&amp;e" in md  # the listing, every string escaped for Markdown
    page = (out / "report.html").read_text(encoding="utf-8")
    assert "<li>a&lt;b&gt;: c; d&amp;e</li>" in page and "1,200 items, best 0.75 (ok)" in page
    data = json.loads(page.split("<script type='application/json' id='ls-data'>")[1].split("</script>")[0])
    (curve,) = data["figures"]
    (line,) = [t for t in curve["data"] if t.get("name") == "score"]
    assert line["x"] == ["raw", "0", "1"] and line["y"] == [0.25, 0.5, 0.75]
    assert any(s.get("y0") == 0.5 for s in curve["layout"].get("shapes", []))  # the chance line
    import io

    from rich.console import Console

    from layerscope.analyses.rendering import print_summary

    buf = io.StringIO()
    print_summary(_Declared(), load_results(out), Console(file=buf, width=120, color_system=None))
    assert "1,200 items, best 0.75 (ok)" in buf.getvalue() and "0.750" in buf.getvalue()


class _Bracketed(_Declared):
    """A declaration whose own words hold Rich's markup brackets and HTML's special characters."""

    metadata = AnalysisMetadata(
        name="declared-probe", description="test only", inputs=(), main_score="score",
        figures=Figures(sentence="sums to s(a, b) - [s(r_a, b) + s(a, r_b)] [bold]; a win is diff > 0 ({note})",
                        summary_numbers=("score",), tables=(Table("by_layer", ("layer", "score")),)))


def test_a_declarations_own_words_print_exactly_on_the_console_and_in_html(tmp_path, monkeypatch):
    import io

    from rich.console import Console

    from layerscope.analyses.rendering import print_summary

    analyses_registry.registry()
    monkeypatch.setitem(analyses_registry._REGISTRY, "declared-probe", _Bracketed)
    out = _write(tmp_path, _doc(note="[red]x"))
    rerender(out)
    buf = io.StringIO()
    print_summary(_Bracketed(), load_results(out), Console(file=buf, width=200, color_system=None))
    assert "sums to s(a, b) - [s(r_a, b) + s(a, r_b)] [bold]; a win is diff > 0 ([red]x)" in buf.getvalue()
    page = (out / "report.html").read_text(encoding="utf-8")
    assert "[s(r_a, b) + s(a, r_b)] [bold]; a win is diff &gt; 0 ([red]x)" in page


def test_a_grouped_curve_draws_one_line_per_model_and_group_value(tmp_path):
    """``Curve.group``: the rows split into lines by a column's values (here pooling), named after the model
    where several share the chart."""
    from layerscope.report.declared import sections

    rows = [{"layer": "0", "pooling": "mean", "score": 0.1}, {"layer": "1", "pooling": "mean", "score": 0.2},
            {"layer": "0", "pooling": "cls", "score": 0.3}, {"layer": "1", "pooling": "cls", "score": 0.4}]
    doc = _doc()
    doc["per_model"] = {name: {"summary": {}, "tables": {"by_layer": [dict(r) for r in rows]}} for name in ("a", "b")}
    doc["models"] = {}
    decl = Figures(curves=(Curve("by_layer", (Line("score", "score"),), file="f", title="t", ylabel="y",
                                 per_model=False, group=("pooling",)),))
    (section,) = sections(decl, Results.from_document(doc, "test"))
    (chart,) = section.charts
    lines = {t["name"]: t["y"] for t in chart.figure["data"] if t.get("mode", "").startswith("lines")}
    assert lines == {"a mean": [0.1, 0.2], "a cls": [0.3, 0.4], "b mean": [0.1, 0.2], "b cls": [0.3, 0.4]}
