"""A FAISS index over unit-normalised vectors: build, search, save and load.

Kinds:

* ``flat``: exact inner product (``IndexFlatIP``); cosine on normalised vectors.
* ``ivf``: inverted file (``IndexIVFFlat``, inner product), ``nlist`` cells
  trained by k-means on a seeded sample, ``nprobe`` cells searched.
* ``hnsw``: graph index (``IndexHNSWFlat``, inner product), ``M`` links, ``efSearch``.
* ``binary``: sign bits of the normalised vectors (``IndexBinaryFlat``,
  Hamming distance); scores are Hamming similarities ``1 - hamming / dim``.

An index on disk is a directory: ``index.faiss`` plus ``index.json`` (kind,
n, dim, parameters, backend and what :mod:`layerscope.index.store_index`
adds: model, layer, pooling, store, timings, recall).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from layerscope.errors import InputError, StoreError
from layerscope.progress import track
from layerscope.index.backend import Backend, _faiss, select_backend
from layerscope.index.index_record import INDEX_FORMAT, KINDS, IndexRecord
from layerscope.metrics.neighbors import recall_at_k
from layerscope.metrics.quantization import binary_quantize
from layerscope.metrics.vectors import l2_normalize

INDEX_FILE = "index.faiss"
META_FILE = "index.json"
_QUERY_BLOCK = 4096


def normalize(x: np.ndarray, *, block: int = 65536) -> np.ndarray:
    """Float32 C-contiguous copy with unit rows (zero rows stay zero), built in row blocks."""
    x = np.asarray(x)
    out = np.empty(x.shape, dtype=np.float32)
    for r0 in range(0, x.shape[0], block):
        b = np.asarray(x[r0:r0 + block], dtype=np.float32)
        if not np.all(np.isfinite(b)):
            raise InputError(f"vectors {r0}..{r0 + b.shape[0] - 1} hold NaN or inf values; the store is damaged "
                             "or the model overflowed; re-extract (float32)")
        out[r0:r0 + block] = l2_normalize(b)
    return out


def default_nlist(n: int) -> int:
    """About sqrt(n) cells (k-means training stays cheap on a few cores), at most n / 39 (faiss wants
    39 training points per cell)."""
    return int(max(1, min(math.sqrt(n), n // 39)))


def default_nprobe(nlist: int) -> int:
    """Cells searched per query: 8, or 1/64 of the cells when there are more than 512."""
    return int(max(1, min(nlist, max(8, nlist // 64))))


@dataclass
class VectorIndex:
    """A FAISS index plus what it was built from. ``search`` returns (scores, ids), best first."""

    index: Any
    kind: str
    dim: int
    n: int
    backend: Backend
    params: dict[str, Any] = field(default_factory=dict)
    record: IndexRecord | None = None  # index.json, once saved or loaded
    _vectors: np.ndarray | None = None  # only for the torch-cuda exact path
    _gpu_index: Any = None
    _on_device: Any = None  # the torch-cuda path's vectors on the GPU, copied at the first search where they fit

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
            _add_in_blocks(index, xf, "index build (ivf): vectors added")
            index.nprobe = nprobe
            params = {"nlist": nlist, "nprobe": nprobe, "n_train": int(n_train)}
        elif kind == "hnsw":
            index = faiss.IndexHNSWFlat(dim, hnsw_m, faiss.METRIC_INNER_PRODUCT)
            index.hnsw.efConstruction = ef_construction
            index.hnsw.efSearch = ef_search
            _add_in_blocks(index, xf, "index build (hnsw): vectors added")
            params = {"M": hnsw_m, "efConstruction": ef_construction, "efSearch": ef_search}
        else:
            index = faiss.IndexBinaryFlat(8 * ((dim + 7) // 8))
            index.add(binary_quantize(xf, bitorder="little"))
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
            dist, idx = self.index.search(binary_quantize(qb, bitorder="little"), k)
            return (1.0 - dist.astype(np.float32) / self.dim), idx.astype(np.int64)
        if self.backend.name == "torch-cuda" and self._vectors is not None:
            from layerscope.metrics.neighbors_torch import resident, topk_inner

            if self._on_device is None:  # once, not once per query block
                self._on_device = resident(self._vectors, "cuda")
            base = self._on_device if self._on_device is not None else self._vectors
            return topk_inner(qb, base, k, device="cuda")
        index = self._gpu_index if self._gpu_index is not None else self.index
        s, i = index.search(qb, k)
        return s, i.astype(np.int64)

    # -- saving ----------------------------------------------------------
    def save(self, out: str | Path, **source: Any) -> Path:
        """Write the index and its ``index.json`` (``source``: ``IndexRecord``'s fields saying what it was
        built from) into ``out``."""
        faiss = _faiss()
        from layerscope.ownership import MARKER, note, write_marker

        out = Path(out)
        out.mkdir(parents=True, exist_ok=True)
        from layerscope.out_lock import hold_folder

        hold_folder(out)  # a bind mount of the new folder meets its writer's lock
        if not (out / MARKER).exists():
            write_marker(out, "index")
        tmp = out / (INDEX_FILE + ".partial")
        note(out, files=[tmp.name, INDEX_FILE, META_FILE])  # a save cut short leaves files --force knows
        if self.kind == "binary":
            faiss.write_index_binary(self.index, str(tmp))
        else:
            faiss.write_index(self.index, str(tmp))
        tmp.replace(out / INDEX_FILE)
        record = IndexRecord(kind=self.kind, n=self.n, dim=self.dim, backend=self.backend.name,
                             params=dict(self.params), normalized=True, format=INDEX_FORMAT, **source)
        from layerscope.atomic import write_json_atomic

        write_json_atomic(out / META_FILE, record.to_json())
        self.record = record
        return out

    @classmethod
    def load(cls, path: str | Path, *, device: str = "auto") -> "VectorIndex":
        path = Path(path)
        meta_path = path / META_FILE
        if not (path / INDEX_FILE).exists() or not meta_path.exists():
            raise StoreError(f"{path} is not an index directory (needs {INDEX_FILE} and {META_FILE}); "
                             "build one with layerscope index build")
        try:
            doc = json.loads(meta_path.read_text(encoding="utf-8"))
        except json.JSONDecodeError as exc:
            raise StoreError(f"{meta_path} is damaged ({exc}); rebuild the index") from None
        record = IndexRecord.from_json(doc, where=str(meta_path))
        faiss = _faiss()
        kind = record.kind
        try:
            if kind == "binary":
                index = faiss.read_index_binary(str(path / INDEX_FILE))
            else:
                index = faiss.read_index(str(path / INDEX_FILE))
        except RuntimeError:  # FAISS's own error, a C++ message: the file is not an index of this kind
            raise StoreError(f"{path / INDEX_FILE} is not a readable {kind} index (damaged, or {META_FILE} names "
                             "another kind); rebuild the index") from None
        if kind != "binary" and index.d != record.dim:
            raise StoreError(f"{path}: {INDEX_FILE} holds vectors of dimension {index.d} but {META_FILE} says "
                             f"{record.dim}; rebuild the index")
        if index.ntotal != record.n:
            raise StoreError(f"{path}: {INDEX_FILE} holds {index.ntotal:,} vectors but {META_FILE} says "
                             f"{record.n:,}; rebuild the index")
        backend = select_backend(kind, device)
        vectors = None
        if backend.name == "torch-cuda":
            vectors = index.reconstruct_n(0, index.ntotal)
        out = cls(index, kind, record.dim, record.n, backend, dict(record.params), record, vectors)
        out._to_gpu()
        return out


def measure_recall(index: VectorIndex, base: np.ndarray, queries: np.ndarray, k: int = 10) -> dict[str, Any]:
    """Recall@k of an approximate ``index`` against exact inner-product search over ``base`` (normalised)."""
    faiss = _faiss()
    k = min(k, index.n)
    exact = faiss.IndexFlatIP(base.shape[1])
    exact.add(base)
    _, exact_ids = exact.search(np.ascontiguousarray(queries, dtype=np.float32), k)
    _, approx_ids = index.search(queries, k, normalized=True)
    return {"recall@k": recall_at_k(approx_ids, exact_ids), "k": int(k), "queries": int(queries.shape[0])}


_ADD_BLOCK = 65_536  # vectors per add() call: a progress step of an IVF or HNSW build


def _add_in_blocks(index, x: np.ndarray, label: str) -> None:
    """``index.add(x)`` in row blocks, with a progress count. IVF assigns each row on its own, so blocks change
    nothing; an HNSW graph built in blocks inserts in a slightly different order than one call would (recall is
    measured on the built index either way). Corpora under one block are added in one call, as before."""
    for r0 in track(range(0, x.shape[0], _ADD_BLOCK), label):
        index.add(x[r0:r0 + _ADD_BLOCK])
