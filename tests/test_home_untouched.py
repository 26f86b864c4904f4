"""The suite leaves the user's home alone: it runs under a home of its own session (tests/conftest.py), and a
run that imports OpenVINO, draws with matplotlib and scores with mteb writes nothing new under a home prepared
the same way."""

from __future__ import annotations

import os
import pwd
import subprocess
import sys
from pathlib import Path

import pytest

from home_env import quiet_home
from hang_guard import HANG_S

SRC = str(Path(__file__).resolve().parents[1] / "src")


def _tree(root: Path) -> dict[str, int]:
    return {str(p.relative_to(root)): p.stat().st_size for p in sorted(root.rglob("*"))}


def test_the_session_runs_under_a_home_of_its_own():
    """Catches: the suite run with the user's HOME (each tool's files land in ~/intel, ~/.config/matplotlib,
    ~/.cache/mteb), or a tool's own variable still pointing there."""
    home = Path(os.environ["HOME"]).resolve()
    assert home != Path(pwd.getpwuid(os.getuid()).pw_dir).resolve()
    assert home.parent == Path(os.environ["LAYERSCOPE_HOME"]).resolve().parent  # the session's folder
    for variable in ("MPLCONFIGDIR", "MTEB_CACHE", "XDG_CACHE_HOME"):
        assert Path(os.environ[variable]).resolve().parent == home.parent, variable
    assert (home / "intel" / "openvino_telemetry").read_text() == "0"  # OpenVINO's opt-out


def test_a_run_on_openvino_with_figures_and_mteb_writes_nothing_under_home(bert_export, tmp_path):
    """Catches: OpenVINO's telemetry client id (~/intel), matplotlib's config dir or mteb's result cache written
    into the home the suite runs under."""
    pytest.importorskip("mteb")
    pytest.importorskip("datasets")
    home = quiet_home(tmp_path / "home")
    before = _tree(home)
    pairs = tmp_path / "pairs.tsv"
    rows = ["sentence1\tsentence2\tscore", "a cat sits\ta cat sat\t4.5", "dogs run fast\tthe sky is blue\t0.5",
            "a man plays guitar\ta man plays a guitar\t4.8", "rain falls\tkids play football\t0.2",
            "the market opens\tthe shop opens\t3.0", "birds fly\ta plane takes off\t1.5"]
    pairs.write_text("\n".join(rows) + "\n", encoding="utf-8")
    env = {**os.environ, "HOME": str(home), "PYTHONPATH": SRC}
    proc = subprocess.run([sys.executable, "-m", "layerscope", "run", "mteb", "--model", str(bert_export), "--engine",
                           "ov", "--data", str(pairs), "--layers", "-1", "--pooling", "mean", "--no-cache",
                           "--out", str(tmp_path / "R")], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=HANG_S)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert list((tmp_path / "R").glob("*.png"))  # matplotlib drew
    assert _tree(home) == before, sorted(set(_tree(home)) - set(before))
