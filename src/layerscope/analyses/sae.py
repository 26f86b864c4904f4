"""sae: a sparse autoencoder saved by SAELens, run over a token store's layer.

``--sae DIR`` (SAELens's ``save_model`` folder: cfg.json + sae_weights.safetensors; metrics/sae_files.py) and
``--store STORE`` (a LayerStore made with ``extract --tokens``). Before any token is read: the SAE's hook must
be a residual-stream state the store holds (TransformerLens names: ``blocks.l.hook_resid_pre`` = our layer l,
``blocks.l.hook_resid_post`` = our layer l + 1; metrics/sae.py ``resid_layer``), its width the store's hidden
size, its normalisation one its files carry. Then the layer's non-special tokens (BOS, CLS, SEP left out:
their norms dwarf the rest) are encoded a chunk at a time exactly as SAELens's ``encode`` does, and reported:
fraction of variance unexplained by the reconstruction, L0 (features active per token), each feature's
frequency (a histogram), dead features (never active on these tokens), and for a seeded sample of live
features their top-activating tokens in context (report.md and report.html, escaped).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from layerscope.analyses.base import Analysis, AnalysisMetadata, Context, ModelOutput, Option, register
from layerscope.errors import InputError
from layerscope.report.figures import Curve, Figures, Line, Listing, Table

HIST = "sae_frequencies"
FIGURES = Figures(
    sentence="{architecture} SAE of {d_sae:,} features on {hook} (= layer {layer}), {tokens:,} tokens: fraction of "
             "variance unexplained {fvu:.4f}, L0 {l0:.2f} features per token, {dead:,} dead features "
             "({dead_share:.1%}).",
    summary_numbers=("fvu", "l0", "dead", "dead_share", "tokens", "d_sae"),
    curves=(Curve(HIST, (Line("features", "features"),), file="feature_frequency", x="log10_frequency",
                  xlabel="log10 of the share of tokens a feature fires on", ylabel="features",
                  title="SAE feature frequencies ({about})",
                  caption="How many live features fire on each share of the store's non-special tokens, in bins of "
                          "a quarter decade (dead features, never active, are counted in the summary)."),),
    tables=(Table(HIST, ("bin", "log10_frequency", "features"), key="bin"),),
    listings=(Listing("features", "Top-activating tokens of a sample of live features",
                      item="feature {feature} (fires on {frequency:.3%} of tokens, up to {max_activation:.3g}): {contexts}",
                      sub="contexts", each="{context} ({activation:.3g})", limit=10, html_limit=50),),
    about=lambda r: f"{', '.join(r.per_model)}; {r.data.label}",
)


@register
class SparseAutoencoder(Analysis):
    metadata = AnalysisMetadata(
        name="sae",
        description="A sparse autoencoder saved by SAELens over a token store's layer: reconstruction (FVU), L0, "
                    "feature frequencies, dead features, each feature's top tokens in context",
        inputs=(),
        main_score="fvu",
        options=(
            Option("sae", str, None, "the SAE's folder (SAELens's save_model: cfg.json + sae_weights.safetensors)"),
            Option("store", str, None, "a LayerStore made with extract --tokens holding the SAE's layer"),
            Option("top", int, 5, "top-activating tokens kept per feature"),
            Option("features", int, 30, "live features whose top tokens are shown (a seeded sample)"),
            Option("window", int, 40, "characters of context each side of a token"),
        ),
        figures=FIGURES,
    )

    def prepare(self, ctx: Context):
        from layerscope.metrics.sae_files import load_sae
        from layerscope.metrics.sae import BadSAE, resid_layer
        from layerscope.model.families import family_of
        from layerscope.store.store import LayerStore

        o = self.options(ctx)
        if not o.sae or not o.store:
            raise InputError("run sae needs --sae DIR (an SAE saved by SAELens) and --store STORE (a token store)")
        if o.top < 1 or o.features < 0 or o.window < 0:
            raise InputError("--top must be at least 1, --features and --window at least 0")
        if ctx.spec.data:
            raise InputError("run sae reads the texts of --store; drop --data")
        from layerscope.jsonfile import check_folder_files

        check_folder_files(o.sae, where="an SAE folder")  # its cfg.json bounded, its files regular, before reading
        try:
            sae = load_sae(o.sae)
        except BadSAE as exc:
            raise InputError(f"--sae {o.sae}: {exc}") from None
        store = LayerStore.open(o.store)
        if not store.token_layers:
            raise InputError(f"{store.path} holds no token vectors; the SAE reads tokens: make it with layerscope "
                             "extract ... --tokens --layers <the SAE's layer>")
        manifest = store.manifest
        anatomy = manifest.anatomy  # None only for a manifest copy an older store embeds: the family says it
        normed = anatomy.final_norm_in_hidden_states if anatomy is not None else \
            bool(family_of(manifest).final_norm_in_last_hidden_state)
        try:
            layer = resid_layer(sae.hook, manifest.num_layers, final_norm_in_last=normed)
        except BadSAE as exc:
            raise InputError(f"--sae {o.sae}: {exc}") from None
        if layer not in store.token_layers:
            raise InputError(f"--sae {o.sae} reads {sae.hook} = layer {layer}; {store.path} holds token vectors of "
                             f"layers {', '.join(store.token_layers)}: extract layer {layer} with --tokens")
        hidden = int(store.record.token_arrays.hidden_size)
        if sae.d_in != hidden:
            raise InputError(f"--sae {o.sae} reads vectors of width {sae.d_in}; layer {layer} of {store.path} has "
                             f"width {hidden}: an SAE of another model")
        return {"sae": sae, "store": store, "layer": layer}

    def stored_sources(self, ctx: Context, data):
        st = data["store"]
        return [(str(st.path), st.manifest.source, f"{st.spec.model_key}|{st.spec.corpus_sha256}|{st.record.created}")]

    def offline(self, ctx: Context, data):
        st, sae, layer = data["store"], data["sae"], data["layer"]
        o = self.options(ctx)
        figures = _run(st, sae, layer, o, ctx.spec.seed)
        label = st.manifest.source.alias or st.manifest.source.spec or st.path.name
        meta = {label: {"spec": str(st.path), "manifest": st.manifest.to_dict(), "engine": {"engine": st.spec.engine}}}
        return {label: ModelOutput(figures)}, meta

    def combine(self, ctx: Context, per_model, data) -> dict[str, Any]:
        sae, st = data["sae"], data["store"]
        return {"data": {"origin": str(st.path), "n": st.n,
                         "label": f"{sae.architecture} SAE of {sae.d_sae:,} features on {sae.hook} = layer "
                                  f"{data['layer']} of {st.path.name}"}}

    def compute(self, ctx: Context, run, data):
        raise InputError("run sae reads a token store: give --store")


def _run(store, sae, layer: str, o, seed: int) -> dict[str, Any]:
    from layerscope.metrics.sae import Stats
    from layerscope.progress import track

    tl = store.tokens(layer)
    rows = np.nonzero(np.asarray(tl.special) == 0)[0]
    if len(rows) == 0:
        raise InputError(f"{store.path} holds no non-special tokens at layer {layer}")
    stats = Stats(sae.d_sae, o.top)
    step = int(max(1, min(65536, (1 << 24) // max(sae.d_sae, sae.d_in))))
    for start in track(range(0, len(rows), step), f"sae: encoding {len(rows):,} tokens of layer {layer}"):
        pos = rows[start:start + step]
        x = tl.take(pos).astype(np.float64)
        acts, recon = sae.reconstruct(x)
        stats.update(x, acts, recon, pos)
    freq = stats.active / stats.n
    live = np.nonzero(stats.active > 0)[0]
    dead = int(sae.d_sae - len(live))
    summary = {"fvu": stats.fvu(), "l0": stats.l0 / stats.n, "dead": dead, "dead_share": dead / sae.d_sae,
               "tokens": int(stats.n), "d_sae": sae.d_sae, "d_in": sae.d_in, "hook": sae.hook, "layer": layer,
               "architecture": sae.architecture, "normalization": sae.normalize,
               "sae_model": sae.model_name, "mapping": f"{sae.hook} = layer {layer} of the store"}
    shown = np.sort(np.random.default_rng(seed).choice(live, min(o.features, len(live)), replace=False)) \
        if len(live) else np.zeros(0, np.int64)
    texts = store.texts()
    strings = tl.strings()
    features = [{"feature": int(f), "frequency": float(freq[f]), "max_activation": float(stats.best_val[0, f]),
                 "contexts": [_context(tl, texts, strings, int(p), float(v), o.window)
                              for v, p in zip(stats.best_val[:, f], stats.best_pos[:, f]) if p >= 0 and v > 0]}
                for f in shown]
    return {"summary": summary, "features": features, "tables": {HIST: _histogram(freq[live])}}


def _histogram(freq: np.ndarray) -> list[dict[str, Any]]:
    """Live features counted in bins of a quarter decade of their frequency."""
    if not len(freq):
        return []
    logs = np.log10(freq)
    lo = float(np.floor(logs.min() * 4) / 4)
    edges = np.linspace(lo, 0.0, int(round(-lo * 4)) + 1) if lo < 0 else np.array([-0.25, 0.0])
    counts, edges = np.histogram(logs, bins=edges)
    # a row is named by its bin's number (a table's key is a label, not a measured value)
    return [{"bin": i, "log10_frequency": float((a + b) / 2), "features": int(c)}
            for i, (a, b, c) in enumerate(zip(edges[:-1], edges[1:], counts))]


def _context(tl, texts, strings, pos: int, value: float, window: int) -> dict[str, Any]:
    """The token at ``pos`` in its text, marked ``[[...]]``, with ``window`` characters each side."""
    text_i = int(np.searchsorted(np.asarray(tl.offsets), pos, side="right") - 1)
    text = texts[text_i]
    start, end = (int(v) for v in tl.spans[pos])
    left, right = max(0, start - window), min(len(text), end + window)
    context = ("…" if left else "") + text[left:start] + "[[" + text[start:end] + "]]" + text[end:right] + \
        ("…" if right < len(text) else "")
    return {"text": text_i, "token": strings.get(int(tl.ids[pos]), ""), "activation": value, "context": context}
