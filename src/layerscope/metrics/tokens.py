"""Figures on token-level vectors (pure numpy): ragged sides given as ``(vectors [T, h], ids [T], special [T],
offsets [n + 1])``, text i's tokens being rows ``offsets[i]:offsets[i+1]``.

For paired texts (source i <-> target i), one layer:

* ``shared_token_cosine``: for every id that occurs (not as a special token) on both sides of a pair, the
  cosine between its mean vector on the source side and on the target side; the mean over all such
  (pair, id) items;
* ``specific_token_cosine``: per pair, the cosine between the mean of the source's tokens whose ids the
  target lacks and the mean of the target's tokens whose ids the source lacks (special tokens left out);
  the mean over pairs where both sides have such tokens;
* ``special_token_cosine``: per pair, the cosine between the mean special-token vectors of the two sides
  (BOS, CLS, SEP, ...); ``first_token_cosine``: between the two first tokens (a decoder without a BOS
  has no special token, and its first token plays the BOS's part as an attention sink);
* ``pooled_without_shared``: per text, the mean of its non-special tokens whose ids the other side lacks
  (all its non-special tokens when none are left): the pooled vectors with shared tokens removed,
  for the alignment z;
* ``position_cosine``: tokens binned by relative position ``(p + 0.5) / len`` into ``bins`` equal bins
  (special tokens left out), per pair the cosine of the two sides' bin means, averaged over pairs that
  have tokens in that bin on both sides.

Word vectors in context (the BERT notes' recipe): ``span_vectors`` averages the tokens covering a
character span, of one layer or of the mean of the last k layers; ``same_word_share`` is, for every
occurrence, the share of its k nearest other occurrences (cosine) that are the same word.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Side:
    """One side's tokens at one layer."""

    vectors: np.ndarray  # [T, hidden]
    ids: np.ndarray  # [T]
    special: np.ndarray  # [T], nonzero for special tokens
    offsets: np.ndarray  # [n + 1]

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def text(self, i: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        a, b = int(self.offsets[i]), int(self.offsets[i + 1])
        return np.asarray(self.vectors[a:b], np.float64), np.asarray(self.ids[a:b]), np.asarray(self.special[a:b]) > 0


def _cos(a: np.ndarray, b: np.ndarray) -> float | None:
    na, nb = float(np.linalg.norm(a)), float(np.linalg.norm(b))
    if na == 0 or nb == 0:
        return None
    return float(np.dot(a, b) / (na * nb))


def _mean(values: list[float]) -> float | None:
    return float(np.mean(values)) if values else None


def _pairs(src: Side, tgt: Side):
    if len(src) != len(tgt):
        raise ValueError(f"{len(src)} source texts but {len(tgt)} target texts")
    for i in range(len(src)):
        yield src.text(i), tgt.text(i)


def shared_ids(s_ids: np.ndarray, s_special: np.ndarray, t_ids: np.ndarray, t_special: np.ndarray) -> np.ndarray:
    """Ids that occur as non-special tokens on both sides."""
    return np.intersect1d(s_ids[~s_special], t_ids[~t_special])


def token_decomposition(src: Side, tgt: Side) -> dict:
    """Shared, language-specific, special and first-token cosines of one layer (see the module doc)."""
    return decomposition_summary(decomposition_items(src, tgt))


def decomposition_items(src: Side, tgt: Side) -> dict:
    """What ``token_decomposition`` averages, before averaging: the per-item cosines of each kind and the token
    counts. Items of consecutive chunks of pairs, joined by ``join_items``, summarize as all pairs at once."""
    shared, specific, special, first = [], [], [], []
    n_shared_tokens = n_tokens = 0
    for (sv, si, ss), (tv, ti, ts) in _pairs(src, tgt):
        common = shared_ids(si, ss, ti, ts)
        for tid in common:
            c = _cos(sv[(si == tid) & ~ss].mean(0), tv[(ti == tid) & ~ts].mean(0))
            if c is not None:
                shared.append(c)
        s_only, t_only = ~ss & ~np.isin(si, common), ~ts & ~np.isin(ti, common)
        n_shared_tokens += int((~ss & np.isin(si, common)).sum() + (~ts & np.isin(ti, common)).sum())
        n_tokens += int((~ss).sum() + (~ts).sum())
        if s_only.any() and t_only.any():
            c = _cos(sv[s_only].mean(0), tv[t_only].mean(0))
            if c is not None:
                specific.append(c)
        if ss.any() and ts.any():
            c = _cos(sv[ss].mean(0), tv[ts].mean(0))
            if c is not None:
                special.append(c)
        c = _cos(sv[0], tv[0])
        if c is not None:
            first.append(c)
    return {"shared": shared, "specific": specific, "special": special, "first": first,
            "shared_tokens": n_shared_tokens, "tokens": n_tokens}


def join_items(a: dict | None, b: dict) -> dict:
    """The items of two chunks of pairs, in order (lists joined, counts added)."""
    if a is None:
        return b
    return {k: a[k] + b[k] for k in b}


def decomposition_summary(items: dict) -> dict:
    shared, specific, special, first = items["shared"], items["specific"], items["special"], items["first"]
    return {"shared_cosine": _mean(shared), "n_shared": len(shared),
            "specific_cosine": _mean(specific), "n_specific": len(specific),
            "special_cosine": _mean(special), "n_special": len(special),
            "first_token_cosine": _mean(first),
            "shared_token_share": items["shared_tokens"] / items["tokens"] if items["tokens"] else None}


def pooled_without_shared(src: Side, tgt: Side) -> tuple[np.ndarray, np.ndarray]:
    """float64 ``[n, hidden]`` per side: the mean of each text's non-special tokens whose ids the other side
    lacks (all its non-special tokens when that leaves none; all its tokens when it has only special ones)."""
    hidden = src.vectors.shape[1]
    out_s, out_t = np.zeros((len(src), hidden)), np.zeros((len(tgt), hidden))
    for i, ((sv, si, ss), (tv, ti, ts)) in enumerate(_pairs(src, tgt)):
        common = shared_ids(si, ss, ti, ts)
        for vec, ids, spec, out in ((sv, si, ss, out_s), (tv, ti, ts, out_t)):
            keep = ~spec & ~np.isin(ids, common)
            if not keep.any():
                keep = ~spec if (~spec).any() else np.ones(len(ids), bool)
            out[i] = vec[keep].mean(0)
    return out_s, out_t


def position_bins(length: int, bins: int) -> np.ndarray:
    """Relative-position bin of each of ``length`` tokens: floor((p + 0.5) / length * bins)."""
    return np.minimum(((np.arange(length) + 0.5) / length * bins).astype(np.int64), bins - 1)


def position_cosine(src: Side, tgt: Side, bins: int = 10) -> list[float | None]:
    """Per relative-position bin, the mean over pairs of the cosine between the two sides' bin means."""
    return [_mean(v) for v in position_items(src, tgt, bins)]


def position_items(src: Side, tgt: Side, bins: int = 10) -> list[list[float]]:
    """Per bin, the pairs' cosines that ``position_cosine`` averages (chunks join bin by bin)."""
    per_bin: list[list[float]] = [[] for _ in range(bins)]
    for (sv, _, ss), (tv, _, ts) in _pairs(src, tgt):
        sv, tv = sv[~ss], tv[~ts]
        if not len(sv) or not len(tv):
            continue
        sb, tb = position_bins(len(sv), bins), position_bins(len(tv), bins)
        for b in range(bins):
            if (sb == b).any() and (tb == b).any():
                c = _cos(sv[sb == b].mean(0), tv[tb == b].mean(0))
                if c is not None:
                    per_bin[b].append(c)
    return per_bin


# ---------------------------------------------------------------- words in context

def span_vectors(layers: list[np.ndarray], spans: np.ndarray, offsets: np.ndarray,
                 occurrences: list[tuple[int, int, int]]) -> np.ndarray:
    """float64 ``[len(occurrences), hidden]``: for each ``(text, start, end)``, the mean over the tokens of
    that text whose character span overlaps ``[start, end)`` of the mean over ``layers`` (one layer, or the
    last k); an occurrence no token covers is a zero row."""
    out = np.zeros((len(occurrences), layers[0].shape[1]))
    for j, (text, start, end) in enumerate(occurrences):
        a, b = int(offsets[text]), int(offsets[text + 1])
        sp = np.asarray(spans[a:b])
        hit = np.nonzero((sp[:, 0] < end) & (sp[:, 1] > start) & (sp[:, 1] > sp[:, 0]))[0] + a
        if len(hit):
            out[j] = np.mean([np.asarray(layer[hit], np.float64).mean(0) for layer in layers], axis=0)
    return out


def same_word_share(vectors: np.ndarray, words: list[str], k: int) -> tuple[float, list[list[int]]]:
    """(mean share of each occurrence's k nearest other occurrences, by cosine, that are the same word;
    the neighbour lists). Ties go to the lower row."""
    x = np.asarray(vectors, np.float64)
    norms = np.linalg.norm(x, axis=1, keepdims=True)
    x = x / np.where(norms == 0, 1.0, norms)
    sims = x @ x.T
    np.fill_diagonal(sims, -np.inf)
    k = min(k, len(x) - 1)
    order = np.lexsort((np.broadcast_to(np.arange(len(x)), sims.shape), -sims), axis=1)[:, :k]
    labels = np.asarray(words)
    share = float(np.mean([(labels[row] == labels[i]).mean() for i, row in enumerate(order)])) if k > 0 else 0.0
    return share, order.tolist()
