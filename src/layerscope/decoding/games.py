"""The hiding and revealing games: does masking what a method calls salient move the objective?

For one text, a method's ranking of its content tokens (special tokens are never masked), and
``k = 1..K``:

* hiding: replace the top-``k`` tokens with the replacement token; record the objective;
* revealing: replace every content token *except* the top-``k``; record the objective.

All variants of a text have the same length, so they run as one batch; identical variants
(e.g. the random ranking agreeing with another) are evaluated once.
"""

from __future__ import annotations

from typing import Any

import numpy as np


def ranking(scores: np.ndarray, content: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Content positions ordered by score, highest first; ties broken at random (seeded)."""
    s = np.asarray(scores, dtype=np.float64)[content]
    tiebreak = rng.permutation(len(content))
    order = np.lexsort((tiebreak, -s))
    return content[order]


def variants(ids: np.ndarray, order: np.ndarray, content: np.ndarray, k_max: int, repl: int) -> np.ndarray:
    """``[2 * k_max, S]`` token ids: hiding k=1..K, then revealing k=1..K."""
    rows = []
    for k in range(1, k_max + 1):
        hide = ids.copy()
        hide[order[:k]] = repl
        rows.append(hide)
    for k in range(1, k_max + 1):
        reveal = ids.copy()
        hidden = np.setdiff1d(content, order[:k])
        reveal[hidden] = repl
        rows.append(reveal)
    return np.stack(rows)


def play(evaluate, ids: np.ndarray, content: np.ndarray, rankings: dict[str, list[np.ndarray]], k_max: int,
         repl: int, target: int) -> dict[str, Any]:
    """Objective values for every method's hiding and revealing variants of one text.

    ``rankings`` maps a method to one or more orders (several for ``random``, averaged).
    ``evaluate(ids_batch [N, S]) -> values [N, C]``.  Returns per method ``hide`` and ``reveal``
    arrays (length ``k_max``) of the objective, ``hide_pred``/``reveal_pred`` (argmax class), and the
    full/all-masked reference values.
    """
    all_masked = ids.copy()
    all_masked[content] = repl
    blocks, index = [ids[None], all_masked[None]], {}
    for method, orders in rankings.items():
        for j, order in enumerate(orders):
            index[(method, j)] = sum(len(b) for b in blocks)
            blocks.append(variants(ids, order, content, k_max, repl))
    batch = np.concatenate(blocks)
    uniq, inverse = np.unique(batch, axis=0, return_inverse=True)
    values = np.asarray(evaluate(uniq))[np.asarray(inverse).reshape(-1)]
    y = values[:, target]
    pred = values.argmax(1)
    out: dict[str, Any] = {"full": float(y[0]), "masked": float(y[1]), "full_pred": int(pred[0]),
                           "masked_pred": int(pred[1]), "methods": {}}
    for method, orders in rankings.items():
        hides, reveals, hp, rp = [], [], [], []
        for j in range(len(orders)):
            s = index[(method, j)]
            hides.append(y[s:s + k_max])
            reveals.append(y[s + k_max:s + 2 * k_max])
            hp.append(pred[s:s + k_max])
            rp.append(pred[s + k_max:s + 2 * k_max])
        out["methods"][method] = {"hide": np.mean(hides, 0), "reveal": np.mean(reveals, 0),
                                  "hide_pred": np.stack(hp), "reveal_pred": np.stack(rp)}
    return out


class GameAccumulator:
    """Curves over a set of texts: mean objective drop when hiding, mean objective when revealing,
    both also as fractions of the full-vs-all-masked gap, and accuracy where there are labels."""

    def __init__(self, k_max: int):
        self.k_max = k_max
        self.rows: dict[str, dict[str, list]] = {}
        self.full: list[float] = []
        self.masked: list[float] = []
        self.full_correct: list[bool] = []

    def add(self, played: dict[str, Any], gold: int | None = None) -> None:
        self.full.append(played["full"])
        self.masked.append(played["masked"])
        if gold is not None:
            self.full_correct.append(played["full_pred"] == gold)
        for method, r in played["methods"].items():
            acc = self.rows.setdefault(method, {"drop": [], "reveal": [], "hide_acc": [], "reveal_acc": []})
            acc["drop"].append(played["full"] - r["hide"])
            acc["reveal"].append(r["reveal"])
            if gold is not None:
                acc["hide_acc"].append((r["hide_pred"] == gold).mean(0))
                acc["reveal_acc"].append((r["reveal_pred"] == gold).mean(0))

    def curves(self) -> dict[str, dict[str, list[float | None]]]:
        gap = float(np.mean(self.full) - np.mean(self.masked))
        base = float(np.mean(self.masked))
        out = {}
        for method, acc in self.rows.items():
            drop = np.mean(acc["drop"], 0)
            reveal = np.mean(acc["reveal"], 0)
            c = {"hide_drop": drop.tolist(), "reveal_value": reveal.tolist(),
                 "hide_drop_fraction": (drop / gap).tolist() if abs(gap) > 1e-9 else [None] * self.k_max,
                 "reveal_recovery_fraction": ((reveal - base) / gap).tolist() if abs(gap) > 1e-9
                 else [None] * self.k_max}
            if acc["hide_acc"]:
                c["hide_accuracy"] = np.mean(acc["hide_acc"], 0).tolist()
                c["reveal_accuracy"] = np.mean(acc["reveal_acc"], 0).tolist()
            out[method] = c
        return out

    def per_text_aopc(self, method: str) -> dict[str, list[float]]:
        """Per text explained, in order: the hiding AOPC (mean drop over k = 1..K) and the revealing AOPC
        (mean y kept over k); their means over the texts are the method's AOPCs."""
        acc = self.rows[method]
        return {"hide": [float(np.mean(d)) for d in acc["drop"]],
                "reveal": [float(np.mean(r)) for r in acc["reveal"]]}

    def reference(self) -> dict[str, float | None]:
        return {"mean_full": float(np.mean(self.full)), "mean_all_masked": float(np.mean(self.masked)),
                "accuracy_full": float(np.mean(self.full_correct)) if self.full_correct else None,
                "n_texts": len(self.full)}
