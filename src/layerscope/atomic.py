"""Writing files and directories so that a crash never leaves something that looks complete."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Iterator


def write_json_atomic(path: Path, data: Any) -> None:
    """Write JSON to a temporary sibling, fsync it, and rename it over ``path``."""
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(data, fh, indent=2, ensure_ascii=False)
        fh.write("\n")
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


@contextlib.contextmanager
def staged_dir(target: Path, kind: str | None = None) -> Iterator[Path]:
    """Yield an empty staging directory beside ``target``; on success it replaces ``target``.

    ``kind`` (export, result, ...): the ownership marker written into the staging directory, so
    the directory is marked from the moment it appears. The caller checks with
    :func:`layerscope.ownership.claim` that ``target`` may be replaced before calling this.
    On any error (or Ctrl-C) the staging directory is removed and ``target`` is left as it was.
    """
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    stage = Path(tempfile.mkdtemp(prefix=f".{target.name}.partial-", dir=target.parent))
    try:
        if kind is not None:
            from layerscope.ownership import write_marker

            write_marker(stage, kind)
        yield stage
        if target.exists():
            if kind is not None and any(target.iterdir()):
                from layerscope.ownership import remove

                remove(target, kind)  # re-checked: only layerscope's own directory of this kind is deleted
            else:
                shutil.rmtree(target)
        os.replace(stage, target)
    except BaseException:
        shutil.rmtree(stage, ignore_errors=True)
        raise
