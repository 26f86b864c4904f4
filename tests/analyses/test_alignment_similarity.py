"""alignment and similarity on a tiny model, checked against direct numpy computations; index round trip."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest

from layerscope.analyses.base import RunRequest, run_analysis
from layerscope.errors import InputError

pytest.importorskip("faiss")

N_PERM = 64


def _ctx(tmp_path, model, name, **kw):
    opts = kw.pop("options", {})
    return RunRequest(models=[str(model)], engine="torch", layers=kw.pop("layers", "all"),
                      poolings=kw.pop("poolings", ["mean"]), out=tmp_path / name, seed=kw.pop("seed", 3),
                      options=opts, cache=False, **kw)


def _direct_z(S, T):
    """Matched vs scrambled mean cosine with plain numpy: the exact permutation mean and variance from the
    full cosine matrix (mean of all entries; Hoeffding's variance from the doubly centred entries)."""
    S = S / np.linalg.norm(S, axis=1, keepdims=True)
    T = T / np.linalg.norm(T, axis=1, keepdims=True)
    n = len(S)
    G = S @ T.T
    matched = float(np.mean(np.diag(G)))
    D = G - G.mean(axis=1, keepdims=True) - G.mean(axis=0, keepdims=True) + G.mean()
    return matched, (matched - G.mean()) / np.sqrt((D ** 2).sum() / (n * n * (n - 1)))


def _direct_retrieval(src, tgt):
    """acc@1 and MRR with each tie averaged over the orders of the tied targets (rank uniform on the block)."""
    s = src / np.linalg.norm(src, axis=1, keepdims=True)
    t = tgt / np.linalg.norm(tgt, axis=1, keepdims=True)
    sims = s @ t.T
    acc1, rr = [], []
    for i in range(len(sims)):
        above = int((sims[i] > sims[i, i] + 1e-9).sum())
        tied = int((np.abs(sims[i] - sims[i, i]) <= 1e-9).sum())
        acc1.append(1 / tied if above == 0 else 0.0)
        rr.append(np.mean([1 / (above + j) for j in range(1, tied + 1)]))
    return float(np.mean(acc1)), float(np.mean(rr))


def test_alignment_z_and_retrieval_match_numpy(tmp_path, tiny_model):
    from layerscope.data.bilingual import generate_pairs
    from layerscope.extraction.pipeline import embed

    model = tiny_model("bert")
    out, res = run_analysis("alignment", _ctx(tmp_path, model, "al", options={
        "generate": "zh-en", "n": 30, "permutations": N_PERM, "knn": 5}))
    rows = res["per_model"][next(iter(res["per_model"]))]["tables"]["alignment_layers"]
    assert [r["layer"] for r in rows] == ["raw", "0", "1", "2"]
    pairs = generate_pairs(30, 3)
    texts = [p.source for p in pairs] + [p.target for p in pairs]
    vecs = embed(str(model), texts, engine="torch", layers="all", poolings=["mean"])
    for r in rows:
        v = vecs["mean", r["layer"]].astype(np.float64)
        matched, z = _direct_z(v[:30], v[30:])
        assert r["matched"] == pytest.approx(matched, abs=1e-5)
        assert r["z"] == pytest.approx(z, rel=1e-4, abs=1e-4) and r["z_method"] == "exact permutation moments"
        assert r["effect"] == pytest.approx(r["matched"] - r["scrambled_mean"])
        if r["z"] is not None:  # the check beside it: within a few of its own standard errors
            assert abs(r["z_monte_carlo"] - r["z"]) < 5 * r["z_monte_carlo_se"] and r["n_perm"] == N_PERM
        acc1, mrr = _direct_retrieval(v[:30], v[30:])
        assert r["acc@1_src2tgt"] == pytest.approx(acc1)
        assert r["mrr_src2tgt"] == pytest.approx(mrr, abs=1e-6)
    for f in ("z_by_layer.png", "acc1_by_layer.png", "pc0_separation_by_layer.png", "alignment_layers.csv",
              "alignment_categories.csv", "pairs.csv", "report.md"):
        assert (out / f).exists(), f
    cats = {r["category"] for r in res["per_model"][next(iter(res["per_model"]))]["tables"]["alignment_categories"]}
    assert len(cats) == 5


def test_alignment_bad_input_fails_before_models(tmp_path, tiny_model):
    s, t = tmp_path / "s.txt", tmp_path / "t.txt"
    s.write_text("a\nb\n")
    t.write_text("x\n")
    ctx = _ctx(tmp_path, "no-such-model-dir", "bad", options={"source_file": str(s), "target_file": str(t)})
    with pytest.raises(InputError, match="same number of lines"):
        run_analysis("alignment", ctx)
    ctx = _ctx(tmp_path, "no-such-model-dir", "bad", options={"source_file": str(s)})
    with pytest.raises(InputError, match="go together"):
        run_analysis("alignment", ctx)
    ctx = _ctx(tmp_path, "no-such-model-dir", "bad", options={"generate": "zh-en", "permutations": 1})
    with pytest.raises(InputError, match="0 .no Monte Carlo check. or at least 2"):
        run_analysis("alignment", ctx)
    assert not (tmp_path / "bad").exists()


def test_similarity_cka_heatmap_and_values(tmp_path, tiny_model):
    from layerscope.data.bilingual import generate_pairs
    from layerscope.extraction.pipeline import embed

    model = tiny_model("bert")
    out, res = run_analysis("similarity", _ctx(tmp_path, model, "sim", options={"n": 15, "knn": 4}))
    fig = next(iter(res["per_model"].values()))
    lin = np.array(fig["linear_cka"], dtype=float)
    assert fig["layers"] == ["raw", "0", "1", "2"]
    np.testing.assert_allclose(np.diag(lin), 1.0, atol=1e-9)
    np.testing.assert_allclose(lin, lin.T)
    ps = generate_pairs(15, 3)
    vecs = embed(str(model), [p.target for p in ps], engine="torch", layers="all")  # the English side
    as64 = {key: v.astype(np.float64) for key, v in vecs.items()}
    assert lin[1, 3] == pytest.approx(_direct_linear_cka(as64["mean", "0"], as64["mean", "2"]), abs=1e-6)
    unb = np.array(fig["unbiased_cka"], dtype=float)
    assert unb[0, 2] == pytest.approx(_direct_unbiased_cka(as64["mean", "raw"], as64["mean", "1"]), abs=1e-6)
    assert (out / "linear_cka.png").exists() and (out / "mutual_knn.png").exists()


def _direct_linear_cka(x, y):
    """Kornblith et al. (2019), features centred: ||Y^T X||_F^2 / (||X^T X||_F ||Y^T Y||_F)."""
    x, y = x - x.mean(0), y - y.mean(0)
    return np.linalg.norm(y.T @ x) ** 2 / (np.linalg.norm(x.T @ x) * np.linalg.norm(y.T @ y))


def _direct_unbiased_cka(x, y):
    """Song et al. (2012) unbiased HSIC on linear kernels with zeroed diagonals, normalised like CKA."""
    def hsic1(k, l_):
        n = k.shape[0]
        one = np.ones(n)
        return (np.trace(k @ l_) + (one @ k @ one) * (one @ l_ @ one) / ((n - 1) * (n - 2))
                - 2 / (n - 2) * (one @ k @ l_ @ one)) / (n * (n - 3))

    k, l_ = x @ x.T, y @ y.T
    np.fill_diagonal(k, 0)
    np.fill_diagonal(l_, 0)
    return hsic1(k, l_) / np.sqrt(hsic1(k, k) * hsic1(l_, l_))


def test_store_similarity_index_and_search(tmp_path, tiny_model):
    """Catches (cross-model part): the second model's vectors replaced by the first's, or the matrix
    transposed, in analyses/similarity.py ``combine`` (``cka_matrix(get_a, la, get_a, la, ...)``): both
    keep the matrix's shape, which was all the test checked."""
    from layerscope.index.store_index import build_store_index, search_index
    from layerscope.extraction.pipeline import extract

    texts = [f"the cat number {i} sat on mat {i % 7}" for i in range(40)]
    corpus = tmp_path / "c.txt"
    corpus.write_text("\n".join(texts) + "\n")
    bert, roberta = tiny_model("bert"), tiny_model("roberta")
    sa = extract(str(bert), str(corpus), tmp_path / "sa", engine="torch", layers="all", poolings=["mean"]).store
    sb = extract(str(roberta), str(corpus), tmp_path / "sb", engine="torch", layers="all", poolings=["mean"]).store
    # similarity from two stores (out of core path), cross-model matrix
    ctx = RunRequest(models=["minilm"], engine="torch", poolings=["mean"], out=tmp_path / "simst",
                     options={"store": str(sa.path), "store_b": str(sb.path), "knn": 3})
    _, res = run_analysis("similarity", ctx)
    cross = res["combined"]["cross"]
    assert len(cross["linear_cka"]) == len(sa.layers) and len(cross["linear_cka"][0]) == len(sb.layers)
    # every value of the cross-model matrices against CKA written out directly (Gram form, n x n)
    assert cross["layers_a"] == sa.layers and cross["layers_b"] == sb.layers
    lin, unb = np.array(cross["linear_cka"], dtype=float), np.array(cross["unbiased_cka"], dtype=float)
    for i, la in enumerate(sa.layers):
        for j, lb in enumerate(sb.layers):
            a, b = np.asarray(sa["mean", la], np.float64), np.asarray(sb["mean", lb], np.float64)
            assert lin[i, j] == pytest.approx(_direct_linear_cka(a, b), abs=1e-6), (la, lb)
            assert unb[i, j] == pytest.approx(_direct_unbiased_cka(a, b), abs=1e-6), (la, lb)
    assert np.ptp(lin) > 0.05  # the layers differ: a matrix of one value would not test the indexing
    assert res["settings"]["models"] == list(res["per_model"])  # no model was loaded
    other = tmp_path / "c2.txt"
    other.write_text("\n".join(reversed(texts)) + "\n")
    sc = extract(str(roberta), str(other), tmp_path / "sc", engine="torch", layers="all", poolings=["mean"]).store
    with pytest.raises(InputError, match="differ at row 0"):
        run_analysis("similarity", replace(ctx, options={"store": str(sa.path), "store_b": str(sc.path)}))
    # index build + search round trip, and the refusal for another model
    meta = build_store_index(sa.path, tmp_path / "idx", layer=-1, pooling="mean", kind="flat")
    assert meta.n == 40 and meta.layer == "2"
    assert json.loads((tmp_path / "idx" / "index.json").read_text())["store"] == str(sa.path.resolve())
    m, hits = search_index(tmp_path / "idx", [texts[5]], k=3, engine="torch")
    assert hits[0][0].text == texts[5] and hits[0][0].score == pytest.approx(1.0, abs=1e-4)
    with pytest.raises(InputError, match="built from model .* but the query model is"):
        search_index(tmp_path / "idx", ["a cat"], model=str(roberta), engine="torch")
    with pytest.raises(InputError, match="already holds an index"):
        build_store_index(sa.path, tmp_path / "idx")
