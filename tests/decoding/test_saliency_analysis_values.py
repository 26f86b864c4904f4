"""The ``saliency`` analysis's reference figures (the smoke runs in tests/analyses/test_lens_saliency_runs.py
only check that it completes) against the similarity objective written out with plain transformers.

The per-token scores and the games are checked by hand in tests/decoding/test_saliency.py; this checks
the analysis feeds them the right objective: final layer, the chosen pooling, the reference text, and
the replacement token for hidden tokens."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from layerscope.analyses.base import RunRequest, run_analysis

TEXTS = ["what a lovely warm day in the sunny park today", "the people here are rude and the food is awful",
         "we had a wonderful time and the music was lovely", "the river flows slowly through the old stone town"]
REFERENCE = "a lovely day in the park"


def test_similarity_objective_figures_equal_a_hand_computation(tiny_model, tmp_path):
    """``mean_full``: mean cosine of each text's final-layer mean vector with the reference's;
    ``mean_all_masked``: the same with every non-special token replaced by [MASK].

    Catches: the reference vector taken below the final layer (``hidden_states[-1]`` -> ``[-2]`` in
    analyses/saliency.py ``final_pooled``)."""
    from transformers import AutoModel, AutoTokenizer

    model_dir = tiny_model("bert")
    data = tmp_path / "d.jsonl"
    data.write_text("".join(json.dumps({"text": t}) + "\n" for t in TEXTS), encoding="utf-8")
    ctx = RunRequest(models=[str(model_dir)], engine="torch", out=tmp_path / "out", poolings=["mean"], cache=False,
                     data=str(data), layers="1,2",
                     options={"k": 2, "ig_steps": 2, "random_draws": 1, "objective": "similarity",
                           "reference": REFERENCE, "decode": "probs"})
    _, results = run_analysis("saliency", ctx)
    summary = next(iter(results["per_model"].values()))["summary"]
    assert summary["n_explained"] == len(TEXTS) and summary["pooling"] == "mean"

    tok = AutoTokenizer.from_pretrained(str(model_dir))
    net = AutoModel.from_pretrained(str(model_dir)).eval()
    special = set(tok.all_special_ids)

    def final_mean(ids: list[int]) -> np.ndarray:
        with torch.no_grad():
            h = net(input_ids=torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long))
        return h.last_hidden_state[0].double().mean(0).numpy()  # one text, no padding: a plain mean

    def cos(a, b):
        return float(a @ b / np.linalg.norm(a) / np.linalg.norm(b))

    ref = final_mean(tok(REFERENCE)["input_ids"])
    full, masked = [], []
    for text in TEXTS:
        ids = tok(text)["input_ids"]
        full.append(cos(final_mean(ids), ref))
        masked.append(cos(final_mean([t if t in special else tok.mask_token_id for t in ids]), ref))
    assert summary["mean_full"] == pytest.approx(np.mean(full), abs=1e-5)
    assert summary["mean_all_masked"] == pytest.approx(np.mean(masked), abs=1e-5)
    assert abs(np.mean(full) - np.mean(masked)) > 1e-3  # the two differ: the check is not vacuous
