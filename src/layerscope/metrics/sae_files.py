"""Reading a sparse autoencoder saved in SAELens's format (``SAE.save_model``): ``cfg.json`` and
``sae_weights.safetensors`` (safetensors only), every shape checked against the config before it is used.
What the numbers mean and how they run: metrics/sae.py."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from layerscope.metrics.sae import ARCHITECTURES, NORMALISATIONS, SAE, BadSAE

WEIGHTS, CONFIG = "sae_weights.safetensors", "cfg.json"


def _hook(cfg: dict[str, Any]) -> str:
    meta = cfg.get("metadata") if isinstance(cfg.get("metadata"), dict) else {}
    for value in (meta.get("hook_name"), cfg.get("hook_name"), cfg.get("hook_point")):
        if isinstance(value, str) and value:
            return value
    raise BadSAE("its cfg.json names no hook (metadata.hook_name, hook_name or hook_point)")


def load_sae(folder) -> SAE:
    """The SAE saved at ``folder`` (SAELens's ``save_model`` layout), checked against its own config."""
    from safetensors.numpy import load_file

    folder = Path(folder)
    if not (folder / CONFIG).is_file() or not (folder / WEIGHTS).is_file():
        raise BadSAE(f"{folder} is not an SAE saved by SAELens: it needs {CONFIG} and {WEIGHTS}")
    try:
        cfg = json.loads((folder / CONFIG).read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as exc:
        raise BadSAE(f"{folder / CONFIG} is not JSON ({str(exc)[:80]})") from None
    if not isinstance(cfg, dict):
        raise BadSAE(f"{folder / CONFIG} is not a JSON object")
    arch = cfg.get("architecture", "standard")
    if arch not in ARCHITECTURES:
        raise BadSAE(f"its architecture is {arch!r}; this reader runs {', '.join(ARCHITECTURES)}")
    norm = cfg.get("normalize_activations", "none") or "none"
    if norm not in NORMALISATIONS:
        raise BadSAE(f"its normalize_activations is {norm!r}, which its files do not carry the numbers of; this "
                     f"reader runs {', '.join(NORMALISATIONS)}")
    if cfg.get("reshape_activations", "none") not in ("none", None):
        raise BadSAE(f"it reshapes its input ({cfg.get('reshape_activations')}): an attention-head hook, not a "
                     "residual-stream state a store holds")
    try:
        d_in, d_sae = int(cfg["d_in"]), int(cfg["d_sae"])
    except (KeyError, TypeError, ValueError):
        raise BadSAE(f"{folder / CONFIG} lacks whole numbers d_in and d_sae") from None
    try:
        w = {k: np.asarray(v, np.float64) for k, v in load_file(folder / WEIGHTS).items()}
    except Exception as exc:  # safetensors names no single error type for a damaged file
        raise BadSAE(f"{folder / WEIGHTS} is not a readable safetensors file ({str(exc)[:80]})") from None
    want = {"W_enc": (d_in, d_sae), "b_enc": (d_sae,), "W_dec": (d_sae, d_in), "b_dec": (d_in,)}
    if arch == "jumprelu":
        if "log_threshold" in w and "threshold" not in w:
            w["threshold"] = np.exp(w.pop("log_threshold"))
        want["threshold"] = (d_sae,)
    for name, shape in want.items():
        if name not in w:
            raise BadSAE(f"{folder / WEIGHTS} has no {name}")
        if w[name].shape != shape:
            raise BadSAE(f"{folder / WEIGHTS}: {name} is {list(w[name].shape)}, its cfg.json says {list(shape)} "
                         f"(d_in {d_in}, d_sae {d_sae})")
        if not np.isfinite(w[name]).all():
            raise BadSAE(f"{folder / WEIGHTS}: {name} holds NaN or inf")
    if "scaling_factor" in w and not np.allclose(w["scaling_factor"], 1.0):
        raise BadSAE("its weights carry a fine-tuning scaling factor, which this reader does not apply")
    k = None
    if arch == "topk":
        k = cfg.get("k") or (cfg.get("activation_fn_kwargs") or {}).get("k")
        if not isinstance(k, int) or k < 1:
            raise BadSAE("a topk SAE needs a whole k >= 1 in its cfg.json")
    meta = cfg.get("metadata") if isinstance(cfg.get("metadata"), dict) else {}
    return SAE(arch, d_in, d_sae, _hook(cfg), norm, bool(cfg.get("apply_b_dec_to_input", True)), w["W_enc"],
               w["b_enc"], w["W_dec"], w["b_dec"], w.get("threshold"), k,
               bool(cfg.get("rescale_acts_by_decoder_norm", False)),
               meta.get("model_name") or cfg.get("model_name"))
