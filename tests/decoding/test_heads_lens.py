"""Decoding heads and the logit lens on tiny models, against the models' own heads and plain numpy."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from layerscope.decoding.heads import CAUSAL, MLM, TIED, load_decoding_model, model_inputs
from layerscope.decoding.lens import LensAccumulator, LensBatch, torch_lens
from layerscope.model.handle import ModelHandle

TEXTS = ["The quick brown fox jumps over the lazy dog.", "Similar sentences should have similar embeddings."]


def _setup(path):
    handle = ModelHandle.resolve(str(path))
    model = load_decoding_model(handle)
    inputs = model_inputs(handle, handle.tokenizer(), TEXTS, 64)
    return handle, model, inputs


def test_mlm_head_matches_the_models_own_logits(tiny_model):
    from transformers import AutoModelForMaskedLM

    handle, model, inputs = _setup(tiny_model("bert"))
    assert model.info.kind == MLM and not model.info.final_norm
    ref = AutoModelForMaskedLM.from_pretrained(str(tiny_model("bert"))).eval()
    with torch.no_grad():
        want = ref(**inputs).logits
        hidden = model.base(**inputs, output_hidden_states=True).hidden_states
        got = model.head(hidden[-1], model.num_layers)
        # a middle layer goes through the same head, untouched (post-LN encoder)
        mid = model.head(hidden[1], 1)
        mid_want = ref.cls(hidden[1])
    assert torch.allclose(got, want, atol=1e-5)
    assert torch.allclose(mid, mid_want, atol=1e-6)


def test_causal_head_applies_the_final_norm_below_the_last_layer_only(tiny_model):
    from transformers import AutoModelForCausalLM

    handle, model, inputs = _setup(tiny_model("gpt2"))
    assert model.info.kind == CAUSAL and model.info.final_norm
    ref = AutoModelForCausalLM.from_pretrained(str(tiny_model("gpt2"))).eval()
    with torch.no_grad():
        want = ref(**inputs).logits
        hidden = model.base(**inputs, output_hidden_states=True).hidden_states
        got = model.head(hidden[-1], model.num_layers)
        mid = model.head(hidden[1], 1)
        mid_want = ref.lm_head(ref.transformer.ln_f(hidden[1]))
        twice = ref.lm_head(ref.transformer.ln_f(hidden[-1]))
    assert torch.allclose(got, want, atol=1e-5)
    assert torch.allclose(mid, mid_want, atol=1e-5)
    assert not torch.allclose(got, twice, atol=1e-3)  # the last layer is not normed a second time


def test_checkpoint_without_head_falls_back_to_tied_embeddings(tiny_model, tmp_path):
    from transformers import AutoModel, AutoTokenizer

    src = tiny_model("bert")
    base = AutoModel.from_pretrained(str(src))  # a bare BertModel, as sentence-transformers ship
    base.save_pretrained(tmp_path, safe_serialization=True)
    AutoTokenizer.from_pretrained(str(src)).save_pretrained(tmp_path)
    handle, model, inputs = _setup(tmp_path)
    assert model.info.kind == TIED
    assert any(k.startswith("cls.") for k in model.info.missing_head_weights)
    assert "tied word-embedding" in model.info.description
    with torch.no_grad():
        h = model.base(**inputs, output_hidden_states=True).hidden_states[1]
        got = model.head(h, 1)
    e = base.embeddings.word_embeddings.weight.detach()
    assert torch.allclose(got, h @ e.T, atol=1e-6)


class _Count:
    def __init__(self):
        self.runs = []

    def advance(self, n):
        self.runs.append(n)


@pytest.mark.parametrize("positions", [None, 3])
def test_lens_ranks_and_topk_match_numpy(tiny_model, positions):
    """Decoded all at once or three real positions at a time (runs that cross from one text into the next),
    every real position's rank, top-k ids and probabilities are numpy's on the whole batch's logits.
    Catches: a run's results written to the wrong positions, padding decoded, a run skipped."""
    handle, model, inputs = _setup(tiny_model("bert"))
    bar = _Count()
    out = torch_lens(model, inputs, [0, 1, 2], k=4, positions=positions, bar=bar)
    real = int(inputs["attention_mask"].sum())
    assert real < inputs["attention_mask"].numel()  # the batch has padding
    assert bar.runs == ([real] if positions is None else [3] * (real // 3) + ([real % 3] if real % 3 else []))
    with torch.no_grad():
        hidden = model.base(**inputs, output_hidden_states=True).hidden_states
    ids = inputs["input_ids"].numpy()
    mask = inputs["attention_mask"].numpy()
    for li in range(3):
        logits = model.head(hidden[li], li).detach().numpy()
        probs = np.exp(logits - logits.max(-1, keepdims=True))
        probs /= probs.sum(-1, keepdims=True)
        for b in range(ids.shape[0]):
            for s in range(ids.shape[1]):
                if not mask[b, s]:
                    assert out.rank[li, b, s] == 0 and not out.topk_ids[li, b, s].any()
                    continue
                row = logits[b, s]
                assert out.rank[li, b, s] == 1 + int((row > row[ids[b, s]]).sum())
                order = np.argsort(-row)[:4]
                assert out.topk_ids[li, b, s].tolist() == order.tolist()
                np.testing.assert_allclose(out.topk_probs[li, b, s], probs[b, s, order], rtol=1e-5)


def test_decoder_lens_targets_the_next_token(tiny_model):
    handle, model, inputs = _setup(tiny_model("gpt2"))
    out = torch_lens(model, inputs, [2], k=3)
    with torch.no_grad():
        logits = model.head(model.base(**inputs, output_hidden_states=True).hidden_states[2], 2).numpy()
    ids, mask = inputs["input_ids"].numpy(), inputs["attention_mask"].numpy()
    n0 = int(mask[0].sum())
    for s in range(n0 - 1):
        row = logits[0, s]
        assert out.rank[0, 0, s] == 1 + int((row > row[ids[0, s + 1]]).sum())
    assert out.rank[0, 0, n0 - 1] == 0  # the last real token has no next token


def test_lens_accumulator_by_hand():
    # 2 layers, one text of 4 positions: [CLS]=9, a=1, b=2, [SEP]=8
    rank = np.array([[[1, 3, 1, 1]], [[1, 1, 2, 1]]])
    top = np.array([[[[9], [5], [2], [8]]], [[[9], [1], [7], [8]]]])
    b = LensBatch(rank, top, np.ones_like(top, dtype=np.float32), np.array([[9, 1, 2, 8]]), np.ones((1, 4)))
    acc = LensAccumulator([0, 1], {8, 9}, decoder=False)
    acc.add(b)
    rows = acc.table(["0", "1"])
    assert rows[0]["positions"] == 2  # special-token targets left out
    assert rows[0]["mean_rank"] == 2.0 and rows[1]["mean_rank"] == 1.5
    assert rows[0]["top1_is_target"] == 0.5 and rows[1]["top1_is_target"] == 0.5
    assert rows[0]["top1_agrees_with_last"] == 0.0 and rows[1]["top1_agrees_with_last"] == 1.0


def test_lens_onnx_graph_matches_torch_bert(tiny_export, tmp_path):
    from layerscope.decoding.lens_onnx import export_lens, lens_parity

    out = tiny_export("bert", pooled=["mean"], to=tmp_path / "exp")
    meta = export_lens(out, 5)
    assert meta.parity.rank_mismatch_fraction == 0.0
    assert meta.parity.top1_mismatch_fraction == 0.0
    assert meta.parity.max_prob_diff < 1e-5
    handle = ModelHandle.resolve(out)
    model = load_decoding_model(handle)
    p = lens_parity(handle, model, out / meta.file, 5, texts=TEXTS)
    assert p.rank_mismatch_fraction == 0.0 and p.top1_mismatch_fraction == 0.0
    # the graph's softmax runs in float64, and a sidecar that does not say so marks a graph to export again
    from layerscope.decoding.lens_onnx import read_sidecar
    from layerscope.engines.ort_session import make_session

    probs = next(o for o in make_session(out / meta.file, "CPUExecutionProvider").get_outputs()
                 if o.name == "lens.topk_probs")
    assert probs.type == "tensor(double)" and meta.probabilities == "float64"
    assert read_sidecar(handle, 5) is not None
    side = out / "lens-k5.json"
    side.write_text(side.read_text().replace('"probabilities": "float64",', ""))
    assert read_sidecar(handle, 5) is None


def _hf_causal_lens(path, inputs, k):
    """The logit lens written out on transformers' own GPT-2 (not layerscope's head): every layer below the
    last through ln_f and lm_head, the last as the model's own logits; the target is the next token, the
    rank 1 + the number of logits strictly above the target's (0 where there is no next token)."""
    from types import SimpleNamespace

    from transformers import AutoModelForCausalLM

    lm = AutoModelForCausalLM.from_pretrained(str(path)).eval()
    ids, mask = inputs["input_ids"], inputs["attention_mask"]
    with torch.no_grad():
        out = lm(input_ids=ids, attention_mask=mask, output_hidden_states=True)
        logits = [lm.lm_head(lm.transformer.ln_f(h)) for h in out.hidden_states[:-1]] + [out.logits]
    target = torch.cat([ids[:, 1:], torch.zeros_like(ids[:, :1])], dim=1)
    valid = (mask > 0) & (torch.cat([mask[:, 1:], torch.zeros_like(mask[:, :1])], dim=1) > 0)
    ranks, top_ids, top_probs = [], [], []
    for lg in logits:
        above = (lg > torch.gather(lg, -1, target.unsqueeze(-1))).sum(-1) + 1
        ranks.append(torch.where(valid, above, torch.zeros_like(above)).numpy())
        p, i = torch.topk(torch.softmax(lg, -1), k, dim=-1)
        top_ids.append(i.numpy())
        top_probs.append(p.numpy())
    return SimpleNamespace(rank=np.stack(ranks), topk_ids=np.stack(top_ids), topk_probs=np.stack(top_probs))


def test_lens_head_graph_matches_torch_gpt2(tiny_model, tmp_path):
    """The traced head alone (fed torch hidden states), for a decoder with its final norm."""
    from layerscope.decoding.lens_onnx import OUTPUTS, _trace_head, run_onnx_lens
    from layerscope.engines.ort_session import make_session

    handle, model, inputs = _setup(tiny_model("gpt2"))
    path = tmp_path / "head.onnx"
    _trace_head(model, 3, handle.manifest.hidden_size, 18, path)
    ref = _hf_causal_lens(tiny_model("gpt2"), inputs, 3)
    with torch.no_grad():
        hidden = model.base(**inputs, output_hidden_states=True).hidden_states
    r, ids, p = run_onnx_lens(make_session(path, "CPUExecutionProvider"),
                              {n: inputs[n].numpy() for n in ("input_ids", "attention_mask")},
                              [h.numpy() for h in hidden], True, 3, int(handle.manifest.vocab_size))
    assert [o.name for o in make_session(path, "CPUExecutionProvider").get_outputs()] == list(OUTPUTS)
    assert np.array_equal(r, ref.rank)
    real = inputs["attention_mask"].numpy().astype(bool)  # padding is in no figure (and GPT-2 pads differently)
    assert np.array_equal(ids[:, real, 0], ref.topk_ids[:, real, 0])
    np.testing.assert_allclose(p[:, real], ref.topk_probs[:, real], atol=1e-5)


def test_lens_k_errors(tiny_model, tmp_path):
    from layerscope.decoding.lens_onnx import export_lens
    from layerscope.errors import InputError

    with pytest.raises(InputError, match="not an export dir"):
        export_lens(tiny_model("bert"), 5)


def test_lens_probabilities_near_one_match_a_float64_softmax():
    """A dominant logit over a 50,000-word vocabulary: the printed probability equals SciPy's float64 softmax
    (a float32 softmax is off by about 1e-6 here)."""
    from scipy.special import softmax

    from layerscope.decoding.lens import lens_outputs

    rng = np.random.default_rng(3)
    logits = rng.normal(0.0, 2.0, size=(1, 2, 50_000)).astype(np.float32)
    logits[0, 0, 17] = 18.0  # p close to 1
    logits[0, 1, 5] = 11.0
    ids = torch.tensor([[17, 5]])
    mask = torch.ones(1, 2, dtype=torch.int64)
    _, top_ids, top_p = lens_outputs(lambda h, layer: h, [torch.from_numpy(logits)], [0], ids, mask, 3, False)
    want = softmax(logits.astype(np.float64), axis=-1)
    assert top_p.dtype == torch.float64
    assert top_ids[0, 0, 0, 0] == 17 and 0.99 < want[0, 0, 17] < 1.0
    for s in range(2):
        np.testing.assert_allclose(top_p[0, 0, s].numpy(), want[0, s, top_ids[0, 0, s].numpy()], rtol=1e-13,
                                   atol=0)
