"""Analyses on token vectors, each figure checked against an independent computation written here: a plain
Hugging Face forward of each text alone, and the figures in plain Python loops (dicts of ids, the full n x n
cosine matrix for the permutation moments)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from layerscope.analyses.base import RunRequest, run_analysis

N = 12
BINS = 4


def hf_tokens(model_dir, texts):
    """Per text: (ids list, special list, {layer: float64 [tokens, hidden]}) from transformers alone."""
    import torch
    from transformers import AutoModel, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(model_dir))
    net = AutoModel.from_pretrained(str(model_dir)).eval()
    out = []
    for t in texts:
        enc = tok([t], return_tensors="pt", return_special_tokens_mask=True)
        special = enc.pop("special_tokens_mask")[0].tolist()
        with torch.no_grad():
            res = net(**enc, output_hidden_states=True)
            raw = net.get_input_embeddings()(enc["input_ids"])[0]
        layers = {"raw": raw.double().numpy(),
                  **{str(i): h[0].double().numpy() for i, h in enumerate(res.hidden_states)}}
        out.append((enc["input_ids"][0].tolist(), special, layers))
    return out


def cos(a, b):
    return float(sum(x * y for x, y in zip(a, b)) / math.sqrt(sum(x * x for x in a) * sum(y * y for y in b)))


def mean_rows(rows):
    return [sum(col) / len(rows) for col in zip(*rows)]


def exact_z(S, T):
    """(matched - E) / sd over uniform permutations, from the full cosine matrix (Hoeffding's variance)."""
    S = S / np.linalg.norm(S, axis=1, keepdims=True)
    T = T / np.linalg.norm(T, axis=1, keepdims=True)
    C = S @ T.T
    n = len(C)
    matched = np.trace(C) / n
    d = C - C.mean(1, keepdims=True) - C.mean(0, keepdims=True) + C.mean()
    var = (d ** 2).sum() / (n - 1) / n ** 2
    return (matched - C.mean()) / math.sqrt(var)


def by_hand(src, tgt, layer):
    """The decomposition of one layer, computed with dicts and lists."""
    shared, specific, special, first, pos = [], [], [], [], {b: [] for b in range(BINS)}
    pooled_s, pooled_t, plain_s, plain_t = [], [], [], []
    for (si, ss, sl), (ti, ts, tl) in zip(src, tgt):
        sv, tv = sl[layer].tolist(), tl[layer].tolist()
        s_by, t_by = {}, {}
        for i, v, sp in zip(si, sv, ss):
            if not sp:
                s_by.setdefault(i, []).append(v)
        for i, v, sp in zip(ti, tv, ts):
            if not sp:
                t_by.setdefault(i, []).append(v)
        common = set(s_by) & set(t_by)
        shared += [cos(mean_rows(s_by[i]), mean_rows(t_by[i])) for i in sorted(common)]
        s_only = [v for i, v, sp in zip(si, sv, ss) if not sp and i not in common]
        t_only = [v for i, v, sp in zip(ti, tv, ts) if not sp and i not in common]
        if s_only and t_only:
            specific.append(cos(mean_rows(s_only), mean_rows(t_only)))
        s_sp = [v for v, sp in zip(sv, ss) if sp]
        t_sp = [v for v, sp in zip(tv, ts) if sp]
        if s_sp and t_sp:
            special.append(cos(mean_rows(s_sp), mean_rows(t_sp)))
        first.append(cos(sv[0], tv[0]))
        s_real = [v for v, sp in zip(sv, ss) if not sp]
        t_real = [v for v, sp in zip(tv, ts) if not sp]
        pooled_s.append(mean_rows(s_only or s_real or sv))
        pooled_t.append(mean_rows(t_only or t_real or tv))
        plain_s.append(mean_rows(sv))
        plain_t.append(mean_rows(tv))
        for b in range(BINS):
            sb = [v for p, v in enumerate(s_real) if int((p + 0.5) / len(s_real) * BINS) == b]
            tb = [v for p, v in enumerate(t_real) if int((p + 0.5) / len(t_real) * BINS) == b]
            if sb and tb:
                pos[b].append(cos(mean_rows(sb), mean_rows(tb)))
    avg = lambda xs: sum(xs) / len(xs) if xs else None  # noqa: E731
    return {"shared_cosine": avg(shared), "n_shared": len(shared), "specific_cosine": avg(specific),
            "special_cosine": avg(special), "first_token_cosine": avg(first),
            "z": exact_z(np.array(plain_s), np.array(plain_t)),
            "z_without_shared": exact_z(np.array(pooled_s), np.array(pooled_t)),
            **{f"pos{b}": avg(pos[b]) for b in range(BINS)}}


@pytest.mark.parametrize("family,chunk_bytes", [("qwen2", None), ("bert", None), ("bert", 4096)])
def test_token_alignment_equals_an_independent_computation(tmp_path, tiny_model, family, chunk_bytes, monkeypatch):
    from layerscope.data.bilingual import generate_pairs

    if chunk_bytes:  # pairs read a few at a time: the figures are those of all pairs at once
        monkeypatch.setattr("layerscope.extraction.token_embed.CHUNK_BYTES", chunk_bytes)
    model = tiny_model(family)
    ctx = RunRequest(models=[str(model)], engine="torch", layers="all", out=tmp_path / "ta", seed=1,
                     options={"generate": "zh-en", "n": N, "bins": BINS}, cache=False)
    out, res = run_analysis("token_alignment", ctx)
    fig = next(iter(res["per_model"].values()))
    rows = fig["tables"]["token_alignment_layers"]
    pairs = generate_pairs(N, 1)
    src = hf_tokens(model, [p.source for p in pairs])
    tgt = hf_tokens(model, [p.target for p in pairs])
    assert [r["layer"] for r in rows] == list(src[0][2])
    for r in rows:
        want = by_hand(src, tgt, r["layer"])
        assert want["n_shared"] > 0  # digits and names are shared between the zh and en problems
        for key, value in want.items():
            if value is None:
                assert r[key] is None, (r["layer"], key)
            else:
                assert r[key] == pytest.approx(value, abs=2e-4), (r["layer"], key)
    if family == "qwen2":
        assert all(r["special_cosine"] is None for r in rows)  # Qwen adds no BOS: only the first token
    else:
        assert all(r["special_cosine"] is not None for r in rows)
    for f in ("report.md", "token_alignment_layers.csv", "token_cosines.png", "z_without_shared.png"):
        assert (out / f).exists(), f


def linear_cka_by_hand(X, Y):
    X = X - X.mean(0)
    Y = Y - Y.mean(0)
    return np.linalg.norm(Y.T @ X) ** 2 / (np.linalg.norm(X.T @ X) * np.linalg.norm(Y.T @ Y))


def test_similarity_on_tokens_equals_cka_of_hf_token_states(tmp_path, tiny_model):
    pytest.importorskip("faiss")
    from layerscope.data.bilingual import generate_pairs

    model = tiny_model("bert")
    ctx = RunRequest(models=[str(model)], engine="torch", layers="all", out=tmp_path / "sim", seed=1,
                     options={"n": 6, "tokens": True, "knn": 3}, cache=False)
    _, res = run_analysis("similarity", ctx)
    fig = next(iter(res["per_model"].values()))
    assert fig["summary"]["vectors"] == "tokens"
    pairs = generate_pairs(6, 1)
    ref = hf_tokens(model, [p.target for p in pairs])  # the default texts: the English side
    states = {layer: np.concatenate([np.asarray(layers[layer])[np.asarray(sp) == 0] for _, sp, layers in ref])
              for layer in ref[0][2]}
    assert fig["summary"]["n"] == len(states["0"])
    names = fig["layers"]
    for i, a in enumerate(names):
        for j, b in enumerate(names):
            want = linear_cka_by_hand(states[a], states[b])
            assert fig["linear_cka"][i][j] == pytest.approx(want, abs=1e-4), (a, b)
    assert all(fig["mutual_knn"][i][i] == pytest.approx(1.0) for i in range(len(names)))


def test_similarity_tokens_from_a_token_store(tmp_path, tiny_model):
    pytest.importorskip("faiss")
    from layerscope.extraction.pipeline import extract

    texts = ["the cat sat on the mat", "a dog runs over the river", "the quick brown fox", "lazy dogs sleep"]
    store = extract(tiny_model("bert"), texts, tmp_path / "s", engine="torch", layers="all", tokens=True).store
    ctx = RunRequest(models=["minilm"], engine="torch", layers="all", out=tmp_path / "sim", seed=1,
                     options={"store": str(store.path), "tokens": True, "knn": 3}, cache=False)
    _, res = run_analysis("similarity", ctx)
    fig = next(iter(res["per_model"].values()))
    layer = store.tokens(1)
    real = np.asarray(layer.special) == 0
    X, Y = store.tokens(0).rows()[real].astype(np.float64), store.tokens(2).rows()[real].astype(np.float64)
    assert fig["summary"]["n"] == int(real.sum())
    i, j = fig["layers"].index("0"), fig["layers"].index("2")
    assert fig["linear_cka"][i][j] == pytest.approx(linear_cka_by_hand(X, Y), abs=1e-4)


@pytest.mark.parametrize("last_k, chunk_bytes", [(2, None), (1, None), (2, 1024)])
def test_word_context_equals_an_independent_computation(tmp_path, tiny_model, last_k, chunk_bytes, monkeypatch):
    """Every layer's share and the last-k share (the mean of layers L-k+1..L) by hand; with k=1 the window
    one layer lower (layer 1 instead of 2) gives another share on these texts, so a shifted window shows."""
    import re

    if chunk_bytes:  # texts read one or two at a time: the figures are those of all texts at once
        monkeypatch.setattr("layerscope.extraction.token_embed.CHUNK_BYTES", chunk_bytes)

    import torch
    from transformers import AutoModel, AutoTokenizer

    model = tiny_model("bert")
    texts = ["the cat sat on the mat", "a black cat runs over the river", "the river runs past the mat",
             "my cat likes the river", "a mat for the cat", "the lazy river and the lazy cat"]
    data = tmp_path / "t.txt"
    data.write_text("\n".join(texts) + "\n", encoding="utf-8")
    ctx = RunRequest(models=[str(model)], engine="torch", layers="all", out=tmp_path / "wc", seed=1, data=str(data),
                     options={"words": "cat,river,mat", "knn": 3, "last_k": last_k}, cache=False)
    _, res = run_analysis("word_context", ctx)
    fig = next(iter(res["per_model"].values()))
    tok = AutoTokenizer.from_pretrained(str(model))
    net = AutoModel.from_pretrained(str(model)).eval()
    occ = []  # (word, {layer: vector}) by hand: tokens whose offsets overlap the word, averaged
    for t in texts:
        enc = tok([t], return_tensors="pt", return_offsets_mapping=True)
        offs = enc.pop("offset_mapping")[0].tolist()
        with torch.no_grad():
            res_hf = net(**enc, output_hidden_states=True)
        states = {"raw": net.get_input_embeddings()(enc["input_ids"])[0].detach().double().numpy(),
                  **{str(i): h[0].double().numpy() for i, h in enumerate(res_hf.hidden_states)}}
        found = sorted((m.start(), w, m.end()) for w in ("cat", "river", "mat")
                       for m in re.finditer(rf"\b{w}\b", t))
        for start, w, end in found:
            toks = [i for i, (a, b) in enumerate(offs) if b > a and a < end and b > start]
            occ.append((w, {k: v[toks].mean(0) for k, v in states.items()}))
    def share(vectors, words, k):
        total = 0.0
        for i in range(len(vectors)):
            sims = sorted(((-cos(vectors[i], vectors[j]), j) for j in range(len(vectors)) if j != i))[:k]
            total += sum(words[j] == words[i] for _, j in sims) / k
        return total / len(vectors)

    words = [w for w, _ in occ]
    rows = {r["layer"]: r["same_word_share"] for r in fig["tables"]["word_context_layers"]}
    for layer in ("raw", "0", "1", "2"):
        assert rows[layer] == pytest.approx(share([v[layer] for _, v in occ], words, 3), abs=1e-9), layer
    window = [str(i) for i in range(2 - last_k + 1, 3)]  # the tiny BERT has layers 0..2
    last = [sum(v[x] for x in window) / last_k for _, v in occ]
    assert rows[f"last{last_k}"] == pytest.approx(share(last, words, 3), abs=1e-9)
    if last_k == 1:  # the data tells adjacent windows apart: 0.7222 (layer 2) against 0.75 (layer 1)
        assert share([v["1"] for _, v in occ], words, 3) != pytest.approx(rows["last1"], abs=1e-6)
    # the raw lookup of a word is the same in every context: its other occurrences come first
    # (cat x5, river x4: 3 of 3 neighbours; mat x3: 2 of 3)
    assert rows["raw"] == pytest.approx((5 + 4 + 3 * 2 / 3) / 12)
    assert fig["summary"]["occurrences"] == len(occ) == 12
