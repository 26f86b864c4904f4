"""Pairs of texts to explain (no score needed): ``run explain``'s input.

* the STS Benchmark's original files (scores kept, unused);
* JSONL with two text fields per line (``sentence1``/``sentence2``, ``text1``/``text2``, ... as for scored pairs);
* plain lines ``text A<TAB>text B`` (``.tsv``/``.txt``: exactly one tab per line, no header).

Every bad line is one ``InputError`` naming the file and line: an empty text, a line without two texts.
"""

from __future__ import annotations

import os
from pathlib import Path

from layerscope.errors import InputError


def check_text(text, where: str) -> str:
    if not isinstance(text, str) or not text.strip():
        raise InputError(f"{where} is empty; every pair needs two non-empty texts")
    return text


def read_text_pairs(source: str | os.PathLike) -> list[tuple[str, str]]:
    """The pairs of a file, in file order."""
    from layerscope.data.pairs import _S1_NAMES, _S2_NAMES, _detect, _pick, read_pairs, tab_rows

    path = Path(source).expanduser()
    if not path.exists():
        raise InputError(f"pairs file {path} does not exist")
    if path.is_dir():
        raise InputError(f"{path} is a directory; give a pairs file")
    name = path.name.lower()
    try:
        if name.endswith((".jsonl", ".ndjson")):
            from layerscope.data.jsonl import iter_json_objects

            pairs, keys = [], None
            for lineno, obj in iter_json_objects(path, "with two texts"):
                where = f"{path}:{lineno}"
                if keys is None:
                    keys = (_pick(list(obj), None, _S1_NAMES, "first-text", "sentence1", where),
                            _pick(list(obj), None, _S2_NAMES, "second-text", "sentence2", where))
                pairs.append((check_text(obj.get(keys[0]), f"{where}: {keys[0]}"),
                              check_text(obj.get(keys[1]), f"{where}: {keys[1]}")))
        elif _detect_sts(path, _detect):
            got = read_pairs(path)
            pairs = list(zip(got.s1, got.s2))
        else:
            pairs = []
            for where, cols in tab_rows(path):
                if len(cols) != 2:
                    raise InputError(f"{where}: {len(cols)} tab-separated fields; a pairs line is "
                                     "'text A<TAB>text B' (or use JSONL with sentence1/sentence2)")
                pairs.append((check_text(cols[0], f"{where}: the first text"),
                              check_text(cols[1], f"{where}: the second text")))
    except UnicodeDecodeError as exc:
        raise InputError(f"{path} is not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    if not pairs:
        raise InputError(f"{path} holds no pairs")
    return pairs


def _detect_sts(path: Path, detect) -> bool:
    try:
        return detect(path, None) == "sts"
    except InputError:
        return False
