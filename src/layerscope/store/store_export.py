"""``layerscope export-store``: a LayerStore as one Parquet or safetensors file other tools read.

* Parquet: one row per text with ``id``, ``text`` and one fixed-size float list
  column per (pooling, layer) named ``<pooling>/layer_<name>`` (e.g. ``mean/layer_6``);
  the store's settings and model manifest go into the file's key-value metadata
  under ``layerscope``. Written in row groups, so memory stays bounded.
* safetensors: one tensor ``<pooling>/layer_<name>`` of shape ``[n, hidden]`` per
  (pooling, layer); ids, texts and the store's description are JSON strings in the
  header metadata (``ids``, ``texts``, ``layerscope``), so it suits stores up to a
  few hundred thousand texts (a larger header is refused: use Parquet).

The file is written under a temporary name of its own beside its final name (``.<name>.<pid>-<random>.partial``:
never a name a user's file may have) and renamed into place, holding the ``--out`` lock every writer
takes (``out_lock.py``), so two runs into one file never interleave.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from layerscope.errors import InputError, MissingExtraError
from layerscope.store.store import LayerStore

FORMATS = ("parquet", "safetensors")
ROW_GROUP = 8192
MAX_HEADER_BYTES = 90_000_000  # safetensors refuses headers over 100 MB


def column_name(pooling: str, layer: str) -> str:
    return f"{pooling}/layer_{layer}"


def _description(store: LayerStore) -> dict[str, Any]:
    return {"n": store.n, "layers": store.layers, "poolings": store.poolings,
            "hidden_size": store.hidden_size, "dtype": store.dtype,
            "settings": store.settings, "model": store.manifest.source_dict(),
            "columns": {column_name(p, l): {"pooling": p, "layer": l} for p in store.poolings for l in store.layers}}


def export_store(store_path: str | Path, fmt: str, out: str | Path | None = None, *,
                 force: bool = False, tokens: bool = False) -> Path:
    """Write the store as ``fmt`` (parquet or safetensors); return the file's path. ``tokens``: its
    token-level vectors instead (store/token_export.py), default ``<store>.tokens.<fmt>``."""
    if fmt not in FORMATS:
        raise InputError(f"--format {fmt}: choose parquet or safetensors")
    store = LayerStore.open(store_path)
    if tokens and store.record.token_arrays is None:
        raise InputError(f"{store_path} holds no token-level vectors; make it with layerscope extract ... --tokens")
    suffix = f".tokens.{fmt}" if tokens else f".{fmt}"
    out = Path(out) if out else store.path.resolve().with_suffix(suffix)  # '.' has no name of its own
    _check_folder(out)
    from layerscope.out_lock import out_lock

    with out_lock(out):  # one writer per file: a second run is refused, not interleaved
        _check_destination(out, fmt, force)
        tmp = None
        try:
            tmp = _temporary(out)
            if tokens:
                from layerscope.store.token_export import token_parquet, token_safetensors

                (token_parquet if fmt == "parquet" else token_safetensors)(store, tmp)
            else:
                (_parquet if fmt == "parquet" else _safetensors)(store, tmp)
            from layerscope.atomic import as_umask_allows

            as_umask_allows(tmp)  # mkstemp made it 0600: the file gets the mode the user's umask gives a new file
            os.replace(tmp, out)
        except OSError as exc:  # pyarrow's and our own writes: a full, read-only or vanished destination
            raise _write_error(out, exc) from None
        except Exception as exc:
            if type(exc).__name__ == "SafetensorError" and "I/O error" in str(exc):  # safetensors' own writer
                raise _write_error(out, OSError(None, str(exc))) from None
            raise
        finally:
            if tmp is not None and tmp.exists():
                tmp.unlink()
    return out


def _check_destination(out: Path, fmt: str, force: bool) -> None:
    """``out`` may be written: absent, or (with ``force``) a file layerscope export-store wrote."""
    if not os.path.lexists(out):
        return
    if not force:
        raise InputError(f"{out} exists; pass --force to replace it, or --out another file")
    if out.is_symlink() or not out.is_file() or not _made_by_layerscope(out, fmt):
        raise InputError(f"{out} exists and was not written by layerscope export-store; --force only replaces "
                         "layerscope's own files: choose another --out")


def _temporary(out: Path) -> Path:
    """A new, empty file beside ``out`` whose name no other file has (made with O_EXCL)."""
    import tempfile

    fd, name = tempfile.mkstemp(prefix=f".{out.name}.{os.getpid()}-", suffix=".partial", dir=out.parent)
    os.close(fd)
    return Path(name)


def _check_folder(out: Path) -> None:
    """One line, before any work, for a destination whose folder is missing, not a folder or not writable."""
    parent = out.parent if str(out.parent) else Path(".")
    if not parent.is_dir():
        raise InputError(f"cannot write {out}: {parent} is not an existing folder; create it or choose another --out")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise InputError(f"cannot write {out}: {parent} is not writable (read-only or not yours); choose another "
                         "--out")


def _write_error(out: Path, exc: OSError) -> Exception:
    from layerscope.errors import StoreError
    from layerscope.store.store_space import FULL

    why = (exc.strerror or str(exc) or type(exc).__name__).splitlines()[0][:160]
    if exc.errno in FULL or "No space left" in str(exc) or "Disk quota" in str(exc):
        return StoreError(f"cannot write {out}: not enough free space in {out.parent} ({why}); nothing was "
                          "written: free some space or choose another --out")
    return StoreError(f"cannot write {out} ({why}); nothing was written: choose another --out")


def _made_by_layerscope(path: Path, fmt: str) -> bool:
    try:
        if fmt == "parquet":
            import pyarrow.parquet as pq

            return b"layerscope" in (pq.read_schema(str(path)).metadata or {})
        from safetensors import safe_open

        with safe_open(str(path), framework="numpy") as fh:
            return "layerscope" in (fh.metadata() or {})
    except Exception:  # unreadable or another format: not ours
        return False


def _parquet(store: LayerStore, path: Path) -> None:
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        raise MissingExtraError("pyarrow", "parquet") from None
    hidden = store.hidden_size
    keys = [(p, l) for p in store.poolings for l in store.layers]
    # a float16 store stays float16 in the file; bfloat16 (which Arrow lacks) is written as float32
    vec_type = pa.list_(pa.float16() if store.dtype == "float16" else pa.float32(), hidden)
    schema = pa.schema([("id", pa.string()), ("text", pa.string())]
                       + [(column_name(p, l), vec_type) for p, l in keys],
                       metadata={"layerscope": json.dumps(_description(store))})
    records = store.iter_records()
    with pq.ParquetWriter(str(path), schema) as writer:
        for start in range(0, store.n, ROW_GROUP):
            stop = min(store.n, start + ROW_GROUP)
            rows = [next(records) for _ in range(start, stop)]
            cols = [pa.array([r["id"] for r in rows], pa.string()), pa.array([r["text"] for r in rows], pa.string())]
            for p, l in keys:
                block = _block(store, p, l, start, stop)
                flat = pa.array(block.reshape(-1), vec_type.value_type)
                cols.append(pa.FixedSizeListArray.from_arrays(flat, hidden))
            writer.write_table(pa.Table.from_arrays(cols, schema=schema))


def _block(store: LayerStore, pooling: str, layer: str, start: int, stop: int):
    """Rows ``[start, stop)`` as written to a file: float16 as stored, else float32 (bfloat16 decoded)."""
    from layerscope.store.store_dtype import decode

    raw = store.raw((pooling, layer))[start:stop]
    return raw if store.dtype in ("float32", "float16") else decode(raw, store.dtype)


def _safetensors(store: LayerStore, path: Path) -> None:
    import numpy as np
    from safetensors.numpy import save_file

    metadata = {"ids": json.dumps(store.ids(), ensure_ascii=False),
                "texts": json.dumps(store.texts(), ensure_ascii=False),
                "layerscope": json.dumps(_description(store), ensure_ascii=False)}
    size = sum(len(v.encode("utf-8")) for v in metadata.values())
    if size > MAX_HEADER_BYTES:
        raise InputError(f"{store.path}: its ids and texts take {size / 1e6:.0f} MB, more than a safetensors "
                         "header holds; use --format parquet")
    tensors = {column_name(p, l): np.ascontiguousarray(_block(store, p, l, 0, store.n))
               for p in store.poolings for l in store.layers}
    save_file(tensors, str(path), metadata=metadata)
