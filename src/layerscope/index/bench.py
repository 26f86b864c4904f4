"""Benchmark: FAISS flat and IVF build/query times, and alignment at scale, on seeded random unit vectors.

    python -m layerscope.index.bench --sizes 100000,1000000 --dim 384 --out benchmarks/faiss

For each size N: base = N random unit vectors (seeded Gaussian, normalised);
queries = 1,000 other random unit vectors. Flat: add time, query time for
k = 10, QPS. IVF: train + add time, then query time and recall@10 against
the flat results for several nprobe values. Random vectors have no cluster
structure, so IVF recall here is a worst case.

Alignment at N (with ``--align``): pairs ``(s_i, t_i)`` with
``t_i = normalise(s_i + e_i)``, ``e_i ~ N(0, 1/d)`` per coordinate (matched
cosine about 0.7): the exact scrambled z and a Monte Carlo one (``--permutations``,
with its standard error; 0 for none), retrieval both ways (exact ranks counted in one blocked product for
both directions; IVF above 50k pairs on the CPU), mutual k-NN and PCA, each timed (wall and this process's
CPU seconds); no N x N matrix is ever formed.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np


def random_unit(n: int, d: int, seed: int, block: int = 100_000) -> np.ndarray:
    rng = np.random.default_rng(seed)
    out = np.empty((n, d), dtype=np.float32)
    for r0 in range(0, n, block):
        b = rng.standard_normal((min(block, n - r0), d), dtype=np.float32)
        out[r0:r0 + b.shape[0]] = b / np.linalg.norm(b, axis=1, keepdims=True)
    return out


def bench_indexes(n: int, d: int, seed: int, nprobes=(1, 4, 16, 64), n_queries: int = 1000, k: int = 10) -> dict:
    from layerscope.index.vector_index import VectorIndex, default_nlist
    from layerscope.metrics.neighbors import recall_at_k

    x = random_unit(n, d, seed)
    q = random_unit(n_queries, d, seed + 1)
    res: dict = {"n": n, "dim": d, "queries": n_queries, "k": k}
    t0 = time.perf_counter()
    flat = VectorIndex.build(x, "flat", normalized=True)
    t1 = time.perf_counter()
    _, exact = flat.search(q, k, normalized=True)
    t2 = time.perf_counter()
    res["flat"] = {"build_s": round(t1 - t0, 3), "query_s": round(t2 - t1, 3),
                   "qps": round(n_queries / (t2 - t1), 1), "backend": flat.backend.describe()}
    del flat
    nlist = default_nlist(n)
    t0 = time.perf_counter()
    ivf = VectorIndex.build(x, "ivf", normalized=True, nlist=nlist, seed=seed)
    t1 = time.perf_counter()
    rows = []
    for p in nprobes:
        ivf.index.nprobe = min(p, nlist)
        ta = time.perf_counter()
        _, ids = ivf.search(q, k, normalized=True)
        tb = time.perf_counter()
        rows.append({"nprobe": min(p, nlist), "query_s": round(tb - ta, 4), "qps": round(n_queries / (tb - ta), 1),
                     "recall@10": round(recall_at_k(ids, exact), 4)})
    res["ivf"] = {"nlist": nlist, "n_train": ivf.params["n_train"], "build_s": round(t1 - t0, 3), "search": rows,
                  "backend": ivf.backend.describe()}
    return res


def bench_alignment(n: int, d: int, seed: int, n_perm: int, nprobe: int | None, device: str = "auto") -> dict:
    from layerscope.index.alignment import alignment_figures

    s = random_unit(n, d, seed)
    rng = np.random.default_rng(seed + 2)
    t = np.empty_like(s)
    for r0 in range(0, n, 100_000):
        b = s[r0:r0 + 100_000] + rng.standard_normal((min(100_000, n - r0), d), dtype=np.float32) / np.sqrt(d)
        t[r0:r0 + b.shape[0]] = b / np.linalg.norm(b, axis=1, keepdims=True)
    timings: dict = {}
    cpu: dict = {}
    t0, c0 = time.perf_counter(), time.process_time()
    f = alignment_figures(s, t, n_perm=n_perm, seed=seed, knn_k=10, device=device,
                          index_params={"nprobe": nprobe} if nprobe else None, timings=timings, cpu_timings=cpu)
    total, cpu_total = time.perf_counter() - t0, time.process_time() - c0
    r = f["retrieval"]
    return {
        "n": n, "dim": d, "permutations": n_perm, "seconds_total": round(total, 1), "seconds": timings,
        "cpu_seconds_total": round(cpu_total, 1), "cpu_seconds": cpu,
        "load_avg_1m_after": round(os.getloadavg()[0], 2) if hasattr(os, "getloadavg") else None,
        "z": f["z"], "z_monte_carlo": f.get("z_monte_carlo"),
        "retrieval": {"index": r["index"], "backend": r.get("backend"), "mrr_cutoff": r["mrr_cutoff"],
                      "seconds_search_both": r.get("seconds_search_both"),
                      **{dn: {kk: r[dn][kk] for kk in ("acc@1", "acc@10", "mrr", "seconds_build", "seconds_search",
                                                        "recall_vs_exact", "params") if kk in r[dn]}
                         for dn in ("src2tgt", "tgt2src")}},
        "mutual_knn": f["mutual_knn"], "pca_pc0_abs_d": f["pca"].get("pc0_abs_cohens_d"),
    }


def peak_rss_gib() -> float:
    import resource

    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 2)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", default="100000,1000000")
    ap.add_argument("--dim", type=int, default=384)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--align", default="1000000", help="sizes for the alignment benchmark ('' for none)")
    ap.add_argument("--permutations", type=int, default=20)
    ap.add_argument("--nprobe", type=int, default=8, help="IVF cells searched in the alignment benchmark")
    ap.add_argument("--device", default="auto", choices=("auto", "cpu", "gpu"),
                    help="where nearest-neighbour search runs (gpu: FAISS GPU or exact PyTorch top-k)")
    ap.add_argument("--out", default="benchmarks/faiss")
    args = ap.parse_args(argv)
    import faiss

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    record = {"machine": {"platform": platform.platform(), "cpus": os.cpu_count(),
                          "faiss": faiss.__version__, "faiss_threads": faiss.omp_get_max_threads()},
              "command": "python -m layerscope.index.bench " + " ".join(argv if argv is not None else sys.argv[1:]),
              "indexes": [], "alignment": []}
    path = out / "results.json"
    for n in [int(v) for v in args.sizes.split(",") if v]:
        r = bench_indexes(n, args.dim, args.seed)
        record["indexes"].append(r)
        print(json.dumps(r), flush=True)
        path.write_text(json.dumps(record, indent=2) + "\n")
    for n in [int(v) for v in args.align.split(",") if v]:
        r = bench_alignment(n, args.dim, args.seed, args.permutations, args.nprobe, args.device)
        record["alignment"].append(r)
        print(json.dumps(r), flush=True)
        path.write_text(json.dumps(record, indent=2) + "\n")
    record["peak_rss_gib"] = peak_rss_gib()
    path.write_text(json.dumps(record, indent=2) + "\n")
    print(f"wrote {path} (peak RSS {record['peak_rss_gib']} GiB)")


if __name__ == "__main__":
    main()
