"""The README is a short tour that points into docs/; what it and the docs say matches what the code does."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def test_readme_is_short_and_every_link_it_gives_exists():
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(text.splitlines()) <= 90  # the research-question table grows by a line per analysis
    links = re.findall(r"\]\(([^)#]+)\)", text)
    assert {"docs/USAGE.md", "docs/ENGINES.md"} <= set(links)
    for link in links:
        assert (ROOT / link).exists(), link
    for research_line in ("run sts", "run compositionality", "run alignment", "run lens", "run saliency"):
        assert research_line in text


def test_nothing_points_outside_the_repository():
    for doc in DOCS:
        assert "DESIGN.md" not in doc.read_text(encoding="utf-8"), doc


def test_the_results_folder_the_docs_name_is_the_one_runs_write():
    from layerscope.analyses.layout import model_name
    from layerscope.model.handle import ModelHandle

    model_part = model_name("minilm", ModelHandle.resolve("minilm").manifest.source)  # the folder runs write under results/
    assert model_part == "sentence-transformers__all-MiniLM-L6-v2"
    for doc in DOCS:
        text = doc.read_text(encoding="utf-8")
        assert "results/minilm/" not in text, doc
    assert f"results/{model_part}/" in (ROOT / "README.md").read_text(encoding="utf-8")


def test_quickstart_calls_layerscope():
    script = (ROOT / "scripts" / "quickstart.sh").read_text(encoding="utf-8")
    assert not re.search(r"/inspect\"? ", script)
    assert '"$bin/layerscope" export' in script and '"$bin/layerscope" extract' in script
