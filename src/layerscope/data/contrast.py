"""Paired texts that interventions read: clean/corrupted pairs for activation patching, positive/negative pairs
for steering vectors (JSONL, one pair per line; each bad line is one ``InputError`` naming the file and line).

Patch pairs: ``clean`` and ``corrupted`` (the same text but for a few tokens), and what the metric reads:
``target`` and ``foil`` (a decoder's logit difference or the target's probability at the next token), ``other``
(an encoder's: the similarity of the run's embedding to this text's; without it, to the clean run's). The
built-in set (``patch_pairs.jsonl``, written for layerscope) swaps one country for another in 16 short prompts.

Steer pairs: ``positive`` and ``negative``. The built-in set (``steer_pairs.jsonl``) is the 30 minimal
positive/negative pairs of ``sentiment_small.jsonl``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from layerscope.errors import InputError

DATA_DIR = Path(__file__).resolve().parent
PATCH_PAIRS = DATA_DIR / "patch_pairs.jsonl"
STEER_PAIRS = DATA_DIR / "steer_pairs.jsonl"


@dataclass(frozen=True)
class PatchPair:
    line: int  # its line in the file (how a message names it)
    clean: str
    corrupted: str
    target: str | None = None
    foil: str | None = None
    other: str | None = None


@dataclass(frozen=True)
class SteerPair:
    line: int
    positive: str
    negative: str


def _text(obj: dict, key: str, where: str, *, required: bool = True) -> str | None:
    value = obj.get(key)
    if value is None:
        if required:
            raise InputError(f"{where}: the pair has no '{key}'")
        return None
    if not isinstance(value, str):
        raise InputError(f"{where}: '{key}' must be a text, got {type(value).__name__}")
    if not value.strip():
        raise InputError(f"{where}: '{key}' is empty")
    return value


def _two(obj: dict, where: str, first: str, second: str, why: str) -> tuple[str, str]:
    """The pair's two texts, which must differ (``why``: what the same text would mean)."""
    a, b = _text(obj, first, where), _text(obj, second, where)
    if a == b:
        raise InputError(f"{where}: {first} and {second} are the same text{why}")
    return a, b


def _lines(path: str | Path, expected: str):
    from layerscope.data.jsonl import iter_json_objects

    path = Path(path)
    if not path.exists():
        raise InputError(f"pairs file {path} does not exist")
    if path.is_dir():
        raise InputError(f"{path} is a directory; give a JSONL file of pairs")
    return path, iter_json_objects(path, expected)


def read_patch_pairs(path: str | Path | None = None) -> list[PatchPair]:
    """Clean/corrupted pairs (the built-in set when ``path`` is None). A file mixes no kinds: every pair names a
    target and a foil, or none does (the same for ``other``)."""
    path, rows = _lines(path or PATCH_PAIRS, "with clean and corrupted")
    pairs = []
    for lineno, obj in rows:
        where = f"{path}:{lineno}"
        clean, corrupted = _two(obj, where, "clean", "corrupted", "; a patch between them changes nothing")
        target, foil = _text(obj, "target", where, required=False), _text(obj, "foil", where, required=False)
        if (target is None) != (foil is None):
            raise InputError(f"{where}: give both 'target' and 'foil' (the tokens whose logits are compared), or neither")
        if target is not None and target == foil:
            raise InputError(f"{where}: 'target' and 'foil' are the same text")
        pairs.append(PatchPair(lineno, clean, corrupted, target, foil, _text(obj, "other", where, required=False)))
    if not pairs:
        raise InputError(f"{path} holds no pairs")
    for key in ("target", "other"):
        have = [p for p in pairs if getattr(p, key) is not None]
        if have and len(have) < len(pairs):
            lacking = next(p for p in pairs if getattr(p, key) is None)
            raise InputError(f"{path}:{lacking.line}: this pair has no '{key}' but others do; give every pair one, "
                             "or none")
    return pairs


def read_steer_pairs(path: str | Path | None = None) -> list[SteerPair]:
    """Positive/negative pairs (the built-in set when ``path`` is None)."""
    path, rows = _lines(path or STEER_PAIRS, "with positive and negative")
    pairs = []
    for lineno, obj in rows:
        where = f"{path}:{lineno}"
        pairs.append(SteerPair(lineno, *_two(obj, where, "positive", "negative", "")))
    if not pairs:
        raise InputError(f"{path} holds no pairs")
    return pairs
