"""OPT whose word embeddings are narrower than its hidden states (OPT-350m: word_embed_proj_dim 512, hidden
size 1024; project_in after the embeddings, project_out after the last layer), with its blocks normed
before (most OPT) or after (OPT-350m: ``do_layer_norm_before`` false, no final norm) attention.

Every layer is exported at the hidden size: layer L is what project_out reads, and the lens decodes it
through project_out and the LM head.  References are plain Hugging Face (``OPTForCausalLM``) with a hook
written here on ``project_out``; nothing of layerscope's makes them.
"""

from __future__ import annotations

import numpy as np
import pytest

import tiny_zoo
from zoo_checks import TEXTS, check_store_tokens

PROJ = 16  # word_embed_proj_dim; the hidden size is tiny_zoo.H (32)


@pytest.fixture(scope="module")
def opt(tmp_path_factory):
    cache: dict[bool, tuple] = {}

    def get(norm_before: bool):
        if norm_before not in cache:
            from layerscope.export.exporter import export_model
            from layerscope.model.source import resolve_source

            root = tmp_path_factory.mktemp(f"opt-proj-{'pre' if norm_before else 'post'}")
            shapes = dict(tiny_zoo.SHAPES)
            shapes["opt"] = dict(shapes["opt"], word_embed_proj_dim=PROJ, do_layer_norm_before=norm_before)
            with pytest.MonkeyPatch.context() as mp:
                mp.setattr(tiny_zoo, "SHAPES", shapes)
                ckpt = tiny_zoo.build_zoo_model("opt", root / "ckpt")
            export_model(resolve_source(str(ckpt)), root / "onnx", pooled=["mean", "last"])
            cache[norm_before] = ckpt, root / "onnx"
        return cache[norm_before]

    return get


def _hugging_face(ckpt, side: str):
    """(per text {"raw", "0".."L", "hf_last"}, HF logits of the batch, mask): plain OPTForCausalLM, positions
    from the mask; layer L is project_out's input, ``hf_last`` Hugging Face's own last hidden state."""
    import torch
    import transformers

    tok = transformers.AutoTokenizer.from_pretrained(str(ckpt))
    tok.padding_side = side
    net = transformers.OPTForCausalLM.from_pretrained(str(ckpt), attn_implementation="eager").eval()
    assert net.config.word_embed_proj_dim == PROJ and net.config.hidden_size == tiny_zoo.H
    enc = tok(TEXTS, padding=True, return_tensors="pt")
    mask = enc["attention_mask"]
    seen = []
    hook = net.model.decoder.project_out.register_forward_pre_hook(lambda mod, args: seen.append(args[0]))
    with torch.no_grad():
        out = net(**enc, position_ids=(mask.cumsum(1) - 1).clamp(min=0), output_hidden_states=True)
        raw = torch.nn.functional.embedding(enc["input_ids"], net.get_input_embeddings().weight)
    hook.remove()
    L = net.config.num_hidden_layers
    layers = {"raw": raw,
              **{str(i): out.hidden_states[i] for i in range(L)}, str(L): seen[0], "hf_last": out.hidden_states[L]}
    per_text = [{k: v[b][mask[b].bool()].double().numpy() for k, v in layers.items()} for b in range(len(TEXTS))]
    return per_text, out.logits, net, mask.bool()


@pytest.mark.parametrize("norm_before", [False, pytest.param(True, marks=pytest.mark.slow)])
def test_every_layer_has_the_hidden_size_and_equals_hugging_face(norm_before, opt, tmp_path):
    """Catches: the export refused, layer L exported at word_embed_proj_dim (Hugging Face's last hidden state,
    project_out applied: a store of two widths) or taken before the final norm, raw read after project_in,
    a layer that differs from Hugging Face on either padding side, parity not recorded for each output."""
    from layerscope.engines.base import create_engine
    from layerscope.model.handle import ModelHandle

    ckpt, export = opt(norm_before)
    manifest = ModelHandle.resolve(export).manifest
    L, H = manifest.num_layers, manifest.hidden_size
    assert (L, H) == (2, tiny_zoo.H)
    assert manifest.outputs["raw_embeddings"][-1] == PROJ and manifest.raw_width == PROJ
    assert all(manifest.outputs[f"hidden_states.{i}"][-1] == H for i in range(L + 1))
    parity = manifest.raw["parity"]["outputs"]
    assert set(parity) == set(manifest.outputs)
    assert all(fig["max_abs"] <= fig["tolerance"] for fig in parity.values()), parity
    for side in ("right", "left"):
        ref, _, _, _ = _hugging_face(ckpt, side)
        for text in ref:  # the reference itself: Hugging Face's last state is project_out of layer L
            assert text["hf_last"].shape[-1] == PROJ and text[str(L)].shape[-1] == H
        worst = check_store_tokens(export, [{k: v for k, v in t.items() if k != "hf_last"} for t in ref],
                                   tmp_path / f"store-{side}")
        assert worst <= 2e-5, (side, worst)
    engine = create_engine("ort", ModelHandle.resolve(export))
    batch = engine.encoder()(TEXTS)
    (raw,) = engine.run_tokens(batch, ["raw"])
    valid = batch.mask.astype(bool)
    from safetensors.numpy import load_file

    rows = next(v for k, v in load_file(str(ckpt / "model.safetensors")).items() if k.endswith("embed_tokens.weight"))
    np.testing.assert_array_equal(raw[valid], rows[batch.input_ids[valid]])


@pytest.mark.parametrize("norm_before", [False, pytest.param(True, marks=pytest.mark.slow)])
def test_manifest_says_what_raw_and_the_last_layer_are(norm_before, opt):
    """Catches: a manifest silent on the two widths, or one that claims a final norm OPT-350m does not have."""
    from layerscope.model.handle import ModelHandle

    m = ModelHandle.resolve(opt(norm_before)[1]).manifest.raw
    assert f"word_embed_proj_dim={PROJ}" in m["embedding_note"] and "before project_in" in m["embedding_note"]
    assert "before project_out" in m["last_layer_note"] and f"hidden_size={tiny_zoo.H}" in m["last_layer_note"]
    assert m["embedding_size"] == PROJ
    assert m["final_norm_in_last_layer"] is norm_before
    assert ("no final norm" in m["last_layer_note"]) is not norm_before


@pytest.mark.parametrize("norm_before", [False, pytest.param(True, marks=pytest.mark.slow)])
def test_lens_decodes_every_layer_through_project_out(norm_before, opt):
    """Catches: a lens that feeds the LM head the hidden size (a shape error) or skips project_out, applies a
    final norm OPT-350m does not have or misses the one other OPT models apply below the last layer.  On the
    last layer the head's logits equal the model's own; below it, lm_head(project_out(final_norm(h))) as
    computed here from Hugging Face's modules."""
    import torch

    from layerscope.decoding.heads import load_decoding_model
    from layerscope.model.handle import ModelHandle

    ckpt, export = opt(norm_before)
    handle = ModelHandle.resolve(export)
    dm = load_decoding_model(handle)
    assert dm.info.kind == "causal-lm-head"
    assert "project_out" in dm.info.description
    assert ("no final norm" in dm.info.description) is not norm_before
    ref, logits, net, mask = _hugging_face(ckpt, "right")
    L = handle.manifest.num_layers
    decoder = net.model.decoder
    with torch.no_grad():
        for layer in range(L + 1):
            h = torch.nn.utils.rnn.pad_sequence([torch.from_numpy(t[str(layer)]).float() for t in ref],
                                                batch_first=True)
            if layer == L:
                want = logits  # the model's own
            else:
                normed = decoder.final_layer_norm(h) if norm_before else h
                want = net.lm_head(decoder.project_out(normed))
            np.testing.assert_allclose(dm.logits(h, layer)[mask].numpy(), want[mask].numpy(), atol=1e-4,
                                       err_msg=f"layer {layer}")


def test_torch_engine_gives_the_graphs_vectors(opt):
    """Catches: the torch engine handing back Hugging Face's projected last state (another width) while the
    graph gives the hidden size, or differing on any layer."""
    from layerscope.engines.base import create_engine
    from layerscope.model.handle import ModelHandle

    handle = ModelHandle.resolve(opt(False)[1])
    ort = create_engine("ort", handle)
    batch = ort.encoder()(TEXTS)
    layers = list(handle.manifest.layers)
    valid = batch.mask.astype(bool)
    for a, b, layer in zip(create_engine("torch", handle).run_tokens(batch, layers), ort.run_tokens(batch, layers),
                           layers):
        np.testing.assert_allclose(a[valid], b[valid], atol=1e-4, err_msg=f"layer {layer}")
