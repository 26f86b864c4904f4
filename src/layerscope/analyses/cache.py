"""Vectors for an analysis, reusing a matching LayerStore instead of recomputing.

The cache key covers everything that changes the numbers: the model weights,
the engine and the graph it runs (precision variant), the max length, the
tokens per batch, the texts, the layers and the poolings.  A store is extracted
with every layer and every pooling the model has, in one pass over the texts, so
any later analysis of the same texts on the same model and engine, whatever
layers and poolings it asks, reads it instead of running the model again.
"""

from __future__ import annotations

import hashlib
import json
from typing import Callable

import numpy as np


def cache_key(run, texts: list[str], layers: list[str] | None = None, poolings: list[str] | None = None,
              max_length: int | None = None, batch_tokens: int | None = None) -> str:
    """Identity of the vectors: model, engine, graph, max length, tokens per batch (None: the engine's own)
    and texts (and layers/poolings when given)."""
    h = hashlib.sha256()
    for t in texts:
        h.update(t.encode("utf-8"))
        h.update(b"\x00")
    info = run.engine.info
    ident = {
        "model": run.handle.key, "files": run.handle.manifest.source.files_sha256,
        "engine": info.name, "provider": info.provider, "precision": info.precision,
        "onnx": run.handle.manifest.onnx_sha256, "variant": getattr(run.engine, "variant", None),
        "max_length": max_length or run.handle.manifest.max_length, "texts": h.hexdigest(),
        "batch_tokens": batch_tokens,
        "remote_code": bool(getattr(run.handle, "trust_remote_code", False)),
    }
    if layers is not None or poolings is not None:
        ident.update({"layers": layers, "poolings": poolings})
    return hashlib.sha256(json.dumps(ident, sort_keys=True).encode()).hexdigest()[:24]


def model_poolings(manifest, asked: list[str]) -> list[str]:
    """Every pooling ``manifest``'s model can give (``eos`` with its own pooled output, ``st`` with a
    sentence-transformers recipe layerscope reproduces), in the vocabulary's order, and any other asked."""
    from layerscope.vocab.pooling import EOS, POOLINGS, ST

    st = manifest.sentence_transformers or {}
    own = manifest.pooled_output
    have = [p for p in POOLINGS if (p != EOS or own) and (p != ST or st.get("supported"))]
    return have + [p for p in asked if p not in have]


def _find_superset(root, base: str, layers: list[str], poolings: list[str]):
    """A complete cached store of the same model/engine/texts holding every asked layer and pooling."""
    from layerscope.store.store import LayerStore

    if not root.exists():
        return None
    for path in sorted(root.glob(f"*{base}*")):
        if not (path / "store.json").exists():
            continue
        try:
            store = LayerStore.open(path)
        except Exception:  # an incomplete or damaged cache entry is simply skipped (and rebuilt)
            continue
        if set(layers) <= set(store.layers) and set(poolings) <= set(store.poolings):
            return store
    return None


def cached_vectors(run, texts: list[str], *, layers: list[str], poolings: list[str], use_cache: bool = True,
                   say: Callable[[str], None] = lambda m: None, tag: str = "", max_length: int | None = None,
                   batch_tokens: int | None = None) -> dict[tuple[str, str], np.ndarray]:
    """Vectors of ``texts``; a cached store of the same model, engine, settings and texts is reused when it
    holds every asked layer and pooling (stores are extracted with every layer and every pooling of the
    model, so other choices reuse them too)."""
    from layerscope.model.home import cache_root
    from layerscope.extraction.pipeline import embed, extract
    from layerscope.vocab.layers import Layers, layer_names

    if not use_cache:
        return embed(run.handle, texts, engine=run.engine, layers=layers, poolings=poolings,
                     max_length=max_length, batch_tokens=batch_tokens)
    root = cache_root() / "stores"
    base = cache_key(run, texts, max_length=max_length, batch_tokens=batch_tokens)
    store = _find_superset(root, base, layers, poolings)
    if store is not None:
        say(f"reusing cached vectors {store.path}")
    else:
        manifest = run.handle.manifest
        num_layers = manifest.num_layers
        # every layer of one width: raw too, unless its word embeddings are narrower (ALBERT, ELECTRA)
        all_layers = layer_names(num_layers, with_raw=manifest.raw_width == manifest.hidden_size)
        extra = [layer for layer in layers if layer not in all_layers]
        every = model_poolings(run.handle.manifest, poolings)
        path = root / (f"{tag + '-' if tag else ''}{base}-"
                       f"{cache_key(run, texts, all_layers, every, max_length, batch_tokens)[:8]}")
        say(f"extracting {len(texts):,} texts with {run.engine.info.name} -> {path}")
        from layerscope.errors import Interrupted
        from layerscope.progress import mode as progress_mode
        from layerscope.store.store_lock import StoreLockedError

        try:
            store = extract(run.handle, list(texts), path, engine=run.engine,
                            layers=Layers(all_layers + extra, num_layers), poolings=every, force=True,
                            max_length=max_length, batch_tokens=batch_tokens, progress=progress_mode()).store
        except StoreLockedError:  # another run is filling this cache entry: do not wait for it, nor race it
            say(f"{path} is being written by another run; computing these vectors in memory")
            return embed(run.handle, texts, engine=run.engine, layers=layers, poolings=poolings,
                         max_length=max_length, batch_tokens=batch_tokens)
        except Interrupted:  # the cache store is not the user's to --resume; a rerun rebuilds it
            raise Interrupted("interrupted") from None
    return {(p, layer): np.asarray(store[p, layer], dtype=np.float32) for p in poolings for layer in layers}
