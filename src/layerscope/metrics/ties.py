"""Ties in retrieval ranks: the tolerances that decide one, the ranks that carry it, and the float64 recount.

Shared by the numpy path (:mod:`layerscope.metrics.neighbors`), the PyTorch path
(:mod:`layerscope.metrics.neighbors_torch`) and the FAISS path (:mod:`layerscope.index.search`), so all three
count the same ties for the same vectors.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from layerscope.metrics.checks import row_blocks

# Cosines of float32 unit vectors: a float32 score within SCREEN of the right item's is recomputed in float64,
# and float64 cosines within TIE_TOL of it are a tie. Float32 sums over the features may differ in the last
# bits between engines (FAISS, BLAS, a GPU), so identical vectors may not score equal there; in float64 the
# products of float32 values are exact and the rounding of their sum stays far below TIE_TOL.
SCREEN = 1e-4
TIE_TOL = 1e-9


@dataclass(frozen=True)
class TiedRanks:
    """Where the right item lands per query when tied candidates come in a random order.

    ``above``: candidates that score strictly higher (``inf``: the item lies beyond a search cutoff);
    ``tied``: candidates that score the same, the item included (>= 1). Over the ``tied!`` orders of the
    tied block the item's rank is uniform on ``above + 1 .. above + tied``: :attr:`mean` is the mean rank
    of the block, :meth:`hits` and :meth:`reciprocal` the expected hit at k and reciprocal rank.
    """

    above: np.ndarray
    tied: np.ndarray

    @property
    def mean(self) -> np.ndarray:
        return np.asarray(self.above, dtype=np.float64) + (np.asarray(self.tied, dtype=np.float64) + 1.0) / 2.0

    def hits(self, k: int) -> np.ndarray:
        """P(rank <= k) per query: ``clip((k - above) / tied, 0, 1)``."""
        a, t = np.asarray(self.above, dtype=np.float64), np.asarray(self.tied, dtype=np.float64)
        with np.errstate(invalid="ignore"):
            return np.where(np.isinf(a), 0.0, np.clip((k - a) / t, 0.0, 1.0))

    def reciprocal(self) -> np.ndarray:
        """E[1 / rank] per query: ``(1/tied) sum_{j=1..tied} 1 / (above + j)`` (0 beyond a cutoff)."""
        from scipy.special import digamma

        a, t = np.asarray(self.above, dtype=np.float64), np.asarray(self.tied, dtype=np.float64)
        fin = np.where(np.isinf(a), 0.0, a)
        return np.where(np.isinf(a), 0.0, (digamma(fin + t + 1.0) - digamma(fin + 1.0)) / t)


def float64_tie_counts(q32: np.ndarray, b32: np.ndarray, c: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(strictly higher, tied with the correct item incl. itself) per query, from float64 cosines."""
    base64 = b32.astype(np.float64)
    above = np.empty(len(c), dtype=np.float64)
    tied = np.empty(len(c), dtype=np.int64)
    for s in row_blocks(len(c), b32.shape[0]):
        s64 = q32[s].astype(np.float64) @ base64.T
        t = s64[np.arange(s64.shape[0]), c[s]][:, None]
        above[s] = (s64 > t + TIE_TOL).sum(axis=1)
        tied[s] = (np.abs(s64 - t) <= TIE_TOL).sum(axis=1)
    return above, tied
