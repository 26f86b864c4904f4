"""Integrated Jacobians: the matrix against reverse-mode Jacobians by hand, completeness against similarities
computed by hand through plain Hugging Face, the one-sided sums against captum, the hiding game's choices."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from layerscope.analyses.explain import Explain
from layerscope.decoding.heads import model_inputs
from layerscope.decoding.pair_attribution import PairEncoder, attribute_pair, baseline_token, completeness_curve
from layerscope.model.handle import ModelHandle
from layerscope.model.source import load_torch_model

A, B = "A girl is styling her hair.", "The girl brushes her long hair."
DEFAULT_STEPS = next(o.default for o in Explain.metadata.options if o.name == "steps")


def setup(path, pooling, similarity="cosine", baseline="pad"):
    handle = ModelHandle.resolve(str(path))
    tok = handle.tokenizer()
    net = load_torch_model(handle.source(), handle.family()).eval()
    enc = PairEncoder(net, handle.manifest.num_layers, pooling, similarity, frozenset(tok.all_special_ids),
                      baseline_token(tok, baseline))
    a, b = (model_inputs(handle, tok, [t], 64) for t in (A, B))
    return handle, tok, net, enc, a, b


def hand_embedding(net, inputs, embeds, pooling, similarity):
    """Plain Hugging Face from input embeddings, pooled and normalized here (no layerscope code)."""
    feed = {k: v for k, v in inputs.items() if k != "input_ids"}
    h = net(inputs_embeds=embeds, **feed).last_hidden_state[0]
    v = {"mean": h.mean(0), "cls": h[0], "last": h[-1]}[pooling]  # one text, no padding
    return v / v.norm() if similarity == "cosine" else v


def hand_reference(net, tok, inputs, baseline_id):
    ids = inputs["input_ids"][0]
    e = net.get_input_embeddings().weight
    rows = [e[int(t)] if int(t) in set(tok.all_special_ids) else e[baseline_id] for t in ids]
    return torch.stack(rows).unsqueeze(0).detach()


@pytest.mark.parametrize("family,pooling,similarity", [("bert", "mean", "dot"), ("gpt2", "last", "dot"),
                                                       ("qwen2", "last", "cosine"), ("qwen2", "mean", "cosine")])
def test_matrix_sums_to_similarity_minus_reference_terms(tiny_model, family, pooling, similarity):
    handle, tok, net, enc, a, b = setup(tiny_model(family), pooling, similarity)
    emb = net.get_input_embeddings()
    with torch.no_grad():
        ga, gb = (hand_embedding(net, x, emb(x["input_ids"]), pooling, similarity) for x in (a, b))
        ra, rb = (hand_embedding(net, x, hand_reference(net, tok, x, enc.baseline_id), pooling, similarity)
                  for x in (a, b))
    s = float(ga @ gb)
    target = s - float(ra @ gb + ga @ rb - ra @ rb)
    assert abs(target) > 1e-3  # a vacuous target would make every sum pass
    for layer in ("raw", "1", str(handle.manifest.num_layers)):
        res = attribute_pair(enc, a, b, layer, DEFAULT_STEPS)
        assert res.similarity == pytest.approx(s, rel=1e-5, abs=1e-5)
        assert res.target == pytest.approx(target, rel=1e-4, abs=1e-5)
        assert abs(res.total - target) <= 0.01 * abs(target), (layer, res.total, target)


def test_matrix_equals_reverse_mode_jacobians_by_hand(tiny_model):
    """U by torch.autograd.functional.jacobian (reverse mode) of a hand-run BERT stack from layer 1, at 3 points."""
    from torch.autograd.functional import jacobian

    handle, tok, net, enc, a, b = setup(tiny_model("bert"), "mean")
    steps = 3

    def from_layer1(h):  # BertLayer 1..L run by hand, then mean and L2 norm
        for block in net.encoder.layer[1:]:
            h = block(h.unsqueeze(0))[0][0]
        v = h.mean(0)
        return v / v.norm()

    def u_by_hand(x):
        ids = x["input_ids"]
        feed = {k: v for k, v in x.items() if k != "input_ids"}
        with torch.no_grad():
            hx = net(input_ids=ids, **feed, output_hidden_states=True).hidden_states[1][0]
            hr = net(inputs_embeds=hand_reference(net, tok, x, enc.baseline_id), **feed,
                     output_hidden_states=True).hidden_states[1][0]
        delta = (hx - hr).double()
        u = torch.zeros(hx.shape[1], hx.shape[0], dtype=torch.float64)
        for k in range(steps):
            j = jacobian(from_layer1, hr + (k + 0.5) / steps * (hx - hr)).double()  # [D, S, H]
            u += torch.einsum("dsh,sh->ds", j, delta) / steps
        return u.numpy()

    want = u_by_hand(a).T @ u_by_hand(b)
    got = attribute_pair(enc, a, b, "1", steps).matrix
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-6)
    assert np.abs(want).max() > 1e-3


def test_one_sided_sums_equal_captum_layer_integrated_gradients(tiny_model):
    """Where the definitions coincide: row i of the matrix summed over text b is U_a[:, i] . V_b, which is
    integrated gradients of the one-sided objective a -> g(a) . V_b (V_b: text b's column sum of U_b, i.e.
    g(b) - g(r_b) up to b's completeness error) from the same baseline over the same midpoints. captum's
    baseline is given as token ids (content -> pad), so its layer reference equals ours at the word embeddings
    and at a hidden state; for --baseline zero (no token id) captum's LayerIntegratedGradients has no match."""
    from captum.attr import LayerIntegratedGradients

    handle, tok, net, enc, a, b = setup(tiny_model("bert"), "mean")
    steps = 8
    special = set(tok.all_special_ids)
    ids = a["input_ids"]
    base_ids = torch.tensor([[t if t in special else enc.baseline_id for t in ids[0].tolist()]])
    feed = {k: v for k, v in a.items() if k != "input_ids"}
    from layerscope.decoding.pair_attribution import integrated_jacobian

    # hidden state 1 (the input of block 1) is block 0's output (its BertOutput module): captum reads it there
    for layer, module in (("raw", net.embeddings.word_embeddings), ("1", net.encoder.layer[0].output)):
        v_b = integrated_jacobian(enc, b, layer, *enc.ends(b, layer), steps).sum(1)
        direction = torch.tensor(v_b, dtype=torch.float32)

        def objective(input_ids):
            n = input_ids.shape[0]
            h = net(input_ids=input_ids, **{k: v.expand(n, -1) for k, v in feed.items()}).last_hidden_state
            g = torch.nn.functional.normalize(h.mean(1), dim=-1)
            return g @ direction

        lig = LayerIntegratedGradients(objective, module)
        attr = lig.attribute(ids, baselines=base_ids, n_steps=steps, method="riemann_middle")
        attr = attr[0] if isinstance(attr, (tuple, list)) else attr
        captum_rows = attr[0].sum(-1).detach().double().numpy()
        ours = attribute_pair(enc, a, b, layer, steps).rows
        np.testing.assert_allclose(ours, captum_rows, rtol=1e-3, atol=1e-5)
        assert np.abs(captum_rows).max() > 1e-3


def test_completeness_error_falls_with_steps(tiny_model):
    handle, tok, net, enc, a, b = setup(tiny_model("bert"), "mean")
    rows = completeness_curve(enc, a, b, "raw", [2, 10, 50])
    errors = [r["error"] for r in rows]
    assert errors[2] < errors[1] < errors[0]
    full = attribute_pair(enc, a, b, "raw", 10)  # the cheap curve is the matrix's own sum at that many steps
    assert rows[1]["sum"] == pytest.approx(full.total, rel=1e-4)


def test_top_pairs_and_matched_controls():
    from layerscope.decoding.pair_games import delete, top_pairs, top_tokens

    m = np.array([[0.0, 0.0, 0.0], [0.0, 0.5, 0.1], [0.0, 0.4, -0.2], [0.0, 0.0, 0.3]])
    content_a, content_b = np.array([1, 2, 3]), np.array([1, 2])
    assert top_pairs(m, content_a, content_b, 1) == ([1], [1])
    assert top_pairs(m, content_a, content_b, 2) == ([1, 2], [1])
    assert top_pairs(m, content_a, content_b, 3) == ([1, 2, 3], [1, 2])
    assert top_tokens(m.sum(1), content_a, 2) == [1, 3]  # rows 0.6, 0.2, 0.3
    inputs = {"input_ids": torch.tensor([[5, 6, 7, 8]]), "attention_mask": torch.ones(1, 4, dtype=torch.long),
              "position_ids": torch.arange(4).unsqueeze(0)}
    out = delete(inputs, [1, 2])
    assert out["input_ids"].tolist() == [[5, 8]] and out["position_ids"].tolist() == [[0, 1]]


@pytest.mark.slow
def test_minilm_matrix_sums_within_one_percent_at_default_steps(sts_dir):
    """The default steps are enough on a real model, from the embeddings and from a middle layer. One STS pair:
    the cost is steps x tokens forward-mode passes per pair and layer; the identity the sum approximates and
    its convergence with the steps are held on every tiny family above."""
    from layerscope.data.text_pairs import read_text_pairs

    pairs = read_text_pairs(sts_dir / "sts-test.csv")[:1]
    handle = ModelHandle.resolve("minilm")
    tok = handle.tokenizer()
    net = load_torch_model(handle.source(), handle.family()).eval()
    enc = PairEncoder(net, 6, "mean", "cosine", frozenset(tok.all_special_ids), baseline_token(tok, "pad"))
    for ta, tb in pairs:
        a, b = model_inputs(handle, tok, [ta], 128), model_inputs(handle, tok, [tb], 128)
        with torch.no_grad():
            ga, gb = (hand_embedding(net, x, net.get_input_embeddings()(x["input_ids"]), "mean", "cosine")
                      for x in (a, b))
        for layer in ("raw", "3"):
            res = attribute_pair(enc, a, b, layer, DEFAULT_STEPS)
            assert res.similarity == pytest.approx(float(ga @ gb), abs=1e-5)
            assert res.relative_error < 0.01, (ta, tb, layer, res.relative_error)


def test_hiding_game_hides_one_side_at_a_time_by_hand():
    from layerscope.decoding.pair_games import play_pair

    def inputs(ids):
        return {"input_ids": torch.tensor([ids]), "attention_mask": torch.ones(1, len(ids), dtype=torch.long)}

    def shared(x, y):  # a similarity by hand: the share of distinct tokens the two texts have in common
        sx, sy = set(x["input_ids"][0].tolist()), set(y["input_ids"][0].tolist())
        return len(sx & sy) / len(sx | sy)

    a, b = inputs([0, 10, 11, 12, 1]), inputs([0, 10, 13, 12, 1])  # 0 and 1 play the special tokens
    m = np.zeros((5, 5))
    m[1, 1], m[3, 3], m[2, 2] = 0.5, 0.3, -0.2  # tokens 10-10 first, then 12-12
    drops = play_pair(shared, a, b, m, np.array([1, 2, 3]), np.array([1, 2, 3]), 2, 2, np.random.default_rng(0))
    full = 4 / 6  # {0, 10, 12, 1} shared of {0, 1, 10, 11, 12, 13}
    k1 = full - 0.5 * (3 / 6 + 3 / 6)  # 10 deleted from a alone, then from b alone
    k2 = full - 0.5 * (2 / 6 + 2 / 6)  # 10 and 12
    assert drops["pairs"] == pytest.approx([k1, k2])
    assert drops["one-sided"] == pytest.approx([k1, k2])  # rows 0.5, -0.2, 0.3: the same tokens
    assert all(d <= k for d, k in zip(drops["random"], [k1, k2]))
