"""``manifest.json`` of an export dir: reading it and checking it against the graph beside it.

The handle that carries a manifest around is ``model/handle.py``; what is checked is
``model/manifest_check.py``.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from layerscope.errors import ManifestError
from layerscope.hashing import file_sha256
from layerscope.model.manifest_type import FORMAT_VERSION, ONNX_FILE, READABLE_VERSIONS, Manifest, as_manifest

MANIFEST = "manifest.json"


def read_manifest(export_dir: Path) -> Manifest:
    """The export's manifest, typed (model/manifest_type.py); a missing or unknown format version is one line."""
    return Manifest.read_export(Path(export_dir), MANIFEST)


def read_manifest_dict(export_dir: Path) -> dict[str, Any]:
    """The export's manifest.json as plain JSON, for the steps that add to it and write it back."""
    from layerscope.jsonfile import JsonFileError, read_json

    path = Path(export_dir) / MANIFEST
    try:
        data = read_json(path, what="manifest")
    except FileNotFoundError:
        raise ManifestError(f"{export_dir} has no {MANIFEST}: it is not a layerscope export; run layerscope export") from None
    except JsonFileError as exc:
        raise ManifestError(f"{exc}; re-run layerscope export") from None
    if not isinstance(data, dict):
        raise ManifestError(f"{path} holds a JSON {type(data).__name__}, not an object; re-run layerscope export")
    return data


def verify_export(export_dir: Path, manifest: Manifest | dict[str, Any], *, check_hash: bool = True) -> None:
    """Check that model.onnx is the graph the manifest describes (see manifest_check for what is checked)."""
    from layerscope.model.manifest_check import check_external_data, check_graph, check_paths

    manifest = as_manifest(manifest, where=str(Path(export_dir) / MANIFEST))  # a version it cannot read: one line
    onnx_path = check_paths(Path(export_dir), manifest)
    if not onnx_path.exists():
        raise ManifestError(f"{export_dir} has a manifest but no {onnx_path.name}; re-run layerscope export")
    if manifest.format_version not in READABLE_VERSIONS:
        raise ManifestError(
            f"{export_dir} was written by a different layerscope export format ({manifest.format_version}, this "
            f"version reads {', '.join(map(str, READABLE_VERSIONS))}; it writes {FORMAT_VERSION}); re-run layerscope export")
    if not manifest.onnx_sha256:
        raise ManifestError(f"{Path(export_dir) / MANIFEST} has no onnx_sha256, so {onnx_path.name} cannot be "
                            "checked; export it again into a new folder (--force replaces only files layerscope recorded, unchanged)")
    if check_hash and file_sha256(onnx_path) != manifest.onnx_sha256:
        raise ManifestError(
            f"{onnx_path} does not match its manifest (sha256 differs): the file was replaced or "
            "damaged after export; re-run layerscope export")
    if check_hash:
        from layerscope.model.manifest_check import check_small_files

        check_small_files(Path(export_dir), manifest)  # config and tokenizer files decide what is computed too
    import onnx

    graph = onnx.load(str(onnx_path), load_external_data=False).graph
    graph_outputs = [o.name for o in graph.output]
    listed = list(manifest.outputs)
    if graph_outputs != listed:
        missing = sorted(set(listed) - set(graph_outputs))
        extra = sorted(set(graph_outputs) - set(listed))
        raise ManifestError(
            f"{onnx_path} does not match its manifest: outputs missing from the graph {missing or '-'}, "
            f"not in the manifest {extra or '-'}; re-run layerscope export")
    check_graph(Path(export_dir), manifest, graph)
    check_external_data(Path(export_dir), manifest, graph)


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "--", text).strip("-") or "model"
