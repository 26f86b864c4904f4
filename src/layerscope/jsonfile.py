"""Writing a JSON file so that a reader never sees half of it, and reading a file layerscope did not just write
(a model folder's, an export's, a cache's) as untrusted: a regular file, never opened in a way that blocks, read
within a size bound (used by every floor; imports only errors.py).

A FIFO, a device or a socket named like a file (``config.json`` linked to ``/dev/zero``, a FIFO as
``model.safetensors`` or as a derived graph's record) would hang a run or read without end: ``check_regular``
and ``open_regular`` refuse it in one line naming the file (``NotRegularFile``), and ``read_json`` refuses a JSON
file over its bound (``JSON_BYTES``) in one line before reading it (``JsonFileError``). ``check_folder_files``
runs the first check over a folder whose files another library opens (transformers reads a checkpoint's).
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any

from layerscope.errors import InputError

JSON_BYTES = 64 * 2**20  # a config, manifest, record or cache file: far larger is not one anyone wrote
# the files of a tokenizer a model folder keeps (tokenizer.json of a 256k vocabulary is ~35 MB)
TOKENIZER_JSON_BYTES = 1024 * 2**20
TOKENIZER_JSON = ("tokenizer.json", "vocab.json", "merges.txt")


class NotRegularFile(InputError):
    """A path read as a file is a FIFO, a device, a socket or a folder."""


class JsonFileError(InputError):
    """A JSON file that is too large, not UTF-8 or not JSON (the message names it)."""


class FileTooLarge(JsonFileError):
    """A file far larger than what is read from it can be."""


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"), (stat.S_ISDIR, "a folder")):
        if test(mode):
            return name
    return "not a regular file"


def _refuse(path: Path, mode: int) -> NotRegularFile:
    target = os.path.realpath(path)
    via = f" (it links to {target})" if target != os.path.abspath(path) else ""
    return NotRegularFile(f"{path} is {_kind(mode)}{via}, not a regular file; layerscope reads only regular files "
                          "there: put the file itself in its place")


def check_regular(path: str | Path) -> os.stat_result:
    """``os.stat(path)`` (symlinks followed) where it is a regular file; ``NotRegularFile`` (one line) otherwise.
    A missing file raises FileNotFoundError, as ``open`` would."""
    st = os.stat(path)
    if not stat.S_ISREG(st.st_mode):
        raise _refuse(Path(path), st.st_mode)
    return st


def open_regular(path: str | Path):
    """``path`` opened for reading in binary, refused in one line unless it is a regular file: opened without
    blocking (a FIFO with no writer would wait forever in a plain ``open``), checked on the open descriptor (no
    swap between a check and the open), then read as usual."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise _refuse(Path(path), st.st_mode)
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_bytes(path: str | Path, limit: int, what: str = "file") -> bytes:
    """The bytes of regular file ``path``, refused in one line (``FileTooLarge``) over ``limit`` bytes."""
    with open_regular(path) as fh:
        size = os.fstat(fh.fileno()).st_size
        if size > limit:
            raise FileTooLarge(f"{path} is {size:,} bytes, more than a {what} can be ({limit:,}); it is not one "
                                "layerscope or a model writes: replace it")
        data = fh.read(limit + 1)
    if len(data) > limit:  # grew while it was read
        raise FileTooLarge(f"{path} is more than {limit:,} bytes, more than a {what} can be; replace it")
    return data


def read_json(path: str | Path, *, limit: int = JSON_BYTES, what: str = "JSON file") -> Any:
    """The JSON value in ``path``: a regular file of at most ``limit`` bytes, else one line (``NotRegularFile``,
    ``JsonFileError``); FileNotFoundError where it is missing."""
    raw = read_bytes(path, limit, what)
    try:
        return json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise JsonFileError(f"{path} is not valid JSON ({str(exc).splitlines()[0][:120]})") from None


def check_folder_files(folder: str | Path, *, where: str | None = None) -> None:
    """Every file directly in ``folder`` (symlinks followed) is a regular file and each JSON file within its
    bound: what transformers, tokenizers and safetensors open there is then never a FIFO, a device or a link to
    nothing, nor a config without end. One line naming the first that is not."""
    folder = Path(folder)
    try:
        entries = sorted(os.scandir(folder), key=lambda e: e.name)
    except OSError:
        return
    for entry in entries:
        path = Path(entry.path)
        try:
            st = os.stat(entry.path)
        except FileNotFoundError:  # a link to nothing: a loader would fail on it with a traceback
            if not path.is_symlink():
                continue  # removed meanwhile
            raise NotRegularFile(f"{path} is a symlink to {os.readlink(path)}, which does not exist; put the file "
                                 "itself in its place") from None
        except OSError:
            continue
        if stat.S_ISDIR(st.st_mode):
            continue
        if not stat.S_ISREG(st.st_mode):
            raise _refuse(path, st.st_mode)
        limit = TOKENIZER_JSON_BYTES if entry.name in TOKENIZER_JSON else JSON_BYTES
        if entry.name.endswith(".json") and st.st_size > limit:
            raise FileTooLarge(f"{path} is {st.st_size:,} bytes, more than a JSON file of "
                                f"{where or 'a model folder'} can be ({limit:,}); replace it")


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
    """The JSON object in ``path``; {} when the file is missing, unreadable, not a regular file (never waited
    on), over ``JSON_BYTES`` or holds anything but an object."""
    try:
        data = read_json(path)
    except (OSError, InputError):
        return {}
    return data if isinstance(data, dict) else {}
