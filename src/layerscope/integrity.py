"""``layerscope verify PATH``: what the path is decides which checks run."""

from __future__ import annotations

from pathlib import Path

from layerscope.errors import InputError


def verify_path(path: Path) -> tuple[int, list[str]]:
    """(files verified, one line per problem) for a store or an export dir."""
    from layerscope.store.store_layout import StoreLayout

    path = Path(path)
    if StoreLayout(path).store_json.is_file():
        from layerscope.store.store import LayerStore

        return LayerStore.verify(path)
    if (path / "manifest.json").is_file():
        from layerscope.model.manifest_verify import verify_export_files

        return verify_export_files(path)
    raise InputError(f"{path} is neither a layer store (store.json) nor an export dir (manifest.json); "
                     "nothing to verify")
