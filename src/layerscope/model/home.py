"""Where layerscope keeps what it makes for itself (the export cache, remembered file hashes, engine speeds):
``$LAYERSCOPE_HOME``, else ``~/.cache/layerscope``."""

from __future__ import annotations

import os
from pathlib import Path


def cache_root() -> Path:
    return Path(os.environ.get("LAYERSCOPE_HOME", Path.home() / ".cache" / "layerscope"))
