"""The export cache: ONNX exports of plain models made on first use, keyed by content.

An entry is ``<cache root>/exports/<name>-<key>`` where the key hashes everything
that shapes the export: the model's files (weights sha256, config and tokenizer
files; the snapshot commit for hub models), the revision, the trust-remote-code
setting, the versions of layerscope and of the libraries that trace and check
the graph, and the export options.  The key is also written into the entry's
manifest, and an entry is reused only when its manifest carries the same key and
its graph still matches its hash; anything else is exported again.

Entries are built in a staging directory and renamed into place, so a reader
never sees half an export; a file lock per entry makes a second process wait for
the first one's export instead of repeating it (the OS releases the lock if the
exporting process dies).
"""

from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path
from typing import Any

log = logging.getLogger("layerscope")

# The packages whose versions change what an export holds (graph tracing, conversion, parity check).
EXPORT_PACKAGES = ("torch", "transformers", "optimum", "optimum-onnx", "onnx", "onnxruntime")
NOT_KEYED = ("progress", "force")  # options that do not change the export
# what layerscope adds to the traced graph, where it changes within one version: 2 = the 'last' pooling's index
# found in integers (a bf16 runtime rounded float positions above 256); 3 = the manifest records the model's
# positions (a decoder reads them by default, not its tokenizer's model_max_length)
GRAPH_RECIPE = 3


def _dist_version(name: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    for dist in ((name, name + "-gpu") if name == "onnxruntime" else (name,)):
        try:
            return version(dist)
        except PackageNotFoundError:
            continue
    return None


def tool_versions() -> dict[str, str | None]:
    import layerscope

    return {"layerscope": layerscope.__version__, **{name: _dist_version(name) for name in EXPORT_PACKAGES}}


def export_options(options: dict[str, Any]) -> dict[str, Any]:
    """The export options with their defaults filled in, so that equal exports get equal keys."""
    from layerscope.export.exporter import DEFAULT_OPSET

    opts: dict[str, Any] = {"pooled": None, "opset": DEFAULT_OPSET, "atol": 1e-4}
    opts.update({k: v for k, v in options.items() if k not in NOT_KEYED})
    return opts


def export_key(handle, options: dict[str, Any] | None = None) -> dict[str, Any]:
    """``{"key": hex, ...what it hashes}`` for the export of a plain-model handle."""
    return source_export_key(handle.source(), trust_remote_code=handle.trust_remote_code,
                             st_recipe=handle.manifest.sentence_transformers, options=options)


def source_export_key(source, *, trust_remote_code: bool, st_recipe: dict | None,
                      options: dict[str, Any] | None = None) -> dict[str, Any]:
    """``export_key`` from the model's source alone: file hashes and versions, nothing that imports
    transformers or torch (so a cached export can be found without them)."""
    from layerscope.model.identity import model_identity

    parts = {"model": model_identity(source), "revision": source.revision, "graph": GRAPH_RECIPE,
             "trust_remote_code": bool(trust_remote_code), "versions": tool_versions(),
             "options": export_options(options or {}),
             # the checkpoint's own sentence-transformers modules (1_Pooling/, Normalize, prompts) are recorded
             # in the manifest at export time: a change there, or an entry made before they were read, is a
             # different export
             "sentence_transformers": st_recipe}
    key = hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()
    return {"key": key, **parts}


def entry_name(handle, key: str) -> str:
    return _entry_name(handle.manifest.source.alias, handle.manifest.source.path_or_id or handle.spec, key)


def _entry_name(alias: str | None, path_or_id: str, key: str) -> str:
    from layerscope.model.manifest import _slug

    name = alias or Path(str(path_or_id)).name
    return f"{_slug(name)}-{key[:16]}"


def find_cached_export(spec: str, *, trust_remote_code: bool = False, tower: str | None = None):
    """The cached export (default options) of a local plain model (an alias such as ``minilm`` or a checkpoint
    folder), found from its files alone, with ``spec`` as its name; None when there is none yet or ``spec``
    is something else (an export dir, a hub id). Neither transformers nor torch is imported, so a run on a
    model exported before starts in the time its engine takes."""
    from layerscope.errors import ModelNotFoundError
    from layerscope.model.home import cache_root
    from layerscope.model.manifest import MANIFEST
    from layerscope.model.source import resolve_source
    from layerscope.model.stconfig import read_st_config

    path = Path(str(spec)).expanduser()
    if path.is_dir() and (path / MANIFEST).exists():
        return None  # an export dir is its own export
    try:
        source = resolve_source(str(spec))
    except ModelNotFoundError:
        return None  # the full resolution says what is wrong
    if not source.is_local:
        return None  # a hub id: its snapshot and the hub's state are for the full resolution to read
    st = read_st_config(source.path_or_id)
    ident = source_export_key(source, trust_remote_code=trust_remote_code, st_recipe=st,
                              options={"tower": tower} if tower else None)
    root = cache_root() / "exports"
    target = root / _entry_name(source.alias, source.path_or_id, ident["key"])
    found = _reusable(target, ident["key"], trust_remote_code, st, quiet=True)
    if found is None:
        return None
    found = _repoint(found, source, root / f".{target.name}.lock")
    from dataclasses import replace

    return replace(found, spec=str(spec))


def _reusable(target: Path, key: str, trust_remote_code: bool, st_recipe: dict | None = None, *,
              quiet: bool = False):
    """The handle of a complete entry made for ``key``, else None (``quiet``: without the warnings, for a look
    that the full resolution follows)."""
    from layerscope.errors import ManifestError
    from layerscope.model.handle import ModelHandle
    from layerscope.model.manifest import FORMAT_VERSION, MANIFEST

    if not (target / MANIFEST).exists():
        return None
    from layerscope.jsonfile import JsonFileError, NotRegularFile

    try:
        handle = ModelHandle.resolve(target, trust_remote_code=trust_remote_code)
    except (ManifestError, OSError, NotRegularFile, JsonFileError) as exc:  # OSError: being replaced right now
        if quiet:
            return None
        log.warning("cached export %s is damaged or being replaced (%s); exporting it again", target, exc)
        return None
    if (handle.manifest.export_cache or {}).get("key") != key:
        if quiet:
            return None
        log.warning("cached export %s was made from other files or settings; exporting it again", target)
        return None
    if handle.manifest.format_version != FORMAT_VERSION:  # made before its anatomy was recorded and checked
        if quiet:
            return None
        log.warning("cached export %s was made by an older layerscope (format %s); exporting it again", target,
                    handle.manifest.format_version)
        return None
    if st_recipe is not None and handle.manifest.sentence_transformers != st_recipe:
        if quiet:
            return None
        log.warning("cached export %s lacks this checkpoint's sentence-transformers recipe; exporting it again",
                    target)
        return None
    return handle


def cached_export(handle, options: dict[str, Any] | None = None):
    """The cached export of a plain-model handle, made (under a lock) when no valid entry exists."""
    from filelock import FileLock

    from layerscope.export.exporter import export_model
    from layerscope.model.handle import ModelHandle
    from layerscope.model.home import cache_root

    options = dict(options or {})
    tower = handle.manifest.raw.get("tower")  # a two-tower checkpoint's tower, as the handle was described
    if tower and not handle.is_export:
        options.setdefault("tower", tower)
    ident = export_key(handle, options)
    root = cache_root() / "exports"
    target = root / entry_name(handle, ident["key"])
    found = _reusable(target, ident["key"], handle.trust_remote_code, ident["sentence_transformers"])
    if found is not None:
        return _repoint(found, handle.source(), root / f".{target.name}.lock")
    from layerscope.ownership import check_writable

    check_writable(root)  # a read-only LAYERSCOPE_HOME: one line before the export starts
    root.mkdir(parents=True, exist_ok=True)
    with FileLock(str(root / f".{target.name}.lock")):
        found = _reusable(target, ident["key"], handle.trust_remote_code, ident["sentence_transformers"])  # made while we waited?
        if found is not None:
            return _repoint(found, handle.source(), None)
        log.info("exporting %s to the cache: %s", handle.spec, target)
        options.pop("force", None)
        if target.is_dir() and not target.is_symlink():  # the cache's own entry, found unusable: replaced whole
            import shutil

            shutil.rmtree(target)
        made = export_model(handle.source(), target, trust_remote_code=handle.trust_remote_code, force=True,
                            cache_entry=ident, lock=False, **options)
        from layerscope.export.cpu_precision import record_cpu_precisions

        # for --engine auto, which says what it picks (its variants' parity runs texts: not for a vision tower)
        precisions = [] if made.modality == "image" else record_cpu_precisions(
            target, trust_remote_code=handle.trust_remote_code)
        for line in precisions:
            log.debug("%s", line)
    return ModelHandle.resolve(target, trust_remote_code=handle.trust_remote_code)


def _repoint(found, new, lock_path: Path | None):
    """An entry is keyed by content, so the same weights found at a new place (a moved folder, a rebuilt
    environment's copy of an alias's package) reuse it; when the place it recorded is gone, it records the
    new one, so that what loads the weights again (parity of a variant, the bench's reference rows) finds
    them."""
    old = found.manifest.source
    if not (old.is_local and new.is_local) or old.path_or_id == new.path_or_id or Path(old.path_or_id).is_dir():
        return found
    if lock_path is not None:
        from filelock import FileLock

        with FileLock(str(lock_path)):
            return _repoint(found, new, None)
    from layerscope.atomic import write_json_atomic
    from layerscope.model.handle import ModelHandle
    from layerscope.model.manifest import MANIFEST, read_manifest_dict
    from layerscope.ownership import writing

    target = found.export_dir
    with writing(target, "export") as wrote:
        wrote.add(MANIFEST)
        manifest = read_manifest_dict(target)
        manifest["source"].update(spec=new.spec, path_or_id=new.path_or_id, alias=new.alias)
        write_json_atomic(target / MANIFEST, manifest)
    log.info("cached export %s: its weights are now read from %s (%s is gone)", target, new.path_or_id,
             old.path_or_id)
    return ModelHandle.resolve(target, trust_remote_code=found.trust_remote_code)


def export_record(handle) -> dict[str, Any] | None:
    """Which export ran, for results.json: its directory, graph hash, cache key and maker (None: no export)."""
    if handle is None or getattr(handle, "export_dir", None) is None:
        return None
    man = handle.manifest
    return {"dir": str(handle.export_dir), "onnx_sha256": man.onnx_sha256,
            "cache_key": (man.export_cache or {}).get("key"), "made_by": man.layerscope_version}
