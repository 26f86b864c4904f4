"""similarity: how alike are two layers, or two models, on the same texts?

Linear CKA (Kornblith et al. 2019) and its unbiased version (Song et al.
2012 HSIC estimator) between every pair of layers of a model, and between the
layers of two models; mutual k-NN agreement (FAISS) between them; SVCCA, PWCCA,
orthogonal Procrustes distance and RSA (``--indices``), and every index's
permutation-calibrated score (``--permutations``; analyses/similarity_indices.py).

Inputs: one or two LayerStores (``--store``, ``--store-b``), read as memory
maps in row blocks, so a corpus larger than memory works; or ``--model``(s)
plus ``--data`` texts (default: the English side of the built-in zh-en problems, one language, so
CKA does not mostly measure a language split; ``--language zh`` or ``both`` for the others),
extracted through the cached vectors. Two stores must hold the same texts in
the same order (checked by ids and a hash of the texts).
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import numpy as np

from layerscope.analyses.similarity_indices import as_rows, check_same_tokens
from layerscope.analyses.base import Analysis, AnalysisMetadata, Context, ModelOutput, ModelRun, Option, register
from layerscope.errors import InputError
from layerscope.report.figures import Figures, HeatMap, Listing
from layerscope.report.similarity_figs import subtitle
from layerscope.progress import track

ROW_BLOCK = 16384


def cka_matrix(get_a, layers_a: list[str], get_b, layers_b: list[str], n: int, *, unbiased: bool = True,
               block: int = ROW_BLOCK) -> tuple[np.ndarray, np.ndarray | None]:
    """Linear CKA (and unbiased CKA) between every layer of A and every layer of B.

    ``get_a(layer)`` returns an ``[n, d]`` array (a memmap is fine). Linear
    CKA streams row blocks through one :class:`LinearCKAAccumulator` per pair,
    so only ``block`` rows of each layer are in memory at a time. When A and B
    are the same model (``get_b is get_a``), the matrix is symmetric and only
    the upper triangle is computed.
    """
    from layerscope.metrics.cka import LinearCKAAccumulator, unbiased_cka

    same = get_b is get_a and layers_a == layers_b
    pairs = [(i, j) for i in range(len(layers_a)) for j in range(len(layers_b)) if not same or j >= i]
    accs = {p: LinearCKAAccumulator() for p in pairs}
    for r0 in track(range(0, n, block), "linear CKA: row blocks"):
        blocks_a = {la: np.asarray(get_a(la)[r0:r0 + block]) for la in layers_a}
        blocks_b = blocks_a if same else {lb: np.asarray(get_b(lb)[r0:r0 + block]) for lb in layers_b}
        for (i, j), acc in accs.items():
            acc.update(blocks_a[layers_a[i]], blocks_b[layers_b[j]])
    lin = np.full((len(layers_a), len(layers_b)), np.nan)
    unb = np.full_like(lin, np.nan) if unbiased else None
    for (i, j), acc in track(list(accs.items()), "unbiased CKA: layer pairs" if unbiased else "CKA: layer pairs"):
        try:
            lin[i, j] = acc.result()
        except ValueError:  # a layer without variance (e.g. a constant raw lookup): CKA undefined
            pass
        if unbiased:
            try:
                unb[i, j] = unbiased_cka(get_a(layers_a[i]), get_b(layers_b[j]))
            except ValueError:
                pass
        if same:
            lin[j, i] = lin[i, j]
            if unbiased:
                unb[j, i] = unb[i, j]
    return lin, unb


def knn_matrix(get_a, layers_a, get_b, layers_b, *, k: int, seed: int = 0, ann_threshold: int = 50_000,
               device: str = "auto") -> np.ndarray:
    """Mutual k-NN overlap between every layer of A and every layer of B (FAISS neighbours)."""
    from layerscope.index.search import self_knn
    from layerscope.index.vector_index import normalize
    from layerscope.metrics.neighbors import mutual_knn

    cache: dict[tuple[str, str], np.ndarray] = {}

    def nbrs(side: str, get, layer: str) -> np.ndarray:
        key = ("a" if get is get_a else side, layer)
        if key not in cache:
            cache[key] = self_knn(normalize(get(layer)), k, seed=seed, ann_threshold=ann_threshold, device=device)
        return cache[key]

    out = np.zeros((len(layers_a), len(layers_b)))
    for i, la in enumerate(track(layers_a, "mutual k-NN: layers")):
        for j, lb in enumerate(layers_b):
            out[i, j] = mutual_knn(nbrs("a", get_a, la), nbrs("b", get_b, lb))
    return out


def matrix_rows(lin, unb, knn, layers_a, layers_b) -> list[dict[str, Any]]:
    rows = []
    for i, la in enumerate(layers_a):
        for j, lb in enumerate(layers_b):
            rows.append({"layer_a": la, "layer_b": lb,
                         "linear_cka": None if np.isnan(lin[i, j]) else float(lin[i, j]),
                         "unbiased_cka": None if unb is None or np.isnan(unb[i, j]) else float(unb[i, j]),
                         "mutual_knn": None if knn is None else float(knn[i, j])})
    return rows


def texts_digest(ids: list[str], texts: list[str]) -> str:
    h = hashlib.sha256()
    for i, t in zip(ids, texts):
        h.update(i.encode())
        h.update(b"\x00")
        h.update(t.encode())
        h.update(b"\x01")
    return h.hexdigest()


def check_same_texts(a_label: str, a_ids, a_texts, b_label: str, b_ids, b_texts) -> None:
    if len(a_texts) != len(b_texts):
        raise InputError(f"{a_label} holds {len(a_texts):,} texts but {b_label} holds {len(b_texts):,}; "
                         "similarity compares the same texts: extract both from the same corpus")
    if texts_digest(a_ids, a_texts) != texts_digest(b_ids, b_texts):
        row = next(i for i, (x, y, u, v) in enumerate(zip(a_ids, b_ids, a_texts, b_texts)) if x != y or u != v)
        raise InputError(f"{a_label} and {b_label} differ at row {row} (ids {a_ids[row]!r} vs {b_ids[row]!r}); "
                         "similarity compares the same texts in the same order: extract both from one corpus")


def best_pairs(figs: dict[str, Any], names) -> list[dict[str, Any]]:
    """Each index's best layer pair, calibrated against the maximum of the null over every pair."""
    return [{"index": "Procrustes similarity (1 - distance / 2)" if k == "procrustes" else _NAMES[k],
             **figs[f"{k}_best"]} for k in names if figs.get(f"{k}_best")]


def _store_layers(store, spec: str) -> list[str]:
    if spec in (None, "all"):
        return store.layers
    from layerscope.vocab.layers import resolve_layers

    wanted = resolve_layers(spec, store.manifest.num_layers)
    missing = [w for w in wanted if w not in store.layers]
    if missing:
        raise InputError(f"layers {', '.join(missing)} are not in {store.path} (it holds {', '.join(store.layers)})")
    return wanted


def _label(manifest, fallback: str) -> str:
    return manifest.source.alias or manifest.source.spec or fallback


def _maps(value: str, name: str, markdown: bool = False, *, scale=(0.0, 1.0), caption: str = "",
          zlabel: str = "") -> tuple[HeatMap, HeatMap]:
    """One figure between the layers of each model, and between the layers of two models (the cross block)."""
    return (HeatMap(value, value, title=f"{name} between layers: {{model}} ({{about}})", zlabel=zlabel or name,
                    caption=caption or f"{name} between every two layers' vectors of {{n}} texts.", scale=scale,
                    markdown=markdown),
            HeatMap(value, f"cross_{value}", title=f"{name}: {{model_a}} vs {{model_b}} ({{about}})",
                    zlabel=zlabel or name, block="cross", rows="layers_a", cols="layers_b",
                    ylabel="layer of {model_a}", xlabel="layer of {model_b}",
                    caption=caption or "Every layer of one model against every layer of the other.",
                    scale=scale, markdown=markdown))


_LINEAR, _UNBIASED, _KNN = _maps("linear_cka", "linear CKA", True), _maps("unbiased_cka", "unbiased CKA"), \
    _maps("mutual_knn", "mutual k-NN")

_RAW_CAPTIONS = {
    "svcca": ("SVCCA", "mean canonical correlation of the top singular directions keeping 99% of each layer's "
                       "variance (Raghu et al. 2017), on {index_rows} rows; CCA fits as many directions as the "
                       "narrower side keeps, so it is near 1 for any two layers when that is not far below the "
                       "rows: read its calibrated map"),
    "pwcca": ("PWCCA", "canonical correlations weighted by the share of the layer each direction accounts for "
                       "(Morcos et al. 2018), on {index_rows} rows; biased towards 1 like SVCCA"),
    "procrustes": ("Procrustes distance", "orthogonal Procrustes distance 2 - 2||X^T Y||_* of the centred layers at "
                                          "unit Frobenius norm (Ding et al. 2021; 0: one is a rotation of the "
                                          "other), on {index_rows} rows"),
    "rsa": ("RSA", "Spearman correlation of the two layers' dissimilarity matrices ({rdm} distance between "
                   "texts, as rsatoolbox computes them), on {index_rows} rows"),
}
_NAMES = {"linear_cka": "linear CKA", "debiased_cka": "debiased CKA", "mutual_knn": "mutual k-NN",
          **{k: v[0] for k, v in _RAW_CAPTIONS.items()}}
_EXTRA_MAPS = tuple(m for key, (name, cap) in _RAW_CAPTIONS.items()
                    for m in _maps(key, name, scale=None, caption=cap + "."))
_CALIBRATED_MAPS = tuple(
    m for key, name in _NAMES.items()
    for m in _maps(f"{key}_calibrated", f"{name}, calibrated", zlabel="calibrated score",
                   caption=f"{name} against a row-shuffled null ({{permutations}} permutations of one side's rows, "
                           "Groger et al. 2026): (score - tau) / (1 - tau), 0 where the score does not beat the "
                           "null's 95th percentile tau, so width, depth and the rows' count stop inflating it" +
                           (" (the Procrustes similarity ||X^T Y||_* is calibrated)" if key == "procrustes" else "")
                           + "."))

# What the reports show: PNG, report.md, report.html and the console all draw this one declaration (one colour
# scale for every heat map of the run, so equal colours are equal values across them).
FIGURES = Figures(
    preface="Texts: {data.origin}; {about}.",
    sentence="Linear CKA between layers. Mean CKA between adjacent layers {mean_adjacent_cka:.3g}; first vs last "
             "{first_last_cka:.3g} ({n} texts; mutual {knn_k}-NN).",
    summary_numbers=("mean_adjacent_cka", "first_last_cka", "n", "knn_k"),
    listings=(Listing("best_calibrated", "Best pair of different layers per index, calibrated against the maximum "
                      "over every pair of the row-shuffled null",
                      item="{index}: layers {layer_a} and {layer_b}, score {score:.3f}, calibrated {calibrated:.3f} "
                           "(p = {p:.3g})", limit=10),),
    heatmaps=(_LINEAR[0], _UNBIASED[0], _KNN[0], _LINEAR[1], _UNBIASED[1], _KNN[1], *_EXTRA_MAPS,
              *_CALIBRATED_MAPS),
    about=subtitle,
)


@register
class Similarity(Analysis):
    metadata = AnalysisMetadata(
        name="similarity",
        description="How alike are the layers of a model, or of two models? Linear CKA, unbiased CKA, mutual k-NN, "
                    "SVCCA, PWCCA, Procrustes, RSA, each calibrated against a row-shuffled null.",
        inputs=("texts",),
        main_score="mean_adjacent_cka",
        default_poolings=("mean",),
        default_data="generated English problems (the English side of zh-en)",
        options=(
            Option("store", str, None, "a LayerStore to read instead of running --model"),
            Option("store_b", str, None, "a second LayerStore (same texts) to compare with --store"),
            Option("n", int, 500, "built-in problems used as texts when no --data is given"),
            Option("language", str, "en", "without --data: which side of the built-in zh-en problems (one "
                   "language, so CKA does not mostly measure the language split; 'both' mixes them)",
                   choices=("en", "zh", "both")),
            Option("knn", int, 10, "k for mutual k-NN (0 to skip)"),
            Option("no_unbiased", bool, False, "skip the unbiased CKA (one more pass over the data per pair)"),
            Option("device", str, "auto", "where FAISS runs: auto, cpu or gpu", choices=("auto", "cpu", "gpu")),
            Option("tokens", bool, False, "compare token vectors (every non-special token; a --store made with "
                   "extract --tokens) instead of pooled ones"),
            Option("max_tokens", int, 4000, "with --tokens: a seeded sample of at most this many tokens"),
            Option("indices", str, "none", "indices beside CKA and k-NN: comma list of svcca, pwcca, procrustes, "
                   "rsa, or 'all' (minutes for 500 texts of a 384-wide model: an SVD per permutation and pair)"),
            Option("permutations", int, 20, "row permutations of the null every index is calibrated against "
                   "(0: no calibration; p is at least 1 / (permutations + 1))"),
            Option("max_rows", int, 1000, "the indices beyond CKA and the calibration read a seeded sample of at "
                   "most this many rows (texts or tokens)"),
            Option("rdm", str, "correlation", "RSA's dissimilarity between rows", choices=("correlation", "euclidean")),
        ),
        figures=FIGURES,
    )

    def prepare(self, ctx: Context):
        from layerscope.store.store import LayerStore

        o = self.options(ctx)
        if o.knn < 0:
            raise InputError(f"--knn must be >= 0, got {o.knn}")
        from layerscope.analyses.similarity_indices import check_rows, parse_indices

        parse_indices(o.indices)
        check_rows(o, 0)
        pooling = (ctx.spec.poolings or ["mean"])[0]
        if ctx.spec.poolings and len(ctx.spec.poolings) > 1:
            raise InputError("similarity compares layers at one pooling; give one --pooling")
        if o.store_b and not o.store:
            raise InputError("--store-b needs --store")
        if o.store:
            if ctx.spec.data:
                raise InputError("give --store or --data, not both (a store already holds its texts)")
            a = LayerStore.open(o.store)
            b = LayerStore.open(o.store_b) if o.store_b else None
            for st in (a, b):
                if st is not None and o.tokens and not st.token_layers:
                    raise InputError(f"{st.path} holds no token vectors; make it with layerscope extract ... --tokens")
                if st is not None and not o.tokens and pooling not in st.poolings:
                    raise InputError(f"{st.path} holds poolings {', '.join(st.poolings)}, not '{pooling}'; "
                                     "choose one with --pooling")
            if b is not None:
                check_same_texts(f"--store {a.path}", a.ids(), a.texts(), f"--store-b {b.path}", b.ids(), b.texts())
                if o.tokens:
                    la, lb = a.tokens(a.token_layers[0]), b.tokens(b.token_layers[0])
                    check_same_tokens(f"--store {a.path}", la.offsets, la.ids, f"--store-b {b.path}", lb.offsets,
                                      lb.ids)
            if a.n < 4:
                raise InputError(f"{a.path} holds {a.n} texts; CKA needs at least 4")
            return {"mode": "stores", "a": a, "b": b, "pooling": pooling, "label": a.path.name}
        if ctx.spec.data:
            from layerscope.data.corpus import read_corpus

            records, stats = read_corpus(ctx.spec.data)
            texts = [r.text for r in records]
            for w in stats.warnings():
                ctx.say(w)
            origin, label = ctx.spec.data, Path(str(ctx.spec.data)).name
        else:
            from layerscope.data.bilingual import generate_pairs

            ps = generate_pairs(o.n, ctx.spec.seed)
            sides = {"en": ([p.target for p in ps], "English"), "zh": ([p.source for p in ps], "Chinese"),
                     "both": ([p.source for p in ps] + [p.target for p in ps], "Chinese and English")}
            texts, language = sides[o.language]
            origin = f"generated zh-en problems, {language} (n={len(texts)} texts, seed={ctx.spec.seed})"
            label = f"generated {language} ({len(texts)} texts)"
            ctx.say(f"no --data or --store given: comparing layers on {len(texts)} texts of {origin}; "
                    "give --data FILE for your own texts")
        if len(texts) < 4:
            raise InputError(f"{origin}: {len(texts)} texts; CKA needs at least 4")
        return {"mode": "models", "texts": texts, "origin": origin, "pooling": pooling, "label": label}

    # -- per model (or store) ----------------------------------------------
    def _figures(self, ctx: Context, get, layers: list[str], n: int) -> dict[str, Any]:
        o = self.options(ctx)
        lin, unb = cka_matrix(get, layers, get, layers, n, unbiased=not o.no_unbiased)
        k = min(o.knn, n - 1)
        knn = knn_matrix(get, layers, get, layers, k=k, seed=ctx.spec.seed, device=o.device) if k else None
        adjacent = [lin[i, i + 1] for i in range(len(layers) - 1) if not np.isnan(lin[i, i + 1])]
        figs = {"summary": {"mean_adjacent_cka": float(np.mean(adjacent)) if adjacent else None,
                            "first_last_cka": None if np.isnan(lin[0, -1]) else float(lin[0, -1]), "n": n,
                            "knn_k": k},
                "layers": layers, "linear_cka": lin, "unbiased_cka": unb, "mutual_knn": knn,
                "tables": {"similarity_layers": matrix_rows(lin, unb, knn, layers, layers)}}
        side, rows = self._side(ctx, get, layers, n, "the model")
        more, names = self._indices(ctx, side, layers, side, layers, rows, same=True)
        figs.update(more)
        figs["summary"].update(self._index_summary(ctx, more, names, rows))
        figs["best_calibrated"] = best_pairs(more, names)
        figs["tables"]["similarity_indices"] = as_rows(more, names, layers, layers)
        return figs

    def _side(self, ctx: Context, get, layers, n: int, what: str):
        from layerscope.analyses.similarity_indices import prepare_side, sample_rows

        o = self.options(ctx)
        rows = sample_rows(n, o.max_rows, ctx.spec.seed)
        k = min(o.knn, len(rows) - 1) if o.permutations else 0
        return prepare_side(get, layers, rows, k=k, rdm=o.rdm, what=what), rows

    def _indices(self, ctx: Context, side_a, layers_a, side_b, layers_b, rows, *, same: bool):
        from layerscope.analyses.similarity_indices import index_matrices, parse_indices
        from layerscope.metrics.representation import permutations

        o = self.options(ctx)
        extra = parse_indices(o.indices)
        cal = ("linear_cka",) + (() if o.no_unbiased else ("debiased_cka",)) + \
            (("mutual_knn",) if o.knn and len(rows) > 1 else ()) if o.permutations else ()
        names = cal + extra
        perms = permutations(len(rows), o.permutations, ctx.spec.seed)
        return index_matrices(side_a, layers_a, side_b, layers_b, names=names, perms=perms, same=same), names

    def _index_summary(self, ctx: Context, figs, names, rows) -> dict[str, Any]:
        o = self.options(ctx)
        return {"index_rows": len(rows), "permutations": o.permutations, "rdm": o.rdm,
                "indices": ", ".join(_NAMES[k] for k in names) or "none"}

    def stored_sources(self, ctx: Context, data):
        if data["mode"] != "stores":
            return None
        return [(str(st.path), st.manifest.source, f"{st.spec.model_key}|{st.spec.corpus_sha256}|"
                 f"{st.record.created}") for st in (data["a"], data["b"]) if st is not None]

    def offline(self, ctx: Context, data):
        if data["mode"] != "stores":
            return None
        pooling = data["pooling"]
        per_model, meta = {}, {}
        for key in ("a", "b"):
            st = data[key]
            if st is None:
                continue
            layers = _store_layers(st, ctx.spec.layers)
            label = _label(st.manifest, st.path.name)
            label = label if label not in per_model else f"{label}#b"
            get, n, ids = lambda la, st=st: st[pooling, la], st.n, None
            if self.options(ctx).tokens:
                tl = st.tokens(layers[0])
                get, n = _token_getter(ctx, self.options(ctx), lambda la, st=st: st.tokens(la).take, tl.special)
                ids = (np.asarray(tl.offsets), np.asarray(tl.ids))
            figures = self._figures(ctx, get, layers, n)
            figures["store"] = str(st.path)
            per_model[label] = ModelOutput(figures, kept=(get, layers, n, ids))
            meta[label] = {"spec": str(st.path), "manifest": st.manifest.to_dict(), "engine": {"engine": st.spec.engine}}
        return per_model, meta

    def compute(self, ctx: Context, run: ModelRun, data) -> ModelOutput:
        from layerscope.analyses.common import layers_for

        layers = layers_for(ctx, run)
        pooling = data["pooling"]
        o = self.options(ctx)
        n = len(data["texts"])
        if o.tokens:
            from layerscope.extraction.token_embed import embed_tokens

            spec = ctx.spec
            tv = embed_tokens(run.engine, data["texts"], layers, batch_tokens=spec.batch_tokens,
                              max_length=spec.max_length)
            get, n = _token_getter(ctx, o, lambda la: tv.layers[la].__getitem__, tv.special)
            ids = (tv.offsets, tv.ids)
        else:
            vecs = ctx.vectors(run, data["texts"], layers=layers, poolings=[pooling], tag="similarity")
            get, ids = (lambda la, v=vecs: v[pooling, la]), None
        figures = self._figures(ctx, get, layers, n)
        figures["summary"]["vectors"] = "tokens" if o.tokens else pooling
        return ModelOutput(figures, kept=(get, layers, n, ids))

    def combine(self, ctx: Context, per_model, data) -> dict[str, Any]:
        kept = [(name, out.kept) for name, out in getattr(per_model, "outputs", {}).items() if out.kept is not None]
        info = {"origin": data.get("origin") or str(data.get("a").path), "pooling": data["pooling"],
                "label": data.get("label"), "tokens": bool(self.options(ctx).tokens)}
        if len(kept) < 2:
            return {"data": info}
        (name_a, (get_a, la, n, ids_a)), (name_b, (get_b, lb, n_b, ids_b)) = kept[0], kept[1]
        if ids_a is not None and ids_b is not None:  # token rows: the same tokens on both sides, first
            check_same_tokens(name_a, *ids_a, name_b, *ids_b)
        if n != n_b:
            raise InputError(f"{name_a} has {n:,} rows but {name_b} has {n_b:,}; similarity compares the same rows")
        o = self.options(ctx)
        lin, unb = cka_matrix(get_a, la, get_b, lb, n, unbiased=not o.no_unbiased)
        k = min(o.knn, n - 1)
        knn = knn_matrix(get_a, la, get_b, lb, k=k, seed=ctx.spec.seed, device=o.device) if k else None
        rows = [{"model_a": name_a, "model_b": name_b, **r} for r in matrix_rows(lin, unb, knn, la, lb)]
        side_a, sample = self._side(ctx, get_a, la, n, name_a)
        side_b, _ = self._side(ctx, get_b, lb, n, name_b)
        more, names = self._indices(ctx, side_a, la, side_b, lb, sample, same=False)
        cross = {"model_a": name_a, "model_b": name_b, "layers_a": la, "layers_b": lb,
                 "linear_cka": lin, "unbiased_cka": unb, "mutual_knn": knn, **more,
                 **self._index_summary(ctx, more, names, sample), "best_calibrated": best_pairs(more, names)}
        return {"data": info, "cross": cross,
                "tables": {"similarity_cross": rows, "similarity_cross_indices": [
                    {"model_a": name_a, "model_b": name_b, **r} for r in as_rows(more, names, la, lb)]}}


def token_sample(special: np.ndarray, max_tokens: int, seed: int) -> np.ndarray:
    """Positions of the non-special tokens on the token axis; a seeded sample of ``max_tokens`` of them
    (kept in token order) when there are more. Two models of one tokenizer get the same tokens."""
    rows = np.nonzero(np.asarray(special) == 0)[0]
    if len(rows) > max_tokens:
        rows = np.sort(np.random.default_rng(seed).choice(rows, max_tokens, replace=False))
    return rows


def _token_getter(ctx: Context, o, take, special):
    """(layer -> float32 [tokens, hidden] of the sampled tokens, their count); ``take(layer)`` reads rows."""
    rows = token_sample(special, o.max_tokens, ctx.spec.seed)
    if len(rows) < 4:
        raise InputError(f"{len(rows)} non-special tokens; CKA needs at least 4")
    cache: dict[str, np.ndarray] = {}

    def get(layer: str) -> np.ndarray:
        if layer not in cache:
            cache[layer] = np.asarray(take(layer)(rows), dtype=np.float32)
        return cache[layer]

    return get, len(rows)
