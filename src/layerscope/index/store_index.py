"""Indexes over one (pooling, layer) of a LayerStore: build one with its metadata, search it with query texts."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from layerscope.errors import InputError, StoreError
from layerscope.index.index_record import BuildSeconds, IndexRecord, Recall, StoreIdentity
from layerscope.index.vector_index import VectorIndex, measure_recall, normalize
from layerscope.store.store_layout import STORE_JSON, TEXTS, StoreLayout, array_rel


def _iso_now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S%z")


def build_store_index(store_path: str | Path, out: str | Path, *, layer: str | int = -1, pooling: str | None = None,
                      kind: str = "flat", nlist: int | None = None, nprobe: int | None = None,
                      hnsw_m: int = 32, ef_search: int = 128, seed: int = 0, device: str = "auto",
                      recall_queries: int = 1000, force: bool = False) -> IndexRecord:
    """Build an index over one (pooling, layer) of a LayerStore (``pooling`` None: the store's first) and save
    it with its metadata, holding ``out``'s write lock (one writer per index)."""
    from layerscope.out_lock import out_lock

    with out_lock(out):
        return _build(store_path, Path(out), layer=layer, pooling=pooling, kind=kind, nlist=nlist, nprobe=nprobe,
                      hnsw_m=hnsw_m, ef_search=ef_search, seed=seed, device=device,
                      recall_queries=recall_queries, force=force)


def _build(store_path: str | Path, out: Path, *, layer, pooling, kind, nlist, nprobe, hnsw_m, ef_search, seed,
           device, recall_queries, force) -> IndexRecord:
    from layerscope.store.store import LayerStore

    from layerscope.ownership import claim, record, remove

    where = claim(out, "index", force=force, inputs=[store_path])  # never a folder layerscope did not make
    store = LayerStore.open(store_path)
    layer_name = store.resolve_layer(layer)
    pooling = pooling or store.poolings[0]
    identity = store_identity(store, pooling, layer_name)  # before any work: what the index must find again
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
        got = measure_recall(vi, x, qs, k=10)
        recall = Recall(float(got["recall@k"]), int(got["k"]), int(got["queries"]))
    manifest = store.manifest
    if where.replace:
        remove(out, "index")
    vi.save(out, model_key=store.spec.model_key or manifest.key, model=manifest.source_dict(),
            family=manifest.family, num_layers=manifest.num_layers, layer=layer_name, pooling=pooling,
            store=str(Path(store_path).resolve()), store_created=store.record.created,
            store_identity=identity, max_length=store.spec.max_length,
            seconds=BuildSeconds(round(t_norm, 3), round(t_build, 3)), recall_vs_exact=recall,
            backend_detail=vi.backend.describe(), created=_iso_now())
    record(out, "index")
    return vi.record


def store_identity(store, pooling: str, layer: str) -> StoreIdentity:
    """What an index must find again in its store (a LayerStore): the corpus hash, the recorded checksums of the
    texts and of the indexed array, the row count and the store's structure hash (all recorded in store.json)."""
    rel = array_rel(pooling, layer)
    array = store.file_sha256(rel)
    if array is None:  # nothing to find again: an index would answer from whatever the file holds later
        raise StoreError(f"the store {store.path} records no checksum of {rel} (not finished, or made by an older "
                         "layerscope); extract it again before indexing it")
    return StoreIdentity(corpus_sha256=store.spec.corpus_sha256, structure_sha256=store.structure_sha256,
                         n=store.n, texts_sha256=store.file_sha256(TEXTS), array_sha256=array)


def check_store(index_path: str | Path, meta: IndexRecord):
    """The index's store, opened, once it is the store the index was built from; one line otherwise."""
    from layerscope.store.store import LayerStore

    store_path = Path(str(meta.store))
    rebuild = (f"rebuild the index with layerscope index build --store {store_path} --out {index_path} "
               "--force")
    recorded = meta.store_identity
    if recorded is None or recorded.array_sha256 is None or meta.store is None or meta.layer is None \
            or meta.pooling is None:
        raise StoreError(f"index {index_path} does not record which store (and which of its arrays) it was "
                         f"built from (made by an older layerscope), so its answers cannot be trusted; {rebuild}")
    if not StoreLayout(store_path).store_json.is_file():
        raise StoreError(f"the index's store {store_path} is gone (no {STORE_JSON}); {rebuild}, or move the "
                         "store back")
    store = LayerStore.open(store_path)
    changed = recorded.changed(store_identity(store, meta.pooling, meta.layer))
    if changed:
        what = {"corpus_sha256": "corpus", "texts_sha256": "texts", "array_sha256": "vectors",
                "structure_sha256": "layout", "n": "row count"}
        raise StoreError(f"index {index_path} no longer matches its store {store_path} (its "
                         f"{', '.join(what[k] for k in changed)} changed since the index was built, e.g. by "
                         f"extract --force); {rebuild}")
    return store


@dataclass
class SearchHit:
    rank: int
    score: float
    row: int
    id: str
    text: str


def search_index(index_path: str | Path, queries: list[str], *, k: int = 10, model: str | None = None,
                 engine: str = "auto", device: str = "auto") -> tuple[IndexRecord, list[list[SearchHit]]]:
    """Embed ``queries`` with the index's own model, layer and pooling, and return the top-k texts (and the
    index's record, with the backend this process searched on)."""
    from layerscope.model.handle import ModelHandle
    from layerscope.extraction.pipeline import embed

    if not queries or any(not q.strip() for q in queries):
        raise InputError("give a non-empty query text")
    vi = VectorIndex.load(index_path, device=device)
    meta = vi.record
    check_store(index_path, meta)  # before any model runs: a stale index answers with other texts
    source = meta.source
    spec = model or (source.spec or source.path_or_id if source is not None else None)
    if not spec:
        raise StoreError(f"index {index_path} does not record its model; pass --model, or rebuild the index")
    handle = ModelHandle.resolve(spec)
    key = handle.key
    if key != meta.model_key:
        query_label = handle.manifest.source.alias or handle.manifest.source.spec or handle.manifest.source.path_or_id
        raise InputError(
            f"index {index_path} was built from model '{meta.model_label}' but the query model is "
            f"'{query_label}' ({spec}); query with the index's model or build an index from this model's store")
    vecs = embed(handle, list(queries), engine=engine, layers=[meta.layer], poolings=[meta.pooling],
                 max_length=meta.max_length)[meta.pooling, meta.layer]
    scores, ids = vi.search(vecs, k)
    rows_needed = {int(i) for i in ids.ravel() if i >= 0}
    records = _store_records(Path(meta.store), rows_needed)
    out = []
    for qi in range(len(queries)):
        hits = []
        for r, (s, i) in enumerate(zip(scores[qi], ids[qi]), start=1):
            if i < 0:
                continue
            rec = records[int(i)]
            hits.append(SearchHit(r, float(s), int(i), str(rec.get("id")), rec.get("text", "")))
        out.append(hits)
    return meta.replace(backend_used=vi.backend.describe()), out


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
