"""Compositionality items: a positive sentence, a negative with the same words and another meaning,
and paraphrases of the positive (JSONL, one item per line).

Fields: ``id`` (optional, default the line number), ``category`` (optional, default
``uncategorized``), ``complexity`` (optional), ``positive``, ``negative`` and
``paraphrases`` (a non-empty list of sentences). Each bad line is one ``InputError``
naming the file and line.
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from layerscope.errors import InputError

__all__ = ["Item", "read_items", "default_items_path", "MAX_PARAPHRASES"]

MAX_PARAPHRASES = 5


@dataclass(frozen=True)
class Item:
    id: str
    category: str
    complexity: str | None
    positive: str
    negative: str
    paraphrases: tuple[str, ...]

    def texts(self) -> list[str]:
        return [self.positive, self.negative, *self.paraphrases]


def default_items_path() -> Path:
    return Path(str(resources.files("layerscope.data").joinpath("compositionality.jsonl")))


def _text(obj: dict, key: str, where: str) -> str:
    value = obj.get(key)
    if value is None:
        raise InputError(f"{where}: the item has no '{key}'")
    if not isinstance(value, str):
        raise InputError(f"{where}: '{key}' must be a sentence, got {type(value).__name__}")
    if not value.strip():
        raise InputError(f"{where}: '{key}' is empty")
    return value


def read_items(path: str | Path | None = None) -> list[Item]:
    """Read and check compositionality items (the shipped set when ``path`` is None)."""
    path = Path(path) if path is not None else default_items_path()
    if not path.exists():
        raise InputError(f"items file {path} does not exist")
    if path.is_dir():
        raise InputError(f"{path} is a directory; give a JSONL file of items")
    items: list[Item] = []
    seen: dict[str, int] = {}
    from layerscope.data.jsonl import iter_json_objects

    for lineno, obj in iter_json_objects(path, "with positive, negative and paraphrases"):
        where = f"{path}:{lineno}"
        positive = _text(obj, "positive", where)
        negative = _text(obj, "negative", where)
        paras = obj.get("paraphrases")
        if paras is None or paras == []:
            raise InputError(f"{where}: the item has no paraphrases; give 1 to {MAX_PARAPHRASES} under "
                             "'paraphrases'")
        if isinstance(paras, str) or not isinstance(paras, list):
            raise InputError(f"{where}: 'paraphrases' must be a list of sentences")
        if len(paras) > MAX_PARAPHRASES:
            raise InputError(f"{where}: {len(paras)} paraphrases; give at most {MAX_PARAPHRASES}")
        checked = []
        for j, p in enumerate(paras):
            if not isinstance(p, str) or not p.strip():
                raise InputError(f"{where}: paraphrase {j + 1} is empty or not a sentence")
            checked.append(p)
        if negative.strip() == positive.strip():
            raise InputError(f"{where}: the negative is the positive itself")
        iid = str(obj.get("id", lineno))
        if iid in seen:
            raise InputError(f"{where}: id '{iid}' already used on line {seen[iid]}")
        seen[iid] = lineno
        category = obj.get("category") or "uncategorized"
        complexity = obj.get("complexity")
        items.append(Item(iid, str(category), str(complexity) if complexity else None, positive, negative,
                          tuple(checked)))
    if not items:
        raise InputError(f"{path} holds no items")
    return items
