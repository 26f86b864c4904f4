"""The order in which a pytest-xdist worker lists the tests (``tests/conftest.py`` applies it in each worker)."""

from __future__ import annotations


def _rank(item) -> int:
    if item.get_closest_marker("long"):
        return 0
    if item.get_closest_marker("slow") or item.get_closest_marker("ray"):
        return 1
    return 2


def longest_files_first(items: list) -> None:
    """Sort ``items`` in place: the files that hold a ``long`` test, then those that hold a ``slow`` or ``ray``
    one, then the rest; each file's tests stay together and in their order, and files of one rank keep theirs.
    Handed out whole files in this order (``--dist loadfile --no-loadscope-reorder``), a worker never starts a
    file that runs for minutes when the other has little left to do."""
    rank: dict = {}
    for item in items:
        rank[item.path] = min(rank.get(item.path, 2), _rank(item))
    items.sort(key=lambda item: rank[item.path])  # a stable sort
