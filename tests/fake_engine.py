"""A registered test engine that returns deterministic vectors at memory speed (tests and benchmarks only).

``fake`` tokenizes like any engine (the model's own tokenizer, prompts and truncation) and returns, for
each text, vectors that depend only on its token ids and the layer, so every executor must give the same
store; it costs next to nothing, so the store's write path is what is measured. Import this module to
register it (``python tests/fake_engine.py extract ...`` runs the CLI with it registered).
"""

from __future__ import annotations

import sys

import numpy as np

from layerscope.engines.base import Engine
from layerscope.engines.registry import EngineSpec, register


@register(EngineSpec("fake", "deterministic vectors at memory speed (tests only)", needs_export=False, device="cpu"))
class FakeEngine(Engine):
    name = "fake"
    preferred_batch_tokens = 8192

    def __init__(self, model, **options):
        super().__init__(model)
        self.info.provider = "fake"
        hidden = int(self.manifest["hidden_size"])
        self._basis = np.random.default_rng(0).standard_normal((4096, hidden)).astype(np.float32)

    def run(self, batch, layers, poolings):
        ids, mask = batch.input_ids, batch.mask.astype(np.float32)
        rows = self._basis[ids % len(self._basis)] * mask[..., None]  # [batch, seq, hidden]
        mean = rows.sum(1) / np.maximum(mask.sum(1, keepdims=True), 1.0)
        first = rows[:, 0]
        out = {}
        for p in poolings:
            base = first if p == "cls" else mean
            out[p] = np.stack([base * (1.0 + 0.25 * li) + 0.01 * li for li in range(len(layers))]).astype(np.float32)
        return out

    def run_tokens(self, batch, layers):
        raise NotImplementedError


def setup() -> None:
    """For Ray's ``worker_process_setup_hook``: importing this module registered the engine."""


if __name__ == "__main__":
    from layerscope.cli import main

    sys.exit(main(sys.argv[1:]))
