"""Exact nearest neighbours and retrieval ranks as blocked matrix products in PyTorch (a GPU where present).

What FAISS's flat GPU index does, without FAISS: the database is streamed in row blocks, queries in
query blocks, so at most ``query_block x db_block`` scores are held at once; products accumulate in
float32 whatever the stored type. Results equal the numpy path of :mod:`layerscope.metrics.neighbors`,
ties included: among equal scores the lower index comes first, and a rank counts the tied block (found from
float64 cosines, as on the numpy path). Retrieval ranks of matched pairs (:func:`paired_tied_ranks`) need
no top-k: the partner's rank is counted inside the blocked product, both directions from one product.

The same functions run on CPU tensors (``device="cpu"``), which is how the tests hold them equal to the
numpy and FAISS paths on a machine without a GPU. PyTorch is imported when a function runs.
"""

from __future__ import annotations

import numpy as np

DB_BLOCK = 1 << 18  # database rows per block
QUERY_BLOCK = 4096  # query rows per block


def cuda_device() -> str | None:
    """``"cuda"`` where PyTorch imports and sees a GPU, else None."""
    try:
        import torch
    except ImportError:
        return None
    try:
        return "cuda" if torch.cuda.is_available() else None
    except Exception:  # a broken driver reports itself here; the CPU paths still work
        return None


def _ordered(vals, idx):
    """Sort each row's candidates by (score descending, index ascending)."""
    import torch

    idx, perm = torch.sort(idx, dim=1, stable=True)
    vals = torch.gather(vals, 1, perm)
    vals, perm = torch.sort(vals, dim=1, descending=True, stable=True)
    return vals, torch.gather(idx, 1, perm)


def _block_topk(s, k: int):
    """Top ``k`` of each row of scores ``s`` [b, m], lower column first among ties at the k-th score."""
    import torch

    vals, idx = torch.topk(s, k, dim=1)
    crowded = (s >= vals[:, -1:]).sum(dim=1) > k  # ties straddle the k-th place: topk's pick is arbitrary
    if bool(crowded.any()):
        sv, si = torch.sort(s[crowded], dim=1, descending=True, stable=True)
        vals[crowded], idx[crowded] = sv[:, :k], si[:, :k]
    return _ordered(vals, idx)


def topk_inner(q: np.ndarray, x: np.ndarray, k: int, *, device: str = "cuda", exclude_self: bool = False,
               query_block: int = QUERY_BLOCK, db_block: int = DB_BLOCK) -> tuple[np.ndarray, np.ndarray]:
    """Top-``k`` inner products of each row of ``q`` against the rows of ``x``: (scores float32, ids int64).

    ``exclude_self``: ``q`` is ``x`` itself and row i never lists i. ``x`` may be a memory-mapped array
    of any float type; it goes to a GPU once per call where it fits (:func:`resident`), else one block at a
    time; or a float32 tensor already on ``device`` (:func:`resident`'s, kept by a caller that searches
    again).
    """
    import torch

    dev = torch.device(device)
    n, nq = x.shape[0], q.shape[0]
    k = int(min(k, n - (1 if exclude_self else 0)))
    out_s = np.empty((nq, k), dtype=np.float32)
    out_i = np.empty((nq, k), dtype=np.int64)
    with torch.inference_mode(), _float32_products(torch):
        whole = x if torch.is_tensor(x) else resident(x, dev)
        for q0 in range(0, nq, query_block):
            qb = torch.from_numpy(np.ascontiguousarray(q[q0:q0 + query_block], dtype=np.float32)).to(dev)
            best_s = best_i = None
            for r0 in range(0, n, db_block):
                xb = whole[r0:r0 + db_block] if whole is not None else \
                    torch.from_numpy(np.ascontiguousarray(x[r0:r0 + db_block], dtype=np.float32)).to(dev)
                s = qb @ xb.T
                if exclude_self:
                    rows = torch.arange(qb.shape[0], device=dev)
                    cols = rows + q0 - r0
                    inside = (cols >= 0) & (cols < xb.shape[0])
                    s[rows[inside], cols[inside]] = -torch.inf
                vals, idx = _block_topk(s, min(k, s.shape[1]))
                idx = idx + r0
                if best_s is None:
                    best_s, best_i = vals, idx
                else:
                    best_s, best_i = _block_merge(torch.cat([best_s, vals], 1), torch.cat([best_i, idx], 1), k)
            out_s[q0:q0 + qb.shape[0]] = best_s.cpu().numpy()
            out_i[q0:q0 + qb.shape[0]] = best_i.cpu().numpy()
    return out_s, out_i


def resident(x: np.ndarray, device):
    """``x`` as one float32 tensor on ``device`` where that is free (CPU, float32 rows: shared, not copied)
    or fits a quarter of the GPU's free memory (copied once instead of once per query block); else None."""
    import torch

    dev = torch.device(device)
    if dev.type == "cpu":
        ok = isinstance(x, np.ndarray) and x.dtype == np.float32 and x.flags.c_contiguous
        return torch.from_numpy(x) if ok else None
    if dev.type == "cuda" and x.shape[0] * x.shape[1] * 4 <= torch.cuda.mem_get_info(dev)[0] // 4:
        return torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32)).to(dev)
    return None


def _block_merge(vals, idx, k: int):
    vals, idx = _ordered(vals, idx)
    return vals[:, :k], idx[:, :k]


def knn(xf: np.ndarray, k: int, metric: str, *, device: str = "cuda") -> np.ndarray:
    """Exact k nearest neighbours of every row among the rows (self excluded), nearest first.

    ``xf`` float32, already L2-normalised for cosine. ``metric`` "l2" ranks by ``2 x.y - |y|^2``, the
    numpy path's score (the query's own norm does not change the order)."""
    if metric != "l2":
        return topk_inner(xf, xf, k, device=device, exclude_self=True)[1]
    # 2 q.y - |y|^2 = [q, 1] . [2y, -|y|^2]: one inner product, blocked like the others
    sq = np.einsum("ij,ij->i", xf, xf)
    q = np.hstack([xf, np.ones((len(xf), 1), dtype=np.float32)])
    x = np.hstack([2 * xf, -sq[:, None]]).astype(np.float32)
    return topk_inner(q, x, k, device=device, exclude_self=True)[1]


def cosine_ranks(sn: np.ndarray, tn: np.ndarray, *, device: str = "cuda",
                 query_block: int | None = None, db_block: int | None = None) -> np.ndarray:
    """The mean rank of each pair's tied block (:func:`cosine_tied_ranks`), float64."""
    return cosine_tied_ranks(sn, tn, device=device, query_block=query_block, db_block=db_block).mean


def cosine_tied_ranks(sn: np.ndarray, tn: np.ndarray, *, device: str = "cuda", query_block: int | None = None,
                      db_block: int | None = None):
    """Where ``tn[i]`` lands among all rows of ``tn`` for query ``sn[i]`` (rows L2-normalised): the
    source -> target half of :func:`paired_tied_ranks`."""
    return paired_tied_ranks(sn, tn, device=device, both=False, query_block=query_block, db_block=db_block)[0]


CPU_QUERY_BLOCK, CPU_DB_BLOCK = 1024, 8192  # 8M scores (32 MiB) per block on the CPU
NEAR_BUDGET = 1 << 22  # near-tie pairs listed at once (their indices: 64 MiB)
GATHER_ELEMENTS = 1 << 23  # float64 elements gathered at once when near ties are scored again (64 MiB a side)
DENSE_SHARE = 16  # a row with more than 1/16 of its pairs near a tie is scored again as a whole float64 product


def paired_tied_ranks(sn: np.ndarray, tn: np.ndarray, *, device: str = "cuda", both: bool = True,
                      query_block: int | None = None, db_block: int | None = None):
    """Retrieval ranks of matched pairs by counting, no top-k and no sort: ``(src2tgt, tgt2src)`` TiedRanks.

    Row i of ``sn`` and of ``tn`` are a pair (rows L2-normalised). For query ``sn[i]`` the partner's rank
    is one plus the number of rows of ``tn`` scoring strictly above it, its tie the rows scoring the same
    (the partner included); likewise for query ``tn[j]`` among the rows of ``sn``. Block ``sn[a] @ tn[b].T``
    holds both: its rows are source queries, its columns target queries, and both compare with the same
    diagonal ``sn[i] . tn[i]``, so one float32 product per block serves both directions (``both=False``:
    rows only). Ties are those of :func:`layerscope.metrics.neighbors.cosine_tie_counts`: a float32 score
    more than ``SCREEN`` above the partner's counts as above; one within ``SCREEN`` is scored again in
    float64 and is above past ``TIE_TOL``, tied within it. Blocks hold ``query_block x db_block`` scores
    (defaults: 4096 x 262,144 on a GPU, 1024 x 8192 on the CPU); the vectors move to the device once.
    """
    import torch

    from layerscope.metrics.ties import TiedRanks

    dev = torch.device(device)
    gpu = dev.type != "cpu"
    qstep = int(query_block or (QUERY_BLOCK if gpu else CPU_QUERY_BLOCK))
    dstep = int(db_block or (DB_BLOCK if gpu else CPU_DB_BLOCK))
    n = sn.shape[0]
    with torch.inference_mode(), _float32_products(torch):
        S = torch.from_numpy(np.ascontiguousarray(sn, dtype=np.float32)).to(dev)
        T = torch.from_numpy(np.ascontiguousarray(tn, dtype=np.float32)).to(dev)
        diag = torch.empty(n, dtype=torch.float32, device=dev)
        own64 = torch.empty(n, dtype=torch.float64, device=dev)
        for a in range(0, n, qstep):
            diag[a:a + qstep] = (S[a:a + qstep] * T[a:a + qstep]).sum(dim=1)
            own64[a:a + qstep] = (S[a:a + qstep].double() * T[a:a + qstep].double()).sum(dim=1)
        counts = [(torch.zeros(n, dtype=torch.int64, device=dev), torch.ones(n, dtype=torch.int64, device=dev))
                  for _ in range(2 if both else 1)]
        for q0 in range(0, n, qstep):
            qb = S[q0:q0 + qstep]
            for r0 in range(0, n, dstep):
                xb = T[r0:r0 + dstep]
                s = qb @ xb.T
                rows = torch.arange(qb.shape[0], device=dev)
                cols = rows + q0 - r0
                inside = (cols >= 0) & (cols < xb.shape[0])
                s[rows[inside], cols[inside]] = -torch.inf  # the pair itself: neither above nor a tie
                _count(s, diag[q0:q0 + qb.shape[0]], qb, xb, own64[q0:q0 + qb.shape[0]],
                       *(c[q0:q0 + qb.shape[0]] for c in counts[0]))
                if both:  # column j: query tn[r0 + j] against the rows of this source block
                    _count(s.T, diag[r0:r0 + xb.shape[0]], xb, qb, own64[r0:r0 + xb.shape[0]],
                           *(c[r0:r0 + xb.shape[0]] for c in counts[1]))
        return tuple(TiedRanks(above.double().cpu().numpy(), tied.cpu().numpy()) for above, tied in counts)


class _float32_products:
    """Matrix products in full float32 while inside (no TF32), whatever the caller set."""

    def __init__(self, torch):
        self.torch = torch

    def __enter__(self):
        self.before = self.torch.get_float32_matmul_precision()
        self.torch.set_float32_matmul_precision("highest")

    def __exit__(self, *exc):
        self.torch.set_float32_matmul_precision(self.before)


def _count(s, target, q, x, own64, above, tied) -> None:
    """Add to ``above``/``tied`` (per row of ``s`` [b, m], the scores of queries ``q`` against rows ``x``)
    the rows scoring above / tying with each query's partner, whose float32 score is ``target``."""
    import torch

    from layerscope.metrics.ties import SCREEN

    hi = s > (target + SCREEN)[:, None]
    lo = s >= (target - SCREEN)[:, None]
    # summed as bytes into int32: half the time of summing bools into int64 on the CPU
    n_hi = hi.view(torch.uint8).sum(dim=1, dtype=torch.int32)
    above += n_hi
    n_near = lo.view(torch.uint8).sum(dim=1, dtype=torch.int32) - n_hi
    if bool((n_near > 0).any()):
        _near_float64(lo & ~hi, n_near.cpu().numpy(), q, x, own64, above, tied)


def _near_float64(near, n_near: np.ndarray, q, x, own64, above, tied) -> None:
    """Score the ``near`` pairs again in float64 (products of float32 values are exact there) and count them
    above (past ``TIE_TOL``) or tied (within it). A row with more than 1/``DENSE_SHARE`` of its pairs near
    (many equal vectors: a layer where every text ends in the same token) is scored whole, as a float64
    product; the others pair by pair, in slabs of rows so that at most ``NEAR_BUDGET`` pairs are listed and
    ``GATHER_ELEMENTS`` gathered at once."""
    import torch

    from layerscope.metrics.ties import TIE_TOL

    b, m = near.shape
    dense = np.flatnonzero(n_near * DENSE_SHARE > m)
    if dense.size:
        idx = torch.from_numpy(dense).to(near.device)
        x64, rows = x.double(), max(1, NEAR_BUDGET // max(1, m))  # at most NEAR_BUDGET float64 scores at once
        for c0 in range(0, idx.numel(), rows):
            r = idx[c0:c0 + rows]
            diff = q[r].double() @ x64.T - own64[r][:, None]
            nr = near[r]
            above.index_add_(0, r, ((diff > TIE_TOL) & nr).sum(dim=1))
            tied.index_add_(0, r, ((diff.abs() <= TIE_TOL) & nr).sum(dim=1))
        near[idx] = False
        n_near = np.where(n_near * DENSE_SHARE > m, 0, n_near)
    ends = np.cumsum(n_near)
    step = max(1, GATHER_ELEMENTS // max(1, q.shape[1]))
    r0 = 0
    while r0 < b and ends[-1] > (int(ends[r0 - 1]) if r0 else 0):
        done = int(ends[r0 - 1]) if r0 else 0
        r1 = max(r0 + 1, int(np.searchsorted(ends, done + NEAR_BUDGET, side="right")))
        ri_all, ci_all = near[r0:r1].nonzero(as_tuple=True)
        ri_all = ri_all + r0
        for e0 in range(0, ri_all.numel(), step):
            ri, ci = ri_all[e0:e0 + step], ci_all[e0:e0 + step]
            diff = (q[ri].double() * x[ci].double()).sum(dim=1) - own64[ri]
            above += torch.bincount(ri[diff > TIE_TOL], minlength=b)
            tied += torch.bincount(ri[diff.abs() <= TIE_TOL], minlength=b)
        r0 = r1
