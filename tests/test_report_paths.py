"""``inspect report DIR`` never writes outside DIR, whatever results.json says."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from layerscope.analyses import base
from layerscope.analyses.base import Analysis, AnalysisMetadata, rerender
from layerscope.cli import main


class _PoisonProbe(Analysis):
    metadata = AnalysisMetadata(name="poison-probe", description="test only", inputs=(), main_score="x")

    def compute(self, ctx, run, data):
        return {}


ROWS = [{"layer": "0", "score": 0.5}]


def _snapshot(root: Path, skip: Path) -> dict[str, bytes]:
    return {str(p): (p.read_bytes() if p.is_file() and not p.is_symlink() else b"<dir>")
            for p in root.rglob("*") if skip not in p.parents and p != skip}


def _results(tmp_path: Path, analysis: str = "poison-probe") -> dict:
    return {"analysis": analysis, "description": "x", "layerscope_version": "0", "created": "now", "seconds": 1,
            "settings": {}, "models": {"m": {"manifest": {}, "engine": {}}},
            "per_model": {"m": {"summary": {}, "tables": {
                "../../escaped": ROWS, str(tmp_path / "abs"): ROWS, "layers": ROWS, "a/b": ROWS, "a_b": ROWS}}},
            "combined": {"tables": {"../up": ROWS, "..": ROWS}}}


def test_poisoned_table_names_and_links_write_nothing_outside(tmp_path, monkeypatch):
    base.registry()
    monkeypatch.setitem(base._REGISTRY, "poison-probe", _PoisonProbe)  # renders tables and report only
    out = tmp_path / "res" / "deep" / "r"
    out.mkdir(parents=True)
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "victim.txt").write_text("keep")
    (outside / "report.md").write_text("keep too")
    (out / "results.json").write_text(json.dumps(_results(tmp_path)))
    (out / "layers.csv").symlink_to(outside / "victim.txt")  # a link planted where a table goes
    (out / "report.md").symlink_to(outside / "report.md")
    before = _snapshot(tmp_path, out)
    rerender(out)
    assert _snapshot(tmp_path, out) == before  # nothing outside DIR was created or changed
    written = sorted(p.name for p in out.iterdir())
    assert {"escaped.csv", "layers.csv", "a_b.csv", "a_b_2.csv", "up.csv", "report.md"} <= set(written)
    assert not (out / "layers.csv").is_symlink() and "score" in (out / "layers.csv").read_text()
    assert not (out / "report.md").is_symlink() and "escaped.csv" in (out / "report.md").read_text()
    assert all("/" not in line.split("](")[-1] for line in (out / "report.md").read_text().splitlines()
               if line.startswith("- ["))


def test_a_garbled_results_json_is_one_line(tmp_path, capsys):
    out = tmp_path / "r"
    out.mkdir()
    res = _results(tmp_path, analysis="sts")  # sts's report needs fields this file lacks
    (out / "results.json").write_text(json.dumps(res))
    with pytest.raises(SystemExit) as exc:
        main(["report", str(out)])
    text = capsys.readouterr()
    assert exc.value.code == 2
    err = text.err.strip().splitlines()
    assert len(err) == 1 and "results.json" in err[0] and "re-run layerscope run" in err[0]
    (out / "results.json").write_text("[1, 2]")
    with pytest.raises(SystemExit) as exc:
        main(["report", str(out)])
    assert exc.value.code == 2 and "does not name its analysis" in capsys.readouterr().err
