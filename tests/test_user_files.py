"""No user file is ever lost: --force replaces only what layerscope made, never a folder holding the input.

Every directory layerscope makes carries a ``.layerscope.json`` marker naming its kind; directories
made before markers existed are recognised by their own metadata file.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from layerscope.errors import InputError, LayerscopeError
from layerscope.export.exporter import export_model
from layerscope.model.source import resolve_source
from layerscope.extraction.pipeline import extract
from layerscope.store.store import LayerStore
from cli_helpers import run_cli as cli

MARKER = ".layerscope.json"


def kind_of(path):
    from layerscope.ownership import kind_of as real

    return real(path)


def claim(*args, **kw):
    from layerscope.ownership import claim as real

    return real(*args, **kw)


TEXTS = ["a cat sits", "the dog runs in the park", "", "two birds fly over a lake", "hello"]


@pytest.fixture()
def corpus_file(tmp_path) -> Path:
    p = tmp_path / "corpus.txt"
    p.write_text("\n".join(TEXTS) + "\n", encoding="utf-8")
    return p


def one_error(code, text, *needles):
    assert code == 2, text
    assert "Traceback" not in text
    lines = [line for line in text.splitlines() if line.startswith("error:")]
    assert len(lines) == 1, text
    flat = " ".join(text.split())
    for needle in needles:
        assert needle in flat, (needle, text)


def snapshot(path: Path) -> dict[str, bytes]:
    return {str(p.relative_to(path)): p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()}


# ---------------------------------------------------------------- markers

def test_every_directory_layerscope_makes_is_marked_with_its_kind(bert_export, corpus_file, tmp_path):
    from layerscope.index.store_index import build_store_index

    assert json.loads((bert_export / MARKER).read_text())["kind"] == "export"
    store = tmp_path / "store"
    extract(bert_export, str(corpus_file), store, engine="ort")
    assert json.loads((store / MARKER).read_text())["kind"] == "store"
    build_store_index(store, store / "index-flat", kind="flat", device="cpu")
    assert kind_of(store / "index-flat") == "index"
    assert kind_of(store) == "store"


def test_directories_made_before_markers_are_recognised_by_their_own_files(bert_export, corpus_file, tmp_path):
    """Their kind is known, but not which files layerscope wrote: --force refuses them, saying what to do."""
    old_export = tmp_path / "old-export"
    shutil.copytree(bert_export, old_export)
    (old_export / MARKER).unlink()
    assert kind_of(old_export) == "export"
    with pytest.raises(InputError, match=r"older layerscope.*delete it yourself \(rm -r .*old-export\)"):
        claim(old_export, "export", force=True)
    store = tmp_path / "old-store"
    extract(bert_export, str(corpus_file), store, engine="ort")
    (store / MARKER).unlink()
    before = snapshot(store)
    with pytest.raises(InputError, match="older layerscope"):
        extract(bert_export, str(corpus_file), store, engine="ort", force=True)
    assert snapshot(store) == before
    assert LayerStore.open(store).n == len(TEXTS)  # still readable, and resumable


# ---------------------------------------------------------------- extract --force

def test_extract_force_never_empties_a_folder_of_notes(bert_export, corpus_file, tmp_path, capsys):
    notes = tmp_path / "notes"
    notes.mkdir()
    for name in ("a.md", "b.md", "c.md", "d.md"):
        (notes / name).write_text(name)
    before = snapshot(notes)
    code, text = cli(["extract", "--model", bert_export, "--input", corpus_file, "--out", notes, "--force"], capsys)
    one_error(code, text, "holds 4 files that layerscope did not make (a.md, b.md, c.md, ...)", "choose another --out")
    assert snapshot(notes) == before


def test_extract_force_never_deletes_the_folder_holding_the_corpus(bert_export, tmp_path, capsys):
    # The folder is a real store that the user also keeps the corpus in.
    p = tmp_path / "p"
    extract(bert_export, TEXTS, p, engine="ort")
    corpus = p / "arrays" / "corpus.txt"
    corpus.write_text("\n".join(TEXTS) + "\n", encoding="utf-8")
    before = snapshot(p)
    code, text = cli(["extract", "--model", bert_export, "--input", corpus, "--out", p, "--force"], capsys)
    one_error(code, text, "holds this command's input", "corpus.txt")
    assert snapshot(p) == before
    # a plain folder with the corpus in it: refused too (it is not a store)
    q = tmp_path / "q"
    q.mkdir()
    (q / "corpus.txt").write_text("x\ny\n", encoding="utf-8")
    code, text = cli(["extract", "--model", bert_export, "--input", q / "corpus.txt", "--out", q, "--force"], capsys)
    one_error(code, text, "corpus.txt")
    assert (q / "corpus.txt").read_text() == "x\ny\n"


def test_extract_force_keeps_a_store_with_user_files_in_it(bert_export, corpus_file, tmp_path):
    store = tmp_path / "s"
    extract(bert_export, str(corpus_file), store, engine="ort")
    (store / "notes.md").write_text("my notes")
    with pytest.raises(InputError, match=r"layerscope did not make \(notes.md\)"):
        extract(bert_export, str(corpus_file), store, engine="ort", force=True)
    assert (store / "notes.md").read_text() == "my notes"
    assert LayerStore.open(store).n == len(TEXTS)


def test_extract_force_replaces_a_store_it_made(bert_export, corpus_file, tmp_path):
    store = tmp_path / "s"
    extract(bert_export, ["one", "two"], store, engine="ort")
    extract(bert_export, str(corpus_file), store, engine="ort", force=True)
    assert LayerStore.open(store).texts() == TEXTS


def test_extract_refuses_another_kind_of_layerscope_directory(bert_export, corpus_file, capsys):
    code, text = cli(["extract", "--model", bert_export, "--input", corpus_file, "--out", bert_export, "--force"],
                     capsys)
    one_error(code, text, "holds an export, not a layer store")
    assert (bert_export / "model.onnx").exists()


# ---------------------------------------------------------------- extract without --force

def test_extract_without_force_writes_nothing_into_a_folder_that_is_not_a_store(bert_export, corpus_file, tmp_path,
                                                                               capsys):
    mine = tmp_path / "mine"
    (mine / "arrays").mkdir(parents=True)
    (mine / "arrays" / "keep.bin").write_bytes(b"\x01\x02")
    (mine / "texts.jsonl").write_text('{"mine": 1}\n')
    np.save(mine / "lengths.npy", np.arange(3))
    np.save(mine / "done.npy", np.ones(3, np.uint8))
    before = snapshot(mine)
    code, text = cli(["extract", "--model", bert_export, "--input", corpus_file, "--out", mine], capsys)
    one_error(code, text, "holds 4 files that layerscope did not make", "arrays")
    assert snapshot(mine) == before


def test_extract_into_an_existing_empty_folder_is_fine(bert_export, corpus_file, tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    assert extract(bert_export, str(corpus_file), empty, engine="ort").n == len(TEXTS)


# ---------------------------------------------------------------- export --force

def test_export_force_refuses_foreign_folders_and_the_model_itself(tiny_model, tmp_path, capsys):
    model_dir = tiny_model("bert")
    before = snapshot(model_dir)
    code, text = cli(["export", model_dir, "--out", model_dir, "--force"], capsys)
    one_error(code, text, "layerscope did not make", "choose another --out")
    assert snapshot(model_dir) == before
    notes = tmp_path / "notes"
    notes.mkdir()
    (notes / "paper.tex").write_text("draft")
    code, text = cli(["export", model_dir, "--out", notes, "--force"], capsys)
    one_error(code, text, "holds 1 file that layerscope did not make (paper.tex)")
    assert (notes / "paper.tex").read_text() == "draft"


def test_export_force_never_deletes_an_export_that_holds_the_model(tiny_model, tiny_export, tmp_path):
    # An export dir the user saved the model checkpoint into: the input is inside, so --force refuses.
    out = tiny_export("bert", to=tmp_path / "exp")
    inside = out / "trt_cache"
    shutil.copytree(tiny_model("bert"), inside)
    with pytest.raises(InputError, match="holds this command's input"):
        export_model(resolve_source(str(inside)), out, force=True)
    assert (inside / "config.json").exists() and (out / "manifest.json").exists()


def test_export_force_replaces_an_export_and_marks_the_new_one(tiny_model, tiny_export, tmp_path):
    out = tiny_export("bert", pooled=["mean"], to=tmp_path / "exp")
    export_model(resolve_source(str(tiny_model("bert"))), out, pooled=["cls"], force=True)
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["pooled_modes"] == ["cls"] and kind_of(out) == "export"


# ---------------------------------------------------------------- index build --force

def test_index_force_replaces_only_an_index(bert_export, corpus_file, tmp_path, capsys):
    store = tmp_path / "s"
    extract(bert_export, str(corpus_file), store, engine="ort")
    idx = tmp_path / "idx"
    assert cli(["index", "build", "--store", store, "--out", idx, "--device", "cpu"], capsys)[0] == 0
    code, text = cli(["index", "build", "--store", store, "--out", idx, "--device", "cpu"], capsys)
    one_error(code, text, "already holds an index", "--force")
    assert cli(["index", "build", "--store", store, "--out", idx, "--device", "cpu", "--force"], capsys)[0] == 0
    # the store itself is never an index to replace, and it holds the index's input
    code, text = cli(["index", "build", "--store", store, "--out", store, "--device", "cpu", "--force"], capsys)
    one_error(code, text, "holds a layer store, not an index")
    assert LayerStore.open(store).n == len(TEXTS)


# ---------------------------------------------------------------- --out naming a file

@pytest.mark.parametrize("command", [
    ["extract", "--input", "{corpus}", "--out", "{file}"],
    ["export", "{model}", "--out", "{file}"],
    ["run", "compositionality", "--out", "{file}"],
    ["index", "build", "--store", "{store}", "--out", "{file}"],
    ["bench", "--synthetic", "4", "--out", "{file}"],
])
def test_out_naming_a_regular_file_is_one_line(command, tiny_model, bert_export, corpus_file, tmp_path, capsys):
    target = tmp_path / "results.txt"
    target.write_text("precious")
    values = {"corpus": corpus_file, "file": target, "model": tiny_model("bert"), "store": tmp_path / "nostore"}
    args = [a.format(**{k: str(v) for k, v in values.items()}) for a in command]
    if command[0] in ("extract", "run", "bench"):
        args += ["--model", str(bert_export)]
    code, text = cli(args, capsys)
    one_error(code, text, "is a file, not a directory")
    assert target.read_text() == "precious"


def test_ownership_is_one_rule(tmp_path):
    """claim() says the same for every kind: missing and empty are free, others refused or replaceable."""
    assert not claim(tmp_path / "new", "result").existed
    for kind, sig in (("export", "manifest.json"), ("store", "store.json"), ("result", "results.json"),
                      ("index", "index.json")):
        d = tmp_path / kind
        d.mkdir()
        assert claim(d, kind).kind is None  # empty
        (d / sig).write_text("{}")
        with pytest.raises(LayerscopeError, match="--force"):
            claim(d, kind)
        with pytest.raises(InputError, match="did not record the files it wrote"):
            claim(d, kind, force=True)  # no record of which files layerscope wrote
        from layerscope.ownership import record

        record(d, kind, names=[sig])
        assert claim(d, kind, force=True).replace
        others = [k for k in ("export", "store", "result", "index") if k != kind]
        with pytest.raises(InputError, match="not"):
            claim(d, others[0], force=True)


def test_the_final_swap_rechecks_the_target(tmp_path):
    """A file that appears in the target while a result is computed is not deleted by the swap."""
    from layerscope.atomic import staged_dir

    target = tmp_path / "res"
    target.mkdir()
    (target / "results.json").write_text("{}")
    with pytest.raises(InputError, match="changed while this command ran"):
        with staged_dir(target, kind="result") as stage:
            (stage / "results.json").write_text('{"new": 1}')
            (target / "notes.md").write_text("written meanwhile")
    assert (target / "notes.md").read_text() == "written meanwhile"
    assert (target / "results.json").read_text() == "{}"
    assert [p.name for p in tmp_path.iterdir()] == ["res"]  # no staging folder left
