"""Hugging Face datasets as input: save_to_disk directories, .arrow files, hub names (offline here)."""

from __future__ import annotations

import json
import sys

import pytest

datasets = pytest.importorskip("datasets")

from layerscope.errors import InputError  # noqa: E402
from layerscope.data.corpus import read_corpus  # noqa: E402
from cli_helpers import run_cli  # noqa: E402

S1 = ["a cat sits", "a dog runs", "the sun is hot", "rain falls down", "the river flows", "he reads books"]
S2 = ["a kitten sits", "a puppy runs", "the moon is cold", "it rains", "water moves", "she writes letters"]
SCORES = [4.5, 4.0, 1.0, 4.2, 2.5, 0.8]


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    root = tmp_path_factory.mktemp("hfds")
    ds = datasets.Dataset.from_dict({"sentence1": S1, "sentence2": S2, "score": SCORES,
                                     "uid": [f"u{i}" for i in range(len(S1))]})
    datasets.DatasetDict({"test": ds, "train": ds.select(range(3))}).save_to_disk(str(root / "dict"))
    ds.save_to_disk(str(root / "single"))
    arrow = sorted((root / "single").glob("*.arrow"))
    assert len(arrow) == 1
    return {"dict": root / "dict", "single": root / "single", "arrow": arrow[0]}


@pytest.mark.parametrize("kind,split", [("dict", "test"), ("single", None), ("arrow", None)])
def test_every_local_dataset_form_reads_in_order_with_ids(saved, kind, split):
    spec = f"hf:{saved[kind]}" + (f":{split}" if split else "")
    records, stats = read_corpus(spec, column="sentence2", id_field="uid")
    assert [r.text for r in records] == S2
    assert [r.id for r in records] == [f"u{i}" for i in range(len(S1))]
    assert stats.n == len(S2)


def test_extract_from_a_saved_dataset_on_the_command_line(saved, tiny_model, tmp_path, capsys):
    from layerscope.store.store import LayerStore

    out = tmp_path / "store"
    code, text = run_cli(["extract", "--model", str(tiny_model("bert")), "--engine", "torch", "--dataset",
                          str(saved["dict"]), "--split", "train", "--column", "sentence1", "--out", str(out),
                          "--layers", "-1"], capsys)
    assert code == 0, text
    store = LayerStore.open(out)
    assert store.texts() == S1[:3]
    assert store.spec.input == f"hf:{saved['dict']}:train"
    assert store["mean", -1].shape == (3, 32)


def test_run_sts_on_a_saved_dataset(saved, tiny_model, tmp_path, capsys):
    out = tmp_path / "res"
    code, text = run_cli(["run", "sts", "--model", str(tiny_model("bert")), "--engine", "torch", "--dataset",
                          str(saved["dict"]), "--split", "test", "--out", str(out), "--layers", "-1",
                          "--no-cache", "--n-boot", "0"], capsys)
    assert code == 0, text
    results = json.loads((out / "results.json").read_text())
    assert results["settings"]["data"] == f"hf:{saved['dict']}:test"
    (model_result,) = results["per_model"].values() if isinstance(results["per_model"], dict) else results["per_model"]
    assert model_result["summary"]["pairs"] == len(S1)


def test_dataset_errors_are_one_line(saved, capsys, tmp_path, monkeypatch):
    with pytest.raises(InputError, match="has splits test, train: choose one with --split"):
        read_corpus(f"hf:{saved['dict']}", column="sentence1")
    with pytest.raises(InputError, match="did you mean 'sentence1'"):
        read_corpus(f"hf:{saved['single']}", column="sentense1")
    with pytest.raises(InputError, match="holds a float, not text"):
        read_corpus(f"hf:{saved['single']}", column="score")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(InputError, match="could not load dataset hf:nobody/nothing:test"):
        read_corpus("hf:nobody/nothing:test")
    code, text = run_cli(["extract", "--input", "x.txt", "--dataset", str(saved["dict"]), "--out",
                          str(tmp_path / "s")], capsys)
    assert code == 2 and "not both" in text and "Traceback" not in text
    monkeypatch.setitem(sys.modules, "datasets", None)
    with pytest.raises(InputError, match=r"needs the 'datasets' package: pip install 'layerscope\[datasets\]'"):
        read_corpus(f"hf:{saved['single']}", column="sentence1")
