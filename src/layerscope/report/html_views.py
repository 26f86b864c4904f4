"""What report.html shows for the analyses written before declarations: which figures of results.json become
which charts.

An analysis that declares its figures (``AnalysisMetadata.figures``) gets its charts from that declaration
(report/declared.py); the functions below draw the image analyses not yet declared (crossmodal, vision_lens,
cls_attention) from the results document. Every function here reads results.json's figures and draws them;
none computes a figure. An analysis with neither still gets a page (summary, tables, settings, models) plus a
curve of its main score for every table that has one per layer, drawn from typed results by a declaration made
for it (``generic_views``).
"""

from __future__ import annotations

from typing import Any, Callable

from layerscope.report.html_figures import Chart, Section, Series, heatmap, layer_curves, num


def per_model(results: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {m: f for m, f in (results.get("per_model") or {}).items() if isinstance(f, dict)}


def num_layers(results: dict[str, Any], model: str) -> int | None:
    man = ((results.get("models") or {}).get(model) or {}).get("manifest") or {}
    value = man.get("num_layers")
    return int(value) if isinstance(value, int) and value > 0 else None


def multi(results: dict[str, Any]) -> bool:
    return len(per_model(results)) > 1


def table_series(results: dict[str, Any], table: str, value: str, *, group: str = "pooling", where=None,
                 suffix: str = "") -> list[Series]:
    """One series per model and ``group`` value over the rows' ``layer``, with ``value_ci_low/high`` as band."""
    out = []
    for model, figures in per_model(results).items():
        rows = [r for r in (figures.get("tables") or {}).get(table, []) if isinstance(r, dict) and value in r
                and (where is None or where(r))]
        groups: dict[str, list[dict]] = {}
        for r in rows:
            groups.setdefault(str(r.get(group, "")), []).append(r)
        for g, rs in groups.items():
            label = " / ".join(x for x in ((model if multi(results) else ""), g, suffix) if x) or value
            has_ci = any(f"{value}_ci_low" in r for r in rs)
            out.append(Series(label, [str(r.get("layer")) for r in rs], [r.get(value) for r in rs],
                              [r.get(f"{value}_ci_low") for r in rs] if has_ci else None,
                              [r.get(f"{value}_ci_high") for r in rs] if has_ci else None,
                              num_layers(results, model)))
    return out


def curves(results, series: list[Series], *, title: str, ylabel: str, caption: str, hline=None,
           band: str | None = None) -> list[Chart]:
    if not series or all(all(num(v) is None for v in s.values) for s in series):
        return []
    from layerscope.report.depth import relative_depths

    rel = relative_depths(results) is not None  # the axis the PNGs use (report/depth.py)
    if rel:
        caption += " Models of different depth are overlaid by relative depth (layer / number of layers)."
    named = {"band": band} if band else {}
    return [layer_curves(series, title=title, ylabel=ylabel, caption=caption, relative=rel, hline=hline, **named)]


def crossmodal_views(results: dict[str, Any]) -> list[Section]:
    """report.html: one heat map per figure over (image layer, text layer), the best pair in the caption."""
    from layerscope.report.crossmodal_results import CrossmodalResult
    from layerscope.report.crossmodal_plot import TITLES

    c = CrossmodalResult.read(results.get("combined"))
    if c is None:
        return []
    best = c.best
    charts = []
    for name, title in TITLES.items():
        fig = c.figures.get(name)
        if fig is None:
            continue
        note = ""
        if best is not None and best.figure == name:
            note = (f" Best pair: image layer {best.image_layer}, text layer {best.text_layer}, "
                    f"{best.value:.4f} (95% interval of the maximum over every pair {best.ci_low:.4f} to "
                    f"{best.ci_high:.4f}; best again in {best.chosen_share:.0%} of resamples).")
        values = [[None if v != v else float(v) for v in row] for row in fig.value]  # NaN: an empty cell
        charts.append(heatmap(values, list(c.image_layers), list(c.text_layers),
                              title=f"{title}: {c.image_model} vs {c.text_model}",
                              xlabel="text layer", ylabel="image layer", zlabel=title,
                              caption=f"{c.n} image-caption pairs; empty cells are undefined (a layer "
                                      f"whose rows are not distinct).{note}"))
    from layerscope.report.image_html import CSS, crossmodal_thumbnails

    return [Section("figures", "Heat maps", charts, html=crossmodal_thumbnails(results.get("combined")), css=CSS)]


def vision_lens_views(results) -> list[Section]:
    from layerscope.report import image_html

    return image_html.vision_lens_views(results, Section, curves, table_series)


def cls_attention_views(results) -> list[Section]:
    from layerscope.report import image_html

    return image_html.cls_attention_views(results, Section, curves, table_series)


VIEWS: dict[str, Callable[[dict[str, Any]], list[Section]]] = {
    "crossmodal": crossmodal_views,
    "vision_lens": vision_lens_views, "cls_attention": cls_attention_views,
}


def views(results, figures=None) -> list[Section]:
    """The sections of typed ``results``: drawn from the analysis's declared ``figures`` (report/declared.py),
    else by its function above, else the generic curves."""
    if figures is not None:
        from layerscope.report.declared import sections

        return sections(figures, results)
    view = VIEWS.get(results.analysis)
    return generic_views(results) if view is None else view(results.document)


def generic_views(results) -> list[Section]:
    """An analysis with neither a declaration nor a view of its own (a newer or a library user's analysis): a
    curve of its main score for every table of the first model that has one per layer, drawn from typed
    ``results`` as a declaration would draw it."""
    from layerscope.report.declared import sections
    from layerscope.report.figures import Curve, Figures, Line

    main = results.main_score
    first = next(iter(results.per_model.values()), None)
    if not main or first is None:
        return []
    curves = tuple(Curve(name, (Line(main, main),), file=name, png=False, per_model=False,
                         group=("pooling",) if "pooling" in rows[0] else (), title=f"{main} by layer ({name})",
                         ylabel=main, caption=f"From the table {name}.")
                   for name, rows in first.tables.items() if rows and "layer" in rows[0] and main in rows[0])
    return [s for s in sections(Figures(curves=curves), results) if s.charts] if curves else []
