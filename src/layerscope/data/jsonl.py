"""The JSON-lines loop the data readers share: one object per non-blank line, one clear error per bad line."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Iterator

from layerscope.errors import InputError


def iter_json_objects(path: Path, expected: str) -> Iterator[tuple[int, dict]]:
    """Yield ``(line_number, object)`` for every non-blank line of a JSONL file.

    ``expected`` finishes the error for a line that is not an object, e.g. "with positive, negative
    and paraphrases". Bytes that are not UTF-8 name their line; a UTF-8 BOM is accepted.
    """
    with open(path, "rb") as fh:
        for lineno, raw in enumerate(fh, 1):
            if lineno == 1 and raw.startswith(b"\xef\xbb\xbf"):
                raw = raw[3:]
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise InputError(f"{path}:{lineno}: not UTF-8 text ({exc.reason} at byte {exc.start}); "
                                 "re-encode the file as UTF-8") from None
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as exc:
                raise InputError(f"{path}:{lineno}: not valid JSON ({exc.msg})") from None
            if not isinstance(obj, dict):
                raise InputError(f"{path}:{lineno}: each line must be a JSON object {expected}")
            yield lineno, obj
