"""One writer per folder, whatever path leads to it: a bind mount of a store is the same store, and a second
writer reaching it that way is refused with one line while the first one's files stay whole."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

import layerscope
from cli_helpers import run_cli
from mounts import mount_or_skip, unmount_all
from layerscope.extraction.pipeline import extract
from layerscope.store.store import LayerStore
from hang_guard import HANG_S  # noqa: E402

SRC = str(Path(layerscope.__file__).resolve().parents[1])
TEXTS = ["a cat sits", "the dog runs in the park", "two birds fly over a lake", "hello there", "a man plays guitar"]

HOLD = """
import sys, time
from layerscope.store.store_lock import store_lock  # the lock every --out writer takes
with store_lock(sys.argv[1]):
    print("held", flush=True)
    time.sleep(120)
"""


def env() -> dict[str, str]:
    return dict(os.environ, PYTHONPATH=os.pathsep.join([SRC] + [p for p in sys.path if p]))


def tree(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(root.rglob("*"))
            if p.is_file()}


@pytest.fixture
def bind(tmp_path):
    """``bind(folder) -> another path`` to the same folder, through a real bind mount (needs root and mount
    rights: skipped elsewhere, saying why); unmounted at the end."""
    mounts = []

    def make(folder: Path) -> Path:
        where = tmp_path / f"elsewhere{len(mounts)}" / "mounted"
        mounts.append(mount_or_skip(["--bind", str(folder)], where, "a bind mount"))
        return where

    yield make
    unmount_all(mounts)


def one_error(code: int, text: str, needle: str) -> None:
    assert code == 2, text
    assert "Traceback" not in text
    errors = [line for line in text.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and needle in " ".join(text.split()), text


def test_a_bind_mount_of_a_store_meets_its_writers_lock(bert_export, tmp_path, bind, capsys):
    store = tmp_path / "S"
    extract(bert_export, TEXTS, store, engine="ort")
    before = tree(store)
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(store)], stdout=subprocess.PIPE, text=True, env=env())
    try:
        assert proc.stdout.readline().strip() == "held"
        other = bind(store)
        corpus = tmp_path / "c.txt"
        corpus.write_text("another text\n")
        code, text = run_cli(["extract", "--model", bert_export, "--input", corpus, "--out", other, "--force",
                              "--engine", "ort"], capsys)
        one_error(code, text, "is being written by another process")
    finally:
        proc.kill()
        proc.wait()
    assert tree(store) == before


def test_a_store_made_during_the_run_is_locked_by_its_identity(bert_export, tmp_path, bind, capsys):
    """The first writer creates the folder while it runs; a bind mount made then leads to its lock too."""
    store = tmp_path / "S"
    cmd = [sys.executable, "-m", "layerscope", "extract", "--model", str(bert_export), "--engine", "ort",
           "--input", "-", "--out", str(store), "--pooling", "mean"]
    first = subprocess.Popen(cmd, env=env(), stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True)
    try:
        first.stdin.write("".join(f"text {i}\n" for i in range(40)))
        first.stdin.flush()
        deadline = time.time() + 120
        while not (store / "texts.jsonl.partial").exists():
            assert first.poll() is None and time.time() < deadline, first.communicate()
            time.sleep(0.05)
        other = bind(store)
        corpus = tmp_path / "c.txt"
        corpus.write_text("another text\n")
        code, text = run_cli(["extract", "--model", bert_export, "--input", corpus, "--out", other, "--force",
                              "--engine", "ort"], capsys)
        one_error(code, text, "is being written by another process")
        _, stderr = first.communicate(input="the last text\n", timeout=HANG_S)
    finally:
        if first.poll() is None:
            first.kill()
            first.wait()
    assert first.returncode == 0, stderr
    assert len(LayerStore.open(store).texts()) == 41
