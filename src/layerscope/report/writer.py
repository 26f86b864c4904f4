"""results.json -> CSV tables and report.md (never recomputes a figure)."""

from __future__ import annotations

import csv
import io
import logging
import os
import re
from pathlib import Path
from typing import Any

from layerscope.errors import InputError

log = logging.getLogger("layerscope")
_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]+")


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


def merged_tables(results: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
    """Every table by name, rows of every model stacked with a ``model`` column first (as the CSVs hold them)."""
    merged: dict[str, list[dict[str, Any]]] = {}
    for model, figures in results.get("per_model", {}).items():
        for name, rows in (figures.get("tables") or {}).items():
            merged.setdefault(name, []).extend({"model": model, **row} for row in rows)
    for name, rows in (results.get("combined", {}).get("tables") or {}).items():
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


def fmt(value, digits: int = 4) -> str:
    if value is None:
        return "undefined"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def md_table(rows: list[dict[str, Any]], columns: list[str] | None = None, digits: int = 4) -> str:
    if not rows:
        return "_no rows_\n"
    columns = columns or list(rows[0])
    lines = ["| " + " | ".join(columns) + " |", "|" + "|".join("---" for _ in columns) + "|"]
    for row in rows:
        lines.append("| " + " | ".join(fmt(row.get(c), digits) for c in columns) + " |")
    return "\n".join(lines) + "\n"


def write_report(out: Path, results: dict[str, Any], body: str, tables: list[str], plots: list[str],
                 page: str | None = None) -> Path:
    lines = [f"# {results['analysis']}: {results.get('description', '')}", ""]
    if page:
        lines += [f"Interactive version (charts with hover values, tables, settings): [{page}]({page})", ""]
    lines.append(f"Made by layerscope {results.get('layerscope_version')} on {results.get('created')} "
                 f"in {results.get('seconds')} s.")
    lines.append("")
    lines.append("## Models and engines")
    lines.append("")
    for name, meta in results.get("models", {}).items():
        man = meta.get("manifest", {})
        eng = meta.get("engine", {})
        lines.append(f"- **{name}** ({man.get('family')}, {man.get('num_layers')} layers, hidden "
                     f"{man.get('hidden_size')}): engine {eng.get('engine')} on {eng.get('provider')}, "
                     f"precision {eng.get('precision')}")
    settings = results.get("settings", {})
    lines += ["", "## Settings", "", "```", *(f"{k}: {v}" for k, v in settings.items()), "```", ""]
    if body:
        lines += [body.rstrip(), ""]
    from layerscope.report.compare import comparison_markdown

    several = comparison_markdown(results)  # side-by-side table and model-vs-model tests ("" for one model)
    if several:
        lines += [several.rstrip(), ""]
    if plots:
        lines += ["## Plots", ""] + [f"![{p}]({p})" for p in plots] + [""]
    if tables:
        lines += ["## Tables", ""] + [f"- [{t}]({t})" for t in tables] + [""]
    path = Path(out) / "report.md"
    write_text(path, "\n".join(lines))
    return path
