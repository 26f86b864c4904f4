"""Files read from a model folder, an export or layerscope's cache are untrusted: a FIFO or a device named like a
file is one line (never opened blocking), a JSON file is read within a bound, and the cache's speed records are
used only where their shape and figures validate (with a note where they do not)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

# the CLI in a process of its own, its memory bounded: a read without end fails there, not in the test session
RUN = ("import resource, sys; resource.setrlimit(resource.RLIMIT_AS, (3 << 30, 3 << 30)); "
       "from layerscope.cli import main; main(sys.argv[1:])")


def _cli(args: list[str]) -> tuple[int, list[str]]:
    """(exit code, stderr lines) of ``layerscope ARGS``; a run still going after the hang guard is a hang (a FIFO
    opened blocking waits forever)."""
    from hang_guard import HANG_S

    try:
        done = subprocess.run([sys.executable, "-c", RUN, *map(str, args)], capture_output=True, text=True,
                              timeout=HANG_S)
    except subprocess.TimeoutExpired:
        pytest.fail(f"layerscope {' '.join(map(str, args))} still ran after {HANG_S} s (blocked)")
    return done.returncode, [line for line in done.stderr.strip().splitlines() if line]


def _copy(tiny_model, tmp_path, name: str = "m") -> Path:
    return Path(shutil.copytree(tiny_model("bert"), tmp_path / name))


def test_a_fifo_as_the_weights_is_one_line(tiny_model, tmp_path):
    """Catches: identity hashing opening a FIFO named model.safetensors and waiting forever."""
    model = _copy(tiny_model, tmp_path)
    (model / "model.safetensors").unlink()
    os.mkfifo(model / "model.safetensors")
    code, err = _cli(["export", model, "--out", tmp_path / "e"])
    assert code == 2 and len(err) == 1, err
    assert "model.safetensors is a FIFO (named pipe), not a regular file" in err[0]
    assert not (tmp_path / "e").exists()


def test_a_config_linked_to_a_device_or_too_large_is_one_line(tiny_model, tmp_path):
    """Catches: config.json linked to /dev/zero read without bound (3 GB in 38 s), and a config of gigabytes read
    whole, before a line says what is wrong."""
    model = _copy(tiny_model, tmp_path)
    (model / "config.json").unlink()
    (model / "config.json").symlink_to("/dev/zero")
    code, err = _cli(["export", model, "--out", tmp_path / "e"])
    assert code == 2 and len(err) == 1, err
    assert "config.json is a character device (it links to /dev/zero), not a regular file" in err[0]
    (model / "config.json").unlink()
    with open(model / "config.json", "wb") as fh:  # sparse: no disk used
        fh.truncate(65 * 2**20)
    code, err = _cli(["export", model, "--out", tmp_path / "e"])
    assert code == 2 and len(err) == 1 and "config.json is 68,157,440 bytes" in err[0], err


def test_a_fifo_in_an_export_is_one_line(bert_export, tmp_path):
    """Catches: a FIFO in an export (a tokenizer file, the manifest) opened blocking by the tokenizer or the
    manifest reader."""
    from layerscope.errors import InputError
    from layerscope.model.handle import ModelHandle

    export_dir = Path(shutil.copytree(bert_export, tmp_path / "e", symlinks=True))
    (export_dir / "tokenizer.json").unlink()
    os.mkfifo(export_dir / "tokenizer.json")
    with pytest.raises(InputError, match="tokenizer.json is a FIFO"):
        ModelHandle.resolve(export_dir)
    from layerscope.jsonfile import read_json

    with pytest.raises(InputError, match="is a FIFO"):
        read_json(export_dir / "tokenizer.json")


@pytest.mark.parametrize("entry", [
    [1, 2],
    {"runs": [{"texts_per_s": {"ort": "fast"}}]},
    {"runs": [{"texts_per_s": {"ort": float("nan"), "ov": 10.0}}, 7]},
    {"runs": "none"},
])
def test_speed_records_that_do_not_validate_are_ignored_with_a_note(entry, bert_export, caplog, monkeypatch):
    """bench-speeds.json is the user's cache, shared by every version and environment. Catches: a record of the
    wrong shape ({"<cpu>": [1, 2]}) making every ``auto`` run an internal error, and figures that are not numbers
    ranking engines."""
    import logging

    from layerscope.engines import speed_order
    from layerscope.engines.base import create_engine
    from layerscope.model.home import cache_root

    path = cache_root() / speed_order.SPEEDS_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({speed_order.cpu_identity()[0]: entry}))
    monkeypatch.setattr(speed_order, "_NOTED", set(), raising=False)  # each case says its note
    try:
        with caplog.at_level(logging.WARNING, logger="layerscope"):
            eng = create_engine("auto", bert_export)
        assert eng.info.name
        assert any("do not validate" in r.getMessage() or "is not a record" in r.getMessage()
                   for r in caplog.records), [r.getMessage() for r in caplog.records]
        order, source = speed_order.ranked((("ort", None, "fp32"), ("ov", None, "ov-fp32")), None)
        assert source.startswith("the declared order")
    finally:
        path.unlink()


def test_a_tokenizer_pool_record_that_does_not_validate_starts_no_process(tmp_path, caplog, monkeypatch):
    """Catches: a recorded process count no measurement takes (64) or figures that are not numbers read from the
    user's cache: a run spawning 64 tokenizer processes, or failing with a ValueError."""
    import logging

    from layerscope.model import tokenize_pool

    good = {"model": "m", "engine": "ort", "engine_tokens_per_s": 1000.0,
            "tokenize_tokens_per_s": {"1": 100.0, "2": 500.0, "4": 2000.0}}
    path = tmp_path / tokenize_pool.POOL_FILE
    path.write_text(json.dumps({"cpu": [good]}))
    assert tokenize_pool.processes_for("m", "ort", cpu="cpu", root=tmp_path)[0] == 4  # a record that validates
    for bad in ({**good, "tokenize_tokens_per_s": {"1": 100.0, "64": 1e12}},
                {**good, "engine_tokens_per_s": "fast"}, {**good, "tokenize_tokens_per_s": {"1": -1, "2": "x"}}):
        path.write_text(json.dumps({"cpu": [bad]}))
        monkeypatch.setattr(tokenize_pool, "_NOTED", set(), raising=False)  # each case says its note
        with caplog.at_level(logging.WARNING, logger="layerscope"):
            assert tokenize_pool.processes_for("m", "ort", cpu="cpu", root=tmp_path) == (1, None)
        assert any("does not validate" in r.getMessage() for r in caplog.records)
    path.write_text(json.dumps({"cpu": {"not": "a list"}}))
    assert tokenize_pool.processes_for("m", "ort", cpu="cpu", root=tmp_path) == (1, None)


@pytest.mark.parametrize("poison", ["outside", "fifo"])
def test_export_force_checks_a_poisoned_record_before_any_work(poison, tiny_model, tiny_export, tmp_path, monkeypatch,
                                                               capsys):
    """``export --force`` over an export whose record of layerscope's files was edited to name a path outside it,
    or replaced by a FIFO: one line before the model is read at all. Catches: the record checked only once the
    model was loaded (or the whole export made), and a FIFO record read blocking."""
    from layerscope.cli import main
    from layerscope.model import source

    export_dir = tiny_export("bert", to=tmp_path / "e")
    marker = export_dir / ".layerscope.json"
    if poison == "outside":
        record = json.loads(marker.read_text())
        record["owned"]["../elsewhere"] = {"sha256": None}
        marker.write_text(json.dumps(record))
    else:
        marker.unlink()
        os.mkfifo(marker)

    def read_model(*args, **kwargs):
        raise AssertionError("the model was read before the record was checked")

    monkeypatch.setattr(source, "load_config", read_model)
    with pytest.raises(SystemExit) as exc:
        main(["export", str(tiny_model("bert")), "--out", str(export_dir), "--force"])
    err = capsys.readouterr().err.strip().splitlines()
    assert exc.value.code == 2 and len(err) == 1, err
    assert ".layerscope.json" in err[0] and ("edited or damaged" in err[0] or "is a FIFO" in err[0]), err
    assert (export_dir / "model.onnx").exists()  # nothing deleted


def test_a_file_the_loaders_read_changed_or_added_in_an_export_is_one_line(tiny_export, tmp_path):
    """The tokenizer and config files decide what is computed as much as the graph. Catches: an export whose
    tokenizer_config.json was edited after export, or into which an added_tokens.json was dropped, tokenizing
    other ids under the export's name (only model.onnx was compared at load)."""
    from layerscope.errors import ManifestError
    from layerscope.model.handle import ModelHandle

    export_dir = tiny_export("bert", to=tmp_path / "e")
    ModelHandle.resolve(export_dir)
    (export_dir / "added_tokens.json").write_text(json.dumps({"zzzq": 7}))
    with pytest.raises(ManifestError, match="added_tokens.json is not a file its export wrote"):
        ModelHandle.resolve(export_dir)
    (export_dir / "added_tokens.json").unlink()
    config = export_dir / "tokenizer_config.json"
    original = config.read_bytes()
    config.write_text(json.dumps({**json.loads(original), "do_lower_case": False}))
    with pytest.raises(ManifestError, match="tokenizer_config.json is not the file the export wrote"):
        ModelHandle.resolve(export_dir)
    config.write_bytes(original)
    ModelHandle.resolve(export_dir)


def test_a_weights_link_to_nothing_is_one_line(tiny_model, tmp_path, capsys):
    """Catches: a model folder whose model.safetensors links to a file that is gone (a broken download or copy)
    failing identity hashing with a FileNotFoundError traceback."""
    from layerscope.cli import main

    model = _copy(tiny_model, tmp_path)
    (model / "model.safetensors").unlink()
    (model / "model.safetensors").symlink_to(tmp_path / "gone.safetensors")
    with pytest.raises(SystemExit) as exc:
        main(["export", str(model), "--out", str(tmp_path / "e")])
    err = capsys.readouterr().err.strip().splitlines()
    assert exc.value.code == 2 and len(err) == 1, err
    assert "model.safetensors is a symlink to" in err[0] and "which does not exist" in err[0], err
    assert not (tmp_path / "e").exists()


def test_probing_a_provider_writes_and_reads_no_file_in_the_shared_temporary_folder(tmp_path, monkeypatch):
    """Whether ONNX Runtime's providers start is tried on a one-node graph handed over in memory: a file another
    user placed in the temporary folder under a name we could use (a link to the user's own file, or a bogus
    graph) is neither written through nor read, and nothing is left there. Catches: a probe graph saved under a
    fixed name in /tmp (a link there overwrote the user's file; a bogus graph there made ort 'unavailable')."""
    import os
    import tempfile

    from layerscope.engines.ort import OrtEngine, probe_providers

    shared = tmp_path / "tmp"
    shared.mkdir()
    victim = tmp_path / "notes.txt"
    victim.write_text("my own words\n")
    (shared / "layerscope-probe.onnx").write_bytes(b"not a graph")
    for name in (f"layerscope-probe.{os.getpid()}.tmp", f"layerscope-probe.onnx.{os.getpid()}.tmp"):
        (shared / name).symlink_to(victim)
    before = sorted(p.name for p in shared.iterdir())
    monkeypatch.setattr(tempfile, "tempdir", str(shared))
    assert probe_providers(only=OrtEngine)["ort"][0] is True
    assert victim.read_text() == "my own words\n"
    assert sorted(p.name for p in shared.iterdir()) == before
