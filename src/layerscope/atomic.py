"""Writing files and directories so that a crash never leaves something that looks complete."""

from __future__ import annotations

import contextlib
import glob
import json
import logging
import os
import shutil
import socket
import tempfile
from pathlib import Path
from typing import Iterator

from layerscope.jsonfile import write_json_atomic  # noqa: F401 - the writer callers import from here


def umask() -> int:
    """The process's umask (read by setting it and setting it back)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def as_umask_allows(path: Path) -> None:
    """Give ``path`` the mode a plain ``open``/``mkdir`` would under the user's umask (tempfile makes its
    directories 0700 and some writers their files 0600; a shared export must be readable as the user set)."""
    os.chmod(path, (0o777 if Path(path).is_dir() else 0o666) & ~umask())


@contextlib.contextmanager
def staged_dir(target: Path, kind: str | None = None) -> Iterator[Path]:
    """Yield an empty staging directory beside ``target``; on success it replaces ``target``.

    ``kind`` (export, result, ...): the ownership marker written into the staging directory, so
    the directory is marked from the moment it appears; every file in it is recorded there (with its
    sha256) before it replaces ``target``. The caller checks with
    :func:`layerscope.ownership.claim` that ``target`` may be replaced before calling this.
    On any error (or Ctrl-C) the staging directory is removed and ``target`` is left as it was.
    """
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    if kind is not None:
        remove_stale_stages(target, kind)
    # the name says which process on which host stages it, so a later run can tell a killed one's leftovers
    stage = Path(tempfile.mkdtemp(prefix=f"{_stage_prefix(target)}{os.getpid()}-", dir=target.parent))
    try:
        as_umask_allows(stage)  # mkdtemp's 0700 would become the final directory's mode
        if kind is not None:
            from layerscope.ownership import write_marker

            write_marker(stage, kind)
        yield stage
        if kind is not None:
            from layerscope.ownership import record

            record(stage, kind, everything=True, known=_known_hashes(stage))  # every file in the private stage is layerscope's
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


def _known_hashes(stage: Path) -> dict[str, str]:
    """The sha256 an export's manifest recorded a moment ago for the files of its stage (not hashed again)."""
    try:
        files = json.loads((stage / "manifest.json").read_text(encoding="utf-8")).get("files") or {}
        return {rel: rec["sha256"] for rel, rec in files.items()
                if isinstance(rec, dict) and isinstance(rec.get("sha256"), str)}
    except (OSError, ValueError, AttributeError):
        return {}


def _stage_prefix(target: Path) -> str:
    return f".{target.name}.partial-{socket.gethostname()}-"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def remove_stale_stages(target: Path, kind: str) -> list[Path]:
    """Delete the staging directories of ``target`` that a process of this host left when it was killed
    (the OOM killer, SIGKILL, a power cut: no ``except`` ran), and say so; return them.

    Only a directory named by :func:`staged_dir` for this target and this host, whose process no longer runs,
    and which holds layerscope's marker of ``kind``, is deleted: a run in progress (here or on another host
    sharing the filesystem) and anything else are left alone.
    """
    from layerscope.ownership import kind_of

    prefix = _stage_prefix(Path(target))
    removed = []
    for stage in sorted(Path(target).parent.glob(glob.escape(prefix) + "*")):
        pid = stage.name[len(prefix):].split("-", 1)[0]
        if not pid.isdigit() or _alive(int(pid)) or not stage.is_dir() or kind_of(stage) != kind:
            continue
        size = sum(f.stat().st_size for f in stage.rglob("*") if f.is_file() and not f.is_symlink())
        shutil.rmtree(stage, ignore_errors=True)
        logging.getLogger("layerscope").warning(
            "removed %s: an unfinished %s (%.1f GB) left by process %s, which no longer runs (killed before it "
            "could clean up, e.g. out of memory)", stage, kind, size / 1e9, pid)
        removed.append(stage)
    return removed
