"""results.json -> CSV tables and report.md (never recomputes a figure)."""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any


def write_tables(out: Path, results: dict[str, Any]) -> list[str]:
    """One CSV per table name, rows of every model stacked with a ``model`` column first."""
    merged: dict[str, list[dict[str, Any]]] = {}
    for model, figures in results.get("per_model", {}).items():
        for name, rows in (figures.get("tables") or {}).items():
            merged.setdefault(name, []).extend({"model": model, **row} for row in rows)
    for name, rows in (results.get("combined", {}).get("tables") or {}).items():
        merged.setdefault(name, []).extend(rows)
    written = []
    for name, rows in merged.items():
        if not rows:
            continue
        columns: list[str] = []
        for row in rows:
            for k in row:
                if k not in columns:
                    columns.append(k)
        path = Path(out) / f"{name}.csv"
        with open(path, "w", newline="", encoding="utf-8") as fh:
            writer = csv.DictWriter(fh, fieldnames=columns)
            writer.writeheader()
            for row in rows:
                writer.writerow({k: ("" if row.get(k) is None else row.get(k)) for k in columns})
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


def write_report(out: Path, results: dict[str, Any], body: str, tables: list[str], plots: list[str]) -> Path:
    lines = [f"# {results['analysis']}: {results.get('description', '')}", ""]
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
    if plots:
        lines += ["## Plots", ""] + [f"![{p}]({p})" for p in plots] + [""]
    if tables:
        lines += ["## Tables", ""] + [f"- [{t}]({t})" for t in tables] + [""]
    path = Path(out) / "report.md"
    path.write_text("\n".join(lines), encoding="utf-8")
    return path
