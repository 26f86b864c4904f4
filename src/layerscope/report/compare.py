"""The several-models part of a report: the side-by-side table and the model-vs-model tests, from results alone."""

from __future__ import annotations

from layerscope.report.numbers import num


def _p(v, resamples: int | None = None) -> str:
    """A p-value; 0 (no resample on one side of 0) is shown as the bound the resamples allow."""
    if v is None:
        return "-"
    if v == 0:
        return f"< {2 / resamples:.1g}" if resamples else "0"
    return f"{v:.1e}" if v < 1e-3 else f"{v:.4f}"


def _comparison(results):
    """The typed comparison of ``results`` (typed results, or a document holding ``combined``), or None."""
    from layerscope.report.results_comparison import Comparison

    return Comparison.read(results if isinstance(results, dict) else results.combined)


def _best_label(side) -> str:
    return f" (tied with {side.tied})" if side.tied else ""


def _cell(cell) -> str:
    if cell.layer is None:
        return "-"
    ci = f" [{num(cell.ci_low, 3)}, {num(cell.ci_high, 3)}]" if cell.ci_low is not None and cell.ci_high is not None \
        else ""
    return f"{num(cell.score)}{ci}"


def side_by_side_rows(results, escape=str) -> tuple[list[str], list[list[str]]] | None:
    """Header and cells of the side-by-side table (one column per model: layer and score [95% CI]); ``escape``
    makes each string from results safe for where the table goes."""
    comp = _comparison(results)
    if comp is None or not comp.models or not comp.side_by_side:
        return None
    same = comp.by == "layer"  # every model at the row's own layer: no per-model layer to show
    header = [escape(comp.group_label), escape(comp.by)] + [escape(n) if same else f"{escape(n)} (layer: score)"
                                                            for n in comp.models]
    cells = []
    for r in comp.side_by_side:
        line = [escape(r.group), escape(r.at)]
        for n in comp.models:
            cell = r.cells[n]
            line.append("-" if cell.layer is None else _cell(cell) if same else f"{escape(cell.layer)}: {_cell(cell)}")
        cells.append(line)
    return header, cells


def _test_side(side, with_model: bool = True, escape=str) -> str:
    return escape(" ".join(str(x) for x in ((side.model,) if with_model else ()) + (side.group, side.layer))
                  + _best_label(side))


def _ci(test) -> str:
    return f"[{num(test.ci_low)}, {num(test.ci_high)}]" if test.ci_low is not None and test.ci_high is not None \
        else ""


def comparison_rows(results, escape=str) -> tuple[list[str], list[list[str]]] | None:
    comp = _comparison(results)
    if comp is None or not comp.models or not comp.tests:
        return None
    header = ["comparison", "A", "B", "score A", "score B", "A - B", "95% CI", "p", "p (Holm)"]
    cells = [[escape(t.comparison), _test_side(t.a, escape=escape), _test_side(t.b, escape=escape), num(t.a.score), num(t.b.score), num(t.difference),
              _ci(t) or "-", _p(t.p_value, comp.n_resamples), _p(t.p_holm, comp.n_resamples)] for t in comp.tests]
    return header, cells


def _family(comp) -> str:
    return comp.correction.removeprefix("Holm over ") if comp.correction else "the tests of this run"


def _md(header: list[str], cells: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(c.replace("|", "\\|") for c in row) + " |" for row in cells]
    return "\n".join(lines) + "\n"


def comparison_markdown(results, escape=str) -> str:
    """The report.md section for several models ('' for one model); ``escape``: each string from results made
    safe for Markdown (``writer.md_data``)."""
    comp = _comparison(results)
    if comp is None:
        return ""
    if comp.skipped:
        return f"## Models side by side\n\nNo model-vs-model comparison: {escape(comp.skipped)}.\n"
    side = side_by_side_rows(results, escape)
    if side is None:
        return ""
    label = escape(comp.score_label)
    depth = ("one row per layer" if comp.by == "layer" else
             "one row per relative depth (layer / number of layers, on the shallower model's layers; a deeper "
             "model takes its nearest layer): " + ", ".join(f"{escape(k)} has {escape(str(v))} layers"
                                                              for k, v in comp.num_layers.items()))
    out = ["## Models side by side", "",
           f"{label} [95% interval] per {escape(comp.group_label)} and {escape(comp.by)}, {depth}. The table is "
           "`side_by_side.csv`.", "",
           _md(*side)]
    out += [f"- {escape(note)}" for note in comp.notes] + ([""] if comp.notes else [])
    tests = comparison_rows(results, escape)
    if tests is not None:
        out += ["## Model vs model (paired bootstrap)", "",
                f"Difference of {label} (A - B) with both models scored on the same {comp.n_items} items "
                f"resampled {comp.n_resamples} times (seed {comp.seed}): the 95% percentile interval and "
                "the two-sided p-value are read from the same bootstrap differences (p is twice the share of "
                "resamples on the smaller side of 0), so the interval excludes 0 exactly when p < 0.05. "
                f"'p (Holm)' is p adjusted by Holm's step-down method over {escape(_family(comp))}; read significance "
                "from it when looking at more than one row. 'best of each' compares each model's best layer "
                "(raw embeddings and undefined scores left out; ties named), chosen on these same items (so it "
                "leans optimistic); the other rows compare matched rows of the table above. The table is "
                "`model_comparison.csv`.", "", _md(*tests)]
    return "\n".join(out)


def print_comparison(results, console) -> None:
    """The side-by-side table and the model-vs-model tests on the terminal (nothing for one model)."""
    from rich.table import Table

    from layerscope.report.console import esc

    side = side_by_side_rows(results)
    if side is None:
        return
    comp = _comparison(results)
    label = comp.score_label
    table = Table(title=f"models side by side: {esc(label)} [95% CI]")
    for i, h in enumerate(side[0]):
        table.add_column(esc(h), justify="left" if i < 2 else "right")
    for row in side[1]:
        table.add_row(*(esc(v) for v in row))
    console.print(table)
    for n in comp.notes:
        console.print(f"[dim]{esc(n)}[/dim]")
    for a_name, b_name in dict.fromkeys((t.a.model, t.b.model) for t in comp.tests):
        t = Table(title=f"A = {esc(a_name)}, B = {esc(b_name)}: {esc(label)}, paired bootstrap over {comp.n_items} items")
        for h in ("comparison", "A", "B", "score A", "score B", "A - B [95% CI]", "p", "p (Holm)"):
            t.add_column(h, justify="left" if h in ("comparison", "A", "B") else "right")
        for test in comp.tests:
            if (test.a.model, test.b.model) != (a_name, b_name):
                continue
            ci = f" {_ci(test)}" if _ci(test) else ""
            t.add_row(esc(test.comparison), esc(_test_side(test.a, False)), esc(_test_side(test.b, False)),
                      num(test.a.score), num(test.b.score), esc(f"{num(test.difference)}{ci}"),
                      esc(_p(test.p_value, comp.n_resamples)), esc(_p(test.p_holm, comp.n_resamples)))
        console.print(t)
        if comp.correction:
            console.print(f"[dim]p (Holm): {esc(comp.correction)}; the interval excludes 0 exactly when "
                          "p < 0.05[/dim]")
