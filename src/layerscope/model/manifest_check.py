"""Is an export dir what its ``manifest.json`` says?  Checks at load, and ``layerscope verify``.

At load (every ``ModelHandle.resolve``), cheap enough to run each time:

* every path the manifest names (``onnx_file``, variants, ``files``) and every external-data
  location inside the graph stays inside the export dir: no absolute path, no ``..``, no
  symlink that leads out;
* ``onnx_sha256`` is present and ``model.onnx`` hashes to it (done in ``manifest.verify_export``), and so does
  every recorded file the tokenizer and config loaders read (config, tokenizer, processor, the model's own
  code: ``check_small_files``, none they read left unrecorded), remembered by stat signature so an unchanged
  file is read once;
* the manifest's ``outputs`` (names and shapes), ``num_layers``, ``hidden_size`` and the order of
  ``pooled_layers`` agree with the graph itself: the pooled outputs' layer order is read off the
  ``Concat`` that stacks the layers in the graph;
* external data files exist and are as large as the graph's references into them and as
  recorded; they are *not* hashed at load (they can be many GB), ``layerscope verify`` does that.

``layerscope verify EXPORT_DIR`` (``manifest_verify.py``) re-hashes every file recorded in the manifest's ``files`` (written
at export: model.onnx, its external data, tokenizer and config files), every variant and every
lens graph against its sidecar.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping

from layerscope.hashing import file_sha256
from layerscope.errors import ManifestError

if TYPE_CHECKING:
    from layerscope.model.manifest_type import Manifest

MANIFEST = "manifest.json"


def member(export_dir: Path, rel: Any, what: str) -> Path:
    """``export_dir / rel`` if that stays inside ``export_dir`` (symlinks followed); else ManifestError."""
    bad = None
    if not isinstance(rel, str) or not rel or "\x00" in rel:
        bad = "is not a file name"
    elif os.path.isabs(rel) or rel.startswith("\\") or (len(rel) > 1 and rel[1] == ":"):
        bad = "is an absolute path"
    elif ".." in Path(rel).parts or ".." in rel.replace("\\", "/").split("/"):
        bad = "climbs out with '..'"
    else:
        root = Path(export_dir).resolve()
        target = (root / rel).resolve()
        if target != root and root not in target.parents:
            bad = f"leads outside the export dir (to {target})"
    if bad:
        raise ManifestError(f"{Path(export_dir) / MANIFEST}: {what} {rel!r} {bad}; a manifest may only name "
                            "files inside its export dir; re-run layerscope export")
    return Path(export_dir) / rel


def _dims(value_info) -> list:
    return [d.dim_param or d.dim_value for d in value_info.type.tensor_type.shape.dim]


def _stacked_layers(graph, layer_of: dict[str, str]) -> list[str] | None:
    """The layer order the graph's pooled outputs stack (from the Concat of Unsqueezed layer tensors)."""
    made_by = {out: node for node in graph.node for out in node.output}
    for node in graph.node:
        if node.op_type != "Concat" or not node.input:
            continue
        order = []
        for name in node.input:
            src = made_by.get(name)
            if src is None or src.op_type != "Unsqueeze" or src.input[0] not in layer_of:
                break
            order.append(layer_of[src.input[0]])
        else:
            return order
    return None


def check_graph(export_dir: Path, manifest: Manifest, graph) -> None:
    """The manifest's structural fields against the graph (loaded without external data)."""
    from layerscope.vocab.outputs import RAW_OUTPUT, output_layer, pooled_mode, sorted_hidden_outputs

    where = Path(export_dir) / MANIFEST

    def refuse(what: str) -> None:
        raise ManifestError(f"{where} does not match its graph: {what}; re-run layerscope export")

    outputs = {o.name: _dims(o) for o in graph.output}
    listed = manifest.outputs
    if list(listed) == list(outputs):
        for name, dims in outputs.items():
            if list(listed[name]) != dims:
                refuse(f"output {name} is {dims} in the graph, {listed[name]} in the manifest")
    hidden = sorted_hidden_outputs(outputs)
    num_layers, hidden_size = manifest.num_layers, manifest.hidden_size  # typed when the manifest was read
    if len(hidden) != num_layers + 1:
        refuse(f"num_layers is {num_layers}, the graph has {len(hidden)} hidden-state outputs")
    for name in hidden:
        last = outputs[name][-1] if outputs[name] else None
        if isinstance(last, int) and last and last != hidden_size:
            refuse(f"hidden_size is {hidden_size}, the graph's {name} has {last}")
    pooled = [n for n in outputs if pooled_mode(n) is not None]
    if not pooled:
        return
    layer_of = {name: output_layer(name) for name in [RAW_OUTPUT, *hidden]}
    stacked = _stacked_layers(graph, layer_of)
    claimed = list(manifest.pooled_layers)
    if stacked is None:
        refuse("its pooled outputs do not stack the layer outputs the way layerscope builds them")
    if claimed != stacked:
        refuse(f"pooled_layers {claimed} are not the layers the pooled outputs stack ({stacked})")
    for name in pooled:
        first = outputs[name][0] if outputs[name] else None
        if isinstance(first, int) and first and first != len(stacked):
            refuse(f"{name} stacks {first} layers, pooled_layers lists {len(stacked)}")


def check_external_data(export_dir: Path, manifest: Manifest, graph) -> None:
    """Every external-data location inside the dir, present, and as large as the graph needs (no hashing)."""
    from onnx.external_data_helper import ExternalDataInfo, uses_external_data

    needed: dict[str, int] = {}
    tensors = list(graph.initializer)
    for t in tensors:
        if not uses_external_data(t):
            continue
        info = ExternalDataInfo(t)
        end = int(info.offset or 0) + int(info.length or 0)
        needed[info.location] = max(needed.get(info.location, 0), end)
    files = manifest.files
    for location, end in needed.items():
        path = member(export_dir, location, "the graph's external data file")
        if not path.is_file():
            raise ManifestError(f"{export_dir} is missing {location}, the external data of its graph; "
                                "re-run layerscope export")
        size = path.stat().st_size
        recorded = (files.get(location) or {}).get("bytes")
        if size < end or (recorded is not None and size != int(recorded)):
            raise ManifestError(f"{path} is {size:,} bytes, the export wrote "
                                f"{int(recorded) if recorded is not None else end:,} (truncated or replaced); "
                                "re-run layerscope export")


SMALL_FILE_BYTES = 64 * 2**20  # loader files hashed at every load (by stat signature: once per change)
# files of an export dir that transformers' and tokenizers' loaders read when present
LOADER_FILES = frozenset({"config.json", "generation_config.json", "preprocessor_config.json", "tokenizer.json",
                          "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json", "vocab.txt",
                          "vocab.json", "merges.txt", "chat_template.jinja", "chat_template.json"})
LOADER_SUFFIXES = (".py", ".model", ".tiktoken")


def check_small_files(export_dir: Path, manifest: Manifest) -> None:
    """The files of the export that transformers' and tokenizers' loaders read (``LOADER_FILES``: config,
    tokenizer and image-processor files, the model's own code) as the export recorded them: they decide what is
    computed as much as its graph, so one changed after export, or one the export did not write, is one line, not
    a run with other tokens. Weights (external data, the stored head) are checked by size at load and hashed by
    ``layerscope verify`` and where they are read."""
    from layerscope.jsonfile import check_regular
    from layerscope.model.identity import hash_files
    from layerscope.ownership import MARKER as OWNED

    if manifest.files:  # a file the loaders read that the export did not write (added_tokens.json dropped in)
        for entry in sorted(os.scandir(export_dir), key=lambda e: e.name):
            if (entry.name in LOADER_FILES or entry.name.endswith(LOADER_SUFFIXES)) and entry.name not in manifest.files:
                raise ManifestError(f"{Path(export_dir) / entry.name} is not a file its export wrote, and the "
                                    "tokenizer or config loaders would read it; remove it (or export again)")
    for rel, rec in manifest.files.items():
        size = rec.get("bytes") if isinstance(rec, Mapping) else None
        loaded = rel in LOADER_FILES or rel.endswith(LOADER_SUFFIXES)  # weights: by size here, hashed by verify
        if not loaded or rel in (MANIFEST, OWNED) or not isinstance(size, int) or size > SMALL_FILE_BYTES:
            continue
        path = member(export_dir, rel, "file")
        try:
            st = check_regular(path)
        except FileNotFoundError:
            raise ManifestError(f"{export_dir} is missing {rel}, which its export wrote; export it again into a new "
                                "folder") from None
        if st.st_size != size or hash_files([path]) != rec.get("sha256"):
            raise ManifestError(f"{path} is not the file the export wrote (sha256 differs): changed after export; "
                                "export it again into a new folder (--force replaces only files layerscope "
                                "recorded, unchanged)")


def check_paths(export_dir: Path, manifest: Manifest) -> Path:
    """Check every path the manifest names; return the main graph's path."""
    onnx_path = member(export_dir, manifest.onnx_file, "onnx_file")
    for kind, entry in manifest.variants.items():
        member(export_dir, entry.file, f"variant {kind!r} file")
    for rel in manifest.files:
        member(export_dir, rel, "file")
    return onnx_path


# ---------------------------------------------------------------- recording and verifying


def file_records(export_dir: Path) -> dict[str, dict[str, Any]]:
    """``{relative path: {"sha256", "bytes"}}`` of every file in the export dir but the manifest and the
    ownership marker (which records the files layerscope writes there, so it changes as they are added)."""
    from layerscope.ownership import MARKER

    root = Path(export_dir)
    out = {}
    for path in sorted(p for p in root.rglob("*") if p.is_file() and not p.is_symlink()):
        rel = path.relative_to(root).as_posix()
        if rel not in (MANIFEST, MARKER):
            out[rel] = {"sha256": file_sha256(path), "bytes": path.stat().st_size}
    return out
