"""One writer per store (a real OS lock, released when its process dies) and --resume on a changed corpus."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from layerscope.errors import StoreError
from layerscope.extraction.pipeline import embed, extract
from layerscope.store.store import LayerStore
from layerscope.store.store_lock import acquire, lock_path, release
from hang_guard import HANG_S  # noqa: E402

WORDS = "the cat dog man woman bites sees a quick brown fox over lazy river runs".split()
SRC = str(Path(__file__).resolve().parents[2] / "src")


def corpus(n: int, seed: int) -> list[str]:
    rng = np.random.default_rng(seed)
    return [" ".join(rng.choice(WORDS, size=int(rng.integers(1, 40)))) for _ in range(n)]


def _cli(export, path, out, *extra):
    cmd = [sys.executable, "-m", "layerscope", "extract", "--model", str(export), "--engine", "ort",
           "--input", str(path), "--out", str(out), "--batch-tokens", "64", "--pooling", "mean", *extra]
    env = dict(os.environ, PYTHONPATH=SRC)
    return subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def test_two_writers_on_one_store_one_is_refused_and_the_store_is_one_corpus(bert_export, tmp_path):
    texts = {"a": corpus(3000, seed=11), "b": corpus(3000, seed=12)}
    paths = {}
    for k, t in texts.items():
        paths[k] = tmp_path / f"{k}.txt"
        paths[k].write_text("\n".join(t) + "\n", encoding="utf-8")
    out = tmp_path / "stores" / "x"
    first = _cli(bert_export, paths["a"], out)
    time.sleep(0.2)
    second = _cli(bert_export, paths["b"], out, "--force")  # --force would wipe the first one's work
    results = {}
    for name, proc in (("a", first), ("b", second)):
        try:
            _, err = proc.communicate(timeout=HANG_S)
        finally:
            if proc.poll() is None:
                proc.kill()
        results[name] = (proc.returncode, err)
    codes = sorted(code for code, _ in results.values())
    assert codes == [0, 2], results
    winner = "a" if results["a"][0] == 0 else "b"
    loser_err = results["b" if winner == "a" else "a"][1]
    lines = [line for line in loser_err.splitlines() if line.strip()]
    assert len(lines) == 1 and "is being written by another process (pid " in lines[0], loser_err
    assert "wait for it or choose another --out" in lines[0]
    assert "Traceback" not in loser_err
    store = LayerStore.open(out)
    assert store.complete and store.n == 3000
    assert store.texts() == texts[winner]
    assert store.spec.input == str(paths[winner])
    rows = np.random.default_rng(0).choice(3000, size=40, replace=False)
    ref = embed(bert_export, [texts[winner][i] for i in rows], engine="ort", layers="all", poolings=["mean"])
    for layer in store.layers:
        np.testing.assert_allclose(store["mean", layer][rows], ref["mean", layer], atol=1e-4, rtol=1e-4)
    assert not lock_path(out).exists(), "the lock file is removed when the writer is done"


def test_a_writer_killed_with_sigkill_releases_its_lock(bert_export, tmp_path):
    texts = corpus(3000, seed=5)
    path = tmp_path / "c.txt"
    path.write_text("\n".join(texts) + "\n", encoding="utf-8")
    out = tmp_path / "killed"
    proc = _cli(bert_export, path, out)
    held = None
    deadline = time.time() + 120
    try:
        while time.time() < deadline and proc.poll() is None:
            done = out / "done.npy"
            try:
                started = done.exists() and int(np.load(done, mmap_mode="r").sum()) > 0
            except (ValueError, OSError):
                started = False
            if started:  # rows are being written, so the writer holds the lock: a second one is refused
                try:
                    release(out, acquire(out))
                except StoreError as exc:
                    held = str(exc)
                break
            time.sleep(0.05)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
        proc.communicate()
    assert held is not None and f"(pid {proc.pid})" in held, held
    assert proc.returncode == -signal.SIGKILL, "the run finished before it could be killed"
    assert lock_path(out).exists()  # SIGKILL left the file, but not the lock
    report = extract(bert_export, str(path), out, engine="ort", poolings=["mean"], batch_tokens=64, resume=True)
    assert report.resumed_rows > 0 and report.store.complete
    assert LayerStore.open(out).texts() == texts


def test_lock_refuses_a_second_holder_in_process_terms(tmp_path):
    fd = acquire(tmp_path / "s")
    try:
        with pytest.raises(StoreError, match=rf"being written by another process \(pid {os.getpid()}\)"):
            acquire(tmp_path / "s")
    finally:
        release(tmp_path / "s", fd)
    release(tmp_path / "s", acquire(tmp_path / "s"))  # free again once released
    assert not (tmp_path / "s").exists(), "taking the lock writes nothing into the store's place"


def _make(bert_export, tmp_path, texts):
    path = tmp_path / "c.txt"
    path.write_text("\n".join(texts) + "\n", encoding="utf-8")
    extract(bert_export, str(path), tmp_path / "s", engine="ort", poolings=["mean"])
    return path


def test_resume_of_a_complete_store_refuses_a_changed_input(bert_export, tmp_path):
    path = _make(bert_export, tmp_path, ["a b", "c d", "e f"])
    path.write_text("a b\nc d\ne f g\n", encoding="utf-8")
    with pytest.raises(StoreError, match="another version of"):
        extract(bert_export, str(path), tmp_path / "s", engine="ort", poolings=["mean"], resume=True)
    assert LayerStore.open(tmp_path / "s").texts() == ["a b", "c d", "e f"]


def test_resume_of_an_incomplete_store_refuses_a_changed_input(bert_export, tmp_path):
    path = _make(bert_export, tmp_path, ["a b", "c d", "e f"])
    store = LayerStore.open(tmp_path / "s")
    store.mode = "r+"
    store.done_mask()[1:] = 0
    store.update(complete=False)
    store.close()
    path.write_text("a b\nx y\ne f\n", encoding="utf-8")
    with pytest.raises(StoreError, match="another version of"):
        extract(bert_export, str(path), tmp_path / "s", engine="ort", poolings=["mean"], resume=True)
    path.write_text("a b\nc d\ne f\n", encoding="utf-8")  # the same content again: resumes
    report = extract(bert_export, str(path), tmp_path / "s", engine="ort", poolings=["mean"], resume=True)
    assert report.resumed_rows == 1 and report.store.complete


def test_an_analysis_cache_entry_being_written_elsewhere_is_computed_in_memory(bert_export, tmp_path, monkeypatch):
    import shutil

    from layerscope.analyses.base import ModelRun
    from layerscope.analyses.cache import cached_vectors
    from layerscope.engines.base import create_engine
    from layerscope.model.handle import ModelHandle

    monkeypatch.setenv("LAYERSCOPE_HOME", str(tmp_path / "home"))
    handle = ModelHandle.resolve(bert_export)
    run = ModelRun(str(bert_export), handle, create_engine("ort", handle))
    texts = ["a cat", "a dog runs", "the river"]
    said: list[str] = []
    first = cached_vectors(run, texts, layers=["1"], poolings=["mean"], say=said.append)
    (entry,) = (tmp_path / "home" / "stores").iterdir()
    shutil.rmtree(entry)
    fd = acquire(entry)  # another run is filling this entry right now
    try:
        again = cached_vectors(run, texts, layers=["1"], poolings=["mean"], say=said.append)
    finally:
        release(entry, fd)
    assert "computing these vectors in memory" in said[-1]
    np.testing.assert_allclose(again["mean", "1"], first["mean", "1"], atol=1e-5)
    assert not entry.exists()


def test_a_failed_run_releases_its_lock(bert_export, tmp_path):
    from layerscope.errors import InputError

    with pytest.raises(InputError):
        extract(bert_export, ["a b"], tmp_path / "s", engine="ort", layers="99")
    assert not lock_path(tmp_path / "s").exists()
    release(tmp_path / "s", acquire(tmp_path / "s"))  # nobody holds it
