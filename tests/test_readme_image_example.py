"""The README's image example, read from the README and run as written with one change: the CLIP checkpoint it
names (a hub model, none ships offline) replaced by a tiny random two-tower CLIP folder with its tokenizer and
image processor (tests/tiny_models.py). So its commands, options and the folder one hands to the other are
proven; tests/test_readme_examples.py skips the two commands for the hub alone."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_readme_examples import examples  # noqa: E402
from tiny_models import build_tiny_model  # noqa: E402
from hang_guard import HANG_S  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
CHECKPOINT = "openai/clip-vit-base-patch32"


def _image_example() -> list[str]:
    """The README's image example: the command that exports the CLIP checkpoint's image tower, and the run
    that reads the folder it writes (the next command)."""
    shell = [e.code for e in examples("README.md") if e.kind == "shell"]
    first = next(i for i, code in enumerate(shell) if CHECKPOINT in code)
    return shell[first:first + 2]


def test_the_readme_image_example_is_found():
    """Catches: the example dropped or reworded so that the run below would run nothing, or a run that does
    not read the folder the export writes."""
    export, run = _image_example()
    assert export.startswith(f"layerscope export {CHECKPOINT} --tower vision --out clip-vision/")
    assert run.startswith("layerscope run vision_lens --model clip-vision/")


@pytest.mark.slow
def test_the_readme_image_example_runs_on_a_tiny_clip(tmp_path):
    """Catches: an image example whose options were renamed, whose export folder is not the one its run reads,
    or whose run fails on the digits it reads by default."""
    clip = build_tiny_model("clip-text", tmp_path / "tiny-clip")
    work = tmp_path / "checkout"
    work.mkdir()
    env = dict(os.environ, LAYERSCOPE_HOME=str(tmp_path / "home"),
               PYTHONPATH=os.pathsep.join(p for p in (str(ROOT / "src"), os.environ.get("PYTHONPATH")) if p))
    for code in _image_example():
        argv = [sys.executable, "-m", "layerscope", *shlex.split(code.replace(CHECKPOINT, str(clip)))[1:]]
        proc = subprocess.run(argv, cwd=work, env=env, capture_output=True, text=True, timeout=HANG_S)
        assert proc.returncode == 0, f"{code!r}:\n{(proc.stderr or proc.stdout)[-800:]}"
    manifest = json.loads((work / "clip-vision" / "manifest.json").read_text(encoding="utf-8"))
    assert manifest["modality"] == "image" and manifest["family"] == "clip-vision"
    (results,) = work.glob("results/*/*/vision_lens/*/results.json")
    (fig,) = json.loads(results.read_text(encoding="utf-8"))["per_model"].values()
    assert fig["summary"]["n_images"] == 500 and len(fig["summary"]["classes"]) == 10
    assert [r["layer"] for r in fig["tables"]["layers"]] == [str(i) for i in range(manifest["num_layers"] + 1)]
