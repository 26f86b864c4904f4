"""Token-level vectors of a small list of texts, in memory (what analyses on tokens read): the same batches,
engine call and ragged layout as a token store (runtime/token_store.py), without the store."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from layerscope.runtime.token_store import offsets_of, token_counts


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


def embed_tokens(eng, texts: list[str], layers: list[str], *, batch_tokens: int | None = None,
                 max_length: int | None = None, prompt: str = "") -> TokenVectors:
    from layerscope.runtime.batching import DEFAULT_MAX_BATCH, encode_plan

    encoder = eng.encoder(max_length, prompt)
    encoder.details = True
    lengths = encoder.token_lengths(texts)
    offsets = offsets_of(token_counts(lengths, encoder.max_length))
    total, hidden = int(offsets[-1]), eng.manifest.hidden_size
    out = TokenVectors(offsets, np.zeros(total, np.int32), np.zeros(total, np.uint8), np.zeros((total, 2), np.int32),
                       {layer: np.zeros((total, hidden), np.float32) for layer in layers})
    budget = int(batch_tokens or eng.preferred_batch_tokens)
    for batch in encode_plan(encoder, list(texts), lengths, batch_tokens=budget, max_batch=DEFAULT_MAX_BATCH):
        states = eng.run_tokens(batch, layers)
        valid = np.asarray(batch.mask) > 0
        starts = np.concatenate([[0], np.cumsum(valid.sum(1))])
        flat = [(out.ids, batch.input_ids[valid]), (out.special, batch.special[valid]), (out.spans, batch.spans[valid])]
        flat += [(out.layers[layer], s[valid]) for layer, s in zip(layers, states)]
        for dst, values in flat:
            for i, row in enumerate(batch.index):
                dst[offsets[row]:offsets[row + 1]] = values[starts[i]:starts[i + 1]]
    return out
