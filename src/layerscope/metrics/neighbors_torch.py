"""Exact nearest neighbours and retrieval ranks as blocked matrix products in PyTorch (a GPU where present).

What FAISS's flat GPU index does, without FAISS: the database is streamed in row blocks, queries in
query blocks, so at most ``query_block x db_block`` scores are held at once; products accumulate in
float32 whatever the stored type. Results equal the numpy path of :mod:`layerscope.metrics.neighbors`,
ties included: among equal scores the lower index comes first, and a rank counts the tied block (found from
float64 cosines, as on the numpy path).

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
    of any float type; it is copied to the device one block at a time.
    """
    import torch

    dev = torch.device(device)
    n, nq = x.shape[0], q.shape[0]
    k = int(min(k, n - (1 if exclude_self else 0)))
    out_s = np.empty((nq, k), dtype=np.float32)
    out_i = np.empty((nq, k), dtype=np.int64)
    with torch.inference_mode():
        for q0 in range(0, nq, query_block):
            qb = torch.from_numpy(np.ascontiguousarray(q[q0:q0 + query_block], dtype=np.float32)).to(dev)
            best_s = best_i = None
            for r0 in range(0, n, db_block):
                xb = torch.from_numpy(np.ascontiguousarray(x[r0:r0 + db_block], dtype=np.float32)).to(dev)
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
                 query_block: int = QUERY_BLOCK, db_block: int = DB_BLOCK) -> np.ndarray:
    """The mean rank of each pair's tied block (:func:`cosine_tied_ranks`), float64."""
    return cosine_tied_ranks(sn, tn, device=device, query_block=query_block, db_block=db_block).mean


def cosine_tied_ranks(sn: np.ndarray, tn: np.ndarray, *, device: str = "cuda", query_block: int = QUERY_BLOCK,
                      db_block: int = DB_BLOCK):
    """Where ``tn[i]`` lands among all rows of ``tn`` for query ``sn[i]`` (rows L2-normalised), as
    :func:`layerscope.metrics.neighbors.cosine_tie_counts` counts it: float32 products screen, and a query
    with another row within ``SCREEN`` of its own pair is counted again from float64 cosines, so ties are
    the same as on the numpy and FAISS paths."""
    import torch

    from layerscope.metrics.ties import SCREEN, TiedRanks, float64_tie_counts

    dev = torch.device(device)
    n = sn.shape[0]
    above = np.empty(n, dtype=np.float64)
    redo = np.zeros(n, dtype=bool)
    with torch.inference_mode():
        for q0 in range(0, n, query_block):
            qb = torch.from_numpy(np.ascontiguousarray(sn[q0:q0 + query_block], dtype=np.float32)).to(dev)
            own = torch.from_numpy(np.ascontiguousarray(tn[q0:q0 + query_block], dtype=np.float32)).to(dev)
            target = (qb * own).sum(dim=1, keepdim=True)
            greater = torch.zeros(qb.shape[0], dtype=torch.int64, device=dev)
            near = torch.zeros(qb.shape[0], dtype=torch.bool, device=dev)
            for r0 in range(0, n, db_block):
                xb = torch.from_numpy(np.ascontiguousarray(tn[r0:r0 + db_block], dtype=np.float32)).to(dev)
                s = qb @ xb.T
                rows = torch.arange(qb.shape[0], device=dev)
                cols = rows + q0 - r0
                inside = (cols >= 0) & (cols < xb.shape[0])
                s[rows[inside], cols[inside]] = -torch.inf  # the pair itself is neither above nor a tie
                greater += (s > target + SCREEN).sum(dim=1)
                near |= ((s - target).abs() <= SCREEN).any(dim=1)
            above[q0:q0 + qb.shape[0]] = greater.double().cpu().numpy()
            redo[q0:q0 + qb.shape[0]] = near.cpu().numpy()
    tied = np.ones(n, dtype=np.int64)
    idx = np.flatnonzero(redo)
    if idx.size:
        above[idx], tied[idx] = float64_tie_counts(np.asarray(sn[idx], dtype=np.float32), np.asarray(tn, dtype=np.float32),
                                                idx)
    return TiedRanks(above, tied)
