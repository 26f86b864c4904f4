"""What every similarity figure carries in its title: the data and the vectors (pooling), read from typed results
alone (PNG, report.md and report.html alike)."""

from __future__ import annotations

from pathlib import PurePath


def data_label(results) -> str:
    """The texts in a few words: a file's name, the generated set, or the store's name."""
    data = results.data
    if data.label:
        return data.label
    origin = data.origin or ""
    return PurePath(origin).name if origin and not origin.startswith("generated") else origin or "the texts"


def vectors_label(results) -> str:
    data = results.data
    return "token vectors" if data.tokens else f"{data.pooling or 'mean'} pooling"


def subtitle(results) -> str:
    """``"<data>, <pooling> pooling"``: the line every similarity title carries."""
    return f"{data_label(results)}, {vectors_label(results)}"
