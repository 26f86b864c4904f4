"""A registered test engine that returns deterministic vectors at memory speed (tests and benchmarks only).

``fake`` tokenizes like any engine (the model's own tokenizer, prompts and truncation) and returns, for
each text, vectors that depend only on its token ids and the layer, so every executor must give the same
store; it costs next to nothing, so the store's write path is what is measured. Import this module to
register it with ``register_fake()`` (and take it away with ``unregister_fake()``, so no other test sees an
engine the product does not have); ``python tests/fake_engine.py extract ...`` runs the CLI with it registered.
"""

from __future__ import annotations

import sys

import numpy as np

from layerscope.engines.base import Engine
from layerscope.engines import registry

SPEC = registry.EngineSpec("fake", "deterministic vectors at memory speed (tests only)", needs_export=False,
                           device="cpu")


class FakeEngine(Engine):
    name = "fake"
    preferred_batch_tokens = 8192

    def __init__(self, model, **options):
        super().__init__(model)
        self.info.provider = "fake"
        hidden = int(self.manifest.hidden_size)
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


def register_fake() -> None:
    registry.engines()  # the product's engines are found first
    if "fake" not in registry._ENGINES:
        registry.register(SPEC)(FakeEngine)


def unregister_fake() -> None:
    registry._ENGINES.pop("fake", None)


def setup() -> None:
    """For Ray's ``worker_process_setup_hook``."""
    register_fake()


if __name__ == "__main__":
    from layerscope.cli import main

    register_fake()
    sys.exit(main(sys.argv[1:]))
