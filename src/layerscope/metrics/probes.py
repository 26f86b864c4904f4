"""Linear token probes with control tasks (Hewitt & Liang 2019), pure numpy/scipy.

* ``word_tokens``: which of a text's tokens make each word (their character spans inside the word's span);
  a word no token covers, or a token that reaches into two words, is an error: labels would not align.
* ``LinearProbe``: multinomial logistic regression, ``sum_i CE_i + ||W||^2 / (2 C)`` (bias unpenalised; the
  objective of scikit-learn's ``LogisticRegression(C=C)``), fitted with L-BFGS on standardised features
  (train mean and spread). Strictly convex, so the fit is the optimum whatever the start.
* ``control_labels``: the control task: each word type (its form) mapped to one label, drawn once (seeded)
  from the empirical distribution of the real labels; a probe that scores well on it memorises word types
  rather than reading the property from the vectors. Selectivity = accuracy - control accuracy.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from layerscope.metrics.checks import as_matrix, check_finite

PIECES = ("first", "mean", "last")


class Misaligned(ValueError):
    """Words and tokens do not line up (the message says where)."""


def word_tokens(token_spans: np.ndarray, special: np.ndarray, word_spans: list[tuple[int, int]]) -> list[np.ndarray]:
    """Per word, the positions of the tokens inside its span (in order). Raises ``Misaligned`` for a word
    no token covers (e.g. cut off by the max length) or a token overlapping two words."""
    spans = np.asarray(token_spans)
    real = (np.asarray(special) == 0) & (spans[:, 1] > spans[:, 0])
    out, owner = [], np.full(len(spans), -1)
    for w, (start, end) in enumerate(word_spans):
        hit = np.nonzero(real & (spans[:, 0] < end) & (spans[:, 1] > start))[0]
        if not len(hit):
            raise Misaligned(f"word {w + 1} (characters {start}-{end}) has no token: the text was cut at the "
                             "max length, or the tokenizer dropped it")
        inside = (spans[hit, 0] >= start) & (spans[hit, 1] <= end)
        if not inside.all():
            t = int(hit[~inside][0])
            raise Misaligned(f"token {t} (characters {spans[t, 0]}-{spans[t, 1]}) reaches past word {w + 1} "
                             f"(characters {start}-{end}): one token covers two words")
        if np.any(owner[hit] >= 0):
            raise Misaligned(f"a token of word {w + 1} also belongs to word {int(owner[hit][owner[hit] >= 0][0]) + 1}")
        owner[hit] = w
        out.append(hit)
    return out


def word_vectors(states: np.ndarray, pieces: list[np.ndarray], how: str) -> np.ndarray:
    """``[words, hidden]``: each word's first piece, last piece or mean of its pieces."""
    if how not in PIECES:
        raise ValueError(f"pieces: choose from {', '.join(PIECES)}")
    pick = {"first": lambda p: states[p[0]], "last": lambda p: states[p[-1]],
            "mean": lambda p: np.asarray(states[p], np.float64).mean(0)}[how]
    return np.stack([pick(p) for p in pieces]).astype(np.float64)


def control_labels(words: list[str], labels: list[str], seed: int) -> dict[str, str]:
    """Each word type's control label, drawn from the real labels' empirical distribution (seeded)."""
    values, counts = np.unique(np.asarray(labels, dtype=object), return_counts=True)
    rng = np.random.default_rng(seed)
    types = sorted(set(words))
    drawn = rng.choice(len(values), size=len(types), p=counts / counts.sum())
    return {t: str(values[d]) for t, d in zip(types, drawn)}


@dataclass
class LinearProbe:
    """A fitted multinomial logistic regression over standardised features."""

    classes: np.ndarray
    mean: np.ndarray
    scale: np.ndarray
    weights: np.ndarray  # [features, classes]
    bias: np.ndarray  # [classes]
    converged: bool

    @classmethod
    def fit(cls, x, y, *, c: float = 1.0, max_iter: int = 500) -> "LinearProbe":
        from scipy.optimize import minimize
        from scipy.special import logsumexp

        X = as_matrix(x, "x").astype(np.float64)
        check_finite(X, "x")
        if c <= 0:
            raise ValueError(f"C must be > 0, got {c}")
        classes, yi = np.unique(np.asarray(y), return_inverse=True)
        if len(classes) < 2:
            raise ValueError("a probe needs at least two labels among its training words")
        mean, scale = X.mean(0), X.std(0)
        scale = np.where(scale > 0, scale, 1.0)
        Z = (X - mean) / scale
        n, d = Z.shape
        k = len(classes)
        onehot = np.zeros((n, k))
        onehot[np.arange(n), yi] = 1.0

        def objective(theta):
            w, b = theta[:d * k].reshape(d, k), theta[d * k:]
            logits = Z @ w + b
            lse = logsumexp(logits, axis=1)
            loss = float(np.sum(lse - logits[np.arange(n), yi])) + float(np.sum(w * w)) / (2.0 * c)
            g = np.exp(logits - lse[:, None]) - onehot
            return loss, np.concatenate([(Z.T @ g + w / c).ravel(), g.sum(0)])

        res = minimize(objective, np.zeros(d * k + k), jac=True, method="L-BFGS-B",
                       options={"maxiter": max_iter, "gtol": 1e-8, "ftol": 1e-12})
        return cls(classes, mean, scale, res.x[:d * k].reshape(d, k), res.x[d * k:], bool(res.success))

    def scores(self, x) -> np.ndarray:
        Z = (np.asarray(x, np.float64) - self.mean) / self.scale
        return Z @ self.weights + self.bias

    def predict(self, x) -> np.ndarray:
        return self.classes[np.argmax(self.scores(x), axis=1)]
