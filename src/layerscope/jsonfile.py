"""Writing a JSON file so that a reader never sees half of it, and reading back a JSON object that may be missing
or damaged (used by every floor, imports nothing of ours)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any


def write_json_atomic(path: Path, data: Any, *, indent: int = 2) -> None:
    """Write JSON to a temporary sibling, fsync it, and rename it over ``path``."""
    path = Path(path)
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    try:
        with open(tmp, "w", encoding="utf-8") as fh:
            json.dump(data, fh, indent=indent, ensure_ascii=False)
            fh.write("\n")
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:  # a full disk or Ctrl-C: no half-written temporary file is left beside it
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def read_json_dict(path: Path) -> dict[str, Any]:
    """The JSON object in ``path``; {} when the file is missing, unreadable or holds anything but an object."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}
