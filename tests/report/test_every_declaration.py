"""Every registered analysis's declared figures (report/figures.py) drawn from a small result of that analysis:
tests/report/declared_results.json holds one per analysis (``name``, and ``name+what`` for another run of it
whose settings make the parts of its figures that only some runs have: a probe, two models), made by running it
on tiny models and cut down (scripts/declared_results.py; run it again after changing what an analysis writes).

Each is read back as ``layerscope report`` reads results.json, drawn to PNG, report.md, report.html and the
console, and each declared part must find what it names: a curve's table and its lines' columns, a table's
columns, a heat map's matrix (a dotted path), grouped bars' rows, a listing's items, and every template's
fields (the sentence over each model's summary, the preface over the combined figures, a listing's items). A
declaration that names a field the analysis does not write would otherwise draw nothing, or "undefined", in a
user's run, with every other test green."""

from __future__ import annotations

import io
import json
import string
from pathlib import Path

import pytest

from layerscope.analyses.registry import registry

DOCS = json.loads((Path(__file__).with_name("declared_results.json")).read_text(encoding="utf-8"))
MISSING = object()


def _unresolved(template: str, values: dict) -> list[str]:
    """The fields of ``template`` that ``values`` does not hold (a dotted path walks nested dicts and lists)."""
    from layerscope.report.templates import lookup

    names = [name for _, name, _, _ in string.Formatter().parse(template) if name]
    return [name for name in names if lookup(values, name, MISSING) is MISSING]


def _runs(name: str) -> list[str]:
    """The keys of ``name``'s small results (its own and its ``name+what`` runs)."""
    keys = [k for k in DOCS if k.split("+")[0] == name]
    if not keys:
        pytest.fail(f"no small result of '{name}' in tests/report/declared_results.json: give it a plan in "
                    f"scripts/declared_results.py and run python scripts/declared_results.py --only {name}")
    return keys


def _read(key: str):
    """One small result read as ``layerscope report`` reads results.json: its declared fields checked."""
    from layerscope.analyses.rendering import declared_figures
    from layerscope.report.results import Results

    return Results.from_document(json.loads(json.dumps(DOCS[key])), f"declared_results.json[{key}]",
                                 figures_of=declared_figures)


@pytest.mark.parametrize("name", sorted(registry()))
def test_every_declared_part_finds_what_it_names(name):
    """Catches: a curve, table, heat map, bars or listing naming a table, column or dotted path the analysis does
    not write; a template field its summary, combined figures or items do not hold. A part that only some runs
    make (a probe's bars) must find what it names in one of the analysis's runs."""
    decl = registry()[name].metadata.figures
    assert decl is not None, f"{name} declares no figures"
    found = [_problems(decl, _read(key)) for key in _runs(name)]
    missing = set.intersection(*(set(p) for p in found))  # a part no run makes
    broken = {p for problems in found for p in problems if p.startswith("template")}  # a template fails in any
    assert not missing | broken, f"{name}: " + "; ".join(sorted(missing | broken))


def _problems(decl, results) -> list[str]:
    """What ``decl`` names that ``results`` does not hold ("template ..." for a field a template cannot fill)."""
    from layerscope.report import declared, declared_grids

    models = list(results.per_model.values())
    problems = []
    if decl.sentence:
        for fig in models:
            problems += [f"template sentence: {{{f}}}" for f in _unresolved(decl.sentence, fig.summary)]
    if decl.preface:
        problems += [f"template preface: {{{f}}}" for f in
                     _unresolved(decl.preface, declared._preface_values(decl, results))]
    for curve in decl.curves:
        rows = [r for fig in models for r in fig.table(curve.table)]
        if not rows:
            problems.append(f"curve {curve.file}: no rows in table '{curve.table}'")
        for line in curve.lines:
            if not any(r.get(line.column) is not None for r in rows):
                problems.append(f"curve {curve.file}: no value in column '{line.column}'")
        if isinstance(curve.chance, str) and all(_unresolved("{" + curve.chance + "}", f.summary) for f in models):
            problems.append(f"curve {curve.file}: no chance level at '{curve.chance}'")
        problems += [f"template curve {curve.file} title: {{{f}}}" for f in _unresolved(curve.title, {"about": ""})]
    for table in decl.tables:
        rows = [r for fig in models for r in fig.rows(table.name)]
        if not rows:
            problems.append(f"table '{table.name}': no rows")
        problems += [f"table '{table.name}': no column '{c}'" for c in table.columns if rows and
                     not any(c in r for r in rows)]
    for listing in decl.listings:
        items = [x for fig in models for x in declared._items(listing, fig)]
        if not items:
            problems.append(f"listing '{listing.value}': no items")
            continue
        problems += [f"template listing '{listing.value}': {{{f}}}" for f in
                     _unresolved(listing.item, {**items[0], **({listing.sub: ""} if listing.sub else {})})]
        subs = [s for s in items[0].get(listing.sub) or [] if isinstance(s, dict)] if listing.sub else []
        problems += [f"template listing '{listing.value}' each: {{{f}}}" for s in subs[:1]
                     for f in _unresolved(listing.each, s)]
    made = declared_grids.grids(decl, results, declared.fill)
    problems += [f"heat map {spec.file}: nothing at '{spec.value}'" for spec in decl.heatmaps
                 if not any(g.spec is spec for g in made)]
    problems += [f"bars {spec.file}: no bar from '{spec.rows}'" for spec in decl.bars
                 if not declared_grids.bar_groups(spec, results)[0]]
    return problems


@pytest.fixture(scope="module")
def drawn(tmp_path_factory) -> dict[str, tuple[Path, list[str]]]:
    """Each small result drawn as ``layerscope report`` draws results.json: ``{key: (folder, files drawn)}``."""
    from layerscope.analyses.base import rerender

    out = {}
    for key in sorted(DOCS):
        folder = tmp_path_factory.mktemp("declared") / key
        folder.mkdir()
        (folder / "results.json").write_text(json.dumps(DOCS[key]), encoding="utf-8")
        out[key] = (folder, list(rerender(folder).plots))
    return out


@pytest.mark.parametrize("key", sorted(DOCS))
def test_every_declaration_draws_to_png_markdown_html_and_the_console(key, drawn):
    """The declaration as a user's run draws it, from results.json alone. Catches: a template the formatter
    cannot read (an unclosed brace, a format a number cannot take), a chart that fails on the analysis's own
    values."""
    from rich.console import Console

    from layerscope.analyses.rendering import load_results, print_summary

    name = key.split("+")[0]
    assert name in registry(), f"declared_results.json holds '{key}', which no registered analysis is"
    out, plots = drawn[key]
    assert plots and all((out / f).stat().st_size > 0 for f in plots)
    md = (out / "report.md").read_text(encoding="utf-8")
    page = (out / "report.html").read_text(encoding="utf-8")
    assert md.strip() and "<script type='application/json' id='ls-data'>" in page
    buf = io.StringIO()
    print_summary(registry()[name](), load_results(out), Console(file=buf, width=160, color_system=None))
    assert buf.getvalue().strip()


def test_every_declared_png_is_drawn_by_some_run(drawn):
    """Each declared curve, heat map and bars that has a PNG gets it from one of its analysis's runs. Catches: a
    declared figure that never reaches its PNG (its rows filtered away, its file named otherwise)."""
    files: dict[str, list[str]] = {}
    for key, (_, plots) in drawn.items():
        files.setdefault(key.split("+")[0], []).extend(plots)
    problems = []
    for name, analysis in registry().items():
        decl = analysis.metadata.figures
        for spec in [*decl.curves, *decl.heatmaps, *decl.bars]:
            stem = spec.file.split("{slug}")[0]
            if getattr(spec, "png", True) and not any(f.startswith(stem) for f in files.get(name, [])):
                problems.append(f"{name}: {spec.file}")
    assert not problems, problems
