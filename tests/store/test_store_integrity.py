"""Damaged stores are caught: cheap header/size checks on open, checksums re-hashed by inspect verify."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from layerscope.errors import StoreError
from layerscope.extraction.pipeline import extract
from layerscope.store.store import LayerStore
from cli_helpers import cli_output

TEXTS = [f"text number {i} about a cat and a dog" for i in range(40)]


@pytest.fixture(scope="module")
def template(bert_export, tmp_path_factory):
    export = bert_export
    out = tmp_path_factory.mktemp("store-template") / "s"
    extract(export, TEXTS, out, engine="ort", poolings=["mean", "cls"], layers="raw,1,2")
    return out


@pytest.fixture
def store(template, tmp_path):
    path = tmp_path / "s"
    shutil.copytree(template, path)
    return path


def verify_cli(path, capsys):
    code, out, err = cli_output(["verify", path], capsys)
    return code, out, err


def edit_meta(path, fn):
    meta = json.loads((path / "store.json").read_text())
    fn(meta)
    (path / "store.json").write_text(json.dumps(meta))


def test_an_intact_store_verifies(store, capsys):
    meta = json.loads((store / "store.json").read_text())
    assert len(meta["checksums"]) == 2 * 3 + 3  # 6 arrays, done.npy, texts.jsonl, lengths.npy
    code, out, err = verify_cli(store, capsys)
    assert code == 0 and out.strip() == "ok: 9 files verified" and not err


def test_flipped_bytes_are_found_by_verify(store, capsys):
    target = store / "arrays" / "mean" / "2.npy"
    data = bytearray(target.read_bytes())
    data[-7] ^= 0xFF
    target.write_bytes(bytes(data))
    LayerStore.open(store)  # same size, same header: only the checksum can tell
    code, out, err = verify_cli(store, capsys)
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and "arrays/mean/2.npy" in lines[0] and "checksum" in lines[0], err


def test_flipped_bytes_in_texts_are_found_by_verify(store, capsys):
    target = store / "texts.jsonl"
    target.write_bytes(target.read_bytes().replace(b"number 3 ", b"number 8 ", 1))
    code, _, err = verify_cli(store, capsys)
    assert code == 2 and err.strip().splitlines() == [l for l in err.strip().splitlines() if "texts.jsonl" in l]
    assert len(err.strip().splitlines()) == 1


def test_a_truncated_array_is_one_line_on_open_and_in_verify(store, capsys):
    target = store / "arrays" / "cls" / "raw.npy"
    with open(target, "r+b") as fh:
        fh.truncate(target.stat().st_size - 100)
    with pytest.raises(StoreError, match=r"arrays/cls/raw.npy is [\d,]+ bytes.*truncated") as exc:
        LayerStore.open(store)
    assert "\n" not in str(exc.value)
    code, _, err = verify_cli(store, capsys)
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and "arrays/cls/raw.npy" in lines[0] and "Traceback" not in err


def test_a_wrong_shape_array_is_refused_on_open(store):
    target = store / "arrays" / "mean" / "1.npy"
    arr = np.load(target)
    np.save(target, arr.reshape(arr.shape[0] * 2, arr.shape[1] // 2))  # same bytes, another shape
    with pytest.raises(StoreError, match=r"arrays/mean/1.npy holds float32 \[80, 16\], the store says float32 \[40, 32\]"):
        LayerStore.open(store)


def test_a_wrong_dtype_array_is_refused_on_open(store):
    target = store / "arrays" / "mean" / "1.npy"
    np.save(target, np.load(target).astype(np.float16))
    with pytest.raises(StoreError, match="holds float16"):
        LayerStore.open(store)


def test_a_missing_array_is_refused_on_open(store):
    (store / "arrays" / "cls" / "2.npy").unlink()
    with pytest.raises(StoreError, match="arrays/cls/2.npy is missing"):
        LayerStore.open(store)


def test_a_cut_texts_file_is_refused_on_open(store, capsys):
    target = store / "texts.jsonl"
    lines = target.read_text().splitlines(keepends=True)
    target.write_text("".join(lines[:-3]))
    with pytest.raises(StoreError, match="texts.jsonl is [\\d,]+ bytes.*cut or edited"):
        LayerStore.open(store)
    code, _, err = verify_cli(store, capsys)
    assert code == 2 and "texts.jsonl" in err


def test_a_short_done_mask_is_refused_on_open(store):
    np.save(store / "done.npy", np.ones(39, np.uint8))
    with pytest.raises(StoreError, match=r"done.npy holds uint8 \[39\]"):
        LayerStore.open(store)


def test_an_edited_n_is_refused_on_open(store):
    edit_meta(store, lambda m: m.update(n=20))
    with pytest.raises(StoreError, match="store.json was edited after the store was made") as exc:
        LayerStore.open(store)
    assert "more problems" in str(exc.value)  # the arrays no longer match either


def test_an_edited_n_without_its_hash_is_still_refused(store):
    edit_meta(store, lambda m: (m.update(n=20), m.pop("structure_sha256")))
    with pytest.raises(StoreError, match=r"holds float32 \[40, 32\], the store says float32 \[20, 32\]"):
        LayerStore.open(store)


def test_an_edited_num_layers_is_refused_on_open(store):
    edit_meta(store, lambda m: m["manifest"].update(num_layers=m["manifest"]["num_layers"] + 1))
    with pytest.raises(StoreError, match="store.json was edited"):
        LayerStore.open(store)
    edit_meta(store, lambda m: (m["manifest"].update(num_layers=1), m.pop("structure_sha256")))
    with pytest.raises(StoreError, match=r"lists layers \['2'\] that a 1-layer model does not have"):
        LayerStore.open(store)


def test_verify_refuses_a_path_that_is_neither(tmp_path, capsys):
    code, _, err = verify_cli(tmp_path, capsys)
    assert code == 2 and "neither a layer store" in err


def test_a_store_from_before_checksums_still_opens_and_verify_says_what_it_lacks(store, capsys):
    edit_meta(store, lambda m: [m.pop(k) for k in ("structure_sha256", "texts_bytes", "checksums")])
    assert LayerStore.open(store).n == 40  # headers and sizes still checked, nothing else required
    code, _, err = verify_cli(store, capsys)
    assert code == 2 and "records no checksums" in err and len(err.strip().splitlines()) == 1
    target = store / "texts.jsonl"
    target.write_text("".join(target.read_text().splitlines(keepends=True)[:-1]))
    code, _, err = verify_cli(store, capsys)
    assert code == 2 and "texts.jsonl has 39 lines, the store has 40 rows" in err


def test_an_incomplete_store_is_reported_by_verify(store, capsys):
    edit_meta(store, lambda m: m.update(complete=False))
    code, _, err = verify_cli(store, capsys)
    assert code == 2 and "the store is incomplete" in err
