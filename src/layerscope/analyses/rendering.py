"""A result folder's files from its typed results alone: results.json, CSV tables, plots, report.md, report.html.

An analysis that declares its figures (``AnalysisMetadata.figures``) is drawn from that one declaration by
``Analysis.plots``, ``report`` and ``console_summary`` (report/declared.py), handed the typed results; an
analysis that overrides one adds to it (mteb writes MTEB's own files). An analysis without a declaration
overrides the three over the results document (its strings escaped for report.md). ``layerscope report``
re-renders a folder without touching a model."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from layerscope.errors import InputError
from layerscope.report.results import Results, as_results


def declared_figures(name: str):
    """The figures analysis ``name`` declares (None: none, or no such analysis here)."""
    from layerscope.analyses.registry import registry

    cls = registry().get(name)
    return None if cls is None else cls.metadata.figures


def load_results(path: str | Path) -> Results:
    """``DIR/results.json`` (or the file) read and checked, its analysis's declared figures included."""
    return Results.from_disk(path, figures_of=declared_figures)


def write_results(out: Path, results: Results, analysis=None) -> None:
    """Write results.json, CSV tables, plots and report.md into ``out`` atomically (staging dir + rename)."""
    from layerscope.analyses.registry import get_analysis
    from layerscope.atomic import staged_dir

    results = as_results(results)
    analysis = analysis or get_analysis(results.analysis)()
    with staged_dir(Path(out), kind="result") as stage:
        results.to_disk(stage)
        render(stage, results, analysis)


@dataclass(frozen=True)
class Rendered:
    """What a render (re)wrote from results alone: plot and CSV file names, report.md, and report.html
    (None where plotly is missing and the page was not written)."""

    plots: tuple[str, ...]
    tables: tuple[str, ...]
    report: str
    page: str | None

    def files(self) -> list[str]:
        return [self.report] + ([self.page] if self.page else [])

    def written(self) -> list[str]:
        """Every file named here, each plot's SVG twin included (``report.plots.save`` writes both)."""
        return [*self.files(), *self.tables, *self.plots,
                *(p[:-4] + ".svg" for p in self.plots if p.endswith(".png"))]


def render(out: Path, results: Results, analysis=None) -> Rendered:
    """(Re)write CSV tables, plots, report.md and report.html from results alone."""
    from layerscope.analyses.registry import get_analysis
    from layerscope.report.depth import relative_depths
    from layerscope.report.html_page import write_html_report
    from layerscope.report.plots import depth_axis
    from layerscope.report.writer import md_data, write_report, write_tables

    results = as_results(results)
    analysis = analysis or get_analysis(results.analysis)()
    figures = analysis.metadata.figures
    own = results if figures is not None else results.document  # what the analysis's own hooks are handed
    tables = write_tables(out, results)
    with depth_axis(relative_depths(results)):  # the axis report.html draws for the same results
        plots = analysis.plots(own, out)  # a declaration is drawn by Analysis.plots, report, console_summary
    page = write_html_report(out, results, figures)
    body = analysis.report(own if figures is not None else md_data(own))  # strings escaped for Markdown
    write_report(out, results, body, tables, plots, page=page)
    return Rendered(tuple(plots), tuple(tables), "report.md", page)


def print_summary(analysis, results: Results, console) -> None:
    """The run's summary on the console: its declared figures, then the analysis's own lines."""
    results = as_results(results)
    analysis.console_summary(results if analysis.metadata.figures is not None else results.document, console)


def rerender(result_dir: Path) -> Rendered:
    result_dir = Path(result_dir)
    saved = load_results(result_dir)  # older results (no run spec) still render
    from layerscope.out_lock import out_lock
    from layerscope.ownership import writing

    try:
        with out_lock(result_dir), writing(result_dir, "result") as wrote:  # what it rewrites stays layerscope's
            rendered = render(result_dir, saved)
            wrote.add(*rendered.written())
            return rendered
    except (KeyError, TypeError, ValueError, IndexError, AttributeError) as exc:
        raise InputError(f"{saved.path} lacks or garbles a field its report needs ({type(exc).__name__}: {exc}); "
                         "it was edited or written by another version: re-run layerscope run") from exc
