"""layerscope: look inside embedding models layer by layer, fast.

The public names are imported from the top (``from layerscope import LayerStore``) and load their
module on first use, so ``import layerscope`` stays light (no numpy, torch or ONNX Runtime).
"""

__version__ = "0.1.0"

# public name -> the module that defines it, imported on first access
_LAZY = {"LayerStore": "layerscope.store.store", "embed": "layerscope.extraction.pipeline",
         "extract": "layerscope.extraction.pipeline"}
__all__ = ["LayerStore", "embed", "extract", "open", "__version__"]


def __getattr__(name: str):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'layerscope' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


def open(model, *, engine: str = "auto", **engine_options):  # noqa: A001 - the public name is layerscope.open
    """Open a model once for repeated encoding: ``layerscope.open("minilm").embed(texts, layers=[-1])``."""
    from layerscope.session import open_model

    return open_model(model, engine=engine, **engine_options)
