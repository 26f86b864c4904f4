"""Small helpers the analyses share: layer and pooling choices per model, correlations of similarities."""

from __future__ import annotations

from typing import Any

import numpy as np

from layerscope.analyses.metadata import Option
from layerscope.errors import InputError

# Cosines whose spread (max - min) is below this are treated as constant: float32 vectors that are
# the same for every text (CLS at layer 0, say) give cosines equal only up to rounding.
CONSTANT_SPREAD = 1e-6

# The options of analyses that read scored sentence pairs: which columns hold them (named-column files).
PAIR_COLUMN_OPTIONS = (
    Option("sentence1", str, None, "column/field with the first sentence (named-column files)"),
    Option("sentence2", str, None, "column/field with the second sentence"),
    Option("score", str, None, "column/field with the human score"),
)


def layers_for(ctx, run) -> list[str]:
    """The run's layers: resolved once where the run started (run_analysis), else here."""
    if run.layers is not None:
        layers = run.layers
    else:
        from layerscope.vocab.layers import resolve_widths

        manifest = run.handle.manifest
        try:
            layers = resolve_widths(ctx.spec.layers, run.num_layers, raw_width=manifest.raw_width,
                                    hidden_size=manifest.hidden_size, raw_alone=False)
        except InputError as exc:
            raise InputError(f"--layers {ctx.spec.layers}: {exc}") from None
    note = raw_note(run.handle.manifest, layers)
    if note:
        ctx.say(note)
    return layers


def raw_note(manifest, layers) -> str | None:
    """Where both ``raw`` and layer 0 are shown for a family whose layer 0 is the raw word embeddings
    (no position embeddings or norm added: Qwen), one line saying they are the same by construction."""
    from layerscope.model.families import FAMILIES

    family = FAMILIES.get(manifest.family)
    if family is None or not family.raw_is_layer0 or not {"raw", "0"} <= set(map(str, layers)):
        return None
    return (f"{manifest.family}: 'raw' and layer 0 are the same vectors by construction (layer 0 is the "
            "word embeddings, nothing added), so their figures are equal")


def resolve_poolings(ctx, handle, default=("mean",)) -> list[str]:
    """``--pooling`` (else ``default``) checked against one model, once where the run starts (a typo: "did
    you mean")."""
    from layerscope.vocab.pooling import check_poolings, require_pooled_output

    pools = check_poolings(list(ctx.spec.poolings or default))
    require_pooled_output(pools, handle.manifest.pooled_output, handle.manifest.family)
    return pools


def poolings_for(ctx, run) -> list[str]:
    """The run's poolings: resolved once where the run started (run_analysis), else here."""
    if run.poolings is not None:
        return run.poolings
    return resolve_poolings(ctx, run.handle)


def similarity_correlations(sims: np.ndarray, scores: np.ndarray, *, n_boot: int, seed: int) -> dict[str, Any]:
    """Pearson and Spearman (with p-values and bootstrap intervals) of similarities vs human scores.

    Constant similarities give ``None`` figures and an ``undefined`` reason, never NaN.
    """
    from layerscope.analyses.intervals import BOOTSTRAP
    from layerscope.metrics.correlation import pearson, spearman

    sims = np.asarray(sims, dtype=np.float64)
    row: dict[str, Any] = {"mean_similarity": float(sims.mean())}
    spread = float(sims.max() - sims.min())
    if spread <= CONSTANT_SPREAD:
        reason = (f"the similarities are constant (all {sims.mean():.6f}, spread {spread:.1e}): every "
                  "sentence gets the same vector here, so the correlation is undefined")
        for kind in ("pearson", "spearman"):
            row.update({kind: None, f"{kind}_p": None, f"{kind}_ci_low": None, f"{kind}_ci_high": None,
                        f"{kind}_ci_method": BOOTSTRAP})
        row["undefined"] = reason
        return row
    reasons = []
    for kind, fn in (("pearson", pearson), ("spearman", spearman)):
        c = fn(sims, scores, n_boot=n_boot, seed=seed, x_name="similarity", y_name="score")
        row.update({kind: c.value, f"{kind}_p": c.p_value, f"{kind}_ci_low": c.ci_low, f"{kind}_ci_high": c.ci_high,
                    f"{kind}_ci_method": BOOTSTRAP})
        if c.undefined:
            reasons.append(c.undefined)
    row["undefined"] = "; ".join(reasons) or None
    return row


def best_row(rows: list[dict], key: str) -> dict | None:
    defined = [r for r in rows if r.get(key) is not None]
    return max(defined, key=lambda r: r[key]) if defined else None


def models_on_data(results, builtin: str) -> str:
    """``MODELS on DATA`` for figure titles: the run's models and its data file's name (``builtin`` where the run
    read its built-in data)."""
    from pathlib import PurePath

    data = results.settings.data
    name = PurePath(str(data).replace(chr(92), "/")).name if data else builtin
    return f"{', '.join(results.per_model)} on {name}"


def check_tower_asked(spec: str, tower: str | None, *, trust_remote_code: bool = False) -> None:
    """One line, from config.json alone, when a two-tower checkpoint (CLIP, SigLIP) is given to read images
    without ``--tower vision`` (it would otherwise be described, and exported, as its text tower)."""
    from pathlib import Path

    from layerscope.errors import InputError
    from layerscope.model.families import VISION_TOWERS
    from layerscope.model.manifest import MANIFEST
    from layerscope.model.source import load_config, resolve_source

    if tower is not None or (Path(str(spec)).expanduser() / MANIFEST).is_file():
        return
    config = load_config(resolve_source(str(spec)), trust_remote_code=trust_remote_code)
    if config.model_type in VISION_TOWERS:
        raise InputError(f"{spec} is a two-tower {config.model_type} checkpoint (images and text): add --tower vision "
                         "to read its image tower")
