"""Bytes to numbered text lines for the corpus readers: files (gzipped or not), stdin, UTF-8 checks, plain-text rows."""

from __future__ import annotations

import contextlib
import gzip
import os
import stat
import sys
import zlib
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import BinaryIO

from layerscope.errors import InputError

BOM = b"\xef\xbb\xbf"
_GZIP_MAGIC = b"\x1f\x8b"
_MAX_LISTED = 20
# The longest line read. A text only matters up to the model's max length in tokens, and the encoder keeps
# at most a bounded number of characters of it (model/tokenize.py, TEXT_CHARS_PER_TOKEN); this bound only
# keeps memory flat on a source that never ends a line (a pipe from /dev/zero): 64 MiB is 16 times what the
# encoder keeps of a 32k-token context, and a longer line is refused with its number instead of being held.
MAX_LINE_BYTES = 64 * 1024 * 1024


def bounded_lines(fh, limit: int = MAX_LINE_BYTES) -> Iterator[bytes]:
    """The lines of a binary stream, each read with a bound: a line longer than ``limit`` bytes comes back
    as its first ``limit + 1`` bytes (no ending), which ``decoded_lines`` refuses, so no line is held whole."""
    readline = fh.readline
    while True:
        line = readline(limit + 1)
        if not line:
            return
        yield line


def check_stream(fd: int, name: str) -> None:
    """Refuse a source that is neither a regular file nor a pipe or socket, which end (a character device
    such as /dev/zero or /dev/urandom never does)."""
    with contextlib.suppress(OSError):
        mode = os.fstat(fd).st_mode
        if not (stat.S_ISREG(mode) or stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode)):
            kind = "a character device" if stat.S_ISCHR(mode) else "a block device" if stat.S_ISBLK(mode) else \
                "not a regular file"
            raise InputError(f"{name} is {kind}, which never ends; pass a corpus file or pipe texts in")


def stdin_bytes() -> Iterator[bytes]:
    stdin = sys.stdin
    if stdin is None:
        raise InputError("stdin is closed; pass a corpus file instead of -")
    with contextlib.suppress(AttributeError, ValueError, OSError):
        if stdin.isatty():
            raise InputError(
                "reading texts from stdin (-), but stdin is a terminal; pipe texts in "
                "(e.g. cat corpus.txt | ...) or pass a file"
            )
    buffer = getattr(stdin, "buffer", None)
    if buffer is not None:
        fd = None
        with contextlib.suppress(AttributeError, ValueError, OSError):  # io.UnsupportedOperation: no descriptor
            fd = buffer.fileno()
        if fd is not None:
            check_stream(fd, "stdin (-)")
        return bounded_lines(buffer)
    # A text-only stdin (e.g. replaced by io.StringIO): get back to bytes.
    return (line.encode("utf-8", "surrogateescape") for line in stdin)


@contextlib.contextmanager
def open_bytes(path: Path, name: str) -> Iterator[BinaryIO]:
    """The file's bytes, gunzipped when it starts with the gzip magic number."""
    try:
        fh = open(path, "rb")  # noqa: SIM115 (closed below)
    except OSError as exc:
        raise InputError(f"cannot read {name}: {exc.strerror or exc}") from exc
    with fh:
        check_stream(fh.fileno(), name)
        if fh.peek(2)[:2] == _GZIP_MAGIC:
            with gzip.GzipFile(fileobj=fh, mode="rb") as gz:
                yield gz  # type: ignore[misc]
        else:
            yield fh


def decoded_lines(raw_lines: Iterable[bytes], name: str) -> Iterator[tuple[int, str]]:
    """(1-based line number, decoded line with its ending) for each line.

    Lines are split on ``\\n`` only, so ``\\r``, form feeds and Unicode line
    separators stay inside a text. A UTF-8 BOM at the start is dropped; the first
    byte that is not UTF-8 stops the read with its line and column.
    """
    it = iter(raw_lines)
    lineno = 0
    while True:
        try:
            raw = next(it)
        except StopIteration:
            return
        except (EOFError, zlib.error, gzip.BadGzipFile) as exc:
            raise InputError(
                f"{name} is a damaged or truncated gzip file (after line {lineno}: {exc}); "
                "re-create or re-download it"
            ) from exc
        except OSError as exc:
            raise InputError(f"cannot read {name} after line {lineno}: {exc}") from exc
        lineno += 1
        if len(raw) > MAX_LINE_BYTES:
            raise InputError(f"{name} line {lineno} is longer than {MAX_LINE_BYTES // 2 ** 20} MiB without a line "
                             "end; split it, or check that this is a text corpus")
        skipped = 0
        if lineno == 1 and raw.startswith(BOM):
            raw = raw[len(BOM):]
            skipped = len(BOM)
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise InputError(_utf8_message(name, lineno, raw, exc, skipped)) from exc
        yield lineno, text


def _utf8_message(name: str, lineno: int, raw: bytes, exc: UnicodeDecodeError, skipped: int) -> str:
    bad = raw[exc.start]
    column = exc.start + 1 + skipped
    source = "utf-16" if lineno == 1 and raw[:2] in (b"\xff\xfe", b"\xfe\xff") else "latin1"
    return (
        f"{name} line {lineno} is not valid UTF-8 (byte 0x{bad:02x} at column {column}); "
        f"re-encode the file as UTF-8 (e.g. iconv -f {source} -t utf-8)"
    )


def _strip_ending(line: str) -> str:
    if line.endswith("\r\n"):
        return line[:-2]
    if line.endswith("\n"):
        return line[:-1]
    return line


def txt_rows(lines: Iterator[tuple[int, str]]) -> Iterator[tuple[str, str | None, int]]:
    for lineno, line in lines:
        yield _strip_ending(line), None, lineno


def list_names(names: Iterable[str]) -> str:
    names = list(names)
    if not names:
        return "none"
    shown = ", ".join(repr(n) for n in names[:_MAX_LISTED])
    if len(names) > _MAX_LISTED:
        shown += f", ... ({len(names)} in all)"
    return shown
