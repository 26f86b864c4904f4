"""results.json -> CSV tables and report.md (never recomputes a figure).

Text from data (model names, settings, texts, table cells: every string of results.json) reaches report.md
only through :func:`md_data`, which writes the characters that could start raw HTML, an entity, a link or
an image (``< > & [ ]``) as character references: a Markdown viewer shows them as they are and runs or
loads nothing (as report.html escapes the same strings). The settings block is fenced with a run of
backticks longer than any in its text, so no value can close it.
"""

from __future__ import annotations

import csv
import io
import logging
import os
import re
from pathlib import Path
from typing import Any

from layerscope.errors import InputError
from layerscope.report.numbers import ci, fmt, num, sig

log = logging.getLogger("layerscope")
_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]+")


_MD_DATA = str.maketrans({"&": "&amp;", "<": "&lt;", ">": "&gt;", "[": "&#91;", "]": "&#93;"})


def md_data(value: Any) -> Any:
    """``value`` from results.json with every string in it (dict keys too) escaped for report.md."""
    if isinstance(value, str):
        return value.translate(_MD_DATA)
    if isinstance(value, dict):
        return {md_data(k): md_data(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [md_data(v) for v in value]
    return value


def _fenced(lines: list[str]) -> list[str]:
    """``lines`` as a fenced block whose fence no line can close (longer than any backtick run in them)."""
    longest = max((len(run) for line in lines for run in re.findall(r"`+", line)), default=0)
    fence = "`" * max(3, longest + 1)
    return [fence, *lines, fence]


def safe_file_name(name: str, used: set[str] | None = None) -> str:
    """A plain file name made from a name read out of results.json (a table name may say ``../../x``)."""
    clean = _UNSAFE.sub("_", str(name)).strip("._-")[:120] or "table"
    if used is not None:
        base, i = clean, 2
        while clean.lower() in used:
            clean, i = f"{base}_{i}", i + 1
        used.add(clean.lower())
    if clean != str(name):
        log.warning("table name %r in results.json is not a plain file name; written as %s", name, clean)
    return clean


def output_path(out: Path, file_name: str) -> Path:
    """``out/file_name`` ready to be (re)written: the name must be a plain file name, and a symlink found
    there is removed rather than written through (so nothing outside ``out`` changes)."""
    if not file_name or file_name in (".", "..") or Path(file_name).name != file_name or "\\" in file_name:
        raise InputError(f"refusing to write {file_name!r}: not a plain file name inside {out}")
    path = Path(out) / file_name
    if path.is_symlink():
        path.unlink()
    elif path.exists() and not path.is_file():
        raise InputError(f"{path} exists and is not a file; move it away and re-run")
    return path


def write_text(path: Path, text: str) -> None:
    """Write beside and rename over: never through a link, never half a file."""
    path = output_path(path.parent, path.name)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    with open(tmp, "w", encoding="utf-8", newline="") as fh:
        fh.write(text)
    os.replace(tmp, path)


def merged_tables(results) -> dict[str, list[dict[str, Any]]]:
    """Every table by name, rows of every model stacked with a ``model`` column first (as the CSVs hold them);
    ``results`` typed (report/results.py) or a results document."""
    from layerscope.report.results import as_results

    results = as_results(results)
    merged: dict[str, list[dict[str, Any]]] = {}
    for model, figures in results.per_model.items():
        for name, rows in figures.tables.items():
            merged.setdefault(name, []).extend({"model": model, **row} for row in rows)
    for name, rows in results.combined.tables.items():
        merged.setdefault(name, []).extend(rows)
    return merged


def write_tables(out: Path, results: dict[str, Any]) -> list[str]:
    """One CSV per table name, rows of every model stacked with a ``model`` column first."""
    written: list[str] = []
    used: set[str] = set()
    for name, rows in merged_tables(results).items():
        if not rows:
            continue
        columns: list[str] = []
        for row in rows:
            for k in row:
                if k not in columns:
                    columns.append(k)
        path = output_path(Path(out), f"{safe_file_name(name, used)}.csv")
        buf = io.StringIO(newline="")
        writer = csv.DictWriter(buf, fieldnames=columns)
        writer.writeheader()
        for row in rows:
            writer.writerow({k: ("" if row.get(k) is None else row.get(k)) for k in columns})
        write_text(path, buf.getvalue())
        written.append(path.name)
    return written


def md_table(rows: list[dict[str, Any]], columns: list[str] | None = None, digits: int = 4) -> str:
    if not rows:
        return "_no rows_\n"
    columns = columns or list(rows[0])
    lines = ["| " + " | ".join(columns) + " |", "|" + "|".join("---" for _ in columns) + "|"]
    for row in rows:
        lines.append("| " + " | ".join(fmt(row.get(c), digits) for c in columns) + " |")
    return "\n".join(lines) + "\n"


def headline_section(results) -> list[str]:
    """``## Headline figures``: each model's headline figures (its summary's ``headline``) with their 95%
    intervals; every string escaped for Markdown."""
    lines: list[str] = []
    for model, figures in results.per_model.items():
        if not figures.headline:
            continue
        lines += [f"- **{md_data(model)}**" if results.several else ""]
        bullet = "  - " if results.several else "- "
        for h in figures.headline:
            chance = f"; chance {sig(h.chance)}" if h.chance is not None else ""
            where = f" ({md_data(h.where)}{chance})" if h.where or chance else ""
            lines.append(f"{bullet}{md_data(h.figure)}: **{md_data(sig(h.value))}**{ci(h.ci_low, h.ci_high)}{where}")
        if figures.intervals:
            lines.append(f"{bullet}brackets: {md_data(figures.intervals)}")
    lines = [x for x in lines if x]
    return ["## Headline figures", "", *lines, ""] if lines else []


def write_report(out: Path, results, body: str, tables: list[str], plots: list[str],
                 page: str | None = None) -> Path:
    """``report.md`` of typed ``results`` (report/results.py); ``body`` is the analysis's own section, every
    string from data in it escaped (``md_data``)."""
    from layerscope.report.results import as_results

    results = as_results(results)
    lines = [f"# {md_data(results.analysis)}: {md_data(results.description)}", ""]
    if page:
        lines += [f"Interactive version (charts with hover values, tables, settings): [{page}]({page})", ""]
    lines.append(f"Made by layerscope {md_data(results.layerscope_version)} on {md_data(results.created)} "
                 f"in {results.seconds} s.")
    lines.append("")
    lines.append("## Models and engines")
    lines.append("")
    for name, record in results.models.items():
        f = md_data(record.facts)
        lines.append(f"- **{md_data(name)}** ({f['family']}, {f['layers']} layers, hidden {f['hidden size']}): "
                     f"engine {f['engine']} on {f['execution provider']}, precision {f['precision']}")
    # raw: shown inside a fence no value can close
    setting_lines = [f"{k}: {v}" for k, v in results.settings.raw.items()]
    lines += ["", "## Settings", "", *_fenced([x for line in setting_lines for x in line.splitlines()]), ""]
    lines += headline_section(results)
    if body:
        lines += [body.rstrip(), ""]
    from layerscope.report.compare import comparison_markdown

    several = comparison_markdown(results, md_data)  # side-by-side and model-vs-model ("" for one model)
    if several:
        lines += [several.rstrip(), ""]
    if plots:
        lines += ["## Plots", ""] + [f"![{p}]({p})" for p in plots] + [""]
    if tables:
        lines += ["## Tables", ""] + [f"- [{t}]({t})" for t in tables] + [""]
    path = Path(out) / "report.md"
    write_text(path, "\n".join(lines))
    return path
