"""The record of layerscope's files (.layerscope.json) is data from disk and never turns --force against the
user: an entry leading out of its folder or not matching what is there is refused with nothing deleted; only
files layerscope named as it wrote them are recorded (a user's file added mid-run is never deleted, not even by
Ctrl-C); a run killed with SIGKILL leaves files --force knows. Every user file keeps its sha256."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cli_helpers import one_error, run_cli, sha
from layerscope.extraction.pipeline import extract
from layerscope.store.store import LayerStore

import layerscope
from hang_guard import HANG_S  # noqa: E402

SRC = str(Path(layerscope.__file__).resolve().parents[1])  # the layerscope under test, in every subprocess
TEXTS = ["a cat sits", "the dog runs in the park", "two birds fly over a lake", "hello there", "a man plays guitar"]
OTHER = ["A plane is taking off.", "A woman slices an onion.", "Rain falls on the city.", "Kids play football."]


pytestmark = pytest.mark.usefixtures("in_tmp_home")


def tree(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): sha(p) for p in sorted(root.rglob("*")) if p.is_file() and not p.is_symlink()}


def env() -> dict[str, str]:
    return dict(os.environ, PYTHONPATH=os.pathsep.join([SRC] + [p for p in sys.path if p]))


# ---------------------------------------------------------------- a record is data from disk

def _tamper(folder: Path, victim: Path, how: str) -> None:
    """Add an entry to ``folder``'s record that points at ``victim`` outside it."""
    marker = json.loads((folder / ".layerscope.json").read_text())
    digest = {"sha256": sha(victim), "bytes": victim.stat().st_size, "mtime_ns": victim.stat().st_mtime_ns}
    if how == "dotdot":
        rel = os.path.relpath(victim, folder)
        marker["owned"][rel] = digest
    elif how == "absolute":
        marker["owned"][str(victim)] = digest
    elif how == "symlink-entry":
        marker["owned"][os.path.relpath(victim, folder)] = {"symlink": "anything"}
    elif how == "through-a-link":  # a recorded symlink to the victim's folder, and the victim under it
        (folder / "outside").symlink_to(victim.parent)
        marker["owned"]["outside"] = {"symlink": str(victim.parent)}
        marker["owned"][f"outside/{victim.name}"] = digest
    (folder / ".layerscope.json").write_text(json.dumps(marker))


HOWS = ["dotdot", "absolute", "symlink-entry", "through-a-link"]


def _victim(tmp_path: Path) -> tuple[Path, str]:
    victim = tmp_path / "precious" / "thesis.txt"
    victim.parent.mkdir(exist_ok=True)
    victim.write_text("years of work\n")
    return victim, sha(victim)


@pytest.mark.parametrize("how", HOWS)
def test_extract_force_refuses_a_record_leading_outside(how, bert_export, tmp_path, capsys):
    victim, digest = _victim(tmp_path)
    store = tmp_path / "S"
    extract(bert_export, TEXTS, store, engine="ort")
    _tamper(store, victim, how)
    before = tree(store)
    corpus = tmp_path / "c.txt"
    corpus.write_text("\n".join(OTHER) + "\n")
    code, text = run_cli(["extract", "--model", bert_export, "--input", corpus, "--out", store, "--force",
                          "--engine", "ort"], capsys)
    one_error(code, text, ".layerscope.json was edited or damaged", "deletes nothing")
    assert victim.is_file() and sha(victim) == digest
    assert tree(store) == before


@pytest.mark.parametrize("how", ["dotdot", "symlink-entry"])
def test_run_force_refuses_a_record_leading_outside(how, bert_export, tmp_path, capsys):
    victim, digest = _victim(tmp_path)
    args = ["run", "compositionality", "--model", bert_export, "--engine", "ort", "--layers", "-1", "--pooling",
            "cls", "--no-cache", "--out", "R"]
    assert run_cli(args, capsys)[0] == 0
    _tamper(Path("R"), victim, how)
    before = tree(Path("R"))
    one_error(*run_cli(args + ["--force"], capsys), "was edited or damaged")
    assert sha(victim) == digest and tree(Path("R")) == before


@pytest.mark.parametrize("how", ["absolute", "through-a-link"])
def test_export_force_refuses_a_record_leading_outside(how, tiny_model, tiny_export, tmp_path, capsys):
    victim, digest = _victim(tmp_path)
    out = tiny_export("bert", pooled=["mean"], to=tmp_path / "E")
    _tamper(out, victim, how)
    before = tree(out)
    one_error(*run_cli(["export", tiny_model("bert"), "--out", out, "--force"], capsys), "was edited or damaged")
    assert sha(victim) == digest and tree(out) == before


@pytest.mark.parametrize("how", ["dotdot", "symlink-entry"])
def test_an_index_record_inside_a_store_cannot_lead_outside(how, bert_export, tmp_path, capsys):
    from layerscope.index.store_index import build_store_index

    victim, digest = _victim(tmp_path)
    store = tmp_path / "S"
    extract(bert_export, TEXTS, store, engine="ort")
    build_store_index(store, store / "index-flat", device="cpu")
    _tamper(store / "index-flat", victim, how)
    before = tree(store)
    from layerscope.errors import InputError

    with pytest.raises(InputError, match="index-flat/.layerscope.json was edited or damaged"):
        extract(bert_export, OTHER, store, engine="ort", force=True)
    assert sha(victim) == digest and tree(store) == before


def test_a_recorded_file_replaced_by_a_symlink_is_not_followed(bert_export, tmp_path, capsys):
    """The entry is a file inside the folder, but what is there now is a symlink to the user's file: its kind
    no longer matches, so it is the user's (refused, named), and neither the link's target nor anything else
    is deleted."""
    victim, digest = _victim(tmp_path)
    store = tmp_path / "S"
    extract(bert_export, TEXTS, store, engine="ort")
    (store / "lengths.npy").unlink()
    (store / "lengths.npy").symlink_to(victim)
    from layerscope.errors import InputError

    with pytest.raises(InputError, match=r"changed since.*lengths.npy"):
        extract(bert_export, OTHER, store, engine="ort", force=True)
    assert sha(victim) == digest and (store / "store.json").is_file()


# ---------------------------------------------------------------- only what layerscope wrote, by name

def _spooling(out: Path) -> subprocess.Popen:
    """A real extract reading its corpus from a pipe that stays open: it waits while spooling."""
    cmd = [sys.executable, "-m", "layerscope", "extract", "--model", str(_spooling.export), "--engine", "ort",
           "--input", "-", "--out", str(out), "--pooling", "mean"]
    proc = subprocess.Popen(cmd, env=env(), stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    proc.stdin.write("".join(f"text number {i}\n" for i in range(50)))
    proc.stdin.flush()
    deadline = time.time() + 120
    while not (out / "texts.jsonl.partial").exists():
        assert proc.poll() is None and time.time() < deadline, proc.communicate()
        time.sleep(0.05)
    return proc


def test_ctrl_c_while_spooling_keeps_a_file_the_user_added(bert_export, tmp_path):
    _spooling.export = bert_export
    out = tmp_path / "S"
    proc = _spooling(out)
    (out / "notes.md").write_text("my notes on this run\n")
    digest = sha(out / "notes.md")
    proc.send_signal(signal.SIGINT)
    _, stderr = proc.communicate(timeout=HANG_S)
    assert proc.returncode == 130, stderr
    assert "Traceback" not in stderr
    assert (out / "notes.md").is_file() and sha(out / "notes.md") == digest
    assert sorted(p.name for p in out.iterdir()) == ["notes.md"], "what layerscope wrote is removed"


def test_a_file_added_while_extract_runs_is_never_recorded(bert_export, tmp_path, capsys):
    _spooling.export = bert_export
    out = tmp_path / "S"
    proc = _spooling(out)
    (out / "notes.md").write_text("my notes on this run\n")
    digest = sha(out / "notes.md")
    _, stderr = proc.communicate(input="the last text\n", timeout=HANG_S)
    assert proc.returncode == 0, stderr
    assert "notes.md" not in json.loads((out / ".layerscope.json").read_text())["owned"]
    corpus = tmp_path / "c.txt"
    corpus.write_text("\n".join(OTHER) + "\n")
    code, text = run_cli(["extract", "--model", bert_export, "--input", corpus, "--out", out, "--force",
                          "--engine", "ort"], capsys)
    one_error(code, text, "did not make (notes.md)")
    assert sha(out / "notes.md") == digest


# ---------------------------------------------------------------- SIGKILL leaves files --force knows

def test_force_replaces_a_token_store_killed_mid_run(bert_export, tmp_path, capsys):
    out = tmp_path / "S"
    corpus = tmp_path / "c.txt"
    corpus.write_text("".join(f"sentence {i} about a cat and a dog\n" for i in range(3000)))
    cmd = [sys.executable, "-m", "layerscope", "extract", "--model", str(bert_export), "--engine", "ort",
           "--input", str(corpus), "--out", str(out), "--pooling", "mean", "--tokens", "--batch-tokens", "64",
           "--threads", "1"]
    proc = subprocess.Popen(cmd, env=env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 180
    while not (out / "tokens").is_dir():
        assert proc.poll() is None and time.time() < deadline, proc.communicate()
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=60)
    other = tmp_path / "o.txt"
    other.write_text("\n".join(OTHER) + "\n")
    code, text = run_cli(["extract", "--model", bert_export, "--input", other, "--out", out, "--force",
                          "--engine", "ort"], capsys)
    assert code == 0, text
    assert LayerStore.open(out).texts() == OTHER and not (out / "tokens").exists()


KILLED_SAVE = """
import os, signal, sys
import faiss
from layerscope.index.store_index import build_store_index

def cut_short(index, path):
    with open(path, "wb") as fh:
        fh.write(b"half an index")
    os.kill(os.getpid(), signal.SIGKILL)

faiss.write_index = cut_short
build_store_index(sys.argv[1], sys.argv[2], device="cpu")
"""


def test_force_replaces_a_half_saved_index(bert_export, tmp_path, capsys):
    store = tmp_path / "S"
    extract(bert_export, TEXTS, store, engine="ort")
    idx = store / "index-flat"
    proc = subprocess.run([sys.executable, "-c", KILLED_SAVE, str(store), str(idx)], env=env(), capture_output=True,
                          text=True, timeout=HANG_S)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    assert (idx / "index.faiss.partial").is_file()
    code, text = run_cli(["index", "build", "--store", store, "--out", idx, "--device", "cpu", "--force"], capsys)
    assert code == 0, text
    assert not (idx / "index.faiss.partial").exists() and (idx / "index.faiss").is_file()
