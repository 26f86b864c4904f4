"""What layerscope counts as its own, at the level of the record: a user's edit that keeps a file's size, a
file that was in a store before its writer started, and path parts read from files."""

from __future__ import annotations

import os

import pytest

from layerscope.errors import InputError
from layerscope.ownership import foreign, note, record, safe_part


def _recorded_dir(root, kind="store"):
    d = root / kind
    (d / "arrays").mkdir(parents=True)
    (d / "store.json").write_text("{}", encoding="utf-8")
    (d / "arrays" / "mean.npy").write_bytes(b"\x00" * 64)
    (d / "notes.md").write_text("layerscope's own notes\n", encoding="utf-8")
    record(d, kind, everything=True)  # every file in it written by layerscope
    return d


def test_a_same_size_edit_makes_a_file_the_users(tmp_path):
    """A file whose bytes changed but whose size did not is the user's now (its sha256 differs from the
    record), so --force would refuse it rather than delete it."""
    d = _recorded_dir(tmp_path)
    notes = d / "notes.md"
    before = notes.stat()
    notes.write_text("the user's own notes\n"[: before.st_size].ljust(before.st_size, "!"), encoding="utf-8")
    assert notes.stat().st_size == before.st_size
    os.utime(notes, ns=(before.st_mtime_ns + 10**9, before.st_mtime_ns + 10**9))  # an edit a second later
    found = foreign(d)
    assert found.changed == ["notes.md"] and found.unrecorded == []
    # the same bytes rewritten (a copy, a touch) stay layerscope's
    (d / "arrays" / "mean.npy").write_bytes(b"\x00" * 64)
    os.utime(d / "arrays" / "mean.npy", ns=(before.st_mtime_ns + 2 * 10**9,) * 2)
    assert foreign(d).changed == ["notes.md"]


def test_a_store_writer_leaves_out_what_was_there_before_it_started(tmp_path):
    """A file the user put into a store (with a record) before a writer (resume, a shard) started, or a
    recorded file the user edited, is not recorded as layerscope's when the writer ends; what the writer made
    is. Catches: the writer's end hashing the user's edit into the record, so --force would delete it."""
    from layerscope.store.store_lock import store_writer

    d = _recorded_dir(tmp_path)
    (d / "my_plot.png").write_bytes(b"png")
    (d / "notes.md").write_text("the user's notes now, longer than layerscope's\n", encoding="utf-8")
    with store_writer(d):
        note(d, files=["arrays/cls.npy"])  # a store's writers name each file before writing it
        (d / "arrays" / "cls.npy").write_bytes(b"\x01" * 64)
    found = foreign(d)
    assert found.unrecorded == ["my_plot.png", "notes.md"] and found.changed == []  # both the user's, unrecorded


def test_a_writer_in_place_leaves_out_what_was_there_before_it_started(tmp_path):
    """``writing`` (a variant added to an export, a result re-rendered): a user's file already in the folder
    stays the user's, and so does one that appears while it runs; the file the writer named is layerscope's."""
    from layerscope.ownership import writing

    d = _recorded_dir(tmp_path, "export")
    (d / "my_notes.md").write_text("mine\n", encoding="utf-8")
    with writing(d, "export") as wrote:
        wrote.add("model.int8.onnx", "my_notes.md")  # a name that was the user's before stays the user's
        (d / "model.int8.onnx").write_bytes(b"onnx")
        (d / "my_plot.png").write_bytes(b"png")  # the user's, written meanwhile
    found = foreign(d)
    assert found.unrecorded == ["my_notes.md", "my_plot.png"] and found.changed == []


@pytest.mark.parametrize("text, part", [(".hidden", "hidden"), ("...x..", "x"), ("../etc", "etc"),
                                        ("a/../b", "a-..-b"), ("-.-name-.-", "name")])
def test_safe_part_strips_leading_and_trailing_dots(text, part):
    assert safe_part(text) == part


@pytest.mark.parametrize("text", ["..", ".", "...", "/..", "-.-"])
def test_safe_part_never_returns_a_dot_folder(text):
    """``..`` (or ``.``) read from a manifest would name the parent folder: nothing usable is left."""
    with pytest.raises(InputError, match="leaves nothing usable as a folder name"):
        safe_part(text)
