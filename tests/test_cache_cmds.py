"""``inspect cache list`` / ``inspect cache clear``: only what layerscope made, never through a symlink."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from cli_helpers import run_cli as cli
from hang_guard import HANG_S  # noqa: E402


def _export_entry(root: Path, name: str, model: str, version: str, age_days: float = 0.0) -> Path:
    d = root / "exports" / name
    d.mkdir(parents=True)
    (d / "model.onnx").write_bytes(b"x" * 2048)
    marker = d / "manifest.json"
    marker.write_text(json.dumps({"layerscope_version": version, "source": {"alias": model}}))
    if age_days:
        t = time.time() - age_days * 86400
        os.utime(marker, (t, t))
    return d


def _store_entry(root: Path, name: str, model: str) -> Path:
    d = root / "stores" / name
    (d / "arrays").mkdir(parents=True)
    (d / "store.json").write_text(json.dumps({"manifest": {"layerscope_version": "0.0.9",
                                                           "source": {"path_or_id": model}}}))
    (d / "arrays" / "a.npy").write_bytes(b"y" * 100)
    return d


@pytest.fixture()
def home(tmp_path, monkeypatch):
    root = tmp_path / "home"
    monkeypatch.setenv("LAYERSCOPE_HOME", str(root))
    return root


def test_list_shows_kind_model_size_age_and_maker(home, capsys):
    _export_entry(home, "minilm-abc", "minilm", "0.1.0", age_days=3)
    _store_entry(home, "sts-123", "/models/mine")
    (home / "exports" / "notes").mkdir()
    code, out = cli(["cache", "list"], capsys)
    assert code == 0
    lines = [line for line in out.splitlines() if "minilm-abc" in line or "sts-123" in line]
    assert len(lines) == 2
    export_line = next(line for line in lines if "minilm-abc" in line)
    assert "exports" in export_line and "minilm" in export_line and "0.1.0" in export_line
    assert "3.0" in export_line and "2.1 KB" in export_line
    store_line = next(line for line in lines if "sts-123" in line)
    assert "stores" in store_line and "/models/mine" in store_line and "0.0.9" in store_line
    assert "notes" in out and "not made by layerscope" in out


def test_clear_removes_only_layerscope_entries_and_never_follows_links(home, tmp_path, capsys):
    outside = tmp_path / "precious"
    outside.mkdir()
    (outside / "manifest.json").write_text("{}")  # looks like an export, but lives outside the cache
    (outside / "data.txt").write_text("keep me")
    ours = _export_entry(home, "tiny-1", "tiny", "0.1.0")
    (ours / "link-out").symlink_to(outside, target_is_directory=True)  # a link inside an entry
    (home / "exports" / "linked-entry").symlink_to(outside, target_is_directory=True)
    (home / "exports" / "user-notes").mkdir()
    (home / "exports" / "user-notes" / "n.md").write_text("mine")
    store = _store_entry(home, "s1", "tiny")
    code, out = cli(["cache", "clear", "--exports"], capsys)
    assert code == 0, out
    assert not ours.exists() and store.exists()  # --exports leaves stores
    assert (outside / "data.txt").read_text() == "keep me" and (outside / "manifest.json").exists()
    assert (home / "exports" / "linked-entry").is_symlink()
    assert (home / "exports" / "user-notes" / "n.md").read_text() == "mine"
    assert "removed 1 cache entry" in out
    code, out = cli(["cache", "clear", "--stores"], capsys)
    assert code == 0 and not store.exists()


def test_a_linked_kind_dir_is_not_followed(home, tmp_path, capsys):
    elsewhere = tmp_path / "elsewhere"
    _store_entry(tmp_path / "x", "s", "m")
    (tmp_path / "x" / "stores").rename(elsewhere)
    home.mkdir()
    (home / "stores").symlink_to(elsewhere, target_is_directory=True)
    code, out = cli(["cache", "clear"], capsys)
    assert code == 0
    assert (elsewhere / "s" / "store.json").exists()
    assert "symlink" in out


def test_older_than_keeps_recent_entries(home, capsys):
    old = _export_entry(home, "old", "m", "0.1.0", age_days=10)
    new = _export_entry(home, "new", "m", "0.1.0", age_days=1)
    code, out = cli(["cache", "clear", "--older-than", "5"], capsys)
    assert code == 0 and not old.exists() and new.exists()
    code, out = cli(["cache", "clear", "--older-than", "-1"], capsys)
    assert code == 2 and "--older-than" in out and "Traceback" not in out


def test_a_recent_unfinished_export_is_left_for_its_writer(home, capsys):
    partial = home / "exports" / ".tiny-1.partial-abcd"
    partial.mkdir(parents=True)
    code, out = cli(["cache", "clear"], capsys)
    assert code == 0 and partial.exists() and "another process" in out
    t = time.time() - 2 * 86400
    os.utime(partial, (t, t))
    cli(["cache", "clear"], capsys)
    assert not partial.exists()


def test_clear_leaves_a_store_that_a_run_is_writing(home, bert_export, tmp_path, capsys):
    import subprocess
    import sys

    import numpy as np

    from layerscope.store.store import LayerStore

    words = "the cat dog man woman bites sees a quick brown fox over lazy river runs".split()
    rng = np.random.default_rng(3)
    corpus = tmp_path / "c.txt"
    corpus.write_text("\n".join(" ".join(rng.choice(words, size=30)) for _ in range(3000)) + "\n", encoding="utf-8")
    busy = home / "stores" / "sts-busy"
    idle = _store_entry(home, "sts-idle", "/models/mine")
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[1] / "src"))
    writer = subprocess.Popen([sys.executable, "-m", "layerscope", "extract", "--model", str(bert_export),
                               "--engine", "ort", "--input", str(corpus), "--out", str(busy), "--batch-tokens", "64",
                               "--pooling", "mean", "--threads", "1"], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.time() + 120
        while time.time() < deadline and writer.poll() is None and not (busy / "store.json").exists():
            time.sleep(0.05)
        assert writer.poll() is None, writer.communicate()
        code, out = cli(["cache", "clear", "--stores"], capsys)
        running = writer.poll() is None
    finally:
        stdout, stderr = writer.communicate(timeout=HANG_S)
    assert running, "the writer finished before the clear: the test proves nothing"
    assert code == 0, out
    flat = " ".join(out.split())
    assert f"left alone {busy}: being written by another process right now" in flat, out
    assert "removed 1 cache entry" in flat and not idle.exists()
    assert writer.returncode == 0, stderr
    assert LayerStore.open(busy).complete


@pytest.mark.parametrize("width", [80, 120])
def test_list_is_readable_at_a_terminal_width(width, tmp_path):
    """At 80 and 120 columns no line runs past the terminal (it would wrap every table row into a mess); a
    model name or entry name longer than the terminal sits alone on its own line, whole."""
    import io

    from rich.console import Console

    from layerscope.cachedir import Entry
    from layerscope.report.console import print_cache

    model = "/work/wt/shared/models/tiny-qwen2-random-weights-for-the-side-by-side-run"
    entries = [Entry("exports", tmp_path / "minilm-0123456789abcdef", "minilm", 91_000_000, 2.0, "0.4.0"),
               Entry("exports", tmp_path / "tiny-qwen2-random-weights-fedcba9876543210", model, 3_000_000, 0.1,
                     "0.4.0"),
               Entry("stores", tmp_path / "sts-9f8e7d6c5b4a39281706f5e4d3c2b1a0", "minilm", 12_000, 0.5, "0.4.0")]
    buf = io.StringIO()
    console = Console(file=buf, width=width, force_terminal=False, color_system=None)
    print_cache(console, tmp_path, entries, [])
    lines = buf.getvalue().splitlines()
    for line in lines:
        alone = line.strip().removeprefix("model: ").removeprefix("entry: ")
        assert len(line) <= width or alone in {model, str(tmp_path)} or str(tmp_path) in line, line
    for e in entries:  # each name whole on one line
        assert any(e.model in line for line in lines) and any(e.path.name in line for line in lines)
    assert any("2.9 MB" in line and "0.1 days" in line and "0.4.0" in line for line in lines)
    tail = " ".join(buf.getvalue().split("3 entries", 1)[1].split())
    assert tail.endswith("clear with: layerscope cache clear [--exports|--stores] [--older-than DAYS]")


def test_list_is_a_table_where_it_fits(tmp_path):
    import io

    from rich.console import Console

    from layerscope.cachedir import Entry
    from layerscope.report.console import print_cache

    buf = io.StringIO()
    print_cache(Console(file=buf, width=160, color_system=None), tmp_path,
                [Entry("exports", tmp_path / "minilm-0123456789abcdef", "minilm", 1024, 2.0, "0.4.0")], [])
    row = next(line for line in buf.getvalue().splitlines() if "minilm-0123456789abcdef" in line)
    assert "exports" in row and "minilm" in row and "1.0 KB" in row and "2.0" in row and "0.4.0" in row
