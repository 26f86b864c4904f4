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
                  engine: str | None = None) -> ModelHandle:
    """The handle of ``model`` (returned as is when it is one already); nothing is exported.

    ``engine``: the engine that will run it; when that engine runs exports and a local plain model (an alias
    such as ``minilm``, a checkpoint folder) has its export in the cache already, that export's handle is
    returned, found from the files alone, without importing transformers or torch."""
    if isinstance(model, ModelHandle):
        return model
    if engine is not None:
        from layerscope.engines.base import needs_export

        if needs_export(engine):
            from layerscope.export.cache import find_cached_export

            found = find_cached_export(str(model), trust_remote_code=trust_remote_code)
            if found is not None:
                return found
    return ModelHandle.resolve(model, trust_remote_code=trust_remote_code)


def require_engine(engine: str) -> None:
    """One clear line when engine ``engine`` cannot start on this machine, found out on a one-node graph
    before any export, weights hash or model load (a missing CUDA/TensorRT provider, say)."""
    from layerscope.engines.registry import engine_spec
    from layerscope.errors import EngineUnavailableError

    spec = engine_spec(engine)  # an unknown name: one line with the closest one
    probe = getattr(spec.factory, "probe", None)
    if spec.name == "auto" or not spec.needs_export or probe is None:
        return  # auto tries the others in turn; torch runs the model itself, no export to wait for
    works, detail = probe()
    if not works:
        raise EngineUnavailableError(f"--engine {engine} cannot run on this machine: {detail}")


def ensure_export(model: str | Path | ModelHandle, *, trust_remote_code: bool = False,
                  **export_options: Any) -> ModelHandle:
    """The handle of an export of ``model``: itself if it is an export dir, else its cached export,
    keyed by content (see export/cache.py) and made on first use."""
    handle = resolve_model(model, trust_remote_code=trust_remote_code)
    if handle.is_export:
        return handle
    from layerscope.export.cache import cached_export

    return cached_export(handle, export_options)


def open_engine(model: str | Path | ModelHandle, engine: str = "auto", *, trust_remote_code: bool = False,
                **options: Any):
    """Engine ``engine`` running ``model``, exporting the model first when that engine runs exports."""
    from layerscope.engines.base import check_engine_name, create_engine, needs_export

    from layerscope.engines.registry import check_engine_options

    check_engine_name(engine)
    check_engine_options(engine, options)  # a mistyped option is one line, before anything is exported
    if needs_export(engine) and not (isinstance(model, ModelHandle) and model.is_export):
        require_engine(engine)  # before the export (or the hash of the weights it is keyed by)
    handle = resolve_model(model, trust_remote_code=trust_remote_code, engine=engine)
    if needs_export(engine) and not handle.is_export:
        handle = ensure_export(handle)
    return create_engine(engine, handle, **options)
