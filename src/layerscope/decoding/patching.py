"""Activation patching between paired inputs on any engine that writes states (engines/resume.py).

For each clean/corrupted pair, both texts run once for every layer's states. Then, for each layer j and each
column (a position, or a group of positions), the corrupted run's state at layer j gets the clean run's state at
that column's positions, and layers j+1..L run from there; the metric is read off the end. The copies of one
pair that differ only in the column patched are one batch (``rows`` at most), so each layer's suffix runs once
per position batch, never the whole model once per (layer, position).

Positions align one to one: a pair's clean and corrupted texts must tokenize to the same number of tokens
(``tokenize_pairs`` says which pair does not, before any layer runs). Columns (``by``):

* ``position``: each token position. Pairs of one length share their positions (labelled with the token every
  pair has there, ``clean/corrupted`` where they differ, or how many pairs change their token there);
  pairs of several lengths are aligned at their last
  token (``last``, ``last-1``, ...), a column holding the pairs long enough to reach it.
* ``group``: ``changed`` (positions whose tokens differ), ``before`` and ``after`` them, and ``last`` (the last
  token, where it did not change); a pair without a group leaves that cell to the others.

Metrics (``PatchMetric``): ``similarity`` (encoders: cosine of the run's pooled final embedding with the pair's
``other`` text's, or with the clean run's), ``logit_diff`` (decoders: target minus foil logit at the next token)
and ``prob`` (decoders: the target's next-token probability), read through the model's head
(decoding/head_graph.py). The effect of a cell is ``metrics.intervention.normalised_effect`` over the pairs.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from layerscope.decoding.readout import cosines, last_positions, pooled, tiled, token_id
from layerscope.errors import InputError

METRICS = ("similarity", "logit_diff", "prob")
BY = ("position", "group")
GROUPS = ("before", "changed", "after", "last")


@dataclass
class PairRun:
    """One pair as the model reads it: its two one-text batches and their every layer's states."""

    index: int
    line: int
    clean: Any  # Batch of one text
    corrupted: Any
    clean_tokens: list[str]
    corrupted_tokens: list[str]
    target: int | None = None
    foil: int | None = None
    clean_states: list[np.ndarray] = field(default_factory=list)  # layers 0..L, each [tokens, hidden]
    corrupted_states: list[np.ndarray] = field(default_factory=list)

    @property
    def length(self) -> int:
        return int(self.clean.mask.shape[1])

    def changed(self) -> np.ndarray:
        return np.nonzero(self.clean.input_ids[0] != self.corrupted.input_ids[0])[0]


def tokenize_pairs(engine, pairs, *, metric: str, drop_uneven: bool = False,
                   say: Callable[[str], None] = lambda _m: None) -> list[PairRun]:
    """Each pair tokenized on its own (no padding) and checked: the same number of tokens in both texts (the
    alignment rule), a difference somewhere, the metric's tokens. ``drop_uneven`` (the built-in set) leaves out
    pairs of two lengths, saying how many, instead of refusing the first."""
    enc = engine.encoder()
    tok = engine.model.tokenizer()
    out, dropped = [], []
    for i, pair in enumerate(pairs):
        clean, corrupted = enc([pair.clean]), enc([pair.corrupted])
        if bool(clean.truncated[0]) or bool(corrupted.truncated[0]):
            raise InputError(f"pair on line {pair.line}: a text is longer than the model's {enc.max_length} tokens; "
                             "shorten it (positions must align, so nothing is cut)")
        n_clean, n_corr = int(clean.mask.sum()), int(corrupted.mask.sum())
        if n_clean != n_corr:
            if drop_uneven:
                dropped.append(pair.line)
                continue
            raise InputError(f"pair on line {pair.line}: the clean text has {n_clean} tokens and the corrupted "
                             f"{n_corr}; patching aligns positions one to one, so both must tokenize to the same "
                             "number of tokens (swap words of one token each, or pad the shorter text's wording)")
        run = PairRun(len(out), pair.line, clean, corrupted,
                      tok.convert_ids_to_tokens(clean.input_ids[0].tolist()),
                      tok.convert_ids_to_tokens(corrupted.input_ids[0].tolist()))
        if not run.changed().size:
            raise InputError(f"pair on line {pair.line}: clean and corrupted tokenize to the same tokens; a patch "
                             "between them changes nothing")
        if metric != "similarity":
            if pair.target is None:
                raise InputError(f"--metric {metric} reads the pairs' 'target'" +
                                 (" and 'foil'" if metric == "logit_diff" else "") +
                                 f" tokens; the pair on line {pair.line} has none")
            run.target = token_id(tok, pair.target, f"pair on line {pair.line}: target")
            run.foil = token_id(tok, pair.foil, f"pair on line {pair.line}: foil")
            if metric == "logit_diff" and run.target == run.foil:
                raise InputError(f"pair on line {pair.line}: target {pair.target!r} and foil {pair.foil!r} begin "
                                 "with the same token, so their logit difference is 0")
        out.append(run)
    if dropped:
        say(f"{len(dropped)} built-in pair(s) left out: their clean and corrupted texts tokenize to different "
            f"lengths in this model (lines {', '.join(map(str, dropped[:5]))}{'...' if len(dropped) > 5 else ''})")
    if not out:
        raise InputError("no pair is left whose clean and corrupted texts tokenize to the same length")
    return out


@dataclass(frozen=True)
class Columns:
    """What a cell's column is: its labels, and per pair the positions each column patches ([] where none)."""

    labels: tuple[str, ...]
    positions: tuple[tuple[tuple[int, ...], ...], ...]  # [pair][column] -> positions
    alignment: str  # how columns align across pairs, in words


def columns(runs: list[PairRun], by: str) -> Columns:
    if by == "group":
        per = []
        for run in runs:
            changed = set(int(x) for x in run.changed())
            last = run.length - 1
            first, final = min(changed), max(changed)
            groups = {"before": [t for t in range(first) if t not in changed],
                      "changed": sorted(changed),
                      "after": [t for t in range(final + 1, last)],
                      "last": [last] if last not in changed else []}
            per.append(tuple(tuple(groups[g]) for g in GROUPS))
        return Columns(GROUPS, tuple(per), "groups of positions: before, at and after the changed tokens, and the "
                                           "last token")
    lengths = {run.length for run in runs}
    top = max(lengths)
    if len(lengths) == 1:
        labels = tuple(_position_label(runs, t) for t in range(top))
        per = tuple(tuple((t,) for t in range(top)) for _ in runs)
        return Columns(labels, per, "positions one to one (every pair has the same length)")
    labels = tuple("last" if k == 0 else f"last-{k}" for k in range(top - 1, -1, -1))
    per = tuple(tuple((c - (top - run.length),) if c >= top - run.length else () for c in range(top)) for run in runs)
    return Columns(labels, per, "positions counted from each pair's last token (the pairs differ in length)")


def _position_label(runs: list[PairRun], t: int) -> str:
    """Position ``t`` of pairs of one length: its token where every pair has the same one there (``clean/corrupted``
    where they differ), else how many pairs change their token there, else the number alone."""
    seen = {(r.clean_tokens[t], r.corrupted_tokens[t]) for r in runs}
    if len(seen) == 1:
        a, b = seen.pop()
        return f"{t} {a}" if a == b else f"{t} {a}/{b}"
    changed = sum(r.clean_tokens[t] != r.corrupted_tokens[t] for r in runs)
    if changed == len(runs):
        return f"{t} (changed)"
    return f"{t} (changed in {changed} of {len(runs)})" if changed else str(t)


class PatchMetric:
    """The figure a patch is judged by, read off the final layer's states of a batch of copies of one pair."""

    name = ""
    reads = ""

    def of(self, run: PairRun, batch, final: np.ndarray) -> np.ndarray:
        raise NotImplementedError


class Similarity(PatchMetric):
    name = "similarity"

    def __init__(self, manifest, pooling: str, references: np.ndarray, reads: str):
        self.manifest, self.pooling, self.references, self.reads = manifest, pooling, references, reads

    def of(self, run: PairRun, batch, final: np.ndarray) -> np.ndarray:
        return cosines(pooled(self.manifest, batch, final, self.pooling), self.references[run.index])


class HeadMetric(PatchMetric):
    """A decoder's next-token figure at the last token: logit difference or the target's probability."""

    def __init__(self, head, name: str):
        self.head, self.name = head, name
        self.reads = ("logit(target) - logit(foil) at the next token" if name == "logit_diff"
                      else "probability of the target at the next token")

    def of(self, run: PairRun, batch, final: np.ndarray) -> np.ndarray:
        from layerscope.metrics.intervention import log_softmax, logit_difference

        last = last_positions(batch.mask)
        logits = self.head.logits(final[np.arange(len(final)), last], self.head.num_layers)
        if self.name == "logit_diff":
            return logit_difference(logits, run.target, run.foil)
        return np.exp(log_softmax(logits)[:, run.target])


@dataclass
class PatchResult:
    """Per pair, layer and column the patched run's metric (NaN where the pair has no such column); per pair the
    clean and corrupted runs' metric; how many runs it took against the naive count."""

    layers: list[int]
    columns: Columns
    patched: np.ndarray  # [pairs, layers, columns]
    clean: np.ndarray  # [pairs]
    corrupted: np.ndarray  # [pairs]
    suffix_runs: int = 0  # resume runs (one per layer below L, pair and position batch)
    suffix_rows: int = 0  # copies run through them
    naive_runs: int = 0  # whole-model runs patching one cell each would take
    block_rows: int = 0  # block applications x copies the resume runs made (blocks j+1..L each)
    naive_block_rows: int = 0  # ... and the naive runs (every block each)


def run_pairs(engine, runs: list[PairRun]) -> None:
    """Every layer's states of each pair's two texts (one run each)."""
    names = [str(i) for i in range(engine.manifest.num_layers + 1)]
    for run in runs:
        run.clean_states = [s[0] for s in engine.run_tokens(run.clean, names)]
        run.corrupted_states = [s[0] for s in engine.run_tokens(run.corrupted, names)]


def patch(engine, runs: list[PairRun], metric: PatchMetric, layers: list[int], cols: Columns, *, rows: int = 64,
          bar=None) -> PatchResult:
    """Patch every (layer, column) of every pair (``run_pairs`` first): the corrupted state at the layer gets the
    clean state at the column's positions, the layers after it run, ``metric`` reads the end. Copies of one pair
    run ``rows`` at a time; layers outermost, so each layer's resume graph is opened once."""
    num_layers = engine.manifest.num_layers
    n, c = len(runs), len(cols.labels)
    patched = np.full((n, len(layers), c), np.nan)
    clean = np.array([metric.of(r, r.clean, r.clean_states[num_layers][None])[0] for r in runs])
    corrupted = np.array([metric.of(r, r.corrupted, r.corrupted_states[num_layers][None])[0] for r in runs])
    result = PatchResult(list(layers), cols, patched, clean, corrupted)
    for li, layer in enumerate(layers):
        for run in runs:
            todo = [k for k in range(c) if cols.positions[run.index][k]]
            for start in range(0, len(todo), max(1, int(rows))):
                chunk = todo[start:start + max(1, int(rows))]
                state = np.repeat(run.corrupted_states[layer][None], len(chunk), axis=0)
                for row, k in enumerate(chunk):
                    where = list(cols.positions[run.index][k])
                    state[row, where] = run.clean_states[layer][where]
                batch = tiled(run.corrupted, np.zeros(len(chunk), dtype=np.int64))
                final = engine.resume(batch, layer, state, [num_layers])[0]
                patched[run.index, li, chunk] = metric.of(run, batch, final)
                if layer < num_layers:  # at layer L the state is the end: nothing runs
                    result.suffix_runs += 1
                    result.suffix_rows += len(chunk)
                result.block_rows += len(chunk) * (num_layers - layer)
                if bar is not None:
                    bar.advance(len(chunk))
            result.naive_runs += len(todo)
            result.naive_block_rows += len(todo) * num_layers
    return result


def pair_grid(result: PatchResult, index: int) -> list[list[float | None]]:
    """One pair's effect per (layer, column): its own (patched - corrupted) / (clean - corrupted)."""
    from layerscope.metrics.intervention import normalised_effect

    out = []
    for li in range(len(result.layers)):
        row = []
        for k in range(len(result.columns.labels)):
            value = result.patched[index, li, k]
            row.append(None if not np.isfinite(value) else
                       normalised_effect([value], [result.clean[index]], [result.corrupted[index]]))
        out.append(row)
    return out
