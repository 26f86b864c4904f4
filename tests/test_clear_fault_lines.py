"""Faults a user can run into get one clear line (exit 2) instead of ``internal error ... please report it``:
a symlinked --out with --force, a read-only --out or cache, an unsupported model type, a tokenizer larger than
the embedding matrix, a results.json nested too deep, an index.json whose kind was edited. User files are
left byte for byte as they were."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from cli_helpers import run_cli

TEXTS = "a cat sits on the mat\nthe dog runs in the park\nbirds fly over the lake\n"


@pytest.fixture(autouse=True)
def _home(tmp_path, monkeypatch):
    monkeypatch.setenv("LAYERSCOPE_HOME", str(tmp_path / "home"))


def _one_line(args, capsys) -> str:
    code, text = run_cli(args, capsys)
    assert code == 2, text
    assert "internal error" not in text and "Traceback" not in text, text
    return " ".join(text.split())


def _hashes(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture()
def corpus(tmp_path) -> Path:
    path = tmp_path / "c.txt"
    path.write_text(TEXTS, encoding="utf-8")
    return path


# ---------------------------------------------------------------- --out through a symlink

def test_force_through_a_symlinked_out_is_refused(bert_export, corpus, tmp_path, capsys):
    from layerscope.extraction.pipeline import extract

    store = tmp_path / "S"
    extract(bert_export, str(corpus), store, engine="ort", poolings=["mean"])
    before = _hashes(store)
    link = tmp_path / "link"
    link.symlink_to(store)
    line = _one_line(["extract", "--model", bert_export, "--engine", "ort", "--input", corpus, "--out", link,
                      "--force"], capsys)
    assert f"--out {link} is a symlink to {store.resolve()}" in line and "real path" in line, line
    assert link.is_symlink() and _hashes(store) == before


# ---------------------------------------------------------------- read-only places

@pytest.fixture()
def readonly_dir(tmp_path, monkeypatch):
    """A folder on a read-only file system: a tmpfs mounted read-only when this process may mount (root in a
    container usually may); otherwise the writability probe (os.access) is patched to say so for it, since
    tests run as root and a chmod would not stop root."""
    where = tmp_path / "ro"
    where.mkdir()
    (where / "home").mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(where)],
                             capture_output=True).returncode == 0
    if mounted:
        (where / "home").mkdir()
        mounted = subprocess.run(["mount", "-o", "remount,ro", str(where)], capture_output=True).returncode == 0
        if not mounted:
            subprocess.run(["umount", str(where)], capture_output=True)
    if not mounted:
        real = os.access

        def access(path, mode, *a, **kw):
            inside = Path(path).absolute() == where or where in Path(path).absolute().parents
            return False if inside and mode & os.W_OK else real(path, mode, *a, **kw)

        monkeypatch.setattr(os, "access", access)
    try:
        yield where
    finally:
        if mounted:
            subprocess.run(["umount", str(where)], capture_output=True)


@pytest.mark.parametrize("command", ["run", "export", "index"])
def test_a_read_only_out_is_refused_before_the_work(command, readonly_dir, bert_export, tiny_model, corpus,
                                                      tmp_path, capsys):
    out = readonly_dir / "out"
    if command == "run":
        args = ["run", "compositionality", "--model", bert_export, "--pooling", "cls", "--out", out]
    elif command == "export":
        args = ["export", tiny_model("bert"), "--out", out]
    else:
        from layerscope.extraction.pipeline import extract

        extract(bert_export, str(corpus), tmp_path / "S", engine="ort", poolings=["mean"])
        args = ["index", "build", "--store", tmp_path / "S", "--out", out]
    line = _one_line(args, capsys)
    assert f"--out {out} cannot be written: {readonly_dir}" in line, line
    assert "read-only file system" in line or "not writable" in line
    assert not (tmp_path / "home" / "stores").exists()  # refused before any vector was computed


def test_a_read_only_cache_is_one_line(readonly_dir, tiny_model, monkeypatch, tmp_path, capsys):
    monkeypatch.setenv("LAYERSCOPE_HOME", str(readonly_dir / "home"))
    line = _one_line(["run", "compositionality", "--model", tiny_model("bert"), "--engine", "ort", "--pooling",
                      "cls", "--out", tmp_path / "R"], capsys)
    assert f"layerscope's cache {readonly_dir / 'home'} cannot be written" in line, line
    assert "set LAYERSCOPE_HOME to a writable folder" in line


# ---------------------------------------------------------------- models that cannot run

def test_an_unsupported_model_type_is_named(tiny_model, corpus, tmp_path, capsys):
    model = Path(shutil.copytree(tiny_model("bert"), tmp_path / "xl"))
    config = json.loads((model / "config.json").read_text())
    config["model_type"] = "resnet"  # a convolutional image model: transformers knows it, layerscope has no family
    (model / "config.json").write_text(json.dumps(config))
    before = _hashes(model)
    for args in (["extract", "--model", model, "--engine", "torch", "--input", corpus, "--out", tmp_path / "S"],
                 ["export", model, "--out", tmp_path / "E"]):
        line = _one_line(args, capsys)
        assert "model type 'resnet' is not supported: transformers knows it neither as a masked-LM encoder" in line, line
    assert _hashes(model) == before


@pytest.fixture()
def big_vocab_bert(tiny_model, tmp_path) -> Path:
    """The tiny BERT with its embedding matrix cut to 200 rows while its tokenizer keeps every token."""
    from safetensors.numpy import load_file, save_file

    model = Path(shutil.copytree(tiny_model("bert"), tmp_path / "bigvocab"))
    config = json.loads((model / "config.json").read_text())
    weights = load_file(str(model / "model.safetensors"))
    for key, value in list(weights.items()):
        if value.ndim and value.shape[0] == config["vocab_size"]:
            weights[key] = np.ascontiguousarray(value[:200])
    save_file(weights, str(model / "model.safetensors"), metadata={"format": "pt"})
    config["vocab_size"] = 200
    (model / "config.json").write_text(json.dumps(config))
    return model


@pytest.mark.parametrize("engine", ["torch", "ort"])
def test_a_tokenizer_larger_than_the_embeddings_is_named(engine, big_vocab_bert, corpus, tmp_path, capsys):
    line = _one_line(["extract", "--model", big_vocab_bert, "--engine", engine, "--input", corpus,
                      "--out", tmp_path / "S"], capsys)
    assert "its tokenizer has 402 tokens but the model's embedding matrix has 200 rows" in line, line
    assert not (tmp_path / "S").exists()


# ---------------------------------------------------------------- damaged results and indexes

def test_a_results_json_nested_too_deep_is_one_line(bert_export, tmp_path, capsys):
    out = tmp_path / "R"
    code, text = run_cli(["run", "compositionality", "--model", bert_export, "--pooling", "cls", "--out", out], capsys)
    assert code == 0, text
    (out / "results.json").write_text('{"a":' * 100_000 + "1" + "}" * 100_000)
    line = _one_line(["report", out], capsys)
    assert f"{out / 'results.json'} is nested too deeply to read" in line, line


@pytest.mark.parametrize("kind", ["binary", "hnsw-x", None])
def test_an_index_json_whose_kind_was_edited_is_one_line(kind, bert_export, corpus, tmp_path, capsys):
    from layerscope.extraction.pipeline import extract

    extract(bert_export, str(corpus), tmp_path / "S", engine="ort", poolings=["mean"])
    index = tmp_path / "I"
    code, text = run_cli(["index", "build", "--store", tmp_path / "S", "--out", index], capsys)
    assert code == 0, text
    meta = json.loads((index / "index.json").read_text())
    if kind is None:
        del meta["kind"]
    else:
        meta["kind"] = kind
    (index / "index.json").write_text(json.dumps(meta))
    line = _one_line(["search", "--index", index, "a cat"], capsys)
    assert "rebuild the index" in line and str(index) in line, line
