"""Token-level vectors of a small list of texts, in memory (what analyses on tokens read): the same batches,
engine call and ragged layout as a token store (store/token_store.py), without the store.

A corpus is read in chunks (``token_chunks``): each chunk's token vectors, every layer asked, fit in
``CHUNK_BYTES``, so what an analysis holds at once is bounded by that, not by the corpus; each engine batch
advances a progress count (``steps``), so a long pass is never silent."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from layerscope.store.token_store import offsets_of, token_counts


@dataclass
class TokenVectors:
    """Ragged token vectors of ``n`` texts: text i's tokens are rows ``offsets[i]:offsets[i+1]``."""

    offsets: np.ndarray  # int64 [n + 1]
    ids: np.ndarray  # int32 [T]
    special: np.ndarray  # uint8 [T]
    spans: np.ndarray  # int32 [T, 2], character spans in the text
    layers: dict[str, np.ndarray]  # layer name -> float32 [T, hidden]

    def select(self, rows: np.ndarray) -> "TokenVectors":
        """The texts at ``rows``, in that order."""
        rows = np.asarray(rows, dtype=np.int64)
        index = np.concatenate([np.arange(self.offsets[r], self.offsets[r + 1]) for r in rows]) if len(rows) \
            else np.zeros(0, np.int64)
        return TokenVectors(offsets_of(np.diff(self.offsets)[rows]), self.ids[index], self.special[index],
                            self.spans[index], {k: v[index] for k, v in self.layers.items()})


CHUNK_BYTES = 256 * 2**20  # token vectors (every layer asked) held at once by an analysis reading a corpus


def token_lengths(eng, texts: list[str], *, max_length: int | None = None,
                  prompt: str = "") -> tuple[np.ndarray, np.ndarray]:
    """``(token lengths, tokens fed)`` per text (the second capped at the max length), from the tokenizer alone."""
    encoder = eng.encoder(max_length, prompt)
    lengths = encoder.token_lengths(list(texts))
    return lengths, token_counts(lengths, encoder.max_length)


def token_chunks(tokens: np.ndarray, groups: list[np.ndarray], row_bytes: int,
                 budget: int | None = None) -> list[np.ndarray]:
    """``groups`` (arrays of text indices that must be read together, e.g. the two sides of a pair) gathered,
    in order, into chunks whose tokens take at most ``budget`` bytes at ``row_bytes`` per token (a group
    larger than that is a chunk of its own); each chunk is the concatenated indices."""
    limit = max(int(CHUNK_BYTES if budget is None else budget) // max(int(row_bytes), 1), 1)
    chunks, now, size = [], [], 0
    for group in groups:
        need = int(np.asarray(tokens)[group].sum())
        if now and size + need > limit:
            chunks.append(np.concatenate(now))
            now, size = [], 0
        now.append(np.asarray(group, np.int64))
        size += need
    if now:
        chunks.append(np.concatenate(now))
    return chunks


def embed_tokens(eng, texts: list[str], layers: list[str], *, batch_tokens: int | None = None,
                 max_length: int | None = None, prompt: str = "", lengths: np.ndarray | None = None,
                 bar=None, edit=None) -> TokenVectors:
    """Token vectors of ``texts`` (``lengths``: their untruncated token lengths, when known already; ``bar``:
    a progress count advanced by the texts of each engine batch; ``edit``: a function that changes a batch's
    input ids in place before the engine runs it, keeping every text's length, e.g. a control's shuffled
    tokens; the ids stored are the ids run)."""
    from layerscope.extraction.batching import DEFAULT_MAX_BATCH, encode_plan

    encoder = eng.encoder(max_length, prompt)
    encoder.details = True
    lengths = encoder.token_lengths(texts) if lengths is None else np.asarray(lengths)
    offsets = offsets_of(token_counts(lengths, encoder.max_length))
    total, width = int(offsets[-1]), eng.manifest.width_of  # raw: the word embeddings' width
    out = TokenVectors(offsets, np.zeros(total, np.int32), np.zeros(total, np.uint8), np.zeros((total, 2), np.int32),
                       {layer: np.zeros((total, width([layer])), np.float32) for layer in layers})
    budget = int(batch_tokens or eng.preferred_batch_tokens)
    for batch in encode_plan(encoder, list(texts), lengths, batch_tokens=budget, max_batch=DEFAULT_MAX_BATCH):
        if edit is not None:
            edit(batch)
        states = eng.run_tokens(batch, layers)
        valid = np.asarray(batch.mask) > 0
        starts = np.concatenate([[0], np.cumsum(valid.sum(1))])
        flat = [(out.ids, batch.input_ids[valid]), (out.special, batch.special[valid]), (out.spans, batch.spans[valid])]
        flat += [(out.layers[layer], s[valid]) for layer, s in zip(layers, states)]
        for dst, values in flat:
            for i, row in enumerate(batch.index):
                dst[offsets[row]:offsets[row + 1]] = values[starts[i]:starts[i + 1]]
        if bar is not None:
            bar.advance(len(batch.index))
    return out
