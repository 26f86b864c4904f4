"""A full disk is one line: the arrays' space is reserved up front, and ENOSPC while writing is caught.

Memory-mapped writes to a disk that is full die with SIGBUS, so every run that could
hit one goes through a subprocess.
"""

from __future__ import annotations

import errno
import os
import resource
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from layerscope.errors import StoreError
from layerscope.model.handle import ModelHandle
from layerscope.store.store import LayerStore
from layerscope.store.store_spec import StoreSpec
from hang_guard import HANG_S  # noqa: E402

SRC = str(Path(__file__).resolve().parents[2] / "src")


def _extract(export, corpus, out, preexec=None):
    cmd = [sys.executable, "-m", "layerscope", "extract", "--model", str(export), "--engine", "ort",
           "--input", str(corpus), "--out", str(out), "--pooling", "mean"]
    return subprocess.run(cmd, env=dict(os.environ, PYTHONPATH=SRC), capture_output=True, text=True,
                          timeout=HANG_S, preexec_fn=preexec)


def _one_line(proc):
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 2, (proc.returncode, proc.stderr[-2000:])
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    return lines[0]


def test_a_too_small_disk_is_one_error_before_any_work(bert_export, tmpfs, tmp_path):
    small_disk = tmpfs("2m")
    n = 5000
    corpus = tmp_path / "c.txt"
    corpus.write_text("".join(f"short text {i}\n" for i in range(n)), encoding="utf-8")
    manifest = ModelHandle.resolve(bert_export).manifest
    needed = n * manifest.hidden_size * 4 * (manifest.num_layers + 2) + n  # raw, 0..L
    assert needed > 2 * 2**20  # the arrays do not fit, the texts do
    proc = _extract(bert_export, corpus, small_disk / "s")
    line = _one_line(proc)
    assert f"they need {needed:,} bytes" in line and "are free" in line, line
    assert not (small_disk / "s" / "store.json").exists()
    assert not list((small_disk / "s").glob("arrays*")), "no half-made arrays are left behind"


def test_a_disk_filling_up_while_writing_is_one_line(bert_export, tmpfs, tmp_path):
    small_disk = tmpfs("2m")
    corpus = tmp_path / "c.txt"
    corpus.write_text("".join(f"text {i} " + "word " * 200 + "\n" for i in range(3000)), encoding="utf-8")
    proc = _extract(bert_export, corpus, small_disk / "s")
    line = _one_line(proc)
    assert "no space left writing" in line and "No space left on device" in line, line


def _fsize_limit(limit):
    def apply():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # get EFBIG instead of being killed
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    return apply


def test_a_file_size_limit_is_one_line(bert_export, tmp_path):
    n = 10000  # one array: n * 32 floats = 1.28 MB, over the 1 MB limit; texts.jsonl stays under it
    corpus = tmp_path / "c.txt"
    corpus.write_text("".join(f"t {i}\n" for i in range(n)), encoding="utf-8")
    proc = _extract(bert_export, corpus, tmp_path / "s", preexec=_fsize_limit(1_000_000))
    line = _one_line(proc)
    assert "file-size limit" in line and "they need" in line, line
    assert not list((tmp_path / "s").glob("arrays*"))


def test_a_failed_reservation_names_the_bytes_and_cleans_up(tmp_path, monkeypatch):
    def full(fd, offset, length):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "posix_fallocate", full)
    with pytest.raises(StoreError, match=r"they need 4,001 bytes"):
        LayerStore.create(tmp_path / "s", n=1, spec=StoreSpec.bare(["raw", "0"], ["mean", "cls"]), hidden_size=250,
                          manifest={"num_layers": 1, "hidden_size": 250})
    assert sorted(p.name for p in (tmp_path / "s").iterdir()) == []


def test_reserved_arrays_are_allocated_not_sparse(tmp_path):
    store = LayerStore.create(tmp_path / "s", n=1000, spec=StoreSpec.bare(["raw"], ["mean"]), hidden_size=256,
                              manifest={"num_layers": 0, "hidden_size": 256, "family": "bert",
                                        "source": {"spec": "m", "path_or_id": "m"}})
    path = tmp_path / "s" / "arrays" / "mean" / "raw.npy"
    st = path.stat()
    if st.st_blocks * 512 < st.st_size and os.statvfs(path).f_bsize:  # tmpfs, ext4, xfs all support it
        pytest.fail(f"{path} has {st.st_blocks * 512} bytes allocated of {st.st_size}: still sparse")
    assert not np.asarray(store["mean", "raw"]).any()
