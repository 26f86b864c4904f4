"""A disk that fills up while extract --tokens runs (another program takes the space after the arrays were
reserved): one "no space" line, no temporary file left, and --force then replaces the store."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import layerscope
from layerscope.store.store import LayerStore
from hang_guard import HANG_S  # noqa: E402

SRC = str(Path(layerscope.__file__).resolve().parents[1])


def _fill(path: Path) -> None:
    """Take every free byte of ``path``'s file system, as another program writing there would."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        st = os.statvfs(path.parent)
        try:
            os.posix_fallocate(fd, 0, max(st.f_bavail * st.f_frsize - (1 << 16), 1))
        except OSError:
            pass
        os.lseek(fd, 0, os.SEEK_END)
        block = b"\0" * 4096
        try:
            while os.write(fd, block):
                pass
        except OSError:
            pass
    finally:
        os.close(fd)


def test_disk_filling_up_during_extract_tokens(bert_export, tmpfs, tmp_path):
    disk = tmpfs("160m")
    corpus = tmp_path / "c.txt"
    corpus.write_text("".join(f"text {i} " + "word " * 20 + "\n" for i in range(3000)), encoding="utf-8")
    store = disk / "s"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([SRC] + [p for p in sys.path if p]))
    cmd = [sys.executable, "-m", "layerscope", "extract", "--model", str(bert_export), "--engine", "ort", "--input",
           str(corpus), "--out", str(store), "--pooling", "mean", "--tokens", "--batch-tokens", "64", "--threads", "1"]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 180
    while not (store / "tokens").is_dir():
        assert proc.poll() is None and time.time() < deadline, proc.communicate()
        time.sleep(0.02)
    _fill(disk / "filler")
    _, stderr = proc.communicate(timeout=HANG_S)
    lines = [line for line in stderr.splitlines() if line.strip() and not line.startswith("token store:")]
    assert proc.returncode == 2, stderr
    assert "Traceback" not in stderr and len(lines) == 1, stderr
    assert "no space left writing" in lines[0] and "No space left on device" in lines[0], stderr
    assert not [p for p in store.rglob("*") if ".tmp" in p.name or p.name.endswith(".partial")], \
        sorted(str(p) for p in store.rglob("*"))
    (disk / "filler").unlink()
    other = tmp_path / "o.txt"
    other.write_text("a plane takes off\nrain falls on the city\n", encoding="utf-8")
    done = subprocess.run(cmd[:9] + [str(other), "--out", str(store), "--pooling", "mean", "--force"], env=env,
                          capture_output=True, text=True, timeout=HANG_S)
    assert done.returncode == 0, done.stderr
    assert LayerStore.open(store).texts() == ["a plane takes off", "rain falls on the city"]
