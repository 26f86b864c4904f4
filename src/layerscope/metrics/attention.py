"""Attention rollout and attention flow (Abnar & Zuidema 2020, "Quantifying Attention Flow in Transformers").

Both read one text's unpadded attention probabilities ``[L, H, T, T]`` (layer, head, query, key). Each layer's
heads are averaged and the residual connection is added as the identity: ``Â_l = 0.5 A_l + 0.5 I``, rows
renormalised (every row of ``A_l`` sums to one, so ``Â_l``'s do too).

- rollout: ``R_1 = Â_1``, ``R_l = Â_l R_(l-1)``; ``R_l[i, j]`` is how much of token ``i`` at layer ``l``
  comes from input token ``j`` when attention is taken to mix linearly;
- flow: the layered graph with nodes (layer, token), an edge from (l, i) to (l-1, j) of capacity
  ``Â_l[i, j]``; the flow from (L, i) to input token j is the maximum flow between them (networkx).
"""

from __future__ import annotations

import numpy as np

from layerscope.errors import InputError


def _check(patterns) -> np.ndarray:
    p = np.asarray(patterns, dtype=np.float64)
    if p.ndim != 4 or p.shape[2] != p.shape[3] or p.shape[2] == 0:
        raise InputError(f"attention patterns must be [layers, heads, tokens, tokens], got shape {p.shape}")
    return p


def residual_attention(patterns) -> np.ndarray:
    """``Â_l`` per layer ``[L, T, T]``: heads averaged, half identity added, rows summing to one."""
    p = _check(patterns)
    a = 0.5 * p.mean(axis=1) + 0.5 * np.eye(p.shape[-1])[None]
    return a / a.sum(axis=-1, keepdims=True)


def rollout(patterns) -> np.ndarray:
    """Attention rollout after every layer, ``[L, T, T]`` (row: token at that layer; column: input token)."""
    a = residual_attention(patterns)
    out = np.empty_like(a)
    acc = np.eye(a.shape[-1])
    for layer in range(a.shape[0]):
        acc = a[layer] @ acc
        out[layer] = acc
    return out


def flow(patterns, query: int) -> np.ndarray:
    """Attention flow from token ``query`` at the last layer to every input token, ``[T]``."""
    import networkx as nx

    a = residual_attention(patterns)
    n_layers, t = a.shape[0], a.shape[-1]
    if not 0 <= query < t:
        raise InputError(f"query token {query} is outside the text's {t} tokens")
    graph = nx.DiGraph()
    for layer in range(n_layers, 0, -1):
        for i in range(t):
            for j in range(t):
                if a[layer - 1, i, j] > 0:
                    graph.add_edge((layer, i), (layer - 1, j), capacity=float(a[layer - 1, i, j]))
    out = np.zeros(t)
    for j in range(t):
        if graph.has_node((0, j)):
            out[j] = nx.maximum_flow_value(graph, (n_layers, query), (0, j))
    return out
