"""The decoding head kept in the export: a lens made after the source checkpoint is gone equals one made with it."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from layerscope.decoding.heads import load_decoding_model, model_inputs
from layerscope.decoding.lens_onnx import export_lens, lens_file, lens_of_export
from layerscope.export.exporter import export_model
from layerscope.model.source import resolve_source
from layerscope.export.lm_head import HEAD_FILE
from layerscope.model.handle import ModelHandle
from layerscope.hashing import file_sha256

TEXTS = ["The cat sat on the mat.", "hi there", "a quick brown fox jumps"]


def _lens(export_dir, k):
    handle = ModelHandle.resolve(export_dir)
    inputs = model_inputs(handle, handle.tokenizer(), TEXTS, 32)
    return lens_of_export(handle, k, {n: t.numpy() for n, t in inputs.items()})


@pytest.mark.parametrize("family,kind", [("gpt2", "causal-lm-head"), ("qwen2", "causal-lm-head"),
                                         ("bert", "mlm-head")])
def test_lens_after_the_checkpoint_is_gone_equals_the_lens_made_with_it(family, kind, tiny_model, tmp_path):
    """Catches: the lens still loading its head from the checkpoint (InputError once it is deleted), a
    head stored with different values (an untied copy, fp16, a missing norm: different outputs), and a
    lens parity check that still runs the torch base model (it is gone)."""
    src = tmp_path / "ckpt"
    shutil.copytree(tiny_model(family), src)
    out = tmp_path / "exp"
    manifest = export_model(resolve_source(str(src)), out, pooled=["mean"])
    entry = manifest.lm_head
    assert entry["kind"] == kind and entry["file"] == HEAD_FILE
    assert entry["sha256"] == file_sha256(out / HEAD_FILE) == manifest.files[HEAD_FILE]["sha256"]
    with_source = export_lens(out, 4)
    assert with_source.parity.reference_hidden_states.startswith("torch")
    a = _lens(out, 4)
    graph_sha = file_sha256(out / lens_file(4))
    for f in (lens_file(4), "lens-k4.json"):
        (out / f).unlink()
    shutil.rmtree(src)
    without = export_lens(out, 4)
    assert without.parity.reference_hidden_states == "model.onnx (ONNX Runtime)"
    assert without.parity.rank_mismatch_fraction == 0.0
    assert without.head == with_source.head
    assert file_sha256(out / lens_file(4)) == graph_sha  # the very same graph
    for x, y in zip(a, _lens(out, 4)):
        np.testing.assert_array_equal(x, y)


def test_stored_head_decodes_like_the_checkpoint_head(tiny_model, tiny_export, tmp_path):
    """The rebuilt head (meta-device model + stored tensors + aliases) gives the checkpoint head's logits
    exactly. Catches: an alias (tied unembedding) left on the meta device or pointing at the wrong tensor."""
    import torch

    out = tiny_export("gpt2", pooled=["mean"], to=tmp_path / "exp")
    handle = ModelHandle.resolve(out)
    assert handle.manifest.lm_head["aliases"] == {"lm_head.weight": "transformer.wte.weight"}
    stored = load_decoding_model(handle)
    source = load_decoding_model(ModelHandle.resolve(str(tiny_model("gpt2"))))
    h = torch.randn(2, 5, 32)
    with torch.inference_mode():
        for layer in (0, 2):
            np.testing.assert_array_equal(stored.head(h, layer).numpy(), source.head(h, layer).numpy())


def test_bare_checkpoint_keeps_its_word_embeddings_as_the_head(tmp_path, tiny_model):
    """A checkpoint saved without its MLM head (all-MiniLM-L6-v2 is a bare BertModel) keeps the tied
    word embeddings, and says so."""
    from transformers import AutoModel

    bare = tmp_path / "bare"
    src = tiny_model("bert")
    AutoModel.from_pretrained(str(src)).save_pretrained(str(bare))
    for f in src.iterdir():
        if f.name.startswith(("tokenizer", "special", "vocab")):
            shutil.copy(f, bare / f.name)
    out = tmp_path / "exp"
    manifest = export_model(resolve_source(str(bare)), out, pooled=["mean"])
    assert manifest.lm_head["kind"] == "tied-word-embeddings"
    assert manifest.lm_head["missing_head_weights"]
    meta = export_lens(out, 3)
    shutil.rmtree(bare)
    assert load_decoding_model(ModelHandle.resolve(out)).info.kind == "tied-word-embeddings"
    for f in (lens_file(3), "lens-k3.json"):
        (out / f).unlink()
    assert export_lens(out, 3).sha256 == meta.sha256


def test_changed_head_file_is_refused(tiny_export, tmp_path):
    from layerscope.errors import ManifestError

    out = tiny_export("qwen2", pooled=["mean"], to=tmp_path / "exp")
    handle = ModelHandle.resolve(out)
    data = bytearray((out / HEAD_FILE).read_bytes())
    data[-1] ^= 0xFF
    (out / HEAD_FILE).write_bytes(bytes(data))
    with pytest.raises(ManifestError, match="sha256"):
        load_decoding_model(handle)
    m = json.loads((out / "manifest.json").read_text())
    m["lm_head"]["file"] = "../elsewhere.safetensors"
    (out / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(ManifestError, match="outside|climbs"):
        load_decoding_model(ModelHandle.resolve(out, verify=False))


@pytest.mark.parametrize("family", ["qwen2", "gpt2"])
def test_head_of_a_bf16_checkpoint_is_loaded_in_bf16_and_kept_in_fp32(family, tiny_model, tmp_path, monkeypatch):
    """Catches: the head loaded with the whole model widened to fp32 (for a bf16 3B checkpoint that is a
    12 GB copy next to the export's: a 24 GiB machine ran out of memory), and a head stored in bf16 or with
    values other than the checkpoint's widened exactly (the lens would decode with other weights)."""
    import torch
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    import layerscope.model.source as source_mod
    from layerscope.export.lm_head import save_head
    from layerscope.model.families import FAMILIES
    from layerscope.model.source import resolve_source

    src = tmp_path / "bf16"
    shutil.copytree(tiny_model(family), src)
    AutoModelForCausalLM.from_pretrained(str(src)).to(torch.bfloat16).save_pretrained(str(src))
    asked = []
    real = source_mod.load_torch_model

    def spy(*args, **kwargs):
        asked.append(kwargs.get("dtype", "fp32"))
        return real(*args, **kwargs)

    monkeypatch.setattr(source_mod, "load_torch_model", spy)
    family_entry = FAMILIES[ModelHandle.resolve(src).manifest.family]
    entry, _ = save_head(resolve_source(str(src), None), family_entry, ModelHandle.resolve(src).manifest.num_layers,
                         tmp_path)
    assert asked == ["auto"]
    stored = load_file(str(tmp_path / HEAD_FILE))
    widened = {k: v.float() for k, v in AutoModelForCausalLM.from_pretrained(str(src), dtype=torch.bfloat16)
               .state_dict().items()}
    assert stored and all(t.dtype == torch.float32 for t in stored.values())
    for name, tensor in stored.items():
        torch.testing.assert_close(tensor, widened[name], rtol=0, atol=0, msg=name)
    assert set(entry["tensors"]) == set(stored)


def test_head_and_lens_graphs_are_traced_beside_the_export_not_in_tmp(tiny_export, tmp_path, monkeypatch):
    """A system temporary folder too small for a trace (a folder made there says the disk is full; small files
    still fit): the head-logits graph and the lens graph are still traced and written, in a folder beside the
    export that is gone afterwards. Catches: a trace into /tmp, where a large vocabulary's head (GBs) does not
    fit."""
    import errno
    import tempfile

    from layerscope.decoding.head_graph import export_head

    out = tmp_path / "exp"
    shutil.copytree(tiny_export("gpt2"), out)
    before = {p.name for p in out.iterdir()}
    system = tempfile.TemporaryDirectory

    class SmallTmp(system):
        def __init__(self, *args, dir=None, **kwargs):
            if dir is None:
                raise OSError(errno.ENOSPC, "No space left on device (the system's temporary folder)")
            super().__init__(*args, dir=dir, **kwargs)

    monkeypatch.setattr(tempfile, "TemporaryDirectory", SmallTmp)
    record = export_head(out)
    assert (out / record.file).is_file() and record.max_abs <= 1e-4 * max(1.0, record.scale)
    assert export_lens(out, 3).parity.rank_mismatch_fraction == 0.0
    made = {p.name for p in out.iterdir()} - before
    assert made and not [n for n in made if "trace" in n], made
