"""Analyses: each one module of this package holding one registered Analysis class (see base.py).

A new analysis is one file: the registry imports every public module it finds in this package
(``pkgutil.iter_modules`` over ``__path__``), and the ``@register`` in that module adds it.
Helper modules (base, cache, layout, ...) register nothing; importing them costs nothing extra,
as the analyses import them anyway.
"""


def _load_all() -> None:
    """Import every public module of the package, which registers the analyses among them."""
    import importlib
    import pkgutil

    for info in pkgutil.iter_modules(__path__):
        if not info.name.startswith("_"):
            importlib.import_module(f"{__name__}.{info.name}")
