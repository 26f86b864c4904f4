"""What report.html shows of an analysis's figures: its declared figures (``AnalysisMetadata.figures``), drawn
by report/declared.py; an analysis that declares none (a newer or a library user's) still gets a page (summary,
tables, settings, models) plus a curve of its main score for every table that has one per layer, drawn from
typed results by a declaration made for it (``generic_views``).
"""

from __future__ import annotations

from layerscope.report.html_figures import Section


def views(results, figures=None) -> list[Section]:
    """The sections of typed ``results``: drawn from the analysis's declared ``figures`` (report/declared.py),
    else the generic curves."""
    if figures is not None:
        from layerscope.report.declared import sections

        return sections(figures, results)
    return generic_views(results)


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
