"""``run patch``, ``run steer`` and ``run patchscope`` on tiny models of an encoder (BERT) and two decoder families
(GPT-2, Qwen2), held to an independent PyTorch computation (tests/intervene_reference.py: the Hugging Face model
with forward hooks written there, one whole run per cell) and, for the decoders' patching, to pyvene; every layer.
Bad input is one line before any layer runs."""

from __future__ import annotations

import json

import numpy as np
import pytest

from intervene_reference import Reference, add_everywhere, cosine, log_softmax, mean_pool, replace_at
from layerscope.analyses.base import RunRequest, run_analysis
from layerscope.errors import InputError

# swaps of one single-token word each in every tiny tokenizer (" on" and " the"), so positions align
PATCH_PAIRS = [
    {"clean": "The cat sat on the mat.", "corrupted": "The cat sat the on mat.", "target": " on", "foil": " the"},
    {"clean": "A dog ran on the road.", "corrupted": "A dog ran the the road.", "target": " the", "foil": " on"},
    {"clean": "The water flows on the stone.", "corrupted": "The water flows the on stone.", "target": " on",
     "foil": " the"},
]
STEER_PAIRS = [
    {"positive": "The film was a delight from the first scene.", "negative": "The film was a dull mess from the start."},
    {"positive": "I loved the warm and funny characters.", "negative": "I hated the cold and boring characters."},
    {"positive": "What a wonderful concert, full of joy.", "negative": "What a terrible concert, without energy."},
    {"positive": "The service was friendly and quick.", "negative": "The service was rude and slow."},
]
SOURCES = ["The quick brown fox jumps over the lazy dog.", "Water boils at 100 degrees Celsius.", "Hi"]


@pytest.fixture(scope="module")
def exports(tiny_export):
    return {family: tiny_export(family) for family in ("bert", "gpt2", "qwen2")}


def _jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _run(name, export, tmp_path, engine="ort", **kw):
    out = run_analysis(name, RunRequest(models=(str(export),), engine=engine,
                                        out=tmp_path / f"out-{name}-{engine}", **kw))
    return next(iter(out.results["per_model"].values()))


def _tokens(tok, text):
    return {k: np.asarray(v)[None] for k, v in tok(text).items() if k in ("input_ids", "attention_mask",
                                                                           "token_type_ids")}


# ---------------------------------------------------------------------------------------------------- patching

def _naive_patch(ref: Reference, tok, pair, metric: str, decoder: bool):
    """Per (layer, position) the metric of the corrupted run with the clean state written there: one whole run
    each (the naive count), plus the clean and corrupted runs' metric."""
    clean, corr = _tokens(tok, pair["clean"]), _tokens(tok, pair["corrupted"])
    clean_states, clean_logits = ref.run(clean)
    target = tok(pair["target"], add_special_tokens=False)["input_ids"][0]
    foil = tok(pair["foil"], add_special_tokens=False)["input_ids"][0]
    reference = mean_pool(clean_states[-1][0])

    def judge(states, logits):
        if not decoder:
            return cosine(mean_pool(states[-1][0]), reference)
        z = logits[0, -1]
        return float(z[target] - z[foil]) if metric == "logit_diff" else float(np.exp(log_softmax(z)[target]))

    length = clean["input_ids"].shape[1]
    grid = np.zeros((ref.num_layers + 1, length))
    for layer in range(ref.num_layers + 1):
        for t in range(length):
            grid[layer, t] = judge(*ref.run(corr, layer, replace_at([t], clean_states[layer][0])))
    return grid, judge(clean_states, clean_logits), judge(*ref.run(corr))


@pytest.mark.parametrize("family,metric,engine", [("bert", "similarity", "ort"), ("gpt2", "logit_diff", "ort"),
                                                  ("qwen2", "prob", "ov")])
def test_patching_equals_one_hooked_run_per_cell(family, metric, engine, exports, tiny_model, tmp_path):
    """Every pair, layer and position: the patched metric equals the hooked model's; the heat map is the ratio of
    the sums; the suffix ran once per layer and pair (a position batch), the naive count once per cell."""
    from transformers import AutoTokenizer

    from layerscope.decoding.head_graph import head_reader
    from layerscope.decoding.patching import HeadMetric, Similarity, columns, patch, run_pairs, tokenize_pairs
    from layerscope.data.contrast import read_patch_pairs
    from layerscope.engines.base import create_engine

    data = _jsonl(tmp_path / "pairs.jsonl", PATCH_PAIRS)
    model = tiny_model(family)
    ref, tok = Reference(model, family), AutoTokenizer.from_pretrained(str(model))
    decoder = family != "bert"
    naive = [_naive_patch(ref, tok, p, metric, decoder) for p in PATCH_PAIRS]
    eng = create_engine(engine, str(exports[family]))
    runs = tokenize_pairs(eng, read_patch_pairs(data), metric=metric)
    cols = columns(runs, "position")
    if decoder:
        judge = HeadMetric(head_reader(eng), metric)
    else:
        run_pairs(eng, runs)
        refs = np.stack([np.asarray(eng.run(r.clean, ["2"], ["mean"])["mean"][0, 0], np.float64) for r in runs])
        judge = Similarity(eng.manifest, "mean", refs, "")
    run_pairs(eng, runs)
    got = patch(eng, runs, judge, [0, 1, 2], cols, rows=4)
    scale = max(1.0, max(np.abs(g).max() for g, _, _ in naive))
    for i, (grid, clean, corr) in enumerate(naive):
        length = grid.shape[1]
        offset = len(cols.labels) - length  # the pairs differ in length: aligned at their last token
        np.testing.assert_allclose(got.patched[i, :, offset:], grid, atol=2e-5 * scale, rtol=0, err_msg=f"pair {i}")
        assert np.isnan(got.patched[i, :, :offset]).all()
        assert got.clean[i] == pytest.approx(clean, abs=2e-5 * scale)
        assert got.corrupted[i] == pytest.approx(corr, abs=2e-5 * scale)
    cells = sum(g.shape[1] for g, _, _ in naive)
    assert got.naive_runs == 3 * cells and got.suffix_rows == 2 * cells
    assert got.suffix_runs == sum(2 * -(-g.shape[1] // 4) for g, _, _ in naive)  # layers 0 and 1; layer 2 runs none
    eng.close()
    # the analysis: each cell is sum(patched - corrupted) / sum(clean - corrupted) over the pairs that reach it
    fig = _run("patch", exports[family], tmp_path, engine=engine, data=str(data), options={"metric": metric,
                                                                                            "batch": 4})
    grid = np.array([[np.nan if v is None else v for v in row] for row in fig["grids"]["effect"]], dtype=float)
    longest = max(g.shape[1] for g, _, _ in naive)
    for layer in range(3):
        for c in range(longest):
            have = [(g[layer, c - (longest - g.shape[1])], cl, co) for g, cl, co in naive
                    if c >= longest - g.shape[1]]
            want = sum(p - co for p, _, co in have) / sum(cl - co for _, cl, co in have)
            assert grid[layer, c] == pytest.approx(want, abs=1e-4 * max(1.0, abs(want))), (layer, c)
    assert fig["columns"][-1] == "last" and fig["summary"]["naive_runs"] == 3 * cells
    rows = {(r["layer"], r["column"]): r for r in fig["tables"]["patch_cells"]}
    row = rows[("1", "last")]
    assert row["effect_ci_low"] <= row["effect"] + 1e-9 and row["effect"] <= row["effect_ci_high"] + 1e-9
    if decoder:  # the last position patched at the last layer is the clean run's next token: effect 1
        assert rows[("2", "last")]["effect"] == pytest.approx(1.0, abs=1e-5)


@pytest.mark.parametrize("family", ["gpt2", "qwen2"])
def test_decoder_patching_equals_pyvene(family, exports, tiny_model, tmp_path):
    """pyvene's interchange intervention at each block's input (our layer j) and every position gives the same
    logit difference as the resume graphs."""
    pv = pytest.importorskip("pyvene")
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from layerscope.data.contrast import read_patch_pairs
    from layerscope.decoding.head_graph import head_reader
    from layerscope.decoding.patching import HeadMetric, columns, patch, run_pairs, tokenize_pairs
    from layerscope.engines.base import create_engine

    data = _jsonl(tmp_path / "pairs.jsonl", PATCH_PAIRS[:1])
    model = tiny_model(family)
    net = AutoModelForCausalLM.from_pretrained(str(model), attn_implementation="eager").eval()
    tok = AutoTokenizer.from_pretrained(str(model))
    pair = PATCH_PAIRS[0]
    clean, corr = tok(pair["clean"], return_tensors="pt"), tok(pair["corrupted"], return_tensors="pt")
    target = tok(pair["target"], add_special_tokens=False)["input_ids"][0]
    foil = tok(pair["foil"], add_special_tokens=False)["input_ids"][0]
    eng = create_engine("ort", str(exports[family]))
    runs = tokenize_pairs(eng, read_patch_pairs(data), metric="logit_diff")
    run_pairs(eng, runs)
    got = patch(eng, runs, HeadMetric(head_reader(eng), "logit_diff"), [0, 1], columns(runs, "position"))
    for layer in range(2):
        model_pv = pv.IntervenableModel({"layer": layer, "component": "block_input"}, model=net)
        for t in range(clean["input_ids"].shape[1]):
            with torch.inference_mode():
                _, out = model_pv({"input_ids": corr["input_ids"]}, [{"input_ids": clean["input_ids"]}],
                                  {"sources->base": ([[[t]]], [[[t]]])})
            z = out.logits[0, -1].float().numpy()
            assert got.patched[0, layer, t] == pytest.approx(float(z[target] - z[foil]), abs=2e-5), (layer, t)
    eng.close()


def test_patching_by_token_group(exports, tiny_model, tmp_path):
    """--by group: the changed tokens, those before and after them and the last token, each patched at once,
    equal the hooked model with those positions written."""
    from transformers import AutoTokenizer

    data = _jsonl(tmp_path / "pairs.jsonl", PATCH_PAIRS)
    model = tiny_model("gpt2")
    ref, tok = Reference(model, "gpt2"), AutoTokenizer.from_pretrained(str(model))
    fig = _run("patch", exports["gpt2"], tmp_path, data=str(data), options={"by": "group"})
    assert fig["columns"] == ["before", "changed", "after", "last"]
    sums = np.zeros((3, 4, 2))
    for pair in PATCH_PAIRS:
        clean, corr = _tokens(tok, pair["clean"]), _tokens(tok, pair["corrupted"])
        states, logits = ref.run(clean)
        t_id = tok(pair["target"], add_special_tokens=False)["input_ids"][0]
        f_id = tok(pair["foil"], add_special_tokens=False)["input_ids"][0]
        diff = lambda z: float(z[0, -1, t_id] - z[0, -1, f_id])  # noqa: E731
        base = diff(ref.run(corr)[1])
        ids_c, ids_r = clean["input_ids"][0], corr["input_ids"][0]
        changed = [t for t in range(len(ids_c)) if ids_c[t] != ids_r[t]]
        last = len(ids_c) - 1
        groups = [[t for t in range(min(changed))], changed, list(range(max(changed) + 1, last)), [last]]
        for layer in range(3):
            for g, where in enumerate(groups):
                if where:
                    sums[layer, g] += [diff(ref.run(corr, layer, replace_at(where, states[layer][0]))[1]) - base,
                                       diff(logits) - base]
    for layer in range(3):
        for g in range(4):
            if sums[layer, g, 1]:
                assert fig["grids"]["effect"][layer][g] == pytest.approx(sums[layer, g, 0] / sums[layer, g, 1],
                                                                         abs=1e-4), (layer, g)


# ---------------------------------------------------------------------------------------------------- steering

@pytest.mark.parametrize("family,method,engine", [("bert", "mean_diff", "ort"), ("gpt2", "pca", "torch")])
def test_steering_equals_hooks_adding_the_vector(family, method, engine, exports, tiny_model, tmp_path):
    """Vectors from the training pairs (numpy's mean difference; sklearn's PCA of the differences), added at each
    layer to each held-out text alone (ours: in one right-padded batch); the final embedding's projection and a
    decoder's KL (through PyTorch's head on the torch engine) equal the hooked model's."""
    from sklearn.decomposition import PCA
    from transformers import AutoTokenizer

    data = _jsonl(tmp_path / "pairs.jsonl", STEER_PAIRS)
    fig = _run("steer", exports[family], tmp_path, engine=engine, data=str(data),
               options={"method": method, "scales": "2"})
    model = tiny_model(family)
    ref, tok = Reference(model, family), AutoTokenizer.from_pretrained(str(model))
    decoder = family != "bert"
    pool = (lambda h: np.asarray(h[0, -1], np.float64)) if decoder else (lambda h: mean_pool(h[0]))
    held = set(fig["held_out"])
    train = [p for i, p in enumerate(STEER_PAIRS, 1) if i not in held]
    test = [p for i, p in enumerate(STEER_PAIRS, 1) if i in held]
    pos = np.stack([[pool(h) for h in ref.run(_tokens(tok, p["positive"]))[0]] for p in train], axis=1)
    neg = np.stack([[pool(h) for h in ref.run(_tokens(tok, p["negative"]))[0]] for p in train], axis=1)
    if method == "mean_diff":
        vectors = (pos - neg).mean(axis=1)
    else:
        vectors = []
        for p, n in zip(pos, neg):
            unit = PCA(n_components=1).fit(p - n).components_[0]
            mean = (p - n).mean(axis=0)
            vectors.append(unit * (unit @ mean))
        vectors = np.stack(vectors)
    gap = pos[-1].mean(axis=0) - neg[-1].mean(axis=0)
    unit, size = gap / np.linalg.norm(gap), np.linalg.norm(gap)
    rows = {(r["direction"], r["layer"]): r for r in fig["tables"]["steer_cells"]}
    for layer in range(3):
        moved, kls = [], []
        for p in test:
            inputs = _tokens(tok, p["negative"])
            base, base_logits = ref.run(inputs)
            got, logits = ref.run(inputs, layer, add_everywhere(2.0 * vectors[layer]))
            moved.append((pool(got[-1]) - pool(base[-1])) @ unit / size)
            kls.append(np.sum(np.exp(log_softmax(base_logits[0, -1])) * (log_softmax(base_logits[0, -1])
                                                                        - log_softmax(logits[0, -1]))))
        row = rows[("steer", str(layer))]
        assert row["projection"] == pytest.approx(np.mean(moved), abs=2e-4), layer
        assert fig["tables"]["steer_layers"][layer]["norm"] == pytest.approx(np.linalg.norm(vectors[layer]), rel=1e-4)
        if decoder:
            assert row["kl"] == pytest.approx(np.mean(kls), abs=1e-5), layer
        random = rows[("random", str(layer))]
        assert random["projection"] != pytest.approx(row["projection"])


def test_the_random_null_is_a_direction_per_text_and_equals_hooks_adding_it(exports, tiny_model):
    """The null adds each held-out text its own random direction, as long as the layer's vector: per text and
    layer, the final embedding's move equals the hooked model's with that direction added; the directions differ
    between texts (so the null's interval spans directions, not one draw); and a batch of 2 gives the figures of
    one batch of every copy."""
    from transformers import AutoTokenizer

    from layerscope.decoding.steering import estimate, pooled_by_layer, readout_of, steer
    from layerscope.engines.base import create_engine

    engine = create_engine("ort", exports["bert"])
    train, test = STEER_PAIRS[:2], STEER_PAIRS[2:] + STEER_PAIRS[:1]
    pos = pooled_by_layer(engine, [p["positive"] for p in train], "mean")
    neg = pooled_by_layer(engine, [p["negative"] for p in train], "mean")
    vectors = estimate(pos, neg, "mean_diff")
    readout = readout_of(engine.manifest, "mean", pos[-1], neg[-1])
    texts = [p["negative"] for p in test]
    layers, scale = [0, 1, 2], 3.0
    whole = steer(engine, texts, vectors, layers, [scale], readout, seed=5, rows=64)
    small = steer(engine, texts, vectors, layers, [scale], readout, seed=5, rows=2)
    np.testing.assert_array_equal(small.nulls, whole.nulls)
    np.testing.assert_allclose(small.projection, whole.projection, atol=1e-5)
    assert whole.nulls.shape == (3, len(texts), vectors.shape[1])

    model = tiny_model("bert")
    ref, tok = Reference(model, "bert"), AutoTokenizer.from_pretrained(str(model))
    for li, layer in enumerate(layers):
        norms = np.linalg.norm(whole.nulls[layer], axis=1)
        np.testing.assert_allclose(norms, np.linalg.norm(vectors[layer]), rtol=1e-9)
        units = whole.nulls[layer] / norms[:, None]
        assert np.abs(units @ units.T - np.eye(len(texts))).max() < 0.9, "texts share a null direction"
        for t, text in enumerate(texts):
            inputs = _tokens(tok, text)
            base, _ = ref.run(inputs)
            got, _ = ref.run(inputs, layer, add_everywhere(scale * whole.nulls[layer, t]))
            moved = (mean_pool(got[-1][0]) - mean_pool(base[-1][0])) @ readout.direction / readout.gap
            assert whole.projection[1, li, 0, t] == pytest.approx(moved, abs=2e-4), (layer, t)


def test_pca_direction_is_sklearns_first_component():
    from sklearn.decomposition import PCA

    from layerscope.metrics.intervention import mean_difference, pca_direction, random_direction

    rng = np.random.default_rng(3)
    pos, neg = rng.normal(size=(9, 5)) + [2, 0, 0, 1, 0], rng.normal(size=(9, 5))
    unit = PCA(n_components=1).fit(pos - neg).components_[0]
    got = pca_direction(pos, neg)
    mean = (pos - neg).mean(axis=0)
    np.testing.assert_allclose(got, unit * (unit @ mean), atol=1e-10)
    assert got @ mean > 0
    np.testing.assert_allclose(mean_difference(pos, neg), mean)
    assert np.linalg.norm(random_direction(5, 3.5, rng)) == pytest.approx(3.5)


# ---------------------------------------------------------------------------------------------------- Patchscope

@pytest.mark.parametrize("family,engine", [("gpt2", "ort"), ("bert", "ov")])
def test_patchscope_equals_hooks_placing_the_state(family, engine, exports, tiny_model, tmp_path):
    """Each source layer i and target layer j < L: the state placed in the target prompt by a hook, read by the
    head; target layer L: the logit lens (the final norm below the last layer, then the head)."""
    from transformers import AutoTokenizer

    from layerscope.decoding.patchscope import IDENTITY_PROMPT

    data = tmp_path / "sources.txt"
    data.write_text("\n".join(SOURCES) + "\n")
    fig = _run("patchscope", exports[family], tmp_path, engine=engine, data=str(data))
    model = tiny_model(family)
    ref, tok = Reference(model, family), AutoTokenizer.from_pretrained(str(model))
    special = set(tok.all_special_ids)
    num_layers = ref.num_layers
    top1 = np.zeros((len(SOURCES), num_layers + 1, num_layers + 1))
    prob = np.zeros_like(top1)
    target = _tokens(tok, IDENTITY_PROMPT)
    t = max(i for i, x in enumerate(target["input_ids"][0]) if x not in special)
    for s, text in enumerate(SOURCES):
        inputs = _tokens(tok, text)
        at = max(i for i, x in enumerate(inputs["input_ids"][0]) if x not in special)
        states, logits = ref.run(inputs)
        want = int(np.argmax(logits[0, at])) if family != "bert" else int(inputs["input_ids"][0, at])
        for i in range(num_layers + 1):
            h = states[i][0, at]
            for j in range(num_layers):
                z = ref.run(target, j, replace_at([t], h[None]))[1][0, t]
                top1[s, i, j], prob[s, i, j] = np.argmax(z) == want, np.exp(log_softmax(z)[want])
            z = ref.lens(h[None], i)[0]
            top1[s, i, num_layers], prob[s, i, num_layers] = np.argmax(z) == want, np.exp(log_softmax(z)[want])
    np.testing.assert_allclose(np.array(fig["grids"]["top1"]), top1.mean(axis=0), atol=1e-12)
    np.testing.assert_allclose(np.array(fig["grids"]["prob"]), prob.mean(axis=0), atol=1e-5)
    lens = [r["lens"] for r in fig["tables"]["patchscope_layers"]]
    np.testing.assert_allclose(lens, top1.mean(axis=0)[:, num_layers])
    assert fig["target_layers"][-1] == f"{num_layers} (lens)"


# ---------------------------------------------------------------------------------------------------- bad input

def test_bad_input_is_one_line_before_any_layer_runs(tiny_export, tmp_path):
    export = tiny_export("gpt2", to=tmp_path / "gpt2")  # a fresh copy: no derived graph in it yet
    uneven = _jsonl(tmp_path / "uneven.jsonl", [PATCH_PAIRS[0], {"clean": "The cat sat on the mat.",
                                                                  "corrupted": "A dog sat on the mat today.",
                                                                  "target": " on", "foil": " the"}])
    cases = [
        ("patch", {"data": str(uneven)}, "line 2: the clean text has"),
        ("patch", {"data": str(_jsonl(tmp_path / "p.jsonl", PATCH_PAIRS)), "layers": "5"}, "--layers 5"),
        ("steer", {"data": str(_jsonl(tmp_path / "s.jsonl", STEER_PAIRS)),
                   "options": {"vector": str(tmp_path / "v.npy")}}, "a vector of shape (33,)"),
        ("steer", {"data": str(_jsonl(tmp_path / "s.jsonl", STEER_PAIRS)), "options": {"scales": "1,x"}},
         "--scales 1,x"),
    ]
    np.save(tmp_path / "v.npy", np.ones(33, np.float32))
    for name, kw, said in cases:
        with pytest.raises(InputError) as err:
            run_analysis(name, RunRequest(models=[str(export)], engine="ort", out=tmp_path / "out", **kw))
        assert said in str(err.value) and "\n" not in str(err.value), str(err.value)
    assert not list(export.glob("model.from-*")) and not (export / "head-logits.onnx").exists()
    bert = tiny_export("bert", to=tmp_path / "bert")
    with pytest.raises(InputError, match="decoders only"):
        run_analysis("patch", RunRequest(models=[str(bert)], engine="ort", out=tmp_path / "out2",
                                         data=str(_jsonl(tmp_path / "p.jsonl", PATCH_PAIRS)),
                                         options={"metric": "logit_diff"}))


def test_pair_files_are_checked_line_by_line(tmp_path):
    from layerscope.data.contrast import read_patch_pairs, read_steer_pairs

    bad = {
        '{"clean": "a b", "corrupted": "a b"}': ":1: clean and corrupted are the same text",
        '{"clean": "a b", "corrupted": "a c", "target": " b"}': ":1: give both 'target' and 'foil'",
        '{"clean": "a b", "corrupted": "a c", "other": 3}': ":1: 'other' must be a text, got int",
        '{"clean": "a b", "corrupted": "a c", "other": "x"}\n{"clean": "a b", "corrupted": "a d"}':
            ":2: this pair has no 'other' but others do",
        '["a", "b"]': ":1: each line must be a JSON object",
    }
    for text, said in bad.items():
        path = tmp_path / "p.jsonl"
        path.write_text(text + "\n")
        with pytest.raises(InputError, match=said.replace("(", r"\(")):
            read_patch_pairs(path)
    path.write_text('{"positive": "good", "negative": "good"}\n')
    with pytest.raises(InputError, match=":1: positive and negative are the same text"):
        read_steer_pairs(path)
    assert len(read_patch_pairs()) == 16 and len(read_steer_pairs()) == 30  # the built-in sets
