"""Analyses: each a class with metadata and one compute method (see base.py); metrics in metrics.py."""

_MODULES = ("sts", "compositionality", "pooling", "alignment", "similarity", "lens", "saliency", "mteb_layers")


def _load_all() -> None:
    """Import every analysis module that exists, which registers it."""
    import importlib
    import importlib.util

    for name in _MODULES:
        full = f"{__name__}.{name}"
        if importlib.util.find_spec(full) is not None:
            importlib.import_module(full)
