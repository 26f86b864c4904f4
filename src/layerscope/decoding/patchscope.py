"""A one-token Patchscope (Ghandeharioun et al. 2024): what a hidden state says when placed in another prompt.

The source state is layer i's state of a source text at its last token that is not a special token. It is placed
in the target prompt at that prompt's last non-special token (the placeholder: ``?`` in the default identity
prompt, ``cat -> cat; 1135 -> 1135; hello -> hello; ?``), at layer j, replacing the prompt's own state there; the
layers after j run (the engine's resume graphs, engines/resume.py) and the head reads the distribution at that
position (decoding/head_graph.py). Target layer L is the head reading the source state directly, as the logit
lens reads layer i (the final norm applied below the last layer where the head has one): the logit lens is the
Patchscope's last column.

What is read: whether the top token is the reference token (a decoder's: the model's own next-token prediction at
the source position; an encoder's: the source token itself), and the reference token's probability. Copies of the
prompt carrying different sources and source layers run together, ``rows`` at a time, once per target layer.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from layerscope.decoding.readout import tiled
from layerscope.errors import InputError

IDENTITY_PROMPT = "cat -> cat; 1135 -> 1135; hello -> hello; ?"


def placeholder(batch, special: set[int]) -> np.ndarray:
    """Per row the last real token that is not a special token (the last real token where every one is)."""
    ids, mask = np.asarray(batch.input_ids), np.asarray(batch.mask) > 0
    plain = mask & ~np.isin(ids, sorted(special))
    use = np.where(plain.any(axis=1)[:, None], plain, mask)
    return use.shape[1] - 1 - np.argmax(use[:, ::-1], axis=1)


@dataclass
class PatchscopeResult:
    """Per source and (source layer i, target layer j): whether the top token is the reference, and its
    probability; the last target column is the logit lens."""

    source_layers: list[int]
    target_layers: list[int]  # the last is L: the lens
    top1: np.ndarray  # bool [sources, i, j]
    prob: np.ndarray  # [sources, i, j]
    reference: np.ndarray  # [sources] token ids
    top_ids: np.ndarray  # int [sources, i, j]: the top token
    runs: int = 0
    rows: int = 0


def patchscope(engine, head, sources: list[str], prompt: str, *, rows: int = 64, bar=None) -> PatchscopeResult:
    from layerscope.metrics.intervention import log_softmax

    manifest = engine.manifest
    num_layers = manifest.num_layers
    decoder = manifest.kind == "decoder"
    special = set(int(i) for i in engine.model.tokenizer().all_special_ids)
    enc = engine.encoder()
    names = [str(i) for i in range(num_layers + 1)]
    layers = list(range(num_layers + 1))
    n = len(sources)
    states = np.zeros((n, num_layers + 1, manifest.hidden_size), np.float32)
    reference = np.zeros(n, np.int64)
    for start in range(0, n, 32):
        batch = enc(sources[start:start + 32])
        at = placeholder(batch, special)
        got = engine.run_tokens(batch, names)
        rows_ = np.arange(batch.size)
        states[start:start + batch.size] = np.stack([s[rows_, at] for s in got], axis=1)
        if decoder:  # the model's own next-token prediction at the source position
            reference[start:start + batch.size] = head.logits(got[num_layers][rows_, at], num_layers).argmax(-1)
        else:
            reference[start:start + batch.size] = batch.input_ids[rows_, at]
    top1 = np.zeros((n, len(layers), len(layers)), bool)
    prob = np.zeros((n, len(layers), len(layers)))
    top_ids = np.zeros((n, len(layers), len(layers)), np.int64)
    result = PatchscopeResult(layers, layers, top1, prob, reference, top_ids)

    def read(logits: np.ndarray, cells: np.ndarray, ref: np.ndarray) -> None:
        top = logits.argmax(-1)
        top1[cells[:, 0], cells[:, 1], cells[:, 2]] = top == ref
        top_ids[cells[:, 0], cells[:, 1], cells[:, 2]] = top
        prob[cells[:, 0], cells[:, 1], cells[:, 2]] = np.exp(log_softmax(logits)[np.arange(len(ref)), ref])

    for i in layers:  # target layer L: the head reads the source state itself (the logit lens)
        cells = np.array([(s, i, num_layers) for s in range(n)])
        read(head.logits(states[:, i], i), cells, reference)
    target = enc([prompt])
    if bool(target.truncated[0]):
        raise InputError(f"the target prompt is longer than the model's {enc.max_length} tokens")
    t = int(placeholder(target, special)[0])
    own = engine.run_tokens(target, names)
    pairs = [(s, i) for s in range(n) for i in layers]
    for j in layers[:-1]:
        for start in range(0, len(pairs), max(1, int(rows))):
            chunk = np.array(pairs[start:start + max(1, int(rows))])
            state = np.repeat(own[j], len(chunk), axis=0)
            state[:, t] = states[chunk[:, 0], chunk[:, 1]]
            copies = tiled(target, np.zeros(len(chunk), dtype=np.int64))
            final = engine.resume(copies, j, state, [num_layers])[0]
            cells = np.column_stack([chunk, np.full(len(chunk), j)])
            read(head.logits(final[:, t], num_layers), cells, reference[chunk[:, 0]])
            result.runs += 1
            result.rows += len(chunk)
            if bar is not None:
                bar.advance(len(chunk))
    return result
