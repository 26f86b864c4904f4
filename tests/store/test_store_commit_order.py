"""LayerStore.commit puts the vectors on disk before it marks their rows done: at every array flush the
rows being committed are still unmarked in done.npy (as any other process, or the disk after a crash,
would see it), and done.npy is flushed last."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from layerscope.store.store import DONE, LayerStore

LAYERS = ["0", "1", "2"]


def _store(tmp_path) -> LayerStore:
    from layerscope.store.store_spec import StoreSpec

    return LayerStore.create(tmp_path / "s", n=10, spec=StoreSpec.bare(LAYERS, ["mean", "cls"]), hidden_size=4,
                             manifest={"num_layers": 2, "hidden_size": 4, "family": "bert",
                                       "source": {"spec": "m", "path_or_id": "m"}})


def test_rows_are_flushed_before_they_are_marked_done(tmp_path, monkeypatch):
    store = _store(tmp_path)
    index = np.array([2, 5, 7])
    vectors = np.arange(3 * 3 * 4, dtype=np.float32).reshape(3, 3, 4) + 1
    store.write(index, {"mean": vectors, "cls": -vectors}, LAYERS)
    events: list[tuple[str, bool]] = []
    real = np.memmap.flush

    def flush(self):
        on_disk = np.load(store.path / DONE, mmap_mode="r")  # a separate mapping: what another reader sees
        events.append((Path(self.filename).name, bool(on_disk[index].any())))
        return real(self)

    monkeypatch.setattr(np.memmap, "flush", flush)
    store.commit(index)
    arrays = [e for e in events if e[0] != DONE]
    assert len(arrays) == 2 * len(LAYERS), events  # every array written to was flushed
    assert not any(marked for _, marked in arrays), f"rows marked done before their vectors were flushed: {events}"
    assert events[-1] == (DONE, True), events
    assert np.load(store.path / DONE)[index].all() and not np.load(store.path / DONE)[[0, 1, 3]].any()
    np.testing.assert_array_equal(np.load(store.path / "arrays" / "mean" / "1.npy")[index], vectors[1])
