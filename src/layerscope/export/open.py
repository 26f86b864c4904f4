"""``open_engine``: resolve a model, export it on first use, build the engine. The one way in.

Engines (engines/) run a model they are handed; they never resolve a name or run an
export.  This module sits above them and the exporter: it turns what the user typed
(export dir, local checkpoint, hub id, alias, or an already resolved ``ModelHandle``)
into a handle, exports a plain model into the content-keyed cache (export/cache.py)
when the engine asked for declares that it needs an export, and builds the engine.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from layerscope.model.handle import ModelHandle


def resolve_model(model: str | Path | ModelHandle, *, trust_remote_code: bool = False,
                  engine=None, tower: str | None = None) -> ModelHandle:
    """The handle of ``model`` (returned as is when it is one already); nothing is exported.

    ``engine``: the engine that will run it; when that engine runs exports and a local plain model (an alias
    such as ``minilm``, a checkpoint folder) has its export in the cache already, that export's handle is
    returned, found from the files alone, without importing transformers or torch. ``engine``: a name or an
    ``EngineChoice`` (engines/registry.py). ``tower="vision"``: a two-tower checkpoint's image tower."""
    if isinstance(model, ModelHandle):
        return model
    if engine is not None:
        from layerscope.engines.base import needs_export

        if needs_export(engine):
            from layerscope.export.cache import find_cached_export

            found = find_cached_export(str(model), trust_remote_code=trust_remote_code, tower=tower)
            if found is not None:
                return found
    return ModelHandle.resolve(model, trust_remote_code=trust_remote_code, tower=tower)


def require_engine(engine) -> None:
    """One clear line when engine ``engine`` (a name or an ``EngineChoice``) cannot start on this machine,
    found out on a one-node graph before any export, weights hash or model load (a missing CUDA/TensorRT
    provider, say)."""
    from layerscope.engines.registry import resolve_engine
    from layerscope.errors import EngineUnavailableError

    spec = resolve_engine(engine).spec  # an unknown name: one line with the closest one
    probe = getattr(spec.factory, "probe", None)
    if spec.picks_engine or not spec.needs_export or probe is None:
        return  # auto tries the others in turn; torch runs the model itself, no export to wait for
    works, detail = probe()
    if not works:
        raise EngineUnavailableError(f"--engine {spec.name} cannot run on this machine: {detail}")


def ensure_export(model: str | Path | ModelHandle, *, trust_remote_code: bool = False,
                  **export_options: Any) -> ModelHandle:
    """The handle of an export of ``model``: itself if it is an export dir, else its cached export,
    keyed by content (see export/cache.py) and made on first use."""
    handle = resolve_model(model, trust_remote_code=trust_remote_code)
    if handle.is_export:
        return handle
    from layerscope.export.cache import cached_export

    return cached_export(handle, export_options)


def open_engine(model: str | Path | ModelHandle, engine="auto", *, trust_remote_code: bool = False,
                **options: Any):
    """Engine ``engine`` running ``model``, exporting the model first when that engine runs exports.

    ``engine``: a registered name, looked up here once, or an ``EngineChoice`` a run resolved already
    (engines/registry.py ``resolve_engine``), which ``options`` are added to."""
    from layerscope.engines.base import create_engine
    from layerscope.engines.registry import resolve_engine

    choice = resolve_engine(engine, options)  # a mistyped option is one line, before anything is exported
    if choice.needs_export and not (isinstance(model, ModelHandle) and model.is_export):
        require_engine(choice)  # before the export (or the hash of the weights it is keyed by)
    handle = resolve_model(model, trust_remote_code=trust_remote_code, engine=choice)
    if choice.needs_export and not handle.is_export:
        handle = ensure_export(handle)
    return create_engine(choice, handle)
