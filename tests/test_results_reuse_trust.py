"""A run reuses a saved result only while its results.json is the file layerscope wrote (its sha256 in the
folder's record): an edited one is never shown as a result; the command says why in one line and how to run
again, and the edited file is left as it is."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from cli_helpers import run_cli, sha

RUN = ["run", "compositionality", "--engine", "ort", "--layers", "-1", "--pooling", "cls", "--no-cache"]


pytestmark = pytest.mark.usefixtures("in_tmp_home")


def _edit(path: Path, keep_size_and_time: bool) -> None:
    """Change the saved win rate to a figure the run never computed (same byte count and mtime on request)."""
    st = path.stat()
    doc = json.loads(path.read_text(encoding="utf-8"))
    summary = next(iter(doc["per_model"].values()))["summary"]
    summary["best_win_rate"] = 0.987654321
    text = json.dumps(doc, indent=2, ensure_ascii=False) + "\n"
    if keep_size_and_time:  # JSON's indentation is free: take or give spaces until the byte count matches
        lines = text.split("\n")
        excess = len(text.encode("utf-8")) - st.st_size
        for i, line in enumerate(lines):
            if excess <= 0:
                break
            cut = min(excess, len(line) - len(line.lstrip(" ")))
            lines[i], excess = line[cut:], excess - cut
        text = "\n".join(lines)
        text = text[:-1] + " " * (st.st_size - len(text.encode("utf-8"))) + "\n"
        assert len(text.encode("utf-8")) == st.st_size
    path.write_text(text, encoding="utf-8")
    if keep_size_and_time:
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))


@pytest.mark.parametrize("keep_size_and_time", [False, True])
def test_an_edited_result_is_never_reused(keep_size_and_time, bert_export, capsys):
    args = RUN + ["--model", bert_export, "--out", "R"]
    code, text = run_cli(args, capsys)
    assert code == 0, text
    code, text = run_cli(args, capsys)
    assert code == 0 and "reused" in text, text  # unchanged: reused
    results = Path("R") / "results.json"
    _edit(results, keep_size_and_time)
    edited = sha(results)
    code, text = run_cli(args, capsys)
    flat = " ".join(text.split())
    assert code == 2 and "Traceback" not in text, text
    assert len([line for line in text.splitlines() if line.startswith("error:")]) == 1, text
    assert "results.json was changed since layerscope wrote it" in flat and "not reused" in flat, text
    assert "0.987" not in flat and "reused R" not in flat, text
    assert sha(results) == edited
    shutil.move("R", "R-edited")  # as the line says: then the run runs again
    code, text = run_cli(args, capsys)
    assert code == 0 and "reused" not in text, text
    doc = json.loads(results.read_text(encoding="utf-8"))
    assert next(iter(doc["per_model"].values()))["summary"]["best_win_rate"] != 0.987654321
