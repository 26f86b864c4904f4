"""inspect export-store: a store as Parquet or safetensors, read back by pyarrow and safetensors."""

from __future__ import annotations

import json

import numpy as np
import pytest

from layerscope.errors import InputError
from cli_helpers import run_cli as cli

TEXTS = ["a cat sat on the mat", "", "the weather today is sunny", "water boils at 100 degrees",
         "neural networks learn"]


@pytest.fixture(scope="module")
def store(tiny_model, tmp_path_factory):
    from layerscope.extraction.pipeline import extract

    out = tmp_path_factory.mktemp("export-store") / "store"
    extract(str(tiny_model("bert")), TEXTS, out, engine="torch", layers="0,-1", poolings=["mean", "cls"])
    from layerscope.store.store import LayerStore

    return LayerStore.open(out)


def test_parquet_holds_ids_texts_and_every_vector(store, tmp_path, capsys, monkeypatch):
    import pyarrow.parquet as pq

    import layerscope.store.store_export as se

    monkeypatch.setattr(se, "ROW_GROUP", 2)  # several row groups, as in a large store
    path = tmp_path / "s.parquet"
    code, text = cli(["export-store", str(store.path), "--format", "parquet", "--out", str(path)], capsys)
    assert code == 0, text
    table = pq.read_table(path)
    assert table.column("text").to_pylist() == TEXTS
    assert table.column("id").to_pylist() == store.ids()
    for p in ("mean", "cls"):
        for layer in ("0", "2"):
            got = np.asarray(table.column(f"{p}/layer_{layer}").to_pylist(), dtype=np.float32)
            np.testing.assert_array_equal(got, store[p, layer])
    meta = json.loads(table.schema.metadata[b"layerscope"])
    assert meta["layers"] == ["0", "2"] and meta["n"] == len(TEXTS)


def test_safetensors_holds_ids_texts_and_every_vector(store, tmp_path, capsys):
    from safetensors import safe_open

    path = tmp_path / "s.safetensors"
    code, text = cli(["export-store", str(store.path), "--format", "safetensors", "--out", str(path)], capsys)
    assert code == 0, text
    with safe_open(str(path), framework="numpy") as fh:
        meta = fh.metadata()
        assert json.loads(meta["texts"]) == TEXTS
        assert json.loads(meta["ids"]) == store.ids()
        assert sorted(fh.keys()) == ["cls/layer_0", "cls/layer_2", "mean/layer_0", "mean/layer_2"]
        np.testing.assert_array_equal(fh.get_tensor("mean/layer_2"), store["mean", -1])


@pytest.mark.parametrize("fmt", ["parquet", "safetensors"])
@pytest.mark.parametrize("mask", [0o022, 0o002])
def test_the_file_gets_the_mode_the_users_umask_gives(fmt, mask, store, tmp_path, capsys):
    """Catches: the file written 0600 (the mode of its temporary file), unreadable to the group a shared
    folder's umask lets read it."""
    import os
    import stat

    old = os.umask(mask)
    try:
        path = tmp_path / f"s.{fmt}"
        code, text = cli(["export-store", str(store.path), "--format", fmt, "--out", str(path)], capsys)
    finally:
        os.umask(old)
    assert code == 0, text
    assert stat.S_IMODE(path.stat().st_mode) == 0o666 & ~mask


def test_force_replaces_only_layerscopes_own_file(store, tmp_path):
    from layerscope.store.store_export import export_store

    path = tmp_path / "x.parquet"
    path.write_text("someone else's file")
    with pytest.raises(InputError, match="exists; pass --force"):
        export_store(store.path, "parquet", path)
    with pytest.raises(InputError, match="not written by layerscope export-store"):
        export_store(store.path, "parquet", path, force=True)
    assert path.read_text() == "someone else's file"
    path.unlink()
    export_store(store.path, "parquet", path)
    export_store(store.path, "parquet", path, force=True)  # our own file: replaced
    with pytest.raises(InputError, match="choose parquet or safetensors"):
        export_store(store.path, "csv", tmp_path / "x.csv")


def test_export_store_of_dot_writes_beside_the_store(store, tmp_path, capsys, monkeypatch):
    """``export-store .`` from inside the store: the default file is named after the store's folder."""
    import shutil

    copy = tmp_path / "mystore"
    shutil.copytree(store.path, copy)
    monkeypatch.chdir(copy)
    code, text = cli(["export-store", ".", "--format", "parquet"], capsys)
    assert code == 0, text
    assert (tmp_path / "mystore.parquet").is_file() and "wrote" in text


@pytest.fixture()
def small_mount(tmp_path):
    """A 1 MB tmpfs of its own (tests run as root in a container that may mount); skipped where it may not."""
    import subprocess

    where = tmp_path / "mnt"
    where.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(where)], capture_output=True).returncode:
        pytest.skip("this process may not mount a tmpfs (not root, or no CAP_SYS_ADMIN): no real full or "
                    "read-only file system to write to")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], capture_output=True)


@pytest.mark.parametrize("fmt", ["parquet", "safetensors"])
def test_a_full_destination_is_one_line(fmt, store, small_mount, capsys):
    import os

    fd = os.open(small_mount / "filler", os.O_WRONLY | os.O_CREAT)  # fill it to the last byte
    try:
        while os.write(fd, b"\0" * 4096):
            pass
    except OSError:
        pass
    finally:
        os.close(fd)
    code, text = cli(["export-store", str(store.path), "--format", fmt, "--out", str(small_mount / f"x.{fmt}")],
                     capsys)
    line = " ".join(text.split())
    assert code == 2 and "internal error" not in line and "not enough free space" in line, line
    assert sorted(p.name for p in small_mount.iterdir()) == ["filler"]


def test_a_read_only_destination_is_one_line_before_the_work(store, small_mount, capsys):
    import subprocess

    (small_mount / "d").mkdir()
    assert subprocess.run(["mount", "-o", "remount,ro", str(small_mount)], capture_output=True).returncode == 0
    code, text = cli(["export-store", str(store.path), "--format", "parquet", "--out",
                      str(small_mount / "d" / "x.parquet")], capsys)
    line = " ".join(text.split())
    assert code == 2 and "internal error" not in line and "not writable" in line, line
    code, text = cli(["export-store", str(store.path), "--format", "parquet", "--out",
                      str(small_mount / "nofolder" / "x.parquet")], capsys)
    assert code == 2 and "not an existing folder" in " ".join(text.split()), text
