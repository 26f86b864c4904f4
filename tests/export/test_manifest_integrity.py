"""Poisoned manifests and damaged export files are refused; inspect verify re-hashes every file."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from layerscope.errors import ManifestError
from layerscope.hashing import file_sha256
from layerscope.model.handle import ModelHandle
from cli_helpers import cli_output


@pytest.fixture(scope="module")
def pristine(bert_export):
    return bert_export


@pytest.fixture
def export(pristine, tmp_path):
    path = tmp_path / "export"
    shutil.copytree(pristine, path)
    return path


def edit(path: Path, fn) -> None:
    manifest = json.loads((path / "manifest.json").read_text())
    fn(manifest)
    (path / "manifest.json").write_text(json.dumps(manifest))


def verify_cli(path, capsys):
    code, out, err = cli_output(["verify", path], capsys)
    return code, out, [line for line in err.splitlines() if line.strip()]


def test_the_manifest_hashes_every_file_and_verify_passes(export, capsys):
    files = json.loads((export / "manifest.json").read_text())["files"]
    # the ownership marker records the files layerscope writes, so it changes as variants are added: not hashed
    on_disk = sorted(p.name for p in export.iterdir() if p.name not in ("manifest.json", ".layerscope.json"))
    assert sorted(files) == on_disk and "model.onnx" in files and "tokenizer.json" in files
    assert all(files[f]["sha256"] == file_sha256(export / f) for f in files)
    code, out, err = verify_cli(export, capsys)
    assert code == 0 and out.strip() == f"ok: {len(files)} files verified" and not err


def test_a_damaged_tokenizer_file_is_found_by_verify(export, capsys):
    path = export / "tokenizer.json"
    path.write_text(path.read_text().replace('"[CLS]"', '"[CLX]"', 1))
    with pytest.raises(ManifestError, match="tokenizer.json is not the file the export wrote"):
        ModelHandle.resolve(export)  # the tokenizer decides the ids: held to its record at load too
    code, _, err = verify_cli(export, capsys)
    assert code == 2 and len(err) == 1 and "tokenizer.json does not match its checksum" in err[0], err


@pytest.mark.parametrize("onnx_file, message", [
    ("../outside/model.onnx", "climbs out with '..'"),
    ("sub/../../outside/model.onnx", "climbs out with '..'"),
    ("/tmp/model.onnx", "is an absolute path"),
    (None, "is not a file name"),
])
def test_onnx_file_must_stay_inside_the_export(export, onnx_file, message):
    outside = export.parent / "outside"
    outside.mkdir()
    shutil.copy(export / "model.onnx", outside / "model.onnx")
    edit(export, lambda m: m.update(onnx_file=onnx_file))
    with pytest.raises(ManifestError, match=message):
        ModelHandle.resolve(export)


def test_a_symlink_out_of_the_export_is_refused(export):
    outside = export.parent / "elsewhere.onnx"
    shutil.copy(export / "model.onnx", outside)
    (export / "linked.onnx").symlink_to(outside)
    edit(export, lambda m: m.update(onnx_file="linked.onnx"))
    with pytest.raises(ManifestError, match="leads outside the export dir"):
        ModelHandle.resolve(export)


def test_a_variant_path_out_of_the_export_is_refused(export):
    edit(export, lambda m: m.setdefault("variants", {}).update(opt={"file": "../../x.onnx", "sha256": "0"}))
    with pytest.raises(ManifestError, match="variant 'opt' file '../../x.onnx' climbs out"):
        ModelHandle.resolve(export)


def test_a_manifest_without_onnx_sha256_is_refused(export, capsys):
    edit(export, lambda m: m.pop("onnx_sha256"))
    with pytest.raises(ManifestError, match="has no onnx_sha256.*export it again into a new folder"):
        ModelHandle.resolve(export)
    code, _, err = verify_cli(export, capsys)
    assert code == 2 and any("has no onnx_sha256" in line for line in err)


def test_reversed_pooled_layers_are_refused(export):
    layers = json.loads((export / "manifest.json").read_text())["pooled_layers"]
    assert layers[0] == "raw" and len(layers) > 2
    edit(export, lambda m: m.update(pooled_layers=layers[::-1]))
    with pytest.raises(ManifestError, match=r"pooled_layers .* are not the layers the pooled outputs stack"):
        ModelHandle.resolve(export)


def test_a_dropped_pooled_layer_is_refused(export):
    edit(export, lambda m: m.update(pooled_layers=m["pooled_layers"][1:]))
    with pytest.raises(ManifestError, match="are not the layers the pooled outputs stack"):
        ModelHandle.resolve(export)


@pytest.mark.parametrize("field, change, message", [
    ("num_layers", 1, "num_layers is .*, the graph has .* hidden-state outputs"),
    ("hidden_size", 7, "hidden_size is .*, the graph's hidden_states.0 has"),
])
def test_edited_sizes_are_refused(export, field, change, message):
    edit(export, lambda m: m.update({field: m[field] + change}))
    with pytest.raises(ManifestError, match=message):
        ModelHandle.resolve(export)


def test_edited_output_shapes_are_refused(export):
    def change(m):
        m["outputs"]["hidden_states.1"][-1] += 1
    edit(export, change)
    with pytest.raises(ManifestError, match="output hidden_states.1 is"):
        ModelHandle.resolve(export)


# ---------------------------------------------------------------- external data

def _externalize(export: Path, location: str = "model.onnx_data") -> None:
    """Re-save model.onnx with its weights in an external file, as big exports are, and re-record it."""
    import onnx

    model = onnx.load(str(export / "model.onnx"))
    onnx.save(model, str(export / "model.onnx"), save_as_external_data=True, all_tensors_to_one_file=True,
              location=location, size_threshold=1024)
    from layerscope.model.manifest_check import file_records

    edit(export, lambda m: m.update(onnx_sha256=file_sha256(export / "model.onnx"), external_data=True,
                                    files=file_records(export)))


def test_external_data_is_recorded_checked_for_size_on_load_and_hashed_by_verify(export, capsys):
    _externalize(export)
    data = export / "model.onnx_data"
    assert data.stat().st_size > 10_000
    handle = ModelHandle.resolve(export)
    from layerscope.engines.base import create_engine

    assert create_engine("ort", handle).info.name  # ORT finds the weights beside the graph
    code, out, _ = verify_cli(export, capsys)
    assert code == 0 and out.startswith("ok:")
    raw = bytearray(data.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    data.write_bytes(bytes(raw))
    ModelHandle.resolve(export)  # same size: load does not hash gigabytes
    code, _, err = verify_cli(export, capsys)
    assert code == 2 and len(err) == 1 and "model.onnx_data does not match its checksum" in err[0], err
    with open(data, "r+b") as fh:
        fh.truncate(len(raw) - 100)
    with pytest.raises(ManifestError, match=r"model.onnx_data is [\d,]+ bytes, the export wrote [\d,]+"):
        ModelHandle.resolve(export)
    code, _, err = verify_cli(export, capsys)
    assert code == 2 and len(err) == 1 and "model.onnx_data" in err[0], err


def test_external_data_outside_the_export_is_refused(export):
    _externalize(export)
    import onnx

    model = onnx.load(str(export / "model.onnx"), load_external_data=False)
    for tensor in model.graph.initializer:
        for entry in tensor.external_data:
            if entry.key == "location":
                entry.value = "../stolen.bin"
    onnx.save(model, str(export / "model.onnx"))
    shutil.copy(export / "model.onnx_data", export.parent / "stolen.bin")
    edit(export, lambda m: m.update(onnx_sha256=file_sha256(export / "model.onnx")))
    with pytest.raises(ManifestError, match="external data file '../stolen.bin' climbs out"):
        ModelHandle.resolve(export)


def test_a_missing_external_data_file_is_refused(export):
    _externalize(export)
    (export / "model.onnx_data").unlink()
    with pytest.raises(ManifestError, match="is missing model.onnx_data"):
        ModelHandle.resolve(export)


def test_verify_of_a_damaged_lens_graph(export, capsys):
    (export / "lens-k3.onnx").write_bytes(b"not a graph")
    (export / "lens-k3.json").write_text(json.dumps({"file": "lens-k3.onnx", "sha256": "0" * 64}))
    code, _, err = verify_cli(export, capsys)
    assert code == 2 and len(err) == 1 and "lens-k3.onnx does not match its checksum" in err[0], err
