"""The token-level half of an extraction (``extract ... --tokens``): what the pipeline calls, in four steps.

``start_tokens`` reserves (or, resuming, reopens) the token arrays once the corpus is spooled and its
token lengths are known, and says what they cost; ``TokenRun.run`` gets a batch's pooled vectors and
token vectors from one forward pass (``Engine.run_keeping_tokens``) and writes the tokens into their ranges;
``TokenRun.commit`` flushes them before the store marks the rows done; ``TokenRun.finish`` writes the
token strings before the store's checksums are taken. The arrays themselves: ``store/token_store.py``.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING, Callable

import numpy as np

from layerscope.errors import StoreError
from layerscope.store import store_dtype
from layerscope.store.token_store import TextTokenWriter, TokenWriter, create_token_arrays, describe_cost

if TYPE_CHECKING:
    from layerscope.model.tokenize import Batch

log = logging.getLogger("layerscope")


def tokens_dtype(tokens: bool, dtype: str) -> str | None:
    """The dtype a run stores its token vectors in (checked); None without ``--tokens``."""
    return store_dtype.check(dtype) if tokens else None


class TokenRun:
    """A run's token arrays, written batch by batch through ``writer``; ``check`` (the text writer's) refuses a
    batch that cannot be written before the engine runs it (an image batch needs none: every image has the
    export's tokens, which the image writer's ``keep`` holds the engine to)."""

    def __init__(self, writer: TokenWriter, check: Callable[[Batch], None] | None = None):
        self.writer = writer
        self.check = check

    def run(self, eng, batch, layers: list[str], poolings: list[str]) -> dict[str, np.ndarray]:
        """The batch's pooled vectors; its token vectors are written on the way (one forward pass), each layer
        held only as the store keeps it (real tokens, storage type) from the moment the engine hands it over."""
        if self.check is not None:
            self.check(batch)  # before the expensive work
        pooled, kept = eng.run_keeping_tokens(batch, layers, poolings, list(self.writer.section.layers),
                                              lambda layer, states: self.writer.keep(batch, layer, states))
        self.writer.write(batch, kept)
        return pooled

    def commit(self, store, index: np.ndarray) -> None:
        self.writer.flush()  # tokens on disk first: a row is marked done only once all of it is durable
        store.commit(index)

    def finish(self, tokenizer) -> None:
        self.writer.close()
        self.writer.write_strings(tokenizer)


def start_tokens(store, lengths: np.ndarray, layers: list[str]) -> TokenRun | None:
    """The token half of this run, or None when its store holds no tokens (a resumed store's token settings
    were matched with the rest of its spec, ``prepare.open_to_resume``)."""
    want = store.spec.tokens
    if want is None:
        return None
    max_length = store.spec.max_length
    section = store.record.token_arrays
    if section is None:  # a new store (or one killed before its token arrays were made: no row is done)
        if int(store.done_mask().sum()):
            raise StoreError(f"{store.path} has rows done but no token arrays; re-run with --force")
        hidden = store.hidden_size
        log.info(describe_cost(int(np.minimum(np.maximum(lengths, 1), max_length).sum()), len(lengths), layers,
                               hidden, want.dtype))
        section = create_token_arrays(Path(store.path), lengths, max_length, layers, hidden, want.dtype)
        store.add_token_arrays(section)
    writer = TextTokenWriter(Path(store.path), section)
    return TokenRun(writer, writer.check)
