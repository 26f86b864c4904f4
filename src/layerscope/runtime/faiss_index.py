"""FAISS nearest-neighbour indexes over unit-normalised vectors, and exact k-NN fallbacks.

Kinds:

* ``flat``: exact inner product (``IndexFlatIP``); cosine on normalised vectors.
* ``ivf``: inverted file (``IndexIVFFlat``, inner product), ``nlist`` cells
  trained by k-means on a seeded sample, ``nprobe`` cells searched.
* ``hnsw``: graph index (``IndexHNSWFlat``, inner product), ``M`` links, ``efSearch``.
* ``binary``: sign bits of the normalised vectors (``IndexBinaryFlat``,
  Hamming distance); scores are Hamming similarities ``1 - hamming / dim``.

Where it runs (:func:`select_backend`): FAISS on the GPU when the installed
faiss has GPU support and a GPU is present (sharded over all GPUs when there
are several), FAISS on the CPU otherwise. Where faiss has no GPU build but
PyTorch sees a GPU, exact k-NN (``flat``) runs as a blocked matrix product on
the GPU. The backend actually used is recorded and printed.

An index on disk is a directory: ``index.faiss`` plus ``index.json``
(model key, manifest source, layer, pooling, kind, n, dim, normalised, store
path, parameters, timings, recall against exact search for approximate kinds).
"""

from __future__ import annotations

import json
import logging
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from layerscope.errors import InputError, MissingExtraError, StoreError

log = logging.getLogger("layerscope")

KINDS = ("flat", "ivf", "hnsw", "binary")
INDEX_FILE = "index.faiss"
META_FILE = "index.json"
INDEX_FORMAT = 1
_QUERY_BLOCK = 4096


def _faiss():
    try:
        import faiss
    except ImportError:
        raise MissingExtraError("faiss-cpu", "faiss") from None
    return faiss


# ---------------------------------------------------------------- backend

@dataclass(frozen=True)
class Backend:
    """Where nearest-neighbour search runs: ``faiss-gpu``, ``faiss-cpu`` or ``torch-cuda`` (exact only)."""

    name: str
    gpus: int = 0
    reason: str = ""

    def describe(self) -> str:
        where = {"faiss-gpu": f"FAISS on {self.gpus} GPU(s)" + (" (sharded)" if self.gpus > 1 else ""),
                 "faiss-cpu": "FAISS on the CPU",
                 "torch-cuda": f"exact blocked matrix product on {self.gpus} GPU(s) with PyTorch"}[self.name]
        return f"{where}{' - ' + self.reason if self.reason else ''}"


def faiss_gpu_count() -> int:
    faiss = _faiss()
    get = getattr(faiss, "get_num_gpus", None)
    if get is None:
        return 0
    try:
        return int(get())
    except Exception:  # a CPU build may expose the symbol and still fail
        return 0


def torch_gpu_count() -> int:
    try:
        import torch
    except ImportError:
        return 0
    try:
        return torch.cuda.device_count() if torch.cuda.is_available() else 0
    except Exception:
        return 0


def select_backend(kind: str = "flat", prefer: str = "auto") -> Backend:
    """Pick where ``kind`` searches run. ``prefer``: auto, cpu, gpu."""
    if prefer not in ("auto", "cpu", "gpu"):
        raise InputError(f"--device must be auto, cpu or gpu, not {prefer!r}")
    if prefer == "cpu":
        return Backend("faiss-cpu", 0, "asked for the CPU")
    ngpu = faiss_gpu_count()
    if ngpu > 0 and kind != "binary" and kind != "hnsw":
        return Backend("faiss-gpu", ngpu)
    tgpu = torch_gpu_count()
    if tgpu > 0 and kind == "flat":
        return Backend("torch-cuda", 1, "the installed faiss has no GPU support")
    if prefer == "gpu":
        why = ("faiss has no GPU build and PyTorch sees no GPU" if tgpu == 0 else
               f"a {kind} index has no GPU path here (faiss has no GPU build)")
        raise InputError(f"--device gpu: {why}; use --device auto or cpu")
    if ngpu > 0:
        return Backend("faiss-cpu", 0, f"FAISS has no GPU {kind} index")
    if tgpu > 0:
        return Backend("faiss-cpu", 0, f"the installed faiss has no GPU support and a {kind} index needs it")
    return Backend("faiss-cpu", 0, "no GPU found" if ngpu == 0 and tgpu == 0 else "")


# ---------------------------------------------------------------- helpers

def normalize(x: np.ndarray, *, block: int = 65536) -> np.ndarray:
    """Float32 C-contiguous copy with unit rows (zero rows stay zero), built in row blocks."""
    x = np.asarray(x)
    out = np.empty(x.shape, dtype=np.float32)
    for r0 in range(0, x.shape[0], block):
        b = np.asarray(x[r0:r0 + block], dtype=np.float32)
        if not np.all(np.isfinite(b)):
            raise InputError(f"vectors {r0}..{r0 + b.shape[0] - 1} hold NaN or inf values; the store is damaged "
                             "or the model overflowed; re-extract (float32)")
        norms = np.linalg.norm(b, axis=1, keepdims=True)
        out[r0:r0 + block] = b / np.where(norms > 0, norms, 1.0)
    return out


def default_nlist(n: int) -> int:
    """About sqrt(n) cells (k-means training stays cheap on a few cores), at most n / 39 (faiss wants
    39 training points per cell)."""
    return int(max(1, min(math.sqrt(n), n // 39)))


def default_nprobe(nlist: int) -> int:
    """Cells searched per query: 8, or 1/64 of the cells when there are more than 512."""
    return int(max(1, min(nlist, max(8, nlist // 64))))


def pack_bits(x: np.ndarray) -> np.ndarray:
    """Sign bits (x > 0) packed 8 per byte, as faiss binary indexes want (dim padded to 8)."""
    bits = np.asarray(x) > 0
    return np.packbits(bits, axis=1, bitorder="little")


# ---------------------------------------------------------------- the index

@dataclass
class VectorIndex:
    """A FAISS index plus what it was built from. ``search`` returns (scores, ids), best first."""

    index: Any
    kind: str
    dim: int
    n: int
    backend: Backend
    params: dict[str, Any] = field(default_factory=dict)
    meta: dict[str, Any] = field(default_factory=dict)
    _vectors: np.ndarray | None = None  # only for the torch-cuda exact path
    _gpu_index: Any = None

    # -- building --------------------------------------------------------
    @classmethod
    def build(cls, x: np.ndarray, kind: str = "flat", *, nlist: int | None = None, nprobe: int | None = None,
              hnsw_m: int = 32, ef_search: int = 128, ef_construction: int = 80, seed: int = 0,
              device: str = "auto", normalized: bool = False) -> "VectorIndex":
        if kind not in KINDS:
            raise InputError(f"--kind must be one of {', '.join(KINDS)}, not {kind!r}")
        faiss = _faiss()
        xf = x if normalized and isinstance(x, np.ndarray) and x.dtype == np.float32 and x.flags.c_contiguous \
            else normalize(x)
        n, dim = xf.shape
        if n < 1:
            raise InputError("cannot build an index over 0 vectors")
        backend = select_backend(kind, device)
        params: dict[str, Any] = {}
        vectors = None
        if kind == "flat":
            index = faiss.IndexFlatIP(dim)
            index.add(xf)
            if backend.name == "torch-cuda":
                vectors = xf
        elif kind == "ivf":
            nlist = int(nlist or default_nlist(n))
            if nlist > n:
                raise InputError(f"--nlist {nlist} is more than the {n:,} vectors; use at most {n}")
            nprobe = int(nprobe or default_nprobe(nlist))
            quantizer = faiss.IndexFlatIP(dim)
            index = faiss.IndexIVFFlat(quantizer, dim, nlist, faiss.METRIC_INNER_PRODUCT)
            index.cp.seed = seed
            rng = np.random.default_rng(seed)
            n_train = min(n, 50 * nlist)
            sample = xf if n_train == n else xf[np.sort(rng.choice(n, n_train, replace=False))]
            index.train(sample)
            index.add(xf)
            index.nprobe = nprobe
            params = {"nlist": nlist, "nprobe": nprobe, "n_train": int(n_train)}
        elif kind == "hnsw":
            index = faiss.IndexHNSWFlat(dim, hnsw_m, faiss.METRIC_INNER_PRODUCT)
            index.hnsw.efConstruction = ef_construction
            index.hnsw.efSearch = ef_search
            index.add(xf)
            params = {"M": hnsw_m, "efConstruction": ef_construction, "efSearch": ef_search}
        else:
            index = faiss.IndexBinaryFlat(8 * ((dim + 7) // 8))
            index.add(pack_bits(xf))
            params = {"bits": dim}
        out = cls(index, kind, dim, n, backend, params, _vectors=vectors)
        out._to_gpu()
        return out

    def _to_gpu(self) -> None:
        if self.backend.name != "faiss-gpu":
            return
        faiss = _faiss()
        if self.backend.gpus > 1:
            opts = faiss.GpuMultipleClonerOptions()
            opts.shard = True
            self._gpu_index = faiss.index_cpu_to_all_gpus(self.index, co=opts)
        else:
            self._gpu_index = faiss.index_cpu_to_gpu(faiss.StandardGpuResources(), 0, self.index)

    # -- searching -------------------------------------------------------
    def search(self, queries: np.ndarray, k: int, *, normalized: bool = False,
               block: int = _QUERY_BLOCK) -> tuple[np.ndarray, np.ndarray]:
        """Top-``k`` (scores float32 [q, k], ids int64 [q, k]); missing results have id -1."""
        if k < 1:
            raise InputError(f"k must be >= 1, got {k}")
        k = int(min(k, self.n))
        q = queries if normalized else normalize(queries)
        if q.ndim != 2 or q.shape[1] != self.dim:
            raise InputError(f"queries have width {q.shape[-1]}, the index holds vectors of width {self.dim}")
        nq = q.shape[0]
        scores = np.empty((nq, k), dtype=np.float32)
        ids = np.empty((nq, k), dtype=np.int64)
        for q0 in range(0, nq, block):
            qb = np.ascontiguousarray(q[q0:q0 + block], dtype=np.float32)
            s, i = self._search_block(qb, k)
            scores[q0:q0 + qb.shape[0]] = s
            ids[q0:q0 + qb.shape[0]] = i
        return scores, ids

    def _search_block(self, qb: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        if self.kind == "binary":
            dist, idx = self.index.search(pack_bits(qb), k)
            return (1.0 - dist.astype(np.float32) / self.dim), idx.astype(np.int64)
        if self.backend.name == "torch-cuda" and self._vectors is not None:
            return torch_topk(qb, self._vectors, k)
        index = self._gpu_index if self._gpu_index is not None else self.index
        s, i = index.search(qb, k)
        return s, i.astype(np.int64)

    # -- saving ----------------------------------------------------------
    def save(self, out: str | Path, meta: dict[str, Any]) -> Path:
        faiss = _faiss()
        from layerscope.ownership import MARKER, write_marker

        out = Path(out)
        out.mkdir(parents=True, exist_ok=True)
        if not (out / MARKER).exists():
            write_marker(out, "index")
        tmp = out / (INDEX_FILE + ".partial")
        if self.kind == "binary":
            faiss.write_index_binary(self.index, str(tmp))
        else:
            faiss.write_index(self.index, str(tmp))
        tmp.replace(out / INDEX_FILE)
        full = {"format": INDEX_FORMAT, "kind": self.kind, "n": self.n, "dim": self.dim, "normalized": True,
                "params": self.params, "backend": self.backend.name, **meta}
        from layerscope.atomic import write_json_atomic

        write_json_atomic(out / META_FILE, full)
        self.meta = full
        return out

    @classmethod
    def load(cls, path: str | Path, *, device: str = "auto") -> "VectorIndex":
        path = Path(path)
        meta_path = path / META_FILE
        if not (path / INDEX_FILE).exists() or not meta_path.exists():
            raise StoreError(f"{path} is not an index directory (needs {INDEX_FILE} and {META_FILE}); "
                             "build one with inspect index build")
        try:
            meta = json.loads(meta_path.read_text(encoding="utf-8"))
        except json.JSONDecodeError as exc:
            raise StoreError(f"{meta_path} is damaged ({exc}); rebuild the index") from None
        if meta.get("format") != INDEX_FORMAT:
            raise StoreError(f"{path} has index format {meta.get('format')}, this layerscope reads {INDEX_FORMAT}")
        faiss = _faiss()
        kind = meta["kind"]
        if kind == "binary":
            index = faiss.read_index_binary(str(path / INDEX_FILE))
        else:
            index = faiss.read_index(str(path / INDEX_FILE))
        if index.ntotal != meta["n"]:
            raise StoreError(f"{path}: {INDEX_FILE} holds {index.ntotal:,} vectors but {META_FILE} says "
                             f"{meta['n']:,}; rebuild the index")
        backend = select_backend(kind, device)
        vectors = None
        if backend.name == "torch-cuda":
            vectors = index.reconstruct_n(0, index.ntotal)
        out = cls(index, kind, int(meta["dim"]), int(meta["n"]), backend, meta.get("params", {}), meta, vectors)
        out._to_gpu()
        return out


def torch_topk(q: np.ndarray, x: np.ndarray, k: int, *, block_rows: int = 1 << 20) -> tuple[np.ndarray, np.ndarray]:
    """Exact top-k inner products of ``q`` against ``x`` on the GPU, ``x`` streamed in row blocks."""
    import torch

    dev = torch.device("cuda")
    qt = torch.from_numpy(np.ascontiguousarray(q)).to(dev)
    best_s = best_i = None
    for r0 in range(0, x.shape[0], block_rows):
        xb = torch.from_numpy(np.ascontiguousarray(x[r0:r0 + block_rows])).to(dev)
        s = qt @ xb.T
        kk = min(k, s.shape[1])
        bs, bi = torch.topk(s, kk, dim=1)
        bi = bi + r0
        if best_s is None:
            best_s, best_i = bs, bi
        else:
            cs = torch.cat([best_s, bs], dim=1)
            ci = torch.cat([best_i, bi], dim=1)
            best_s, pos = torch.topk(cs, min(k, cs.shape[1]), dim=1)
            best_i = torch.gather(ci, 1, pos)
    return best_s.float().cpu().numpy(), best_i.cpu().numpy().astype(np.int64)


def recall_at_k(approx_ids: np.ndarray, exact_ids: np.ndarray) -> float:
    """Mean share of each query's exact top-k found in the approximate top-k."""
    k = exact_ids.shape[1]
    hits = sum(len(set(a[a >= 0].tolist()) & set(e.tolist())) for a, e in zip(approx_ids, exact_ids))
    return hits / (exact_ids.shape[0] * k)


def measure_recall(index: VectorIndex, base: np.ndarray, queries: np.ndarray, k: int = 10) -> dict[str, Any]:
    """Recall@k of an approximate ``index`` against exact inner-product search over ``base`` (normalised)."""
    faiss = _faiss()
    k = min(k, index.n)
    exact = faiss.IndexFlatIP(base.shape[1])
    exact.add(base)
    _, exact_ids = exact.search(np.ascontiguousarray(queries, dtype=np.float32), k)
    _, approx_ids = index.search(queries, k, normalized=True)
    return {"recall@k": recall_at_k(approx_ids, exact_ids), "k": int(k), "queries": int(queries.shape[0])}


# ---------------------------------------------------------------- indexes over a LayerStore

def _iso_now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S%z")


def build_store_index(store_path: str | Path, out: str | Path, *, layer: str | int = -1, pooling: str = "mean",
                      kind: str = "flat", nlist: int | None = None, nprobe: int | None = None,
                      hnsw_m: int = 32, ef_search: int = 128, seed: int = 0, device: str = "auto",
                      recall_queries: int = 1000, force: bool = False) -> dict[str, Any]:
    """Build an index over one (pooling, layer) of a LayerStore and save it with its metadata."""
    from layerscope.runtime.store import LayerStore

    from layerscope.ownership import claim, remove

    out = Path(out)
    where = claim(out, "index", force=force, inputs=[store_path])  # never a folder layerscope did not make
    store = LayerStore.open(store_path)
    layer_name = store.resolve_layer(layer)
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
        "model_key": store.settings.get("model_key") or _manifest_key(manifest),
        "model": manifest.get("source", {}),
        "family": manifest.get("family"),
        "num_layers": manifest.get("num_layers"),
        "layer": layer_name,
        "pooling": pooling,
        "store": str(Path(store_path).resolve()),
        "store_created": store.meta.get("created"),
        "max_length": store.settings.get("max_length") if isinstance(store.settings, dict) else None,
        "seconds": {"normalize": round(t_norm, 3), "build": round(t_build, 3)},
        "recall_vs_exact": recall,
        "backend_detail": vi.backend.describe(),
        "created": _iso_now(),
    }
    if where.replace:
        remove(out, "index")
    vi.save(out, meta)
    return vi.meta


def _manifest_key(manifest: dict) -> str:
    src = manifest.get("source", {})
    return src.get("weights_sha256") or f"{src.get('path_or_id')}@{src.get('revision')}"


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
    from layerscope.runtime.pipeline import embed

    if not queries or any(not q.strip() for q in queries):
        raise InputError("give a non-empty query text")
    vi = VectorIndex.load(index_path, device=device)
    meta = vi.meta
    spec = model or meta["model"].get("spec") or meta["model"].get("path_or_id")
    handle = ModelHandle.resolve(spec)
    key = handle.key
    if key != meta["model_key"]:
        raise InputError(
            f"index {index_path} was built from model '{_model_label(meta['model'])}' but the query model is "
            f"'{_model_label(handle.manifest.get('source', {}))}' ({spec}); query with the index's model or "
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
    texts = store_path / "texts.jsonl"
    if not texts.exists():
        raise StoreError(f"the index's store {store_path} is gone (no texts.jsonl); rebuild the index or move "
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
