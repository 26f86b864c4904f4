"""The export tolerance USAGE states is the one exports apply and print."""

from __future__ import annotations

import inspect
import io
import re
from pathlib import Path

DOCS = Path(__file__).resolve().parents[2] / "docs" / "USAGE.md"


def _defaults():
    from layerscope.export.exporter import export_model

    params = inspect.signature(export_model).parameters
    return params["atol"].default, params["rtol"].default


def test_usage_states_the_tolerance_exports_use():
    import typer.main

    from layerscope.cli import app

    atol, rtol = _defaults()
    cli = {p.name: p.default for p in typer.main.get_command(app).commands["export"].params}
    assert (cli["atol"], cli["rtol"]) == (atol, rtol)
    text = " ".join(DOCS.read_text(encoding="utf-8").split())
    stated = re.search(r"The tolerance is per output, `([0-9.e-]+) \+ ([0-9.e-]+) x` the output's largest", text)
    assert stated, "USAGE must state the export tolerance rule"
    assert (float(stated.group(1)), float(stated.group(2))) == (atol, rtol)
    assert "above tolerance (1e-4)" not in text  # a bare 1e-4 is not what an export checks


def test_the_printed_tolerance_is_the_recorded_rule(bert_export):
    from rich.console import Console

    from layerscope.model.manifest import read_manifest
    from layerscope.report.console import print_export_summary

    manifest = read_manifest(bert_export)
    buf = io.StringIO()
    print_export_summary(Console(file=buf, width=200, color_system=None), bert_export, manifest)
    line = next(x for x in buf.getvalue().splitlines() if x.startswith("worst output"))
    m = re.search(r"worst output (\S+): \S+ \(tolerance (\S+) = (\S+) \+ (\S+) x its largest \|value\| (\S+)\)", line)
    assert m, line
    name, tol, atol, rtol, scale = m.groups()
    check = manifest.parity.outputs[name]
    assert (float(atol), float(rtol)) == _defaults()
    assert float(scale) == float(f"{check.ref_max_abs:.3g}")
    assert float(tol) == float(f"{float(atol) + float(rtol) * check.ref_max_abs:.2g}")
