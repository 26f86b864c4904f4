"""The hiding game on pairs: delete the tokens of the top token pairs, the similarity should fall.

For ``k = 1..K``: ``pairs`` takes the ``k`` largest cells of the attribution matrix; their rows are ``n_a``
tokens of text a, their columns ``n_b`` tokens of text b. One side is hidden at a time (the a tokens deleted
from a while b stays whole, then the b tokens from b while a stays whole) and the drop is
``s(a, b) - mean(s(a', b), s(a, b'))``: deleting both sides of a matched pair at once (``girl`` from both
texts) mostly leaves two texts that agree on the rest, and would reward hiding what they share. Two controls
delete exactly as many tokens from each side: ``one-sided`` the ``n_a`` / ``n_b`` tokens with the largest
one-sided sums (rows and columns of the matrix), ``random`` ``n_a`` / ``n_b`` content tokens drawn at random
(averaged over draws). Special tokens are never deleted.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

METHODS = ("pairs", "one-sided", "random")


def top_pairs(matrix: np.ndarray, content_a: np.ndarray, content_b: np.ndarray, k: int) -> tuple[list, list]:
    """Rows and columns (token positions, sorted) of the ``k`` largest content cells; ties by position."""
    cells = [(float(matrix[i, j]), int(i), int(j)) for i in content_a for j in content_b]
    cells.sort(key=lambda c: (-c[0], c[1], c[2]))
    chosen = cells[:k]
    return sorted({i for _, i, _ in chosen}), sorted({j for _, _, j in chosen})


def top_tokens(scores: np.ndarray, content: np.ndarray, n: int) -> list[int]:
    order = sorted((int(i) for i in content), key=lambda i: (-float(scores[i]), i))
    return sorted(order[:n])


def delete(inputs: dict, positions) -> dict:
    """One text's inputs without the token ``positions`` (positions renumbered where the model takes them)."""
    import torch

    keep = [i for i in range(inputs["input_ids"].shape[1]) if i not in set(positions)]
    out = {}
    for key, value in inputs.items():
        if key == "position_ids":
            out[key] = torch.arange(len(keep), dtype=value.dtype).unsqueeze(0)
        else:
            out[key] = value[:, keep]
    return out


def play_pair(similarity: Callable[[dict, dict], float], a: dict, b: dict, matrix: np.ndarray,
              content_a: np.ndarray, content_b: np.ndarray, k_max: int, draws: int,
              rng: np.random.Generator) -> dict[str, list[float]]:
    """Each method's drop of the similarity for ``k = 1..k_max`` top pairs (one pair of texts)."""
    full = similarity(a, b)
    drops: dict[str, list[float]] = {m: [] for m in METHODS}
    rows, cols = matrix.sum(1), matrix.sum(0)

    def drop(hide_a, hide_b) -> float:
        return full - 0.5 * (similarity(delete(a, hide_a), b) + similarity(a, delete(b, hide_b)))

    for k in range(1, k_max + 1):
        hide_a, hide_b = top_pairs(matrix, content_a, content_b, k)
        n_a, n_b = len(hide_a), len(hide_b)
        drops["pairs"].append(drop(hide_a, hide_b))
        drops["one-sided"].append(drop(top_tokens(rows, content_a, n_a), top_tokens(cols, content_b, n_b)))
        drops["random"].append(float(np.mean([drop(rng.choice(content_a, n_a, replace=False),
                                                   rng.choice(content_b, n_b, replace=False))
                                              for _ in range(draws)])))
    return drops
