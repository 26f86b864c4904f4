"""Decoded layer saliency against a hand-written reference; IG; the games; the probe."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest
import torch

from layerscope.decoding.games import GameAccumulator, play, ranking, variants
from layerscope.decoding.heads import load_decoding_model, model_inputs
from layerscope.decoding.saliency import Objective, integrated_gradients, text_scores
from layerscope.model.handle import ModelHandle

TEXT = "The river flows slowly through the old stone town."


@pytest.fixture(scope="module")
def bert(tiny_model):
    handle = ModelHandle.resolve(str(tiny_model("bert")))
    model = load_decoding_model(handle)
    inputs = model_inputs(handle, handle.tokenizer(), [TEXT], 64)
    torch.manual_seed(0)
    h = handle.manifest.hidden_size
    objective = Objective("probe", "mean", torch.randn(3, h), torch.randn(3), labels=["a", "b", "c"])
    return handle, model, inputs, objective


def test_decoded_saliency_equals_hand_computation(bert, tiny_model):
    """Independent path: BertForMaskedLM's own forward, autograd, then explicit loops over i, j, f."""
    from transformers import AutoModelForMaskedLM

    handle, model, inputs, objective = bert
    scores, _ = text_scores(model, inputs, objective, [0, 1, 2], target=1,
                            baseline_ids=inputs["input_ids"][0].clone(), ig_steps=2)
    ref = AutoModelForMaskedLM.from_pretrained(str(tiny_model("bert"))).eval()
    out = ref(**inputs, output_hidden_states=True)
    hs = out.hidden_states
    m = inputs["attention_mask"][0].float()
    pooled = (hs[-1][0] * m[:, None]).sum(0) / m.sum()
    y = pooled @ objective.weight[1] + objective.bias[1]
    grads = torch.autograd.grad(y, hs)
    ids = inputs["input_ids"][0].tolist()
    n = len(ids)
    for layer in (0, 1, 2):
        h = hs[layer][0].detach().numpy().astype(np.float64)
        g = grads[layer][0].numpy().astype(np.float64)
        logits = ref.cls(hs[layer]).detach()[0].numpy().astype(np.float64)
        p = np.exp(logits - logits.max(1, keepdims=True))
        p /= p.sum(1, keepdims=True)
        want = np.zeros(n)
        for j in range(n):  # input token j
            total = 0.0
            for i in range(n):  # position i hands its saliency to token j with weight P[i, t_j]
                for f in range(h.shape[1]):
                    total += p[i, ids[j]] * g[i, f] * h[i, f]
            want[j] = max(total, 0.0)
        np.testing.assert_allclose(scores[f"decoded@{layer}"], want, rtol=1e-4, atol=1e-7)
        np.testing.assert_allclose(scores[f"gxa@{layer}"], (g * h).sum(1), rtol=1e-4, atol=1e-6)
    decoded = np.concatenate([scores[f"decoded@{x}"] for x in (0, 1, 2)])
    assert (decoded >= 0).all() and decoded.max() > 0  # not all clipped: the comparison is not vacuous


def test_grad_x_input_by_hand(bert):
    handle, model, inputs, objective = bert
    scores, _ = text_scores(model, inputs, objective, [1], target=0,
                            baseline_ids=inputs["input_ids"][0].clone(), ig_steps=2)
    e = model.word_embeddings(inputs["input_ids"]).detach().requires_grad_(True)
    feed = {k: v for k, v in inputs.items() if k != "input_ids"}
    h = model.base(inputs_embeds=e, **feed).last_hidden_state
    y = (h[0].mean(0) @ objective.weight[0]) + objective.bias[0]
    (g,) = torch.autograd.grad(y, e)
    np.testing.assert_allclose(scores["grad-x-input"], (g * e)[0].sum(-1).detach().numpy(), rtol=1e-4, atol=1e-7)


def test_integrated_gradients_completeness(bert):
    handle, model, inputs, objective = bert
    base = inputs["input_ids"][0].clone()
    base[1:-1] = handle.tokenizer().mask_token_id
    attr, delta = integrated_gradients(model, inputs, objective, base, target=2, steps=64)
    assert abs(float(attr.sum()) - delta) < 0.02 * abs(delta) + 1e-4
    assert float(attr[0]) == 0.0 and float(attr[-1]) == 0.0  # specials equal the baseline: no attribution


@pytest.mark.skipif(importlib.util.find_spec("captum") is None, reason="captum not installed")
def test_integrated_gradients_match_captum(bert):
    from captum.attr import IntegratedGradients

    handle, model, inputs, objective = bert
    base = inputs["input_ids"][0].clone()
    base[1:-1] = handle.tokenizer().mask_token_id
    ours, _ = integrated_gradients(model, inputs, objective, base, target=0, steps=16)
    feed = {k: v for k, v in inputs.items() if k != "input_ids"}

    def f(emb):
        h = model.base(inputs_embeds=emb, **{k: v.expand(emb.shape[0], -1) for k, v in feed.items()})
        return objective.value(h.last_hidden_state, feed["attention_mask"].expand(emb.shape[0], -1), 0)

    x = model.word_embeddings(inputs["input_ids"]).detach()
    b = model.word_embeddings(base.view(1, -1)).detach()
    theirs = IntegratedGradients(f).attribute(x, b, n_steps=16, method="riemann_middle").sum(-1)[0]
    np.testing.assert_allclose(ours.numpy(), theirs.detach().numpy(), rtol=1e-3, atol=1e-6)


def test_ranking_breaks_ties_at_random_but_keeps_order():
    content = np.array([1, 2, 3, 4])
    scores = np.array([9.0, 0.5, 0.0, 0.0, 2.0, 7.0])
    order = ranking(scores, content, np.random.default_rng(0))
    assert order[0] == 4 and order[1] == 1 and set(order[2:]) == {2, 3}


def test_games_by_hand():
    """Objective = sum of a weight per visible token id; the mask token (0) weighs nothing."""
    w = np.array([0.0, 5.0, 3.0, 1.0, 0.5, 0.0])
    ids = np.array([5, 1, 2, 3, 4, 5])  # 5 is special
    content = np.array([1, 2, 3, 4])
    v = variants(ids, np.array([1, 2, 3, 4]), content, 2, 0)
    assert v.tolist() == [[5, 0, 2, 3, 4, 5], [5, 0, 0, 3, 4, 5], [5, 1, 0, 0, 0, 5], [5, 1, 2, 0, 0, 5]]

    def evaluate(batch):
        y = w[batch].sum(1)
        return np.stack([y, -y], 1)

    good = [np.array([1, 2, 3, 4])]
    bad = [np.array([4, 3, 2, 1])]
    played = play(evaluate, ids, content, {"good": good, "bad": bad}, 2, 0, target=0)
    assert played["full"] == 9.5 and played["masked"] == 0.0
    assert played["methods"]["good"]["hide"].tolist() == [4.5, 1.5]
    assert played["methods"]["good"]["reveal"].tolist() == [5.0, 8.0]
    assert played["methods"]["bad"]["hide"].tolist() == [9.0, 8.0]
    acc = GameAccumulator(2)
    acc.add(played, gold=0)
    c = acc.curves()
    assert c["good"]["hide_drop"] == [5.0, 8.0]
    assert c["bad"]["hide_drop"] == [0.5, 1.5]
    assert c["good"]["reveal_recovery_fraction"] == pytest.approx([5 / 9.5, 8 / 9.5])
    assert c["good"]["hide_accuracy"] == [1.0, 1.0]


def test_probe_learns_a_separable_problem():
    from layerscope.decoding.probe import stratified_split, train_probe

    rng = np.random.default_rng(0)
    x = np.concatenate([rng.normal(2, 1, (20, 5)), rng.normal(-2, 1, (20, 5))]).astype(np.float32)
    y = np.array([0] * 20 + [1] * 20)
    tr, te = stratified_split(y, 0.5, seed=0)
    assert len(set(tr) & set(te)) == 0 and len(tr) + len(te) == 40
    assert set(y[te]) == {0, 1}
    probe = train_probe(x[tr], y[tr], ["a", "b"], seed=0)
    assert (probe.predict(x[te]) == y[te]).mean() == 1.0
    again = train_probe(x[tr], y[tr], ["a", "b"], seed=0)
    np.testing.assert_array_equal(probe.weight, again.weight)  # seeded
