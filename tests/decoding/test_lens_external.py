"""Lens graphs on exports whose weights live in external data (threshold lowered on a tiny model)."""

from __future__ import annotations

import numpy as np
import onnx

from layerscope.decoding.heads import load_decoding_model, model_inputs
from layerscope.decoding.lens_onnx import export_lens, lens_of_export
from layerscope.export import external
from layerscope.export import exporter
from layerscope.export.exporter import export_model
from layerscope.model.source import resolve_source
from layerscope.model.handle import ModelHandle

TEXTS = ["The cat sat on the mat.", "hi there", "a quick brown fox"]


def _lens_outputs(export_dir, meta):
    handle = ModelHandle.resolve(export_dir)
    inputs = model_inputs(handle, handle.tokenizer(), TEXTS, 32)
    return lens_of_export(handle, meta.k, {n: t.numpy() for n, t in inputs.items()})


def test_lens_graph_on_external_data_export(tiny_model, tiny_export, tmp_path, monkeypatch):
    src = str(tiny_model("qwen2"))
    normal = tiny_export("qwen2", pooled=["mean"], to=tmp_path / "normal")  # before the limit is lowered
    ref_meta = export_lens(normal, 4)
    monkeypatch.setattr(exporter, "EXTERNAL_DATA_BYTES", 10_000)
    big = tmp_path / "big"
    assert export_model(resolve_source(src), big, pooled=["mean"]).external_data
    meta = export_lens(big, 4)
    assert meta.parity.rank_mismatch_fraction == 0.0
    lens_graph = onnx.load(str(big / meta.file), load_external_data=False)
    for export, lens in ((normal, ref_meta), (big, meta)):  # the head graph alone, its weights the stored head's
        locations = sorted(p.name for p in external.data_files(export / lens.file))
        assert locations == ["lm_head.safetensors"] and not (export / "lens-k4.onnx_data").exists()
        assert lens.shared_bytes >= 4 * 32 * int(ModelHandle.resolve(export).manifest.vocab_size)
        assert (export / lens.file).stat().st_size < 100_000
    assert external.inline_bytes(lens_graph) < 10_000
    for a, b in zip(_lens_outputs(normal, ref_meta), _lens_outputs(big, meta)):
        np.testing.assert_array_equal(a, b)
    assert load_decoding_model(ModelHandle.resolve(big)).num_layers == 2


def test_lens_without_its_source_checkpoint_says_what_to_do(tiny_model, tmp_path):
    import shutil

    import pytest

    from layerscope.errors import InputError

    src = tmp_path / "ckpt"
    shutil.copytree(tiny_model("gpt2"), src)
    out = tmp_path / "exp"
    export_model(resolve_source(str(src)), out, pooled=["mean"])
    meta = export_lens(out, 3)  # made while the checkpoint exists: carries the head
    shutil.rmtree(src)
    model = load_decoding_model(ModelHandle.resolve(out))  # the head is kept in the export
    with pytest.raises(InputError, match="no longer there"):
        model.base  # noqa: B018 - running the model in torch does need the checkpoint
    r, ids, p = _lens_outputs(out, meta)  # the lens graph itself needs no checkpoint
    assert r.shape[0] == 3 and ids.shape[-1] == 3
