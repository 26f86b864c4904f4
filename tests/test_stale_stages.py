"""Staging directories left by a killed process (OOM killer, SIGKILL: no cleanup ran) are removed by the next
run on the same target, and nothing else is: not a run in progress, not another target's, not a user's."""

from __future__ import annotations

import logging
import os
import socket
import subprocess
import sys

from layerscope.atomic import remove_stale_stages, staged_dir
from layerscope.ownership import write_marker


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def _stage(parent, target_name, pid, kind="export", payload=b"x" * 1000):
    stage = parent / f".{target_name}.partial-{socket.gethostname()}-{pid}-abc123"
    stage.mkdir()
    if kind:
        write_marker(stage, kind)
    (stage / "model.onnx_data.tmp").write_bytes(payload)
    return stage


def test_a_killed_runs_stage_is_removed_and_said(tmp_path, caplog):
    """Catches: a 13 GB hidden '.NAME.partial-*' left beside the user's --out after the OOM killer stopped a
    3B export, and kept for ever (each retry added another)."""
    target = tmp_path / "qwen-fp32"
    dead = _stage(tmp_path, target.name, _dead_pid())
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        running = _stage(tmp_path, target.name, sleeper.pid)  # a run in progress
        other_target = _stage(tmp_path, "another", _dead_pid())  # not this target's
        unmarked = _stage(tmp_path, target.name, _dead_pid(), kind=None)  # not provably layerscope's
        other_kind = _stage(tmp_path, target.name, _dead_pid(), kind="store")
        foreign_host = tmp_path / f".{target.name}.partial-not-{socket.gethostname()}-{_dead_pid()}-x"
        foreign_host.mkdir()
        write_marker(foreign_host, "export")  # another host's pid means nothing here
        caplog.set_level(logging.WARNING, logger="layerscope")
        with staged_dir(target, kind="export") as stage:
            (stage / "manifest.json").write_text("{}")
            assert str(os.getpid()) in stage.name and socket.gethostname() in stage.name
        assert not dead.exists()
        for kept in (running, other_target, unmarked, other_kind, foreign_host):
            assert kept.exists(), kept
        said = [r.getMessage() for r in caplog.records if "unfinished export" in r.getMessage()]
        assert len(said) == 1 and dead.name in said[0] and "no longer runs" in said[0]
        assert (target / "manifest.json").exists()
    finally:
        sleeper.kill()
        sleeper.wait()


def test_nothing_to_remove_is_quiet(tmp_path, caplog):
    caplog.set_level(logging.WARNING, logger="layerscope")
    assert remove_stale_stages(tmp_path / "t", "export") == []
    assert not caplog.records
