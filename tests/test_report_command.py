"""``layerscope report DIR`` names every file it rewrote, report.html included."""

from __future__ import annotations

import os

from cli_helpers import run_cli


def test_report_says_it_rewrote_report_html(tiny_model, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("LAYERSCOPE_HOME", str(tmp_path / "home"))
    out = tmp_path / "r"
    code, text = run_cli(["run", "compositionality", "--model", tiny_model("bert"), "--engine", "torch",
                          "--layers", "1,2", "--out", out], capsys)
    assert code == 0, text
    page = out / "report.html"
    os.utime(page, (1, 1))  # as if written long ago: the report command must write it again
    code, text = run_cli(["report", out], capsys)
    assert code == 0, text
    flat = " ".join(text.split())
    assert f"re-rendered {out}: report.md and report.html," in flat, flat
    assert "plot(s)" in flat and "table(s)" in flat
    assert page.stat().st_mtime > 1
