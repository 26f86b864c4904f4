"""What an intervention reads off a run, shared by patching, steering and the Patchscope: batches of copies of
one text, the last real token of each row, a model's pooled final embedding, a token's id, cosines.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from layerscope.errors import InputError


def tiled(batch, rows) -> object:
    """A batch of the rows ``rows`` of ``batch`` (an index array; repeats allowed): copies of a text to write
    different states into."""
    rows = np.asarray(rows, dtype=np.int64)
    return replace(batch, inputs={k: np.ascontiguousarray(v[rows]) for k, v in batch.inputs.items()},
                   index=np.asarray(batch.index)[rows], truncated=np.asarray(batch.truncated)[rows], special=None,
                   spans=None)


def last_positions(mask) -> np.ndarray:
    """The last real token of each row (right or left padding)."""
    mask = np.asarray(mask) > 0
    return mask.shape[1] - 1 - np.argmax(mask[:, ::-1], axis=1)


def pooled(manifest, batch, states, pooling: str) -> np.ndarray:
    """``states`` (``[n, tokens, hidden]``) pooled by ``pooling`` over ``batch``'s tokens: float64 ``[n, hidden]``."""
    from layerscope.engines.base import pool_states

    return np.asarray(pool_states(manifest, batch, np.asarray(states, dtype=np.float32), pooling), dtype=np.float64)


def cosines(a, b) -> np.ndarray:
    """Row-wise cosine of ``a`` and ``b`` (``[n, d]`` each, or ``b`` one row), float64; 0 where a row is zero."""
    a = np.asarray(a, dtype=np.float64)
    b = np.broadcast_to(np.asarray(b, dtype=np.float64), a.shape)
    den = np.linalg.norm(a, axis=-1) * np.linalg.norm(b, axis=-1)
    return np.where(den > 0, np.sum(a * b, axis=-1) / np.where(den > 0, den, 1.0), 0.0)


def token_id(tokenizer, text: str, what: str) -> int:
    """The id of the first token of ``text`` as the model reads it inside a text (no special tokens added)."""
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    if not ids:
        raise InputError(f"{what} {text!r} has no tokens in this model's tokenizer")
    return int(ids[0])


def poolable(pooling: str) -> str:
    """``pooling`` where numpy pools it from token states; one line for those only the model's graph makes."""
    from layerscope.vocab.pooling import EOS, ST

    if pooling in (EOS, ST):
        raise InputError(f"--pooling {pooling}: an intervention pools the final layer's token states itself; use "
                         "mean, cls, last, max or mean-nobos")
    return pooling
