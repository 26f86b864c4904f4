"""Vectors for an analysis, reusing a matching LayerStore instead of recomputing.

The cache key covers everything that changes the numbers: the model weights,
the engine and the graph it runs (precision variant), the max length, the
texts, the layers and the poolings.
"""

from __future__ import annotations

import hashlib
import json
from typing import Callable

import numpy as np


def cache_key(run, texts: list[str], layers: list[str], poolings: list[str]) -> str:
    h = hashlib.sha256()
    for t in texts:
        h.update(t.encode("utf-8"))
        h.update(b"\x00")
    info = run.engine.info
    ident = {
        "model": run.handle.key, "engine": info.name, "provider": info.provider, "precision": info.precision,
        "onnx": run.handle.manifest.get("onnx_sha256"), "variant": getattr(run.engine, "variant", None),
        "max_length": run.handle.manifest.get("max_length"), "layers": layers, "poolings": poolings,
        "texts": h.hexdigest(),
    }
    return hashlib.sha256(json.dumps(ident, sort_keys=True).encode()).hexdigest()[:24]


def cached_vectors(run, texts: list[str], *, layers: list[str], poolings: list[str], use_cache: bool = True,
                   say: Callable[[str], None] = lambda m: None, tag: str = "") -> dict[tuple[str, str], np.ndarray]:
    from layerscope.export.manifest import cache_root
    from layerscope.runtime.pipeline import embed, extract
    from layerscope.runtime.store import LayerStore

    if not use_cache:
        return embed(run.handle, texts, engine=run.engine, layers=layers, poolings=poolings)
    key = cache_key(run, texts, layers, poolings)
    path = cache_root() / "stores" / f"{tag + '-' if tag else ''}{key}"
    store = None
    if (path / "store.json").exists():
        try:
            store = LayerStore.open(path)
            say(f"reusing cached vectors {path}")
        except Exception:  # an incomplete or damaged cache entry is simply rebuilt
            store = None
    if store is None:
        say(f"extracting {len(texts):,} texts with {run.engine.info.name} -> {path}")
        store = extract(run.handle, list(texts), path, engine=run.engine, layers=layers, poolings=poolings,
                        force=True).store
    return {(p, layer): np.asarray(store[p, layer], dtype=np.float32) for p in poolings for layer in layers}
