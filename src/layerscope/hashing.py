"""The one sha256-of-a-file helper that exports, stores and the cache all record and check."""

from __future__ import annotations

import hashlib
from pathlib import Path


def file_sha256(path: str | Path) -> str:
    """sha256 of a file's bytes, read in 4 MiB chunks (exports and stores can be many GB); a FIFO or a device is
    refused in one line (jsonfile.py ``open_regular``), never waited on."""
    from layerscope.jsonfile import open_regular

    h = hashlib.sha256()
    with open_regular(path) as fh:
        for chunk in iter(lambda: fh.read(1 << 22), b""):
            h.update(chunk)
    return h.hexdigest()
