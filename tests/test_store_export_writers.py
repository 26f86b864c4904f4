"""export-store writes one file as every writer does: under the --out lock, through a temporary name of its
own, replacing only a file export-store wrote. Real processes; every user file keeps its sha256."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import layerscope
from cli_helpers import run_cli, sha
from hang_guard import HANG_S  # noqa: E402

SRC = str(Path(layerscope.__file__).resolve().parents[1])
TEXTS = ["a cat sat on the mat", "the weather today is sunny", "water boils at 100 degrees", "neural networks learn"]

HOLD = """
import sys, time
from layerscope.out_lock import out_lock
with out_lock(sys.argv[1]):
    print("held", flush=True)
    time.sleep(120)
"""


def env() -> dict[str, str]:
    return dict(os.environ, PYTHONPATH=os.pathsep.join([SRC] + [p for p in sys.path if p]))


@pytest.fixture(scope="module")
def store(bert_export, tmp_path_factory):
    from layerscope.extraction.pipeline import extract

    out = tmp_path_factory.mktemp("export-writers") / "store"
    extract(bert_export, TEXTS, out, engine="ort", layers="0,-1")
    return out


def test_export_store_takes_the_out_lock(store, tmp_path, capsys):
    out = tmp_path / "s.parquet"
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(out)], stdout=subprocess.PIPE, text=True, env=env())
    try:
        assert holder.stdout.readline().strip() == "held"
        code, text = run_cli(["export-store", store, "--format", "parquet", "--out", out], capsys)
    finally:
        holder.kill()
        holder.wait()
    assert code == 2 and "Traceback" not in text, text
    errors = [line for line in text.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "is being written by another process" in " ".join(text.split()), text
    assert not out.exists() and sorted(p.name for p in tmp_path.iterdir()) == [".s.parquet.lock"]  # the holder's


def test_a_users_partial_file_is_never_touched(store, tmp_path, capsys):
    out = tmp_path / "s.parquet"
    mine = tmp_path / "s.parquet.partial"
    mine.write_text("my half-finished notes\n")
    digest = sha(mine)
    for extra in ([], ["--force"]):
        code, text = run_cli(["export-store", store, "--format", "parquet", "--out", out, *extra], capsys)
        assert code == 0, text
        assert mine.is_file() and sha(mine) == digest
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.parquet", "s.parquet.partial"]


def test_force_never_replaces_a_users_file_or_a_symlink(store, tmp_path, capsys):
    import pyarrow as pa
    import pyarrow.parquet as pq

    out = tmp_path / "s.parquet"
    pq.write_table(pa.table({"x": [1, 2]}), out)  # the user's own Parquet file
    digest = sha(out)
    code, text = run_cli(["export-store", store, "--format", "parquet", "--out", out, "--force"], capsys)
    assert code == 2 and "was not written by layerscope export-store" in " ".join(text.split()), text
    assert sha(out) == digest
    ours = tmp_path / "ours.parquet"
    assert run_cli(["export-store", store, "--format", "parquet", "--out", ours], capsys)[0] == 0
    link = tmp_path / "link.parquet"
    link.symlink_to(ours)
    code, text = run_cli(["export-store", store, "--format", "parquet", "--out", link, "--force"], capsys)
    assert code == 2 and "was not written by layerscope export-store" in " ".join(text.split()), text
    assert link.is_symlink()


def test_two_real_runs_into_one_file_leave_one_whole_file(store, tmp_path):
    """Both --force into one file at once: each either wrote the whole file or was refused with the lock's
    line; the file is whole and readable, and no temporary file is left."""
    import pyarrow.parquet as pq

    out = tmp_path / "s.parquet"
    cmd = [sys.executable, "-m", "layerscope", "export-store", str(store), "--format", "parquet", "--out", str(out),
           "--force"]
    procs = [subprocess.Popen(cmd, env=env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(3)]
    results = [(p.wait(timeout=HANG_S), *p.communicate()) for p in procs]
    for code, stdout, stderr in results:
        assert "Traceback" not in stderr, stderr
        assert (code == 0 and "wrote" in stdout) or (code == 2 and "being written by another process" in
                                                     " ".join(stderr.split())), (code, stdout, stderr)
    assert any(code == 0 for code, _, _ in results)
    assert pq.read_table(out).column("text").to_pylist() == TEXTS
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.parquet"]
