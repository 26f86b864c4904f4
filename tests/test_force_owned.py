"""--force replaces exactly the files layerscope recorded writing, never a file by its name; no path read
from a manifest, store or index leads outside its folder; one writer per --out; an index refuses a store
that changed since it was built. Every user file keeps its sha256."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from cli_helpers import one_error, run_cli, sha
from layerscope.extraction.pipeline import extract
from layerscope.store.store import LayerStore
from hang_guard import HANG_S  # noqa: E402

TEXTS = ["a cat sits", "the dog runs in the park", "two birds fly over a lake", "hello there", "a man plays guitar"]
OTHER = ["A plane is taking off.", "A woman slices an onion.", "Rain falls on the city.", "Kids play football.",
         "The market opens at nine."]
COMPOSITIONALITY = ["run", "compositionality", "--engine", "ort", "--layers", "-1", "--pooling", "cls",
                    "--no-cache"]


pytestmark = pytest.mark.usefixtures("in_tmp_home")


def user_files(root: Path, names: dict[str, str]) -> dict[str, str]:
    """Write the user's files under ``root``; return {relative path: sha256}."""
    for rel, text in names.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text, encoding="utf-8")
    return {rel: sha(root / rel) for rel in names}


def unchanged(root: Path, digests: dict[str, str]) -> None:
    for rel, digest in digests.items():
        assert (root / rel).is_file(), f"{rel} was deleted"
        assert sha(root / rel) == digest, f"{rel} was changed"


def tree(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): sha(p) for p in sorted(root.rglob("*")) if p.is_file()}


# ---------------------------------------------------------------- --force and the user's files

def test_run_force_keeps_user_files_named_like_results(bert_export, capsys):
    out = Path("R")
    code, text = run_cli(COMPOSITIONALITY + ["--model", bert_export, "--out", out], capsys)
    assert code == 0, text
    mine = user_files(out, {"my_analysis.csv": "mine\n", "figure_for_paper.png": "png bytes",
                            "paper_draft.html": "<p>draft</p>"})
    ours = tree(out)
    code, text = run_cli(COMPOSITIONALITY + ["--model", bert_export, "--out", out, "--force"], capsys)
    one_error(code, text, "holds 3 files that layerscope did not make", "figure_for_paper.png", "my_analysis.csv",
              "paper_draft.html", "--force only replaces what layerscope wrote")
    unchanged(out, mine)
    assert tree(out) == ours  # nothing deleted, nothing rewritten
    for rel in mine:
        (out / rel).unlink()
    code, text = run_cli(COMPOSITIONALITY + ["--model", bert_export, "--out", out, "--force"], capsys)
    assert code == 0, text


@pytest.mark.parametrize("edit", ["appended", "same size"])
def test_run_force_refuses_a_result_file_the_user_edited(bert_export, capsys, edit):
    """An edit that keeps the file's size is found by its sha256 as well as one that grows it."""
    out = Path("R")
    assert run_cli(COMPOSITIONALITY + ["--model", bert_export, "--out", out], capsys)[0] == 0
    report = out / "report.md"
    text = report.read_text()
    if edit == "appended":
        report.write_text(text + "\nmy conclusions\n")
    else:
        report.write_text("MY" + text[2:])
        assert report.stat().st_size == len(text.encode("utf-8"))
    digest = sha(report)
    code, text = run_cli(COMPOSITIONALITY + ["--model", bert_export, "--out", out, "--force"], capsys)
    one_error(code, text, "changed since", "yours now", "report.md")
    assert sha(report) == digest


def test_extract_force_keeps_user_files_named_like_store_files(bert_export, tmp_path, capsys):
    store = tmp_path / "S"
    extract(bert_export, TEXTS, store, engine="ort")
    mine = user_files(store, {"checksums-my-notes.txt": "notes", "index-my-experiments/run1.txt": "exp",
                              "thesis.tmp.docx": "chapter 1"})
    before = tree(store)
    corpus = tmp_path / "c.txt"
    corpus.write_text("\n".join(OTHER) + "\n")
    code, text = run_cli(["extract", "--model", bert_export, "--input", corpus, "--out", store, "--force",
                          "--engine", "ort"], capsys)
    one_error(code, text, "holds 3 files that layerscope did not make", "checksums-my-notes.txt",
              "index-my-experiments/", "thesis.tmp.docx")
    unchanged(store, mine)
    assert tree(store) == before
    assert LayerStore.open(store).texts() == TEXTS


def test_extract_force_replaces_its_store_and_the_index_built_inside(bert_export, tmp_path, capsys):
    from layerscope.index.store_index import build_store_index

    store = tmp_path / "S"
    extract(bert_export, TEXTS, store, engine="ort")
    build_store_index(store, store / "index-flat", device="cpu")
    extract(bert_export, TEXTS, store, engine="ort", resume=True)  # a later writer of the store
    mine = user_files(store, {"index-flat/notes.md": "what this index is for"})
    from layerscope.errors import InputError

    with pytest.raises(InputError, match=r"did not make \(index-flat/notes.md\)"):
        extract(bert_export, OTHER, store, engine="ort", force=True)
    unchanged(store, mine)
    (store / "index-flat" / "notes.md").unlink()
    extract(bert_export, OTHER, store, engine="ort", force=True)
    assert LayerStore.open(store).texts() == OTHER and not (store / "index-flat").exists()
    owned = json.loads((store / ".layerscope.json").read_text())["owned"]
    assert owned["texts.jsonl"]["sha256"] == sha(store / "texts.jsonl")
    assert owned["arrays/mean/0.npy"]["sha256"] == sha(store / "arrays" / "mean" / "0.npy")


def test_export_force_keeps_user_files_named_like_export_files(tiny_model, tmp_path, capsys):
    from layerscope.export.exporter import export_model
    from layerscope.model.source import resolve_source

    model = tiny_model("bert")
    out = tmp_path / "E"
    export_model(resolve_source(str(model)), out, pooled=["mean"])
    mine = user_files(out, {"tokenizer_notes.md": "how I tokenized", "peers/mine.txt": "peer list"})
    before = tree(out)
    code, text = run_cli(["export", model, "--out", out, "--force"], capsys)
    one_error(code, text, "holds 2 files that layerscope did not make", "tokenizer_notes.md", "peers/")
    unchanged(out, mine)
    assert tree(out) == before


def test_a_variant_added_later_is_layerscopes_to_replace(bert_export, tmp_path):
    from layerscope.export.variants import make_variant
    from layerscope.ownership import foreign

    out = tmp_path / "E"
    shutil.copytree(bert_export, out)
    (out / "notes.md").write_text("the user's notes on this export\n", encoding="utf-8")
    make_variant(out, "int8")
    # model.int8.onnx was recorded when it was written; the notes there before it started stay the user's
    assert foreign(out).unrecorded == ["notes.md"] and foreign(out).changed == []
    (out / "notes.md").unlink()
    assert not foreign(out)
    (out / "model.int8.onnx").write_bytes(b"edited")
    assert foreign(out).changed == ["model.int8.onnx"]


def test_files_recorded_mid_run_count_as_layerscopes(bert_export, tmp_path):
    """A store whose writer died before it finished keeps the record made before its rows were written
    (files without a sha256 yet): --force may replace it."""
    from layerscope.ownership import foreign

    store = tmp_path / "S"
    extract(bert_export, TEXTS, store, engine="ort")
    marker = json.loads((store / ".layerscope.json").read_text())
    assert all(rec.get("sha256") or rec.get("dir") for rec in marker["owned"].values())
    assert not foreign(store)
    # mid-run record (before the rows are written): files without hashes still count as layerscope's
    for rec in marker["owned"].values():
        rec.pop("sha256", None)
    (store / ".layerscope.json").write_text(json.dumps(marker))
    np.save(store / "arrays" / "mean" / "0.npy", np.zeros((len(TEXTS), 32), np.float32))
    assert not foreign(store)
    extract(bert_export, OTHER, store, engine="ort", force=True)
    assert LayerStore.open(store).texts() == OTHER


# ---------------------------------------------------------------- paths from files stay inside

@pytest.mark.parametrize("bad", ["{tmp}/EVIL", "../../../../tmp", "abc/../../x12345678"])
def test_a_weights_hash_from_a_manifest_never_leads_outside_results(bad, bert_export, tmp_path, capsys):
    exp = tmp_path / "that_export"
    shutil.copytree(bert_export, exp)
    manifest = json.loads((exp / "manifest.json").read_text())
    manifest["source"]["weights_sha256"] = bad.format(tmp=tmp_path)
    manifest["source"].pop("revision", None)
    (exp / "manifest.json").write_text(json.dumps(manifest))
    escapes = [d / "compositionality" for d in tmp_path.parents[:4]]  # where ../ parts would lead
    assert not any(p.exists() for p in escapes)
    code, text = run_cli(["run", "compositionality", "--model", exp, "--engine", "ort", "--layers", "-1",
                          "--no-cache"], capsys)
    one_error(code, text, "source.weights_sha256", "not a sha256")
    assert not (tmp_path / "EVIL").exists()
    assert not any(p.exists() for p in escapes)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["home", "that_export"] or not any(
        Path("results").rglob("*"))


def test_result_folder_parts_are_slugged_and_checked_under_the_root(tmp_path):
    from dataclasses import replace

    from layerscope.analyses.layout import model_name, model_revision
    from layerscope.model.manifest_type import SourceInfo
    from layerscope.errors import InputError
    from layerscope.ownership import check_under

    src = SourceInfo(spec="x", path_or_id="x", alias="../../etc", revision="../../../tmp", weights_sha256="ab" * 32)
    parts = [model_name("x", src), model_revision(src, "k")]
    assert all("/" not in p and p not in (".", "..") and not p.startswith(".") for p in parts), parts
    path = check_under(tmp_path / "results" / parts[0] / parts[1] / "sts", tmp_path / "results")
    assert path.resolve().is_relative_to((tmp_path / "results").resolve())
    src = replace(src, revision=None)
    assert model_revision(src, "k") == "ab" * 6
    src = replace(src, weights_sha256="../../../../tmp")  # as a hand-made source could hold it
    with pytest.raises(InputError, match="not a sha256"):
        model_revision(src, "k")
    (tmp_path / "results").mkdir()
    (tmp_path / "results" / "link").symlink_to("/tmp")
    with pytest.raises(InputError, match="outside"):
        check_under(tmp_path / "results" / "link" / "x", tmp_path / "results")


def _rehash(store: Path, meta: dict) -> None:
    from layerscope.store.store_check import structure_sha256

    meta["structure_sha256"] = structure_sha256(meta)
    (store / "store.json").write_text(json.dumps(meta))


@pytest.mark.parametrize("field", ["poolings", "checksums"])
def test_store_json_paths_stay_inside_the_store(field, bert_export, tmp_path, capsys):
    store = tmp_path / "deep" / "a" / "S"
    extract(bert_export, TEXTS, store, engine="ort", poolings=["mean"])
    meta = json.loads((store / "store.json").read_text())
    if field == "poolings":
        # a copy of the arrays outside the store, reached by ../ with every hash recomputed
        outside = tmp_path / "deep" / "outside"
        shutil.copytree(store / "arrays" / "mean", outside)
        meta["poolings"] = ["../../outside"]
        for layer in meta["layers"]:
            rel = f"arrays/mean/{layer}.npy"
            meta["checksums"][f"arrays/../../outside/{layer}.npy"] = meta["checksums"].pop(rel)
        needle = "not a plain name inside the store"
    else:
        secret = tmp_path / "secret.txt"
        secret.write_text("x" * 12345)
        meta["checksums"]["../../../secret.txt"] = {"sha256": "0" * 64, "bytes": 1}
        needle = "a path outside the store"
    _rehash(store, meta)
    code, text = run_cli(["verify", store], capsys)
    flat = " ".join(text.split())
    assert code != 0 and needle in flat, text
    assert "12,345" not in flat and "12345" not in flat and "Traceback" not in text
    from layerscope.errors import StoreError

    with pytest.raises(StoreError, match=needle):
        LayerStore.open(store)


# ---------------------------------------------------------------- one writer per --out

HOLD = """
import sys, time
from layerscope.store.store_lock import store_lock  # the same OS lock every --out writer takes
with store_lock(sys.argv[1]):
    print("held", flush=True)
    time.sleep(120)
"""


@pytest.fixture()
def holder():
    """Start a second real process holding the write lock of a path; stopped at the end."""
    procs = []

    def start(path: Path) -> subprocess.Popen:
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
        proc = subprocess.Popen([sys.executable, "-c", HOLD, str(path)], stdout=subprocess.PIPE, text=True,
                                env=env)
        procs.append(proc)
        assert proc.stdout.readline().strip() == "held"
        return proc

    yield start
    for proc in procs:
        proc.kill()
        proc.wait()


def test_two_writers_of_one_result_folder(bert_export, holder, capsys):
    out = Path("R")
    assert run_cli(COMPOSITIONALITY + ["--model", bert_export, "--out", out], capsys)[0] == 0
    before = tree(out)
    holder(out)
    code, text = run_cli(COMPOSITIONALITY[:-3] + ["--pooling", "mean", "--no-cache", "--model", bert_export, "--out", out,
                                                  "--force"], capsys)
    one_error(code, text, "is being written by another process (pid", "choose another --out")
    assert tree(out) == before


def test_two_writers_of_one_export(tiny_model, tmp_path, holder, capsys):
    out = tmp_path / "X"
    holder(out)
    code, text = run_cli(["export", tiny_model("bert"), "--out", out], capsys)
    one_error(code, text, "is being written by another process")
    assert not out.exists()


def test_two_writers_of_one_index(bert_export, tmp_path, holder, capsys):
    store = tmp_path / "S"
    extract(bert_export, TEXTS, store, engine="ort")
    idx = tmp_path / "I"
    assert run_cli(["index", "build", "--store", store, "--out", idx, "--device", "cpu"], capsys)[0] == 0
    before = tree(idx)
    holder(idx)
    code, text = run_cli(["index", "build", "--store", store, "--out", idx, "--device", "cpu", "--force",
                          "--kind", "hnsw"], capsys)
    one_error(code, text, "is being written by another process")
    assert tree(idx) == before


def test_a_symlink_to_a_store_takes_the_same_lock(bert_export, tmp_path, holder, capsys):
    corpus = tmp_path / "c.txt"
    corpus.write_text("\n".join(TEXTS) + "\n")
    store = tmp_path / "S"
    extract(bert_export, str(corpus), store, engine="ort")
    before = tree(store)
    link = tmp_path / "link_to_store"
    link.symlink_to(store)
    holder(store)  # a writer of the real path
    code, text = run_cli(["extract", "--model", bert_export, "--input", corpus, "--out", link, "--resume",
                          "--engine", "ort"], capsys)
    one_error(code, text, "is being written by another process")
    assert tree(store) == before


def test_two_real_run_processes_one_refused_nothing_lost(bert_export, tmp_path):
    """Two layerscope processes write one --out at once: one is refused with one line, the other's result
    is whole."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    base = [sys.executable, "-m", "layerscope", "run", "compositionality", "--model", str(bert_export), "--engine",
            "ort", "--layers", "-1", "--no-cache", "--out", "R"]
    for attempt in range(3):  # the second must start while the first still runs
        shutil.rmtree("R", ignore_errors=True)
        a = subprocess.Popen(base + ["--pooling", "cls"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             text=True, env=env)
        while not Path(".R.lock").exists() and a.poll() is None:
            time.sleep(0.01)
        b = subprocess.run(base + ["--pooling", "mean"], capture_output=True, text=True, env=env, timeout=HANG_S)
        out_a = a.communicate(timeout=HANG_S)[0]
        if a.returncode == 0 and b.returncode == 2:
            break
    assert a.returncode == 0, out_a
    assert b.returncode == 2, b.stdout + b.stderr
    errors = [line for line in (b.stdout + b.stderr).splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "being written by another process" in errors[0], b.stdout + b.stderr
    results = json.loads((Path("R") / "results.json").read_text())
    assert results["settings"]["poolings"] == ["cls"]


# ---------------------------------------------------------------- a stale index

def test_an_index_refuses_a_store_that_changed_since(bert_export, tmp_path, capsys):
    store = tmp_path / "S"
    extract(bert_export, TEXTS, store, engine="ort")
    idx = tmp_path / "I"
    assert run_cli(["index", "build", "--store", store, "--out", idx, "--device", "cpu"], capsys)[0] == 0
    code, text = run_cli(["search", "a man plays guitar", "--index", idx, "--device", "cpu", "--engine", "ort"],
                         capsys)
    assert code == 0, text
    corpus = tmp_path / "other.txt"
    corpus.write_text("\n".join(OTHER) + "\n")
    assert run_cli(["extract", "--model", bert_export, "--input", corpus, "--out", store, "--force", "--engine",
                    "ort"], capsys)[0] == 0
    code, text = run_cli(["search", "a man plays guitar", "--index", idx, "--device", "cpu", "--engine", "ort"],
                         capsys)
    one_error(code, text, "no longer matches its store", "corpus", "index build --store", "--force")
    assert "A plane is taking off." not in text


def test_an_index_refuses_a_store_made_again_from_the_same_texts_with_other_settings(bert_export, tmp_path,
                                                                                       capsys):
    """extract --force with another --max-length over the same texts: the same corpus, texts, row count and
    layout, only the indexed array holds other vectors. Catches: the index's record of its array taken from
    another array's name (both sides then record nothing, or the same untouched array, and search answers from
    vectors the store no longer holds)."""
    store = tmp_path / "S"
    corpus = tmp_path / "texts.txt"
    corpus.write_text("\n".join(TEXTS) + "\n")
    extract_args = ["extract", "--model", bert_export, "--input", corpus, "--out", store, "--engine", "ort",
                    "--layers", "-1", "--pooling", "mean"]
    assert run_cli(extract_args, capsys)[0] == 0
    before = np.load(store / "arrays" / "mean" / "2.npy")
    idx = tmp_path / "I"
    assert run_cli(["index", "build", "--store", store, "--out", idx, "--device", "cpu"], capsys)[0] == 0
    search = ["search", "a man plays guitar", "--index", idx, "--device", "cpu", "--engine", "ort"]
    code, text = run_cli(search, capsys)
    assert code == 0 and "a man plays guitar" in text, text
    assert run_cli(extract_args + ["--max-length", "4", "--force"], capsys)[0] == 0
    after = np.load(store / "arrays" / "mean" / "2.npy")
    assert after.shape == before.shape and not np.allclose(after[1], before[1], atol=1e-3)  # truly other vectors
    code, text = run_cli(search, capsys)
    one_error(code, text, "no longer matches its store", "its vectors changed", "index build --store", "--force")
    assert "layout" not in text and "corpus" not in text  # nothing else about the store changed


def test_an_index_needs_its_arrays_checksum_on_both_sides(bert_export, tmp_path, capsys):
    """An index is built only over an array whose checksum the store records, and answers only where its own
    record holds that checksum: without it there is nothing to find again. Catches: an index built over, or
    trusting, an array recorded as nothing (a later extract --force would go unseen)."""
    store = tmp_path / "S"
    extract(bert_export, TEXTS, store, engine="ort", layers="-1", poolings=["mean"])
    doc = json.loads((store / "store.json").read_text())
    idx = tmp_path / "I"
    assert run_cli(["index", "build", "--store", store, "--out", idx, "--device", "cpu"], capsys)[0] == 0
    meta = json.loads((idx / "index.json").read_text())
    meta["store_identity"]["array_sha256"] = None
    (idx / "index.json").write_text(json.dumps(meta))
    code, text = run_cli(["search", "a cat", "--index", idx, "--device", "cpu", "--engine", "ort"], capsys)
    one_error(code, text, "does not record which store (and which of its arrays)", "index build --store")
    del doc["checksums"]["arrays/mean/2.npy"]
    (store / "store.json").write_text(json.dumps(doc))
    code, text = run_cli(["index", "build", "--store", store, "--out", tmp_path / "J", "--device", "cpu"], capsys)
    one_error(code, text, "records no checksum of arrays/mean/2.npy", "extract it again")
    assert not (tmp_path / "J").exists()


def test_an_index_json_pointing_at_another_store_is_refused(bert_export, tmp_path, capsys):
    a, b = tmp_path / "A", tmp_path / "B"
    extract(bert_export, TEXTS, a, engine="ort")
    extract(bert_export, OTHER, b, engine="ort")
    idx = tmp_path / "I"
    assert run_cli(["index", "build", "--store", a, "--out", idx, "--device", "cpu"], capsys)[0] == 0
    meta = json.loads((idx / "index.json").read_text())
    meta["store"] = str(b)
    (idx / "index.json").write_text(json.dumps(meta))
    code, text = run_cli(["search", "a man plays guitar", "--index", idx, "--device", "cpu", "--engine", "ort"],
                         capsys)
    one_error(code, text, "no longer matches its store")
    assert "A plane is taking off." not in text


def test_force_through_a_symlink_to_a_store_deletes_nothing(bert_export, tmp_path, capsys):
    corpus = tmp_path / "c.txt"
    corpus.write_text("\n".join(OTHER) + "\n")
    store = tmp_path / "S"
    extract(bert_export, TEXTS, store, engine="ort")
    before = tree(store)
    link = tmp_path / "link_to_store"
    link.symlink_to(store)
    code, text = run_cli(["extract", "--model", bert_export, "--input", corpus, "--out", link, "--force",
                          "--engine", "ort"], capsys)
    one_error(code, text, "is a symlink to", "give --out its real path")
    assert tree(store) == before


def test_a_folder_without_a_record_gets_none_from_later_writers(tmp_path):
    """Rewriting part of an older layerscope's folder (layerscope report) does not make the rest look foreign,
    nor its own files look recorded: --force keeps saying what to do."""
    from layerscope.errors import InputError
    from layerscope.ownership import claim, writing

    old = tmp_path / "old-result"
    old.mkdir()
    (old / "results.json").write_text("{}")
    (old / "my_analysis.csv").write_text("mine")
    with writing(old, "result"):
        (old / "report.md").write_text("re-rendered")
    with pytest.raises(InputError, match="older layerscope, which did not record the files it wrote"):
        claim(old, "result", force=True)
    assert (old / "my_analysis.csv").read_text() == "mine"


def test_every_foreign_file_is_named_up_to_ten(tmp_path):
    from layerscope.errors import InputError
    from layerscope.ownership import claim, record

    d = tmp_path / "R"
    d.mkdir()
    (d / "results.json").write_text("{}")
    record(d, "result", names=["results.json"])
    mine = user_files(d, {f"mine{i:02d}.csv": str(i) for i in range(12)})
    with pytest.raises(InputError) as err:
        claim(d, "result", force=True)
    assert "holds 12 files that layerscope did not make" in str(err.value)
    assert all(f"mine{i:02d}.csv" in str(err.value) for i in range(10)) and "and 2 more" in str(err.value)
    unchanged(d, mine)


def test_a_damaged_store_says_what_will_work_and_it_does(bert_export, tmp_path):
    """A store whose vectors file was cut short: the line must not offer --force on the same folder (the changed
    file is no longer layerscope's to delete, so that would be a second refusal); its advice must work."""
    from layerscope.errors import StoreError

    store = tmp_path / "store"
    extract(bert_export, TEXTS, store, engine="ort")
    victim = max(sorted((store / "arrays").rglob("*.npy")), key=lambda p: p.stat().st_size)
    with open(victim, "r+b") as fh:
        fh.truncate(victim.stat().st_size - 16)
    with pytest.raises(StoreError) as err:
        LayerStore.open(store)
    line = str(err.value)
    assert "is damaged" in line and "another --out" in line and "extract --force" not in line
    with pytest.raises(Exception, match="changed since"):  # why --force is not offered
        extract(bert_export, TEXTS, store, engine="ort", force=True)
    assert victim.exists()
    extract(bert_export, TEXTS, tmp_path / "store2", engine="ort")  # what the line offers
    assert LayerStore.open(tmp_path / "store2").n == len(TEXTS)
