"""A registered test engine that returns deterministic vectors at memory speed (tests and benchmarks only).

``fake`` tokenizes like any engine (the model's own tokenizer, prompts and truncation) and returns, for
each text, vectors that depend only on its token ids and the layer, so every executor must give the same
store; it costs next to nothing, so the store's write path is what is measured. Import this module to
register it with ``register_fake()`` (and take it away with ``unregister_fake()``, so no other test sees an
engine the product does not have); ``python tests/fake_engine.py extract ...`` runs the CLI with it registered.
"""

from __future__ import annotations

import json
import sys

import numpy as np

from layerscope.engines.base import Engine
from layerscope.engines import registry

OPENED = "opened with "  # the note that records the options the engine was opened with
SPEC = registry.EngineSpec("fake", "deterministic vectors at memory speed (tests only)", needs_export=False,
                           device="cpu")


class FakeEngine(Engine):
    name = "fake"
    preferred_batch_tokens = 8192

    def __init__(self, model, *, spec: registry.EngineSpec | None = None, **options):
        super().__init__(model, spec)
        self.info.provider = "fake"
        # what it was opened with, recorded in the store's engine record (compared across executors)
        self.info.notes.append(OPENED + json.dumps(options, sort_keys=True))
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


# Faults for tests that run range writers as real processes (``--shard`` commands, Ray actors), set by
# environment variables that only this test module reads; the product has no such hooks.
STALL_RANGE = "FAKE_STALL_RANGE"  # a range number: sleep inside it (after its claim), to be killed there
RANGE_DELAY = "FAKE_RANGE_DELAY"  # seconds to wait inside every range, so two processes overlap
KILL_DIR = "FAKE_KILL_DIR"  # a folder: a file kill-<k> there makes the process SIGKILL itself once inside range k


def install_range_faults() -> None:
    """Wrap ``RangeWriter.run`` in this process with the faults the environment asks for (none: unchanged)."""
    import os
    import signal
    import time
    from pathlib import Path

    from layerscope.extraction.range_writer import RangeWriter

    stall, delay, kill_dir = os.environ.get(STALL_RANGE), os.environ.get(RANGE_DELAY), os.environ.get(KILL_DIR)
    if not (stall or delay or kill_dir) or getattr(RangeWriter.run, "with_faults", False):
        return
    real_run = RangeWriter.run

    def run(self, r, claim=None):
        if stall == str(r.k):
            time.sleep(600)
        if delay:
            time.sleep(float(delay))
        if kill_dir and (Path(kill_dir) / f"kill-{r.k}").exists() and not (Path(kill_dir) / f"killed-{r.k}").exists():
            (Path(kill_dir) / f"killed-{r.k}").write_text(str(os.getpid()), encoding="utf-8")
            os.kill(os.getpid(), signal.SIGKILL)
        return real_run(self, r, claim)

    run.with_faults = True
    RangeWriter.run = run


def setup() -> None:
    """For Ray's ``worker_process_setup_hook``: the fake engine and the faults the environment asks for."""
    register_fake()
    install_range_faults()


if __name__ == "__main__":
    from layerscope.cli import main

    register_fake()
    install_range_faults()
    sys.exit(main(sys.argv[1:]))
