"""The lens graph's sidecar ``lens-k{k}.json`` as a typed record: written and read back field for field, a missing
or ill-typed field one line naming the file and the field, and no file it names outside the export dir."""

from __future__ import annotations

import json

import pytest

from layerscope.errors import ManifestError
from layerscope.model.lens_record import LensHead, LensParity, LensSidecar

SHA = "ab" * 32


def _sidecar(**changes) -> LensSidecar:
    made = LensSidecar(file="lens-k3.onnx", k=3, head=LensHead("causal-lm-head", "GPT-2's LM head", True, ("w",)),
                       outputs=("lens.rank", "lens.topk_ids", "lens.topk_probs"), probabilities="float64",
                       sha256=SHA, model_onnx_sha256="cd" * 32, shared_bytes=4096, shared_with="lm_head.safetensors",
                       parity=LensParity(0.0, 1e-6, 0.01, 0.0, 2e-7, "torch (the checkpoint)", 3e-7, 4e-7))
    return LensSidecar(**{**made.__dict__, **changes})


def _edited(tmp_path, edit) -> str:
    doc = _sidecar().to_dict()
    edit(doc)
    path = tmp_path / "lens-k3.json"
    path.write_text(json.dumps(doc), encoding="utf-8")
    return str(path)


def test_the_sidecar_reads_back_as_written(tmp_path):
    """Catches: a field written under one name and read under another (the parity or the head's norm lost), a
    sidecar made without the check read as if it had one."""
    made = _sidecar()
    path = made.to_disk(tmp_path)
    assert path.name == "lens-k3.json" and LensSidecar.from_disk(path) == made
    unchecked = _sidecar(parity=None, shared_with=None)
    assert LensSidecar.from_disk(unchecked.to_disk(tmp_path)) == unchecked
    assert "parity" not in json.loads(path.read_text())
    assert LensSidecar.checksum(path) == ("lens-k3.onnx", SHA)


@pytest.mark.parametrize("edit,field", [
    (lambda d: d.pop("sha256"), "sha256 is missing"),
    (lambda d: d.update(k="3"), "k is str, not int"),
    (lambda d: d["head"].update(final_norm_below_last="yes"), "head.final_norm_below_last is str, not bool"),
    (lambda d: d["parity"].update(max_prob_diff="0"), "parity.max_prob_diff is str, not int or float"),
    (lambda d: d["parity"].pop("reference_hidden_states"), "parity.reference_hidden_states is missing"),
    (lambda d: d.update(shared_bytes=True), "shared_bytes is bool, not int"),
    (lambda d: d.update(outputs=["lens.rank", 3]), "outputs is not a list of output names"),
    (lambda d: d.update(file="lens-k5.onnx"), "file names 'lens-k5.onnx', not the graph of k = 3"),
])
def test_a_missing_or_ill_typed_field_is_one_line_naming_it(tmp_path, edit, field):
    """Catches: an edited sidecar failing the lens with a bare KeyError or TypeError, or a graph of another k run
    as this one."""
    path = _edited(tmp_path, edit)
    with pytest.raises(ManifestError) as err:
        LensSidecar.from_disk(path)
    assert str(err.value).startswith(f"{path}: {field}") and "\n" not in str(err.value)


@pytest.mark.parametrize("key,name", [("file", "../lens-k3.onnx"), ("file", "/etc/lens-k3.onnx"),
                                      ("file", "sub/lens-k3.onnx"), ("shared_with", "../../lm_head.safetensors"),
                                      ("shared_with", "..\\lm_head.safetensors")])
def test_no_file_the_sidecar_names_leads_out_of_the_export(tmp_path, key, name):
    """Catches: a sidecar naming a graph or a head file outside the export dir, which verify would hash or the
    lens would load."""
    path = _edited(tmp_path, lambda d: d.update({key: name}))
    with pytest.raises(ManifestError, match=f"{key} names .* not a plain file name inside the export dir"):
        LensSidecar.from_disk(path)
    if key == "file":
        with pytest.raises(ManifestError, match="not a plain file name"):
            LensSidecar.checksum(path)


def test_another_format_is_made_again_and_an_unreadable_file_is_one_line(tmp_path):
    """Catches: a sidecar of an earlier form of the graph read as this one (or refused instead of made again);
    a sidecar that is not JSON failing with a JSONDecodeError traceback."""
    assert LensSidecar.from_disk(_edited(tmp_path, lambda d: d.update(format=1, outputs="old"))) is None
    assert LensSidecar.from_disk(_edited(tmp_path, lambda d: [d.pop(f) for f in ("format", "shared_bytes")])) is None
    assert LensSidecar.from_disk(_edited(tmp_path, lambda d: d.pop("probabilities"))).probabilities is None
    path = tmp_path / "lens-k3.json"
    path.write_text("{not json", encoding="utf-8")
    with pytest.raises(ManifestError, match="a lens graph's sidecar that cannot be read") as err:
        LensSidecar.from_disk(path)
    assert "\n" not in str(err.value)
    path.write_text("[1, 2]", encoding="utf-8")
    with pytest.raises(ManifestError, match="it holds a JSON list, not an object"):
        LensSidecar.checksum(path)
