"""Indexes over one (pooling, layer) of a LayerStore: build one with its metadata, search it with query texts."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from layerscope.errors import InputError, StoreError
from layerscope.index.vector_index import VectorIndex, measure_recall, normalize
from layerscope.store.store_layout import STORE_JSON, TEXTS, StoreLayout, array_rel


def _iso_now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S%z")


def build_store_index(store_path: str | Path, out: str | Path, *, layer: str | int = -1, pooling: str | None = None,
                      kind: str = "flat", nlist: int | None = None, nprobe: int | None = None,
                      hnsw_m: int = 32, ef_search: int = 128, seed: int = 0, device: str = "auto",
                      recall_queries: int = 1000, force: bool = False) -> dict[str, Any]:
    """Build an index over one (pooling, layer) of a LayerStore (``pooling`` None: the store's first) and save
    it with its metadata, holding ``out``'s write lock (one writer per index)."""
    from layerscope.out_lock import out_lock

    with out_lock(out):
        return _build(store_path, Path(out), layer=layer, pooling=pooling, kind=kind, nlist=nlist, nprobe=nprobe,
                      hnsw_m=hnsw_m, ef_search=ef_search, seed=seed, device=device,
                      recall_queries=recall_queries, force=force)


def _build(store_path: str | Path, out: Path, *, layer, pooling, kind, nlist, nprobe, hnsw_m, ef_search, seed,
           device, recall_queries, force) -> dict[str, Any]:
    from layerscope.store.store import LayerStore

    from layerscope.ownership import claim, record, remove

    where = claim(out, "index", force=force, inputs=[store_path])  # never a folder layerscope did not make
    store = LayerStore.open(store_path)
    layer_name = store.resolve_layer(layer)
    pooling = pooling or store.poolings[0]
    arr = store[pooling, layer_name]
    t0 = time.perf_counter()
    x = normalize(arr)
    t_norm = time.perf_counter() - t0
    t0 = time.perf_counter()
    vi = VectorIndex.build(x, kind, nlist=nlist, nprobe=nprobe, hnsw_m=hnsw_m, ef_search=ef_search, seed=seed,
                           device=device, normalized=True)
    t_build = time.perf_counter() - t0
    recall = None
    if kind in ("ivf", "hnsw", "binary") and recall_queries > 0:
        rng = np.random.default_rng(seed)
        m = min(recall_queries, vi.n)
        qs = x[np.sort(rng.choice(vi.n, m, replace=False))]
        recall = measure_recall(vi, x, qs, k=10)
    manifest = store.manifest
    meta = {
        "model_key": store.spec.model_key or manifest.key,
        "model": manifest.source_dict(),
        "family": manifest.family,
        "num_layers": manifest.num_layers,
        "layer": layer_name,
        "pooling": pooling,
        "store": str(Path(store_path).resolve()),
        "store_created": store.record.created,
        "store_identity": store_identity(store, pooling, layer_name),
        "max_length": store.spec.max_length,
        "seconds": {"normalize": round(t_norm, 3), "build": round(t_build, 3)},
        "recall_vs_exact": recall,
        "backend_detail": vi.backend.describe(),
        "created": _iso_now(),
    }
    if where.replace:
        remove(out, "index")
    vi.save(out, meta)
    record(out, "index")
    return vi.meta


def store_identity(store, pooling: str, layer: str) -> dict[str, Any]:
    """What an index must find again in its store (a LayerStore): the corpus hash, the recorded checksums of the
    texts and of the indexed array, the row count and the store's structure hash (all recorded in store.json)."""
    return {"corpus_sha256": store.spec.corpus_sha256, "structure_sha256": store.structure_sha256, "n": store.n,
            "texts_sha256": store.file_sha256(TEXTS), "array_sha256": store.file_sha256(array_rel(pooling, layer))}


def check_store(index_path: str | Path, meta: dict[str, Any]):
    """The index's store, opened, once it is the store the index was built from; one line otherwise."""
    from layerscope.store.store import LayerStore

    store_path = Path(str(meta.get("store")))
    rebuild = (f"rebuild the index with layerscope index build --store {store_path} --out {index_path} "
               "--force")
    recorded = meta.get("store_identity")
    if not isinstance(recorded, dict):
        raise StoreError(f"index {index_path} does not record which store it was built from (made by an older "
                         f"layerscope), so its answers cannot be trusted; {rebuild}")
    if not StoreLayout(store_path).store_json.is_file():
        raise StoreError(f"the index's store {store_path} is gone (no {STORE_JSON}); {rebuild}, or move the "
                         "store back")
    store = LayerStore.open(store_path)
    now = store_identity(store, str(meta.get("pooling")), str(meta.get("layer")))
    changed = [k for k in ("corpus_sha256", "texts_sha256", "array_sha256", "structure_sha256", "n")
               if recorded.get(k) != now.get(k)]
    if changed:
        what = {"corpus_sha256": "corpus", "texts_sha256": "texts", "array_sha256": "vectors",
                "structure_sha256": "layout", "n": "row count"}
        raise StoreError(f"index {index_path} no longer matches its store {store_path} (its "
                         f"{', '.join(what[k] for k in changed)} changed since the index was built, e.g. by "
                         f"extract --force); {rebuild}")
    return store


def _model_label(meta_model: dict) -> str:
    return meta_model.get("alias") or meta_model.get("spec") or meta_model.get("path_or_id") or "?"


@dataclass
class SearchHit:
    rank: int
    score: float
    row: int
    id: str
    text: str


def search_index(index_path: str | Path, queries: list[str], *, k: int = 10, model: str | None = None,
                 engine: str = "auto", device: str = "auto") -> tuple[dict[str, Any], list[list[SearchHit]]]:
    """Embed ``queries`` with the index's own model, layer and pooling, and return the top-k texts."""
    from layerscope.model.handle import ModelHandle
    from layerscope.extraction.pipeline import embed

    if not queries or any(not q.strip() for q in queries):
        raise InputError("give a non-empty query text")
    vi = VectorIndex.load(index_path, device=device)
    meta = vi.meta
    check_store(index_path, meta)  # before any model runs: a stale index answers with other texts
    spec = model or meta["model"].get("spec") or meta["model"].get("path_or_id")
    handle = ModelHandle.resolve(spec)
    key = handle.key
    if key != meta["model_key"]:
        raise InputError(
            f"index {index_path} was built from model '{_model_label(meta['model'])}' but the query model is "
            f"'{_model_label(handle.manifest.source_dict())}' ({spec}); query with the index's model or "
            "build an index from this model's store")
    vecs = embed(handle, list(queries), engine=engine, layers=[meta["layer"]], poolings=[meta["pooling"]],
                 max_length=meta.get("max_length"))[meta["pooling"], meta["layer"]]
    scores, ids = vi.search(vecs, k)
    rows_needed = {int(i) for i in ids.ravel() if i >= 0}
    records = _store_records(Path(meta["store"]), rows_needed)
    out = []
    for qi in range(len(queries)):
        hits = []
        for r, (s, i) in enumerate(zip(scores[qi], ids[qi]), start=1):
            if i < 0:
                continue
            rec = records[int(i)]
            hits.append(SearchHit(r, float(s), int(i), str(rec.get("id")), rec.get("text", "")))
        out.append(hits)
    meta = dict(meta)
    meta["backend_used"] = vi.backend.describe()
    return meta, out


def _store_records(store_path: Path, rows: set[int]) -> dict[int, dict]:
    texts = StoreLayout(store_path).texts
    if not texts.exists():
        raise StoreError(f"the index's store {store_path} is gone (no {TEXTS}); rebuild the index or move "
                         "the store back")
    out: dict[int, dict] = {}
    last = max(rows) if rows else -1
    with open(texts, encoding="utf-8") as fh:
        for i, line in enumerate(fh):
            if i > last:
                break
            if i in rows:
                out[i] = json.loads(line)
    missing = rows - set(out)
    if missing:
        raise StoreError(f"the index's store {store_path} has fewer rows than the index; rebuild the index")
    return out
