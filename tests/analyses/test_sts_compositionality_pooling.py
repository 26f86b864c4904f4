"""The sts, compositionality and pooling analyses end to end on tiny models, with parity against plain PyTorch."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import numpy as np
import pytest

from layerscope.analyses.base import RunRequest, rerender, run_analysis
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


def _ctx(model, tmp_path, name, **kw) -> RunRequest:
    base = dict(models=[str(model)], engine="torch", layers="all", out=tmp_path / name, seed=0,
                options={"n_boot": 50}, cache=False)
    base.update(kw)
    return RunRequest(**base)


def sts_pairs(n: int = 60, seed: int = 11) -> list[tuple[str, str, float]]:
    """n pairs: half near-paraphrases (a few words changed), half unrelated; scores on STS's 0.2 grid,
    so some scores tie as they do in the STS Benchmark."""
    rng = np.random.default_rng(seed)
    words = ("the a cat dog man woman child plays runs sits reads eats on in near park house guitar book "
             "food river quickly slowly big small red old").split()
    out = []
    for i in range(n):
        a = list(rng.choice(words, size=int(rng.integers(3, 12))))
        if i % 2 == 0:
            b = list(a)
            for j in rng.choice(len(b), size=int(rng.integers(1, 3)), replace=False):
                b[j] = str(rng.choice([w for w in words if w != b[j]]))  # never the same sentence
        else:
            b = list(rng.choice(words, size=int(rng.integers(3, 12))))
        out.append((" ".join(a), " ".join(b), round(float(rng.integers(0, 26)) * 0.2, 1)))
    return out


def test_sts_matches_plain_pytorch(tiny_model, tmp_path):
    """Every layer (raw included) and both poolings (mean, cls) of the sts table against cosines computed
    from plain Hugging Face outputs, on 60 pairs with tied scores.

    Catches: the raw layer read from the wrong module (``"embeddings"`` for ``"embeddings.word_embeddings"``
    in model/families.py's bert family: raw becomes layer 0), ``cls`` reading the token after [CLS]
    (the first real position + 1 in vocab/pooling.py), and a Spearman that ten distinct scores cannot tell
    from the right one."""
    import torch
    from scipy.stats import pearsonr, spearmanr
    from transformers import AutoModel, AutoTokenizer

    pairs = sts_pairs()
    assert len(pairs) >= 50 and len({s for _, _, s in pairs}) < len(pairs)  # ties present
    assert all(a != b for a, b, _ in pairs)  # no cosine of exactly 1, whose order rounding would decide
    data = tmp_path / "pairs.tsv"
    data.write_text("".join(f"g\tf\t2020\t{i:04d}\t{sc}\t{a}\t{b}\n" for i, (a, b, sc) in enumerate(pairs)))
    model_dir = tiny_model("bert")
    out, res = run_analysis("sts", _ctx(model_dir, tmp_path, "sts", data=str(data), poolings=["mean", "cls"]))
    rows = next(iter(res["per_model"].values()))["tables"]["layers"]
    tok = AutoTokenizer.from_pretrained(model_dir)
    net = AutoModel.from_pretrained(model_dir).eval()

    def vectors(texts):
        enc = tok(texts, padding=True, return_tensors="pt")  # right padding: [CLS] at position 0
        with torch.no_grad():
            hs = net(**enc, output_hidden_states=True).hidden_states
            raw = net.embeddings.word_embeddings(enc["input_ids"])
        m = enc["attention_mask"].unsqueeze(-1).double()
        states = {"raw": raw, **{str(i): h for i, h in enumerate(hs)}}
        return {("mean", k): ((h.double() * m).sum(1) / m.sum(1)).numpy() for k, h in states.items()} | \
               {("cls", k): h[:, 0].double().numpy() for k, h in states.items()}

    va, vb = vectors([a for a, _, _ in pairs]), vectors([b for _, b, _ in pairs])
    scores = np.array([s for _, _, s in pairs])
    checked = 0
    for (pooling, layer), a in va.items():
        b = vb[pooling, layer]
        cos = (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)
        row = next(r for r in rows if r["pooling"] == pooling and r["layer"] == layer)
        if np.ptp(cos) < 1e-6:  # one vector for every sentence (cls at raw and 0): undefined, with the reason
            assert pooling == "cls" and layer in ("raw", "0")
            assert row["spearman"] is None and "constant" in row["undefined"]
            continue
        assert row["spearman"] == pytest.approx(spearmanr(cos, scores)[0], abs=1e-6), (pooling, layer)
        # Pearson follows the float32 rounding of every cosine (observed: 1.1e-6 at cls, layer 2)
        assert row["pearson"] == pytest.approx(pearsonr(cos, scores)[0], abs=1e-5), (pooling, layer)
        assert row["mean_similarity"] == pytest.approx(cos.mean(), abs=1e-6), (pooling, layer)
        checked += 1
    assert checked == 6  # mean at raw, 0, 1, 2; cls at 1, 2
    data_json = json.loads((out / "results.json").read_text())
    assert data_json["models"][next(iter(data_json["models"]))]["engine"]["engine"] == "torch"
    for row in next(iter(data_json["per_model"].values()))["tables"]["layers"]:  # each interval names its method
        assert row["spearman_ci_method"] == row["pearson_ci_method"] == "bootstrap-percentile"
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
    """Per-item cosines of the compositionality table against vectors from plain PyTorch (the tiny
    CLIP text model through transformers' CLIPTextModel, mask-aware mean in torch), not layerscope's embed.

    Catches: padding on the left (``tok.padding_side = "left"`` in model/source.py ``prepare_tokenizer``) and
    mean pooling over the padding (weights of 1/seq in vocab/pooling.py); both moved
    layerscope's ``embed`` exactly as they moved the analysis, so the old reference agreed with itself."""
    import torch
    from transformers import AutoTokenizer, CLIPTextModel

    from layerscope.metrics.vectors import paired_cosine
    from layerscope.data.items import read_items

    model_dir = tiny_model("clip-text")
    out, res = run_analysis("compositionality", _ctx(model_dir, tmp_path, "comp", poolings=["mean"], layers="-1"))
    fig = next(iter(res["per_model"].values()))
    items = read_items()
    it0 = items[0]
    texts = [it.positive for it in items] + [it.negative for it in items] + list(it0.paraphrases)
    tok = AutoTokenizer.from_pretrained(str(model_dir))
    net = CLIPTextModel.from_pretrained(str(model_dir)).eval()
    enc = tok(texts, padding=True, return_tensors="pt")
    with torch.no_grad():
        last = net(**enc, output_hidden_states=True).hidden_states[-1].double()  # block 2, before the final norm
    m = enc["attention_mask"].unsqueeze(-1).double()
    v = ((last * m).sum(1) / m.sum(1)).numpy()
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


def _by_hand_quantized(v: np.ndarray, i1: np.ndarray, i2: np.ndarray, scores: np.ndarray, relevant: float = 4.0,
                       seed: int = 0) -> dict:
    """Spearman and MRR of float32, binary and int8 versions of ``v``, written out with plain numpy/scipy
    (nothing from layerscope.analyses): sign bits and Hamming distance; per-dimension min/max int8 with the
    ranges of each half of the texts taken from the other half (seeded permutation); retrieval queries are the
    pairs scored at least ``relevant``."""
    from scipy.stats import spearmanr

    def cos(a, b):
        a, b = a.astype(np.float64), b.astype(np.float64)
        return (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)

    def mrr(score_fn):
        recip = []
        for q_idx, d_idx in ((i1, i2), (i2, i1)):
            docs = sorted(set(d_idx.tolist()))
            for q, d, score in zip(q_idx, d_idx, scores):
                if score < relevant:
                    continue
                s = np.array([score_fn(q, doc) for doc in docs])
                right = s[docs.index(d)]
                above = int((s > right + 1e-9).sum())
                tied = int((np.abs(s - right) <= 1e-9).sum())
                # a tie: the reciprocal rank averaged over every order of the tied documents
                recip.append(np.mean([1 / (above + j) for j in range(1, tied + 1)]))
        return float(np.mean(recip))

    bits = v > 0
    hamming = lambda a, b: (bits[a] != bits[b]).sum(-1)  # noqa: E731
    order = np.random.default_rng(seed).permutation(len(v))
    halves = (order[: len(v) // 2], order[len(v) // 2:])
    deq = np.empty_like(v)
    for rows, other in ((halves[0], halves[1]), (halves[1], halves[0])):
        lo, hi = v[other].min(0).astype(np.float64), v[other].max(0).astype(np.float64)
        scale = (hi - lo) / 255
        codes = np.clip(np.round((v[rows] - (lo + 128 * scale)) / scale), -128, 127)
        deq[rows] = (codes * scale + lo + 128 * scale).astype(np.float32)
    unit = lambda x: x.astype(np.float64) / np.linalg.norm(x.astype(np.float64), axis=1, keepdims=True)  # noqa: E731
    uf, ud = unit(v), unit(deq)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a constant similarity gives NaN here, None in the table
        return {
            "float32": (spearmanr(cos(v[i1], v[i2]), scores)[0], mrr(lambda q, d: uf[q] @ uf[d])),
            "binary": (spearmanr(1 - hamming(i1, i2) / v.shape[1], scores)[0], mrr(lambda q, d: -hamming(q, d))),
            "int8": (spearmanr(cos(deq[i1], deq[i2]), scores)[0], mrr(lambda q, d: ud[q] @ ud[d])),
        }


def test_pooling_variants_quantization_and_truncation(tiny_model, tmp_path):
    """Every binary and int8 retention value (Spearman and MRR, every variant) against a computation by hand.

    Catches: int8 codes truncated instead of rounded (``np.rint`` -> ``np.trunc`` in
    metrics/quantization.py ``int8_quantize``) and Hamming distance taken as the binary retrieval score
    (``-dist`` -> ``dist`` in analyses/pooling.py ``_retrieval_binary``); the old test checked only the
    float32 and full-width rows, which are 1 by construction."""
    from layerscope.data.pairs import read_pairs
    from layerscope.extraction.pipeline import embed

    data = tmp_path / "pairs.tsv"
    data.write_text("".join(f"g\tf\t2020\t{i:04d}\t{sc}\t{a}\t{b}\n"
                            for i, (a, b, sc) in enumerate(sts_pairs())))
    model = tiny_model("bert")
    out, res = run_analysis("pooling", _ctx(model, tmp_path, "pool", data=str(data),
                                            poolings=["cls", "mean", "last", "max"]))
    fig = next(iter(res["per_model"].values()))
    variants = [r["variant"] for r in fig["tables"]["variants"]]
    assert variants == ["cls@2", "mean@2", "last@2", "max@2", "mean@last4", "mean@1"]
    pairs = read_pairs(str(data))
    texts, i1, i2 = pairs.unique_texts()
    vec = embed(str(model), texts, engine="torch", layers="1,2", poolings=["cls", "mean", "last", "max"])
    vectors = {f"{p}@2": vec[p, "2"] for p in ("cls", "mean", "last", "max")}
    vectors["mean@last4"] = np.mean([vec["mean", "1"], vec["mean", "2"]], axis=0).astype(np.float32)
    vectors["mean@1"] = vec["mean", "1"]
    rows = {(r["variant"], r["method"]): r for r in fig["tables"]["quantization"]}
    compared = 0
    for name, v in vectors.items():
        want = _by_hand_quantized(v, i1, i2, pairs.scores)
        f_sp, f_mrr = want["float32"]
        for method in ("binary", "int8"):
            sp, mrr = want[method]
            row = rows[name, method]
            if np.isnan(sp):  # every pair gets one similarity (e.g. cls sign bits all alike): undefined
                assert row["spearman"] is None and row["retention_spearman"] is None and row["undefined"]
            else:
                assert row["spearman"] == pytest.approx(sp, abs=1e-9), (name, method)
            assert row["mrr"] == pytest.approx(mrr, abs=1e-9), (name, method)
            assert row["retention_mrr"] == pytest.approx(mrr / f_mrr, abs=1e-9), (name, method)
            if f_sp > 0 and not np.isnan(sp):
                assert row["retention_spearman"] == pytest.approx(sp / f_sp, abs=1e-9), (name, method)
                compared += 1
            elif f_sp <= 0:
                assert row["retention_spearman"] is None
        assert rows[name, "float32"]["retention_mrr"] == pytest.approx(1.0)
    assert compared >= 4  # enough variants with a positive float32 Spearman that the ratio is checked
    full = [r for r in fig["tables"]["truncation"] if r["dims"] == 32]  # hidden 32: full width
    assert full and all(r["retention_mrr"] == pytest.approx(1.0) for r in full)
    assert any("no pooled output" in n for n in fig["summary"]["notes"])
    assert (out / "pooling_quantization_retention.png").exists()
    with pytest.raises(InputError, match="drop --layers"):
        run_analysis("pooling", _ctx(tiny_model("bert"), tmp_path, "p2", data=str(data), layers="1"))
