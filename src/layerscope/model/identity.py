"""What a model *is*, by content: hashes of its files, remembered between runs.

Hashing multi-GB weights on every call is slow, so a file's sha256 is kept in
``<cache root>/hashes/`` under its stat signature (real path, device, inode,
size, mtime and ctime in nanoseconds).  Rewriting a file in any normal way
changes its ctime, which no user tool can set back, so a stale signature cannot
survive an edit; a file changed within the last two seconds is hashed but not
remembered (the "racy timestamp" rule git uses), since a write in the same
clock tick could otherwise go unnoticed.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import time
from pathlib import Path
from typing import Any

from layerscope.model.home import cache_root

# Weight formats layerscope never loads (safetensors only) and model cards: they do not change an export.
# Every other top-level file counts (config, tokenizer, vocab, custom code), known to matter or not.
IGNORED_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".h5", ".msgpack", ".onnx", ".onnx_data", ".gguf", ".lock",
                    ".md")
RACY_SECONDS = 2.0


_SHA = re.compile(r"[0-9a-f]{64}")


def _signature(paths: list[Path]) -> list[list[Any]]:
    from layerscope.jsonfile import check_regular

    sig = []
    for p in paths:
        st = check_regular(p)
        sig.append([str(Path(p).resolve()), st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns])
    return sig


def _hash_dir() -> Path:
    return cache_root() / "hashes"


def hash_files(paths: list[Path]) -> str:
    """sha256 of the files' bytes in order (for one file: its plain sha256), remembered by stat signature."""
    paths = [Path(p) for p in paths]
    sig = _signature(paths)
    sig_key = hashlib.sha256(json.dumps(sig).encode()).hexdigest()[:40]
    entry = _hash_dir() / f"{sig_key}.json"
    from layerscope.jsonfile import open_regular, read_json_dict

    known = read_json_dict(entry)  # the user's cache: bounded, a FIFO never waited on, a bad entry ignored
    if known.get("files") == sig and isinstance(known.get("sha256"), str) and _SHA.fullmatch(known["sha256"]):
        return known["sha256"]
    h = hashlib.sha256()
    for p in paths:
        with open_regular(p) as fh:  # a FIFO named like a weights file: one line, never waited on
            for chunk in iter(lambda: fh.read(1 << 22), b""):
                h.update(chunk)
    digest = h.hexdigest()
    newest = max((s[5] for s in sig), default=0) / 1e9
    if _signature(paths) == sig and time.time() - newest > RACY_SECONDS:
        try:
            from layerscope.atomic import write_json_atomic

            entry.parent.mkdir(parents=True, exist_ok=True)
            write_json_atomic(entry, {"files": sig, "sha256": digest})
        except OSError:  # a read-only cache only costs speed
            pass
    return digest


def weights_files(model_dir: Path) -> list[Path]:
    return sorted(Path(model_dir).glob("*.safetensors"))


def local_identity(model_dir: Path) -> dict[str, Any]:
    """Weights hash plus a hash of every other file that shapes an export (config, tokenizer, ...)."""
    model_dir = Path(model_dir)
    weights = weights_files(model_dir)
    others = sorted(p for p in model_dir.iterdir()
                    if p.is_file() and p.suffix != ".safetensors" and not p.name.startswith(".")
                    and not p.name.endswith(IGNORED_SUFFIXES))
    h = hashlib.sha256()
    for p in others:
        h.update(f"{p.name}\0{hash_files([p])}\n".encode())
    return {"weights_sha256": hash_files(weights) if weights else None, "files_sha256": h.hexdigest(),
            "files": [p.name for p in weights + others]}


def hub_snapshot(repo_id: str, revision: str | None) -> Path | None:
    """The local snapshot directory of a hub model in Hugging Face's cache (None when not downloaded)."""
    try:
        from huggingface_hub import try_to_load_from_cache

        found = try_to_load_from_cache(repo_id, "config.json", revision=revision)
    except Exception:  # a malformed id or an unusual cache layout: no snapshot known
        return None
    return Path(found).parent if isinstance(found, str) else None


def model_identity(source) -> dict[str, Any]:
    """Content identity of a ``ModelSource``: file hashes for local models and cached hub snapshots."""
    if source.is_local:
        return {"local": True, **local_identity(Path(source.path_or_id))}
    snap = hub_snapshot(source.path_or_id, source.revision)
    ident: dict[str, Any] = {"local": False, "id": source.path_or_id, "revision": source.revision,
                             "commit": snap.name if snap is not None else None}
    if snap is not None:
        ident.update(local_identity(snap))
    return ident
