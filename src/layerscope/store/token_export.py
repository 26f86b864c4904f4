"""``layerscope export-store --tokens``: a store's token-level vectors as one Parquet or safetensors file.

* Parquet: one row per token, in corpus order: ``text`` (int64, the text's row in the store), ``text_id``
  (string, the text's id in the corpus: its id field, or the row number), ``position`` (int32), ``id``
  (int32, the token id), ``token`` (string), ``special`` (bool), ``start`` and ``end`` (int32, the
  character span in the text) and one fixed-size float32 list column ``layer_<name>`` per layer; the
  store's description goes into the key-value metadata under ``layerscope``. Written in row groups.
* safetensors: ``layer_<name>`` ``[total_tokens, hidden]`` in the store's storage type (F32, F16 or BF16,
  which safetensors has natively), ``offsets`` I64 ``[n + 1]``, ``ids`` I32, ``special`` U8, ``spans`` I32
  ``[total_tokens, 2]``, and the texts' ids and the token strings as UTF-8 JSON in U8 arrays
  (``text_ids_json``, ``strings_json``): every per-text or per-token value is an array, so the header
  (the description alone, in its metadata) stays small whatever the store's size; safetensors refuses
  headers over 100 MB. The file is streamed from the memory-mapped arrays (the format is an 8-byte header
  length, a JSON header, then the raw tensors), so memory stays bounded, and it is opened again with
  safetensors and checked tensor by tensor before it is called written.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

import numpy as np

from layerscope.errors import MissingExtraError
from layerscope.store.token_store import TokenLayer

ROW_GROUP = 65536
CHUNK = 1 << 16  # tokens copied at a time
_ST_DTYPES = {"float32": "F32", "float16": "F16", "bfloat16": "BF16", "int64": "I64", "int32": "I32",
              "uint8": "U8"}


def token_column(layer: str) -> str:
    return f"layer_{layer}"


def _description(store, layers: list[TokenLayer]) -> dict[str, Any]:
    sec = layers[0].section
    return {"n": store.n, "total_tokens": sec.total_tokens, "layers": sec.layers, "hidden_size": sec.hidden_size,
            "dtype": sec.dtype, "settings": store.settings, "model": store.manifest.source_dict()}


def token_parquet(store, path: Path) -> None:
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        raise MissingExtraError("pyarrow", "parquet") from None
    layers = [store.tokens(layer) for layer in store.token_layers]
    first, hidden = layers[0], layers[0].section.hidden_size
    strings = first.strings()
    vec = pa.list_(pa.float32(), hidden)
    schema = pa.schema([("text", pa.int64()), ("text_id", pa.string()), ("position", pa.int32()), ("id", pa.int32()), ("token", pa.string()),
                        ("special", pa.bool_()), ("start", pa.int32()), ("end", pa.int32())]
                       + [(token_column(t.layer), vec) for t in layers],
                       metadata={"layerscope": json.dumps(_description(store, layers), ensure_ascii=False)})
    text_of, positions = first.text_of_token(), first.positions()
    text_ids = store.ids()
    with pq.ParquetWriter(str(path), schema) as writer:
        for a in range(0, first.total_tokens, ROW_GROUP):
            b = min(first.total_tokens, a + ROW_GROUP)
            ids = np.asarray(first.ids[a:b])
            spans = np.asarray(first.spans[a:b])
            cols = [pa.array(text_of[a:b]), pa.array([text_ids[int(t)] for t in text_of[a:b]], pa.string()),
                    pa.array(positions[a:b].astype(np.int32)), pa.array(ids),
                    pa.array(first.id_strings(ids, strings), pa.string()),
                    pa.array(np.asarray(first.special[a:b]) > 0), pa.array(spans[:, 0]), pa.array(spans[:, 1])]
            cols += [pa.FixedSizeListArray.from_arrays(pa.array(t.rows(a, b).reshape(-1), pa.float32()), hidden)
                     for t in layers]
            writer.write_table(pa.Table.from_arrays(cols, schema=schema))


def token_safetensors(store, path: Path) -> None:
    layers = [store.tokens(layer) for layer in store.token_layers]
    first = layers[0]
    tensors: list[tuple[str, np.ndarray, str]] = [
        (token_column(t.layer), t.raw, t.section.dtype) for t in layers]
    tensors += [("offsets", first.offsets, "int64"), ("ids", first.ids, "int32"),
                ("special", first.special, "uint8"), ("spans", first.spans, "int32"),
                ("text_ids_json", _utf8_json(store.ids()), "uint8"),
                ("strings_json", _utf8_json({str(k): v for k, v in first.strings().items()}), "uint8")]
    header: dict[str, Any] = {"__metadata__": {
        "layerscope": json.dumps(_description(store, layers), ensure_ascii=False)}}
    pos = 0
    for name, arr, dtype in tensors:
        size = int(arr.size) * arr.dtype.itemsize
        header[name] = {"dtype": _ST_DTYPES[dtype], "shape": list(arr.shape), "data_offsets": [pos, pos + size]}
        pos += size
    blob = json.dumps(header, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
    blob += b" " * (-len(blob) % 8)  # the data starts 8-byte aligned, as safetensors writes it
    with open(path, "wb") as fh:
        fh.write(struct.pack("<Q", len(blob)))
        fh.write(blob)
        for _, arr, _ in tensors:
            for a in range(0, len(arr), CHUNK):
                fh.write(np.ascontiguousarray(arr[a:a + CHUNK]).tobytes())
    read_back(path, {name: arr for name, arr, _ in tensors})


def _utf8_json(value: Any) -> np.ndarray:
    return np.frombuffer(json.dumps(value, ensure_ascii=False).encode("utf-8"), dtype=np.uint8)


_READ_AS = {np.dtype(np.float32): "F32", np.dtype(np.float16): "F16", np.dtype(np.uint16): "BF16",
            np.dtype(np.int64): "I64", np.dtype(np.int32): "I32", np.dtype(np.uint8): "U8"}  # uint16: bf16 bits


def read_back(path: Path, sources: dict[str, np.ndarray]) -> None:
    """Open the written file with safetensors itself: every tensor there with the type and shape of the array
    it came from, and its first and last rows equal to that array's; one line when it is not."""
    from safetensors import safe_open

    from layerscope.errors import StoreError

    try:
        with safe_open(str(path), framework="numpy") as fh:
            names = set(fh.keys())
            if names != set(sources):
                raise ValueError(f"it holds tensors {sorted(names)[:6]}, not {sorted(sources)[:6]}")
            for name, arr in sources.items():
                part, dtype = fh.get_slice(name), _READ_AS[arr.dtype]
                if part.get_dtype() != dtype or list(part.get_shape()) != list(arr.shape):
                    raise ValueError(f"{name} reads back as {part.get_dtype()} {part.get_shape()}, the store "
                                     f"holds {dtype} {list(arr.shape)}")
                if dtype == "BF16" or not len(arr):  # numpy has no bfloat16: type and shape suffice
                    continue
                for rows in (slice(0, min(64, len(arr))), slice(max(0, len(arr) - 64), len(arr))):
                    if not np.array_equal(part[rows], np.asarray(arr[rows])):
                        raise ValueError(f"{name} reads back with other values")
    except Exception as exc:  # noqa: BLE001 - safetensors raises its own untyped SafetensorError
        raise StoreError(f"the safetensors file written for the store cannot be read back "
                         f"({str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__}); nothing was "
                         "written: use --format parquet") from None
