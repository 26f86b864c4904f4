"""The several-models part of a report: the side-by-side table and the model-vs-model tests, from results alone."""

from __future__ import annotations

from typing import Any

from layerscope.report.numbers import num


def _p(v, resamples: int | None = None) -> str:
    """A p-value; 0 (no resample on one side of 0) is shown as the bound the resamples allow."""
    if v is None:
        return "-"
    if v == 0:
        return f"< {2 / resamples:.1g}" if resamples else "0"
    return f"{v:.1e}" if v < 1e-3 else f"{v:.4f}"


def _best_label(r: dict, side: str) -> str:
    tied = r.get(f"tied_{side}")
    return f" (tied with {tied})" if tied else ""


def _cell(row: dict, name: str, score: str) -> str:
    value = row.get(f"{name} {score}")
    if row.get(f"{name} layer") is None:
        return "-"
    lo, hi = row.get(f"{name} ci_low"), row.get(f"{name} ci_high")
    ci = f" [{num(lo, 3)}, {num(hi, 3)}]" if lo is not None and hi is not None else ""
    return f"{num(value)}{ci}"


def side_by_side_rows(results: dict[str, Any]) -> tuple[list[str], list[list[str]]] | None:
    """Header and cells of the side-by-side table (one column per model: layer and score [95% CI])."""
    combined = results.get("combined") or {}
    meta = combined.get("comparison") or {}
    rows = (combined.get("tables") or {}).get("side_by_side") or []
    if not meta.get("models") or not rows:
        return None
    names, score, by, group = meta["models"], meta["score"], meta["by"], meta["group_label"]
    same = by == "layer"  # every model at the row's own layer: no per-model layer to show
    header = [group, by] + [n if same else f"{n} (layer: score)" for n in names]
    cells = []
    for r in rows:
        line = [str(r.get(group)), str(r.get(by))]
        for n in names:
            layer = r.get(f"{n} layer")
            line.append("-" if layer is None else _cell(r, n, score) if same else f"{layer}: {_cell(r, n, score)}")
        cells.append(line)
    return header, cells


def comparison_rows(results: dict[str, Any]) -> tuple[list[str], list[list[str]]] | None:
    combined = results.get("combined") or {}
    meta = combined.get("comparison") or {}
    rows = (combined.get("tables") or {}).get("model_comparison") or []
    if not meta.get("models") or not rows:
        return None
    score, group = meta["score"], meta["group_label"]
    resamples = meta.get("n_resamples")
    header = ["comparison", "A", "B", "score A", "score B", "A - B", "95% CI", "p", "p (Holm)"]
    cells = []
    for r in rows:
        ci = (f"[{num(r['ci_low'])}, {num(r['ci_high'])}]" if r.get("ci_low") is not None
              and r.get("ci_high") is not None else "-")
        cells.append([r["comparison"], f"{r['model_a']} {r.get(f'{group}_a')} {r['layer_a']}{_best_label(r, 'a')}",
                      f"{r['model_b']} {r.get(f'{group}_b')} {r['layer_b']}{_best_label(r, 'b')}",
                      num(r.get(f"{score}_a")), num(r.get(f"{score}_b")), num(r.get("difference")), ci,
                      _p(r.get("p_value"), resamples), _p(r.get("p_holm"), resamples)])
    return header, cells


def _family(meta: dict) -> str:
    corr = meta.get("correction") or ""
    return corr.removeprefix("Holm over ") if corr else "the tests of this run"


def _md(header: list[str], cells: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(c.replace("|", "\\|") for c in row) + " |" for row in cells]
    return "\n".join(lines) + "\n"


def comparison_markdown(results: dict[str, Any]) -> str:
    """The report.md section for several models ('' for one model)."""
    meta = (results.get("combined") or {}).get("comparison") or {}
    if meta.get("skipped"):
        return f"## Models side by side\n\nNo model-vs-model comparison: {meta['skipped']}.\n"
    side = side_by_side_rows(results)
    if side is None:
        return ""
    label = meta.get("score_label") or meta["score"]
    depth = ("one row per layer" if meta["by"] == "layer" else
             "one row per relative depth (layer / number of layers, on the shallower model's layers; a deeper "
             "model takes its nearest layer): " + ", ".join(f"{k} has {v} layers"
                                                              for k, v in meta["num_layers"].items()))
    out = ["## Models side by side", "",
           f"{label} [95% interval] per {meta['group_label']} and {meta['by']}, {depth}. The table is "
           "`side_by_side.csv`.", "",
           _md(*side)]
    out += [f"- {note}" for note in meta.get("notes") or []] + ([""] if meta.get("notes") else [])
    comp = comparison_rows(results)
    if comp is not None:
        out += ["## Model vs model (paired bootstrap)", "",
                f"Difference of {label} (A - B) with both models scored on the same {meta['n_items']} items "
                f"resampled {meta['n_resamples']} times (seed {meta['seed']}): the 95% percentile interval and "
                "the two-sided p-value are read from the same bootstrap differences (p is twice the share of "
                "resamples on the smaller side of 0), so the interval excludes 0 exactly when p < 0.05. "
                f"'p (Holm)' is p adjusted by Holm's step-down method over {_family(meta)}; read significance "
                "from it when looking at more than one row. 'best of each' compares each model's best layer "
                "(raw embeddings and undefined scores left out; ties named), chosen on these same items (so it "
                "leans optimistic); the other rows compare matched rows of the table above. The table is "
                "`model_comparison.csv`.", "", _md(*comp)]
    return "\n".join(out)


def print_comparison(results: dict[str, Any], console) -> None:
    """The side-by-side table and the model-vs-model tests on the terminal (nothing for one model)."""
    from rich.table import Table

    from layerscope.report.console import esc

    side = side_by_side_rows(results)
    if side is None:
        return
    meta = results["combined"]["comparison"]
    label = meta.get("score_label") or meta["score"]
    table = Table(title=f"models side by side: {esc(label)} [95% CI]")
    for i, h in enumerate(side[0]):
        table.add_column(esc(h), justify="left" if i < 2 else "right")
    for row in side[1]:
        table.add_row(*(esc(v) for v in row))
    console.print(table)
    for n in meta.get("notes") or []:
        console.print(f"[dim]{esc(n)}[/dim]")
    rows = (results["combined"].get("tables") or {}).get("model_comparison") or []
    group = meta["group_label"]
    for a_name, b_name in dict.fromkeys((r["model_a"], r["model_b"]) for r in rows):
        t = Table(title=f"A = {esc(a_name)}, B = {esc(b_name)}: {esc(label)}, paired bootstrap over {meta['n_items']} items")
        for h in ("comparison", "A", "B", "score A", "score B", "A - B [95% CI]", "p", "p (Holm)"):
            t.add_column(h, justify="left" if h in ("comparison", "A", "B") else "right")
        for r in rows:
            if (r["model_a"], r["model_b"]) != (a_name, b_name):
                continue
            ci = (f" [{num(r['ci_low'])}, {num(r['ci_high'])}]" if r.get("ci_low") is not None
                  and r.get("ci_high") is not None else "")
            t.add_row(esc(r["comparison"]), esc(f"{r.get(f'{group}_a')} {r['layer_a']}{_best_label(r, 'a')}"),
                      esc(f"{r.get(f'{group}_b')} {r['layer_b']}{_best_label(r, 'b')}"),
                      num(r.get(f"{meta['score']}_a")), num(r.get(f"{meta['score']}_b")),
                      esc(f"{num(r.get('difference'))}{ci}"), esc(_p(r.get("p_value"), meta.get("n_resamples"))),
                      esc(_p(r.get("p_holm"), meta.get("n_resamples"))))
        console.print(t)
        if meta.get("correction"):
            console.print(f"[dim]p (Holm): {esc(meta['correction'])}; the interval excludes 0 exactly when "
                          "p < 0.05[/dim]")
