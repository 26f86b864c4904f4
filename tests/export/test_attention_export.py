"""The attention variant: patterns equal transformers' eager ``output_attentions`` per layer and head, the
summaries equal a per-query numpy computation, on encoders and decoders, right- and left-padded."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from layerscope.export import attention as att
from layerscope.export.attention_run import AttentionRunner
from layerscope.export.variants import make_variant

TEXTS = ["a cat sat on the mat", "hi", "the quick brown fox jumps over the lazy dog twice today", "一只猫"]
ATTN_FAMILIES = ("bert", "gpt2", "qwen2")


@pytest.fixture(scope="module")
def attn_export(tiny_export):
    cache = {}

    def get(family):
        if family not in cache:
            out = tiny_export(family, pooled=[])
            make_variant(out, "attn")
            cache[family] = out
        return cache[family]

    return get


def _feeds(export_dir):
    from layerscope.model.manifest import read_manifest
    from layerscope.model.source import ModelSource, load_tokenizer
    from layerscope.model.tokenize import Encoder

    manifest = read_manifest(export_dir)
    tok = load_tokenizer(ModelSource(str(export_dir), str(export_dir), True))
    right = Encoder(tok, list(manifest.inputs), 64)(TEXTS).inputs
    return {"right": right, "left": att.left_padded(right, pad_id=0)}, tok


def _hf_attentions(source_dir, feed, decoder):
    """transformers' own eager attention probabilities, [B, L, H, T, T], loaded without layerscope."""
    import torch
    from transformers import AutoModel

    net = AutoModel.from_pretrained(str(source_dir), attn_implementation="eager").eval()
    with torch.no_grad():
        out = net(**{k: torch.from_numpy(v) for k, v in feed.items()}, output_attentions=True,
                  **({"use_cache": False} if decoder else {}))
    return np.stack([a.numpy() for a in out.attentions], 1)


def _numpy_summaries(probs, mask, ids, special):
    """Each summary by a plain loop over texts, layers, heads and real query tokens."""
    b_, l_, h_ = probs.shape[:3]
    out = {s: np.zeros((b_, l_, h_)) for s in att.SUMMARIES}
    for b in range(b_):
        real = np.nonzero(mask[b])[0]
        first = real[0]
        for l in range(l_):
            for h in range(h_):
                rows = {s: [] for s in att.SUMMARIES}
                for q in real:
                    p = probs[b, l, h, q]
                    rows["entropy"].append(-sum(x * math.log(x) for x in p if x > 0))
                    rows["first"].append(p[first])
                    rows["special"].append(sum(p[k] for k in real if ids[b, k] in special))
                    rows["distance"].append(sum(p[k] * abs(q - k) for k in range(len(p))))
                    if q != first:
                        rows["previous"].append(p[q - 1])
                for s in att.SUMMARIES:
                    out[s][b, l, h] = np.mean(rows[s]) if rows[s] else np.nan
    return out


@pytest.mark.parametrize("family", ATTN_FAMILIES)
@pytest.mark.parametrize("padding", ["right", "left"])
def test_patterns_and_summaries_equal_transformers(family, padding, attn_export, tiny_model):
    out = attn_export(family)
    manifest = json.loads((out / "manifest.json").read_text())
    feeds, tok = _feeds(out)
    feed = feeds[padding]
    mask = feed["attention_mask"]
    assert (mask[:, 0] == 0).any() if padding == "left" else (mask[:, -1] == 0).any()  # really padded
    ref = _hf_attentions(tiny_model(family), feed, manifest["kind"] == "decoder")
    got = AttentionRunner(out, "ort").run(feed, patterns=True)
    assert got.patterns.shape == ref.shape == (len(TEXTS), 2, 4, mask.shape[1], mask.shape[1])
    for b in range(len(TEXTS)):
        real = mask[b].astype(bool)
        # every layer and head, over the text's real query rows (all keys, padding included)
        np.testing.assert_allclose(got.patterns[b][:, :, real], ref[b][:, :, real], atol=1e-6)
        assert np.abs(got.patterns[b][:, :, real][..., ~real]).max(initial=0.0) == 0.0  # padding gets nothing
        if manifest["kind"] == "decoder":  # causal: nothing on later tokens
            assert np.abs(np.triu(got.patterns[b][:, :, real][..., real], 1)).max() == 0.0
    special = set(manifest["variants"]["attn"]["details"]["special_ids"])
    want = _numpy_summaries(ref, mask, feed["input_ids"], special)
    for s in att.SUMMARIES:
        np.testing.assert_allclose(got.summaries[s], want[s], atol=1e-5, rtol=1e-5, err_msg=s)


def test_special_ids_count_gpt2_end_of_text(attn_export):
    """GPT-2's <|endoftext|> is its unknown token too; it is still a special token (a sink candidate)."""
    entry = json.loads((attn_export("gpt2") / "manifest.json").read_text())["variants"]["attn"]
    assert len(entry["details"]["special_ids"]) == 1


@pytest.mark.parametrize("engine", ["ov", "torch"])
def test_every_engine_gives_the_same_attention(engine, attn_export):
    out = attn_export("bert")
    feed = _feeds(out)[0]["left"]
    ort = AttentionRunner(out, "ort").run(feed, patterns=True)
    other = AttentionRunner(out, engine).run(feed, patterns=True)
    np.testing.assert_allclose(other.patterns, ort.patterns, atol=1e-5)
    for s in att.SUMMARIES:
        np.testing.assert_allclose(other.summaries[s], ort.summaries[s], atol=1e-4, err_msg=s)


def test_summaries_by_hand_three_tokens():
    """One head, three positions, the last one padding; values worked out on paper."""
    import torch

    p = torch.tensor([[0.5, 0.5, 0.0], [0.2, 0.8, 0.0], [0.3, 0.3, 0.4]]).view(1, 1, 1, 3, 3)
    mask = torch.tensor([[1, 1, 0]])
    ids = torch.tensor([[7, 9, 0]])
    entropy, first, special, distance, previous = (float(x) for x in att.summaries(p, mask, ids, torch.tensor([9])))
    assert entropy == pytest.approx((math.log(2) - (0.2 * math.log(0.2) + 0.8 * math.log(0.8))) / 2)
    assert first == pytest.approx((0.5 + 0.2) / 2)  # the padded third row is never read
    assert special == pytest.approx((0.5 + 0.8) / 2)  # token 9 at position 1
    assert distance == pytest.approx((0.5 * 1 + 0.2 * 1) / 2)
    assert previous == pytest.approx(0.2)  # only query 1 has a previous token


def test_default_export_has_no_attention_outputs(attn_export):
    import onnx

    out = attn_export("bert")
    names = [o.name for o in onnx.load(str(out / "model.onnx"), load_external_data=False).graph.output]
    assert not [n for n in names if n.startswith("attention")]
    attn = [o.name for o in onnx.load(str(out / att.FILE)).graph.output]
    assert attn == att.output_names(2)


def test_attention_variant_refused_as_an_embedding_graph(attn_export):
    from layerscope.errors import InputError
    from layerscope.model.manifest import read_manifest
    from layerscope.model.variants import variant_onnx_file

    with pytest.raises(InputError, match="run attention"):
        variant_onnx_file(read_manifest(attn_export("bert")), "attn")


def test_verify_covers_the_attention_graph(attn_export, tmp_path):
    import shutil

    from layerscope.model.manifest_verify import verify_export_files

    copy = tmp_path / "copy"
    shutil.copytree(attn_export("bert"), copy)
    assert verify_export_files(copy)[1] == []
    with open(copy / att.FILE, "ab") as f:
        f.write(b"x")
    assert any(att.FILE in p for p in verify_export_files(copy)[1])


def test_summaries_without_mask_or_ids_count_every_position():
    """A graph with no mask and no token ids (an image tower's patches): every position is a real query."""
    import torch

    p = torch.tensor([[0.5, 0.5], [0.25, 0.75]]).view(1, 1, 1, 2, 2)
    entropy, first, special, distance, previous = (float(x) for x in att.summaries(p, None, None, torch.tensor([-1])))
    assert first == pytest.approx((0.5 + 0.25) / 2)
    assert special == 0.0
    assert distance == pytest.approx((0.5 + 0.25) / 2)
    assert previous == pytest.approx(0.25)


def test_big_graph_data_is_gathered_beside_the_export(tiny_export, tmp_path, monkeypatch):
    """Over 2 GiB torch writes one file per tensor: they are gathered into model.attn.onnx_data, recorded and
    verified, and the graph still runs (simulated by re-saving the tiny graph with per-tensor files)."""
    import onnx

    from layerscope.model.manifest_verify import verify_export_files

    real = att.trace_attention

    def per_tensor_files(net, path, **kw):
        real(net, path, **kw)
        model = onnx.load(str(path))
        onnx.save(model, str(path), save_as_external_data=True, all_tensors_to_one_file=False, size_threshold=0)

    out = tiny_export("bert", pooled=[], to=tmp_path / "onnx")
    monkeypatch.setattr(att, "trace_attention", per_tensor_files)
    entry = make_variant(out, "attn")
    assert list(entry["external_data"]) == ["model.attn.onnx_data"]
    assert not list(out.glob(".attn-trace-*"))  # the tracing folder is gone
    assert verify_export_files(out)[1] == []
    feed = _feeds(out)[0]["right"]
    assert AttentionRunner(out, "ort").run(feed, patterns=True).patterns.shape[:3] == (len(TEXTS), 2, 4)


@pytest.mark.slow
@pytest.mark.parametrize("family", ["roberta", "deberta-v2", "clip-text", "t5-encoder", "qwen3"])
def test_every_other_family_traces_within_tolerance(family, attn_export):
    """The attention graph is generic: each tiny family's patterns match transformers (right and left
    padding) as recorded by the variant's own check against the family's loader."""
    entry = json.loads((attn_export(family) / "manifest.json").read_text())["variants"]["attn"]
    assert entry["parity"]["padding"] == ["right", "left"]
    for name, check in entry["parity"]["outputs"].items():
        assert check["max_abs"] <= (1e-5 if name.startswith(att.PATTERN_PREFIX) else check["tolerance"]), name
