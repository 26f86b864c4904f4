"""Writers that add to a layerscope folder in place (``optimize --variant``, ``layerscope report``) record
only the files they name as they write them: a file a user puts into the folder while they run is never
recorded as layerscope's, and a later ``--force`` leaves it (same sha256) and says so."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cli_helpers import one_error, run_cli, sha
from hang_guard import HANG_S  # noqa: E402

COMPOSITIONALITY = ["run", "compositionality", "--engine", "ort", "--layers", "-1", "--pooling", "cls",
                    "--no-cache"]


pytestmark = pytest.mark.usefixtures("in_tmp_home")


def owned(folder: Path) -> dict:
    return json.loads((folder / ".layerscope.json").read_text(encoding="utf-8"))["owned"]


def test_a_file_dropped_into_an_export_while_optimize_runs_stays_the_users(bert_export, tiny_model, capsys):
    """A real ``layerscope optimize`` process; the user's file is written once the variant's graph is on disk
    and while the process still runs (its parity check against torch follows)."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    for attempt in range(3):  # the file must land while the process still runs
        export = Path(f"E{attempt}")
        shutil.copytree(bert_export, export)
        mine = export / "my_notes.md"
        proc = subprocess.Popen([sys.executable, "-m", "layerscope", "optimize", str(export), "--variant", "int8"],
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
        while not (export / "model.int8.onnx").exists() and proc.poll() is None:
            time.sleep(0.005)
        mine.write_text("what I found in this export\n", encoding="utf-8")
        mid_run = proc.poll() is None
        output = proc.communicate(timeout=HANG_S)[0]
        assert proc.returncode == 0, output
        if mid_run:
            break
    assert mid_run, "optimize finished before the user's file could be written during it"
    digest = sha(mine)
    record = owned(export)
    assert "model.int8.onnx" in record and record["model.int8.onnx"]["sha256"] == sha(export / "model.int8.onnx")
    assert "my_notes.md" not in record
    code, text = run_cli(["export", str(tiny_model("bert")), "--out", str(export), "--force"], capsys)
    one_error(code, text, "holds 1 file that layerscope did not make", "my_notes.md")
    assert sha(mine) == digest
    assert (export / "model.int8.onnx").is_file()  # the refused --force deleted nothing


def test_a_file_dropped_into_a_result_folder_while_report_renders_stays_the_users(bert_export, capsys,
                                                                                   monkeypatch):
    import layerscope.report.html_page as html_page

    out = Path("R")
    code, text = run_cli(COMPOSITIONALITY + ["--model", str(bert_export), "--out", str(out)], capsys)
    assert code == 0, text
    mine = out / "my_figure.png"
    real = html_page.write_html_report

    def rendering_page(folder, results, *more):  # the user saves a file into the folder mid-render
        mine.write_bytes(b"the user's own figure")
        return real(folder, results, *more)

    monkeypatch.setattr(html_page, "write_html_report", rendering_page)
    code, text = run_cli(["report", str(out)], capsys)
    assert code == 0, text
    assert mine.is_file()
    digest = sha(mine)
    record = owned(out)
    assert "my_figure.png" not in record
    assert record["report.md"]["sha256"] == sha(out / "report.md")  # what it re-rendered stays layerscope's
    monkeypatch.setattr(html_page, "write_html_report", real)
    code, text = run_cli(COMPOSITIONALITY + ["--model", str(bert_export), "--out", str(out), "--force"], capsys)
    one_error(code, text, "holds 1 file that layerscope did not make", "my_figure.png",
              "--force only replaces what layerscope wrote")
    assert sha(mine) == digest
    mine.unlink()  # without it, --force replaces the folder: everything else was recorded
    code, text = run_cli(COMPOSITIONALITY + ["--model", str(bert_export), "--out", str(out), "--force"], capsys)
    assert code == 0, text
