"""run geometry: every figure equals its reference library (scikit-dimension) or its definition on vectors from
plain Hugging Face, the shuffled-token control included (its shuffled ids run through transformers' own
forward); too few texts is one line before any model runs."""

from __future__ import annotations

import numpy as np
import pytest

from hf_reference import load_plain
from layerscope.analyses.base import RunRequest, run_analysis
from layerscope.errors import InputError

TEXTS = [f"the {a} {b} sat near the {c} river on day {i}" for i, (a, b, c) in enumerate(
    [(a, b, c) for a in ("old", "small", "red") for b in ("cat", "dog", "bird") for c in ("cold", "wide", "quiet")])]


@pytest.fixture(autouse=True)
def _home(tmp_path, monkeypatch):
    monkeypatch.setenv("LAYERSCOPE_HOME", str(tmp_path / "home"))


def _hf_states(model_dir, texts, seed=None):
    """Per text: {layer: float64 [tokens, hidden]} from transformers, its special-token mask, its ids."""
    import torch

    tok, model = load_plain(model_dir, "bert")
    out = []
    for row, text in enumerate(texts):
        enc = tok(text, return_special_tokens_mask=True, return_tensors="np")
        ids, special = enc["input_ids"][0].copy(), enc["special_tokens_mask"][0].astype(bool)
        if seed is not None:  # the control: the text's non-special tokens in the order seeded by its row
            where = np.nonzero(~special)[0]
            ids[where] = ids[where[np.random.default_rng([seed, row]).permutation(len(where))]]
        with torch.no_grad():
            hs = model(input_ids=torch.as_tensor(ids[None]), output_hidden_states=True).hidden_states
        out.append(({str(i): h[0].double().numpy() for i, h in enumerate(hs)}, special))
    return out


def test_every_figure_equals_its_reference_beside_its_control(tiny_model, tmp_path):
    skdim = pytest.importorskip("skdim")
    model = tiny_model("bert")
    data = tmp_path / "texts.txt"
    data.write_text("\n".join(TEXTS) + "\n", encoding="utf-8")
    out = tmp_path / "run"
    _, results = run_analysis("geometry", RunRequest(
        models=[str(model)], engine="torch", layers="0,2", data=str(data), out=out, seed=5, cache=False,
        options={"max_tokens": 100_000, "gride_n1": 2}))
    rows = {r["layer"]: r for r in next(iter(results["per_model"].values()))["tables"]["geometry_layers"]}
    for cond, seed in (("", None), ("_shuffled", 5)):
        states = _hf_states(model, TEXTS, seed)
        for layer in ("0", "2"):
            row = rows[layer]
            pooled = np.stack([s[layer].mean(0) for s, _ in states])
            assert row[f"twonn{cond}"] == pytest.approx(skdim.id.TwoNN().fit(pooled).dimension_, rel=1e-4)
            assert row[f"gride{cond}"] == pytest.approx(skdim.id.GRIDE(n1=2).fit(pooled).dimension_, rel=1e-4)
            for key in ("twonn", "gride", "anisotropy", "effective_rank", "entropy"):
                lo, hi = row[f"{key}{cond}_ci_low"], row[f"{key}{cond}_ci_high"]
                assert lo <= row[f"{key}{cond}"] <= hi, (key, cond, layer)
            own = [s[layer][~sp] for s, sp in states]
            ranks, ents = [], []
            for z in own:
                sv = np.linalg.svd(z, compute_uv=False)
                p = sv / sv.sum()
                ranks.append(np.exp(-np.sum(p * np.log(p))))
                lam = np.clip(np.linalg.eigvalsh(z @ z.T), 0, None)
                q = lam[lam > 1e-12 * lam.max()] / lam.sum()
                ents.append(-np.sum(q * np.log(q)))
            assert row[f"effective_rank{cond}"] == pytest.approx(np.mean(ranks), rel=1e-4)
            assert row[f"entropy{cond}"] == pytest.approx(np.mean(ents), rel=1e-4)
            tokens = np.concatenate(own)
            text = np.repeat(np.arange(len(own)), [len(z) for z in own])
            for key, v in (("anisotropy", tokens), ("anisotropy_centered", tokens - tokens.mean(0))):
                u = v / np.linalg.norm(v, axis=1, keepdims=True)
                cos = u @ u.T
                other = text[:, None] != text[None, :]
                assert row[f"{key}{cond}"] == pytest.approx(cos[other].mean(), abs=1e-5)
    # layer 0 adds position embeddings to the tokens, so shuffling them moves the pooled vectors; the page draws
    # every figure beside its control
    assert rows["0"]["twonn"] != rows["0"]["twonn_shuffled"]
    page = (out / "report.html").read_text(encoding="utf-8")
    for title in ("intrinsic dimension (TwoNN)", "intrinsic dimension (GRIDE)", "anisotropy after removing the mean",
                  "effective rank per prompt", "matrix entropy per prompt"):
        assert f"{title}, texts vs shuffled tokens (" in page
    assert page.count("shuffled tokens (control)") >= 6 and "Schulte" in page


def test_too_few_texts_for_an_estimator_is_one_line_before_the_model(tmp_path):
    data = tmp_path / "few.txt"
    data.write_text("\n".join(TEXTS[:12]) + "\n", encoding="utf-8")
    with pytest.raises(InputError, match="12 texts; GRIDE at neighbours \\(4, 8\\) needs at least 32"):
        run_analysis("geometry", RunRequest(models=["no-such-model-dir"], engine="torch", data=str(data),
                                            out=tmp_path / "o", options={}))
    assert not (tmp_path / "o").exists()
