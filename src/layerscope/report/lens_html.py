"""The logit lens's token views, from typed results alone: per kept text, the top-1 decoded token at every layer
and position (report.md: a table for the first texts; report.html: a heat map coloured by the target's rank).

A kept text is what lens saved (``per_model.<model>.texts``: the text, its tokens, and per layer the top tokens
and the target's rank at each position); a text whose fields are not that shape is left out, not guessed at.
"""

from __future__ import annotations

import math
from typing import Any


def _grid(t: dict[str, Any], layers: list[str]) -> tuple[list[str], list[str], list[list], list[list[str]]] | None:
    """(layers, columns, log10 ranks, top-1 tokens) of one kept text; None where it is not what lens writes."""
    tokens, by_layer = t.get("tokens"), t.get("layers")
    if not isinstance(tokens, list) or not isinstance(by_layer, dict):
        return None
    names = layers or [str(x) for x in by_layer]
    z, text = [], []
    for name in names:
        got = by_layer.get(name) if isinstance(by_layer.get(name), dict) else {}
        ranks, tops = got.get("rank") or [], got.get("top") or []
        z.append([math.log10(max(1.0, r)) if isinstance(r, (int, float)) and not isinstance(r, bool) else None
                  for r in ranks])
        text.append([str(top[0][0]) if isinstance(top, list) and top and top[0] else "" for top in tops])
    return names, [f"{i}:{tok}" for i, tok in enumerate(tokens)], z, text


def _texts(fig) -> list[dict[str, Any]]:
    return [t for t in fig.value("texts") or [] if isinstance(t, dict)]


def token_markdown(results, md_data) -> str:
    """report.md: the top-1 token per layer of each model's first three kept texts."""
    from layerscope.report.writer import md_table

    parts = []
    for model, fig in results.per_model.items():
        for t in _texts(fig)[:3]:
            got = _grid(t, [str(x) for x in fig.value("layers") or []])
            if got is None:
                continue
            names, cols, _, text = got
            rows = [{"layer": name, **dict(zip(cols, row))} for name, row in zip(names, text)]
            who = f" ({model})" if results.several else ""
            parts += [f"Top-1 token per layer for: _{md_data(str(t.get('text', '')))}_{md_data(who)}\n",
                      md_table(md_data(rows))]
    return "\n".join(parts)


def token_section(results):
    """report.html: one heat map per kept text (at most four per model), or None where none was kept."""
    from layerscope.report.html_figures import Section, heatmap

    charts = []
    for model, fig in results.per_model.items():
        for t in _texts(fig)[:4]:
            got = _grid(t, [str(x) for x in fig.value("layers") or []])
            if got is None or not got[1]:
                continue
            names, cols, z, text = got
            charts.append(heatmap(z, names, cols, text=text, reverse=True, zlabel="log10 rank (0 = top)",
                                  xlabel="position:input token", ylabel="layer",
                                  title=f"Logit lens, top-1 token per layer: “{str(t.get('text', ''))[:80]}”"
                                        + (f" ({model})" if results.several else ""),
                                  caption="Cell text: the layer's top-1 decoded token at that position; colour: "
                                          "log10 rank of the target token there (bright = ranked first)."))
    return Section("tokens", "Top-1 token per layer", charts) if charts else None
