"""Vectors for an analysis, kept per layer: a run pays for the layers it asks, and the cache grows by layer.

Why per layer: ``layerscope run`` opens its engine for the deepest layer the analysis reads (early exit,
``extraction/engine_plan.py``; what an analysis reads is its metadata's ``reads``), so a study of layers 0..2 of
a 28-layer decoder runs 2 blocks, not 28. A cache that held only whole-model stores would make that run pay
for every block; so the cache is a set of LayerStores, each holding some layers, and a run reads each layer
from whichever holds it.

The rule an analysis author can rely on (``Context.vectors`` -> ``cached_vectors``):

- **Identity.** An entry is a LayerStore under ``$LAYERSCOPE_HOME/stores/`` whose name carries ``cache_key``:
  the model (its key and files), the engine, its provider and precision, the graph (the export's hash) and the
  variant, the max length, the tokens per batch, the texts, and whether the model's own code ran
  (``--trust-remote-code``). Vectors are reused only under the same key: different settings never share figures.
  How deep the engine ran is not part of it: a layer's vectors do not depend on the blocks after it (a pruned
  graph is held to the full one when it is made, engines/truncate.py).
- **Reuse.** Each asked (pooling, layer) is read from a complete entry of the key that holds it. A run asking
  for fewer layers than were extracted, or for other poolings the model gives, extracts nothing.
- **Growth.** What no entry holds is extracted into a new entry: the missing layers, with every other layer up
  to the deepest one the engine computes that no entry holds yet (they cost no extra block), in every pooling
  the model gives (``model_poolings``). So ``--layers 0,1,2`` stores raw..2, and a later ``--layers all``
  extracts 3..L only. The engine still runs the blocks under the missing layers from the input: starting at
  the deepest cached layer would need that layer's token states, and the cache keeps pooled vectors only.
- An entry another run is filling is left alone (the vectors are computed in memory); an interrupted or damaged
  entry is skipped and made again.
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


def _entries(root, base: str) -> list:
    """The complete cached stores of one key, in name order (an incomplete or damaged one is skipped)."""
    from layerscope.store.store import LayerStore

    if not root.exists():
        return []
    stores = []
    for path in sorted(root.glob(f"*{base}*")):
        if not (path / "store.json").exists():
            continue
        try:
            stores.append(LayerStore.open(path))
        except Exception:  # an incomplete or damaged cache entry is simply skipped (and made again)
            continue
    return stores


def _holder(stores: list, pooling: str, layer: str):
    return next((s for s in stores if layer in s.layers and pooling in s.poolings), None)


def _to_extract(manifest, stores: list, layers: list[str], poolings: list[str], every: list[str],
                reach: int) -> list[str]:
    """The layers a run must extract: those asked that some asked pooling misses, and every other layer of the
    model's width up to ``reach`` (the deepest the engine computes) that no entry holds in every pooling."""
    from layerscope.engines.truncate import depth_of
    from layerscope.vocab.layers import layer_names

    missing = [x for x in layers if any(_holder(stores, p, x) is None for p in poolings)]
    if not missing:
        return []
    width = layer_names(manifest.num_layers, with_raw=manifest.raw_width == manifest.hidden_size)
    fill = [x for x in width if depth_of([x]) <= reach and x not in missing
            and any(_holder(stores, p, x) is None for p in every)]
    order = {x: i for i, x in enumerate(width)}
    return sorted(set(missing) | set(fill), key=lambda x: order.get(x, len(order)))


def describe_layers(layers: list[str]) -> str:
    """``raw,0..2,5`` for a list of canonical layer names (runs of consecutive layers joined)."""
    parts, run = [], []
    for name in layers:
        if name != "raw" and run and run[-1] != "raw" and int(name) == int(run[-1]) + 1:
            run.append(name)
            continue
        if run:
            parts.append(run[0] if len(run) == 1 else f"{run[0]}..{run[-1]}")
        run = [name]
    if run:
        parts.append(run[0] if len(run) == 1 else f"{run[0]}..{run[-1]}")
    return ",".join(parts)


def cached_vectors(run, texts: list[str], *, layers: list[str], poolings: list[str], use_cache: bool = True,
                   say: Callable[[str], None] = lambda m: None, tag: str = "", max_length: int | None = None,
                   batch_tokens: int | None = None) -> dict[tuple[str, str], np.ndarray]:
    """Vectors of ``texts`` for ``layers`` x ``poolings``: each read from a cached store of the same settings
    that holds it, the rest extracted once into a new store (the module's docstring says the rule)."""
    from layerscope.model.home import cache_root
    from layerscope.extraction.pipeline import embed, extract
    from layerscope.vocab.layers import Layers

    if not use_cache:
        return embed(run.handle, texts, engine=run.engine, layers=layers, poolings=poolings,
                     max_length=max_length, batch_tokens=batch_tokens)
    root = cache_root() / "stores"
    base = cache_key(run, texts, max_length=max_length, batch_tokens=batch_tokens)
    manifest = run.handle.manifest
    num_layers = manifest.num_layers
    stores = _entries(root, base)
    every = model_poolings(manifest, poolings)
    depth = run.engine.depth  # how deep this run's engine computes (early exit; None: every block)
    reach = num_layers if depth is None else int(depth)
    todo = _to_extract(manifest, stores, layers, poolings, every, reach)
    held = [x for x in layers if x not in todo]
    if held:
        used = {_holder(stores, p, x).path for p in poolings for x in held}
        say(f"reusing cached vectors of layers {describe_layers(held)} "
            f"({', '.join(str(p) for p in sorted(used))})")
    if todo:
        path = root / (f"{tag + '-' if tag else ''}{base}-"
                       f"{cache_key(run, texts, todo, every, max_length, batch_tokens)[:8]}")
        from layerscope.engines.truncate import depth_of

        deepest, again = depth_of(todo), ""
        if held and deepest > 1:
            again = (f"; blocks 1..{deepest} run from the input (the cache keeps pooled vectors, not the token "
                     "states a run resumed at a cached layer would start from)")
        say(f"extracting layers {describe_layers(todo)} of {len(texts):,} texts with {run.engine.info.name} -> "
            f"{path}{again}")
        from layerscope.errors import Interrupted
        from layerscope.progress import mode as progress_mode
        from layerscope.store.store_lock import StoreLockedError

        try:
            made = extract(run.handle, list(texts), path, engine=run.engine, layers=Layers(todo, num_layers),
                           poolings=every, force=True, max_length=max_length, batch_tokens=batch_tokens,
                           progress=progress_mode()).store
        except StoreLockedError:  # another run is filling this cache entry: do not wait for it, nor race it
            say(f"{path} is being written by another run; computing these vectors in memory")
            return embed(run.handle, texts, engine=run.engine, layers=layers, poolings=poolings,
                         max_length=max_length, batch_tokens=batch_tokens)
        except Interrupted:  # the cache store is not the user's to --resume; a rerun rebuilds it
            raise Interrupted("interrupted") from None
        stores = [made, *stores]  # what this run extracted serves its own layers first
    return {(p, x): np.asarray(_holder(stores, p, x)[p, x], dtype=np.float32) for p in poolings for x in layers}
