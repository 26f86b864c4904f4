"""ONNX graphs of any size: weights in external data, written and read tensor by tensor.

Protocol buffers cannot serialize a message over 2 GiB, so a graph whose weights
are larger is never held as one serialized proto: the structure is loaded with
``load_external_data=False`` (a few MB), edited, and saved; the weights stay in
``<onnx file>_data`` and are streamed there one tensor at a time.

``EXTERNAL_DATA_BYTES`` is the size above which an export keeps its weights
outside the graph; tests lower it to run the external-data path on tiny models.
"""

from __future__ import annotations

import os
from pathlib import Path

EXTERNAL_DATA_BYTES = 1_800_000_000  # protobuf's hard limit is 2 GiB; stay under it with headroom
ALIGN = 4096  # offsets aligned to pages, so ONNX Runtime can memory-map each tensor


def data_file(onnx_name: str) -> str:
    return onnx_name + "_data"


def external_tensors(model) -> list:
    """Every initializer (and Constant-node tensor) whose bytes live in external data."""
    from onnx import TensorProto
    from onnx.external_data_helper import _get_all_tensors

    return [t for t in _get_all_tensors(model) if t.HasField("data_location")
            and t.data_location == TensorProto.EXTERNAL]


def uses_external_data(model) -> bool:
    return bool(external_tensors(model))


def _info(tensor) -> dict[str, str]:
    return {e.key: e.value for e in tensor.external_data}


def _set_info(tensor, location: str, offset: int, length: int) -> None:
    from onnx import TensorProto

    del tensor.external_data[:]
    for key, value in (("location", location), ("offset", str(offset)), ("length", str(length))):
        entry = tensor.external_data.add()
        entry.key, entry.value = key, value
    tensor.data_location = TensorProto.EXTERNAL


def _safe_child(base: Path, location: str) -> Path:
    from layerscope.errors import ExportError

    path = (base / location).resolve()
    if base.resolve() not in path.parents:
        raise ExportError(f"external data location {location!r} points outside {base}")
    return path


def consolidate(onnx_path: str | Path, *, chunk: int = 64 << 20) -> int:
    """Gather all external tensors of ``onnx_path`` into one ``<name>_data`` file, streaming.

    torch writes one file per tensor for graphs over 2 GiB; this copies each into the
    single data file in bounded chunks (memory stays at ``chunk``, not the model size),
    rewrites the references in the graph proto, and removes the per-tensor files.
    Returns the number of bytes written.
    """
    import onnx

    onnx_path = Path(onnx_path)
    base = onnx_path.parent
    model = onnx.load(str(onnx_path), load_external_data=False)
    tensors = external_tensors(model)
    target_name = data_file(onnx_path.name)
    if not tensors:
        return 0
    if all(_info(t).get("location") == target_name for t in tensors):
        return 0  # already one file
    tmp_data = base / (target_name + ".tmp")
    sources: set[Path] = set()
    offset = 0
    with open(tmp_data, "wb") as out:
        for tensor in tensors:
            info = _info(tensor)
            src = _safe_child(base, info["location"])
            sources.add(src)
            start = int(info.get("offset", 0))
            length = int(info["length"]) if "length" in info else src.stat().st_size - start
            pad = (-offset) % ALIGN
            out.write(b"\0" * pad)
            offset += pad
            with open(src, "rb") as f:
                f.seek(start)
                left = length
                while left:
                    buf = f.read(min(chunk, left))
                    if not buf:
                        raise OSError(f"{src} ended {left} bytes early")
                    out.write(buf)
                    left -= len(buf)
            _set_info(tensor, target_name, offset, length)
            offset += length
    tmp_graph = onnx_path.with_name(onnx_path.name + ".tmp")
    onnx.save(model, str(tmp_graph))
    for src in sources:
        if src.name != target_name:
            src.unlink(missing_ok=True)
    os.replace(tmp_data, base / target_name)
    os.replace(tmp_graph, onnx_path)
    return offset


def save_graph(model, path: str | Path, *, external: bool) -> None:
    """Save an edited graph proto atomically.

    A graph loaded with ``load_external_data=False`` keeps pointing at its data file (written
    once, never rewritten here); a graph held in memory whole is moved to external data when
    ``external`` is asked for (it is then under 2 GiB, or it could not have been loaded).
    """
    import onnx

    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    if external and not uses_external_data(model):
        stale = path.parent / data_file(path.name)
        stale.unlink(missing_ok=True)
        onnx.save(model, str(tmp), save_as_external_data=True, all_tensors_to_one_file=True,
                  location=data_file(path.name), size_threshold=1024)
    else:
        onnx.save(model, str(tmp))
    os.replace(tmp, path)


def check_graph(path: str | Path) -> None:
    """onnx's checker on a file path (works for external data without loading the weights)."""
    import onnx

    onnx.checker.check_model(str(path), full_check=False)


def data_files(onnx_path: str | Path) -> list[Path]:
    """The external data files a graph refers to (each inside its directory)."""
    import onnx

    onnx_path = Path(onnx_path)
    model = onnx.load(str(onnx_path), load_external_data=False)
    names = sorted({_info(t)["location"] for t in external_tensors(model)})
    return [_safe_child(onnx_path.parent, n) for n in names]


def externalize(tensors, base: str | Path, location: str, *, min_bytes: int = 1024) -> int:
    """Move the bytes of in-memory ``tensors`` (each over ``min_bytes``) into ``base/location``, one by one."""
    from onnx import numpy_helper

    base = Path(base)
    path = _safe_child(base, location)
    offset = 0
    with open(path, "wb") as out:
        for tensor in tensors:
            if tensor.HasField("data_location") and tensor.data_location == 1:
                continue
            raw = tensor.raw_data or numpy_helper.to_array(tensor).tobytes()
            if len(raw) < min_bytes:
                continue
            pad = (-offset) % ALIGN
            out.write(b"\0" * pad)
            offset += pad
            out.write(raw)
            for field in ("float_data", "int32_data", "int64_data", "double_data", "uint64_data", "string_data"):
                tensor.ClearField(field)
            tensor.ClearField("raw_data")
            _set_info(tensor, location, offset, len(raw))
            offset += len(raw)
    if not offset:
        path.unlink(missing_ok=True)
    return offset


def inline_bytes(model) -> int:
    """Bytes of initializer data held inside the proto (what would be serialized with it)."""
    return sum(len(t.raw_data) + 4 * len(t.float_data) + 8 * len(t.int64_data) for t in model.graph.initializer)
