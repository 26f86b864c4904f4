"""The order a pytest-xdist worker runs the files in: the longest first, each file whole and in its own order."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from parallel_order import longest_files_first


@dataclass(frozen=True)
class Item:
    path: Path
    name: str
    marks: tuple[str, ...] = ()

    def get_closest_marker(self, name):
        return name if name in self.marks else None


def test_long_then_slow_or_ray_then_the_rest_each_file_whole_and_in_order():
    a, b, c, d, e = (Path(f"tests/test_{x}.py") for x in "abcde")
    items = [Item(a, "a1"), Item(a, "a2"),
             Item(b, "b1"), Item(b, "b2", ("slow",)), Item(b, "b3"),
             Item(c, "c1", ("ray",)),
             Item(d, "d1"), Item(d, "d2", ("slow", "long")), Item(d, "d3"),
             Item(e, "e1")]
    longest_files_first(items)
    assert [i.name for i in items] == ["d1", "d2", "d3", "b1", "b2", "b3", "c1", "a1", "a2", "e1"]

