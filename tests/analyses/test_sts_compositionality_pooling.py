"""The sts, compositionality and pooling analyses end to end on tiny models, with parity against plain PyTorch."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from layerscope.analyses.base import Context, rerender, run_analysis
from layerscope.errors import InputError

SENTENCES = [
    ("the cat sat on the mat", "a cat is sitting on a mat", 4.6),
    ("a man plays the guitar", "a man is playing a guitar", 4.8),
    ("the dog runs in the park", "a woman reads a book", 0.2),
    ("children play football", "kids are playing soccer", 4.0),
    ("the sun is bright today", "it is raining heavily", 0.8),
    ("she cooks dinner at home", "a woman is cooking food", 3.5),
    ("two birds fly over the lake", "birds are flying above water", 3.9),
    ("the train leaves at noon", "the bus arrives at night", 1.1),
    ("a boy rides a bike", "a child is riding a bicycle", 4.2),
    ("the market is closed", "stocks fell sharply today", 0.5),
]


@pytest.fixture()
def pairs_file(tmp_path) -> Path:
    p = tmp_path / "pairs.tsv"
    lines = [f"g\tf\t2020\t{i:04d}\t{sc}\t{a}\t{b}" for i, (a, b, sc) in enumerate(SENTENCES)]
    p.write_bytes(("\r\n".join(lines) + "\r\n").encode())
    return p


@pytest.fixture(autouse=True)
def _home(tmp_path, monkeypatch):
    monkeypatch.setenv("LAYERSCOPE_HOME", str(tmp_path / "home"))


def _ctx(model, tmp_path, name, **kw) -> Context:
    base = dict(models=[str(model)], engine="torch", layers="all", out=tmp_path / name, seed=0,
                options={"n_boot": 50}, cache=False)
    base.update(kw)
    return Context(**base)


def test_sts_matches_plain_pytorch(tiny_model, tmp_path, pairs_file):
    import torch
    from scipy.stats import pearsonr, spearmanr
    from transformers import AutoModel, AutoTokenizer

    model_dir = tiny_model("bert")
    out, res = run_analysis("sts", _ctx(model_dir, tmp_path, "sts", data=str(pairs_file), poolings=["mean", "cls"]))
    rows = next(iter(res["per_model"].values()))["tables"]["layers"]
    tok = AutoTokenizer.from_pretrained(model_dir)
    net = AutoModel.from_pretrained(model_dir).eval()

    def vectors(texts):
        enc = tok(texts, padding=True, return_tensors="pt")
        with torch.no_grad():
            hs = net(**enc, output_hidden_states=True).hidden_states
        m = enc["attention_mask"].unsqueeze(-1).float()
        return [((h * m).sum(1) / m.sum(1)).numpy().astype(np.float64) for h in hs]

    va, vb = vectors([a for a, _, _ in SENTENCES]), vectors([b for _, b, _ in SENTENCES])
    scores = np.array([s for _, _, s in SENTENCES])
    for i in range(len(va)):
        cos = (va[i] * vb[i]).sum(1) / np.linalg.norm(va[i], axis=1) / np.linalg.norm(vb[i], axis=1)
        row = next(r for r in rows if r["pooling"] == "mean" and r["layer"] == str(i))
        assert row["spearman"] == pytest.approx(spearmanr(cos, scores)[0], abs=1e-6)
        assert row["pearson"] == pytest.approx(pearsonr(cos, scores)[0], abs=1e-5)
        assert row["mean_similarity"] == pytest.approx(cos.mean(), abs=1e-5)
    # CLS at the raw and embedding layers is one vector for every sentence: undefined, with the reason
    for layer in ("raw", "0"):
        row = next(r for r in rows if r["pooling"] == "cls" and r["layer"] == layer)
        assert row["spearman"] is None and "constant" in row["undefined"]
    data = json.loads((out / "results.json").read_text())
    assert data["models"][next(iter(data["models"]))]["engine"]["engine"] == "torch"
    assert {"layers.csv", "report.md", "sts_spearman_by_layer.png"} <= {p.name for p in out.iterdir()}
    assert "undefined at layer 0, cls" in (out / "report.md").read_text()
    (out / "report.md").unlink()
    (out / "sts_spearman_by_layer.png").unlink()
    rerender(out)  # from results.json alone
    assert (out / "report.md").exists() and (out / "sts_spearman_by_layer.png").exists()


def test_bad_layers_and_bad_data_write_nothing(tiny_model, tmp_path, pairs_file):
    with pytest.raises(InputError, match="--layers 9"):
        run_analysis("sts", _ctx(tiny_model("bert"), tmp_path, "bad", data=str(pairs_file), layers="9"))
    short = tmp_path / "short.csv"
    short.write_text("sentence1,sentence2,score\na,b,1\nc,d,2\n")
    with pytest.raises(InputError, match="at least 3"):
        run_analysis("sts", _ctx(tiny_model("bert"), tmp_path, "bad", data=str(short)))
    with pytest.raises(InputError, match="--train"):
        run_analysis("sts", _ctx(tiny_model("bert"), tmp_path, "bad", data=str(pairs_file),
                                 options={"probe": True}))
    assert not (tmp_path / "bad").exists()


def test_compositionality_on_shipped_items_and_own_pooled_output(tiny_model, tmp_path):
    from layerscope.analyses.metrics import paired_cosine
    from layerscope.data.items import read_items
    from layerscope.runtime.pipeline import embed

    model_dir = tiny_model("clip-text")
    out, res = run_analysis("compositionality", _ctx(model_dir, tmp_path, "comp", poolings=["mean"], layers="-1"))
    fig = next(iter(res["per_model"].values()))
    items = read_items()
    it0 = items[0]
    texts = [it.positive for it in items] + [it.negative for it in items] + list(it0.paraphrases)
    v = embed(str(model_dir), texts, engine="torch", layers="-1", poolings=["mean"])["mean", "2"]
    n = len(items)
    neg = paired_cosine(v[:n], v[n:2 * n])
    rows = [r for r in fig["tables"]["items"] if r["pooling"] == "mean"]
    np.testing.assert_allclose([r["cos_negative"] for r in rows], neg, atol=1e-5)
    para0 = paired_cosine(np.repeat(v[:1], len(it0.paraphrases), 0), v[2 * n:]).mean()
    assert rows[0]["id"] == it0.id and rows[0]["cos_paraphrases"] == pytest.approx(para0, abs=1e-5)
    assert rows[0]["diff"] == pytest.approx(para0 - neg[0], abs=1e-5)
    layer_row = next(r for r in fig["tables"]["layers"] if r["pooling"] == "mean")
    assert layer_row["n_items"] == n
    assert layer_row["win_rate"] == pytest.approx(np.mean([r["diff"] > 0 for r in rows]))
    assert layer_row["mean_diff"] == pytest.approx(np.mean([r["diff"] for r in rows]))
    own = [r for r in fig["tables"]["layers"] if r["pooling"] == "own"]
    assert len(own) == 1 and fig["summary"]["own_pooled_output"] == "pooler_output"
    cats = {r["value"] for r in fig["tables"]["groups"] if r["group"] == "category"}
    assert cats == {"agent-patient", "modifier", "preposition"}
    assert (out / "compositionality_mean_diff_by_layer.png").exists()


def test_compositionality_item_without_paraphrases_fails_before_models(tmp_path):
    bad = tmp_path / "items.jsonl"
    bad.write_text(json.dumps({"positive": "a b", "negative": "b a", "paraphrases": []}) + "\n")
    with pytest.raises(InputError, match="items.jsonl:1: the item has no paraphrases"):
        run_analysis("compositionality", _ctx("no-such-model-dir", tmp_path, "c", data=str(bad)))
    assert not (tmp_path / "c").exists()


def test_pooling_variants_quantization_and_truncation(tiny_model, tmp_path, pairs_file):
    out, res = run_analysis("pooling", _ctx(tiny_model("bert"), tmp_path, "pool", data=str(pairs_file),
                                            poolings=["cls", "mean", "last", "max"]))
    fig = next(iter(res["per_model"].values()))
    variants = [r["variant"] for r in fig["tables"]["variants"]]
    assert variants == ["cls@2", "mean@2", "last@2", "max@2", "mean@last4", "mean@1"]
    for r in fig["tables"]["quantization"]:
        if r["method"] == "float32":
            assert r["retention_mrr"] == pytest.approx(1.0)
    full = [r for r in fig["tables"]["truncation"] if r["dims"] == 32]  # hidden 32: full width
    assert full and all(r["retention_mrr"] == pytest.approx(1.0) for r in full)
    assert any("no pooled output" in n for n in fig["summary"]["notes"])
    assert (out / "pooling_quantization_retention.png").exists()
    with pytest.raises(InputError, match="drop --layers"):
        run_analysis("pooling", _ctx(tiny_model("bert"), tmp_path, "p2", data=str(pairs_file), layers="1"))
