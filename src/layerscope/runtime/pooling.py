"""Pooling token-level states into one vector per text (the numpy reference).

Every mode is mask-aware and works for right or left padding.  The in-graph
pooling added at export (``export/graph.py``) computes the same thing inside
ONNX; the tests hold the two to each other.

Shapes: ``states`` is ``[..., batch, seq, hidden]`` (any leading layer axes),
``mask`` is ``[batch, seq]`` with 1 for real tokens.
"""

from __future__ import annotations

import numpy as np

from layerscope.errors import InputError
from layerscope.model.families import POOLINGS

ST = "st"  # the model's own sentence-transformers embedding (see layerscope/model/stconfig.py)


def check_poolings(poolings, *, available=POOLINGS) -> list[str]:
    out = []
    for p in poolings:
        p = p.strip()
        if p not in available:
            from difflib import get_close_matches

            hint = get_close_matches(p, available, n=1)
            extra = f" (did you mean '{hint[0]}'?)" if hint else ""
            raise InputError(f"unknown pooling '{p}'{extra}; choose from {', '.join(available)}")
        if p not in out:
            out.append(p)
    if not out:
        raise InputError("no pooling given; choose from " + ", ".join(available))
    return out


def first_index(mask: np.ndarray) -> np.ndarray:
    return np.argmax(mask > 0, axis=1)


def last_index(mask: np.ndarray) -> np.ndarray:
    seq = mask.shape[1]
    return seq - 1 - np.argmax(mask[:, ::-1] > 0, axis=1)


def eos_index(input_ids: np.ndarray, eos_token_id: int | None) -> np.ndarray:
    """Position the model's own pooler reads: the first EOS token (CLIP), or argmax id (legacy CLIP)."""
    if eos_token_id is None or eos_token_id == 2:
        # Old CLIP configs say eos_token_id=2 and pool at the highest token id (the EOS of its vocab).
        return np.argmax(input_ids, axis=1)
    return np.argmax(input_ids == eos_token_id, axis=1)


def pooling_weights(mode: str, mask: np.ndarray, input_ids: np.ndarray | None = None,
                    eos_token_id: int | None = None) -> np.ndarray:
    """[batch, seq] weights whose weighted sum over positions is the pooled vector (not for max)."""
    mask = mask.astype(np.float64)
    batch, seq = mask.shape
    rows = np.arange(batch)
    w = np.zeros_like(mask)
    if mode == "mean":
        w = mask / np.maximum(mask.sum(1, keepdims=True), 1.0)
    elif mode == "cls":  # the first real token, wherever the padding is
        w[rows, first_index(mask)] = 1.0
    elif mode == "last":
        w[rows, last_index(mask)] = 1.0
    elif mode == "mean-nobos":
        w = mask.copy()
        w[rows, first_index(mask)] = 0.0
        w = w / np.maximum(w.sum(1, keepdims=True), 1.0)
    elif mode == "eos":
        if input_ids is None:
            raise InputError("pooling 'eos' needs the input ids")
        w[rows, eos_index(input_ids, eos_token_id)] = 1.0
    else:
        raise InputError(f"pooling '{mode}' has no weights")
    return w


def pool(states: np.ndarray, mask: np.ndarray, mode: str, *, input_ids: np.ndarray | None = None,
         eos_token_id: int | None = None) -> np.ndarray:
    """Pool ``[..., batch, seq, hidden]`` into ``[..., batch, hidden]`` (float32)."""
    states = np.asarray(states)
    if mode == "max":
        valid = (mask > 0)[..., None]
        filled = np.where(valid, states, -np.inf)
        return filled.max(axis=-2).astype(np.float32)
    w = pooling_weights(mode, mask, input_ids, eos_token_id)
    out = np.einsum("...bsh,bs->...bh", states.astype(np.float64), w)
    return out.astype(np.float32)


def with_st(manifest: dict, poolings: list[str], compute) -> dict[str, np.ndarray]:
    """Run ``compute(poolings)`` with ``st`` replaced by the checkpoint's own pooling (and its
    L2 normalization, as sentence-transformers' Normalize module does); other poolings pass through."""
    if ST not in poolings:
        return compute(poolings)
    from layerscope.model.stconfig import st_recipe

    recipe = st_recipe(manifest)
    base = recipe["pooling"]
    needed = [p for p in poolings if p != ST]
    if base not in needed:
        needed.append(base)
    got = dict(compute(needed))
    vec = got[base]
    if recipe["normalize"]:
        norm = np.linalg.norm(vec.astype(np.float64), axis=-1, keepdims=True)
        vec = (vec / np.maximum(norm, 1e-12)).astype(np.float32)
    else:
        vec = vec.copy()
    got[ST] = vec
    return {p: got[p] for p in poolings}


def default_poolings(manifest: dict) -> list[str]:
    """``st`` for a sentence-transformers checkpoint layerscope can reproduce, else the family default."""
    st = manifest.get("sentence_transformers") or {}
    return [ST] if st.get("supported") else [manifest.get("default_pooling", "mean")]
