"""report.md shows text from data exactly as it is and never as Markdown's raw HTML, links or images: rendered
by a CommonMark renderer with raw HTML allowed (markdown-it-py's commonmark preset), no tag, script, image or
link from results.json appears, and each string reads as it was written."""

from __future__ import annotations

import html
import json
import re
from pathlib import Path

import pytest

from cli_helpers import run_cli

IMG = "<img src=x onerror=alert(1)>"
SCRIPT = "<script>alert(2)</script>"
LINK = "[click me](javascript:alert(3))"
IMAGE = "![pixel](http://tracker.example/p.png)"
BREAKOUT = "x\n```\n<script>alert(4)</script>\n````"


@pytest.fixture(autouse=True)
def _cwd(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("LAYERSCOPE_HOME", str(tmp_path / "home"))


def rendered(markdown: str) -> str:
    from markdown_it import MarkdownIt

    md = MarkdownIt("commonmark")
    assert md.options["html"], "the renderer must allow raw HTML, as common viewers do"
    return md.render(markdown)


def shown(page: str) -> str:
    """The text a reader sees: tags dropped, references decoded."""
    return html.unescape(re.sub(r"<[^>]+>", "", page))


def test_report_md_escapes_every_string_from_results(bert_export, capsys):
    out = Path("R")
    code, text = run_cli(["run", "compositionality", "--model", bert_export, "--engine", "ort", "--layers", "-1",
                          "--pooling", "cls", "--no-cache", "--out", out], capsys)
    assert code == 0, text
    doc = (out / "results.json").read_text(encoding="utf-8")
    doc = doc.replace(json.dumps(str(bert_export))[1:-1], json.dumps(f"/models/{IMG}")[1:-1])  # the model's name
    results = json.loads(doc)
    results["description"] = SCRIPT
    results["settings"]["data"] = BREAKOUT
    figures = next(iter(results["per_model"].values()))
    figures["summary"]["headline"][0]["where"] = LINK
    figures["summary"]["intervals"] = IMAGE
    (out / "results.json").write_text(json.dumps(results), encoding="utf-8")
    code, text = run_cli(["report", out], capsys)
    assert code == 0, text
    page = rendered((out / "report.md").read_text(encoding="utf-8"))
    assert not re.search(r"<script|<[^>]*\son\w+=", page), page  # no script element, no event handler
    links = re.findall(r'(?:src|href)="([^"]*)"', page)
    assert links, "the report links its own plots and tables"
    for link in links:  # only layerscope's own files: plots, tables, report.html
        assert re.fullmatch(r"[A-Za-z0-9_.-]+", link) and (out / link).is_file(), (link, page)
    seen = shown(page)
    for payload in (IMG, SCRIPT, LINK, IMAGE, "<script>alert(4)</script>"):
        assert payload in seen, (payload, seen)
