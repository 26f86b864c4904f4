"""layerscope: look inside embedding models layer by layer, fast."""

__version__ = "0.1.0"


def open(model, *, engine: str = "auto", **engine_options):  # noqa: A001 - the public name is layerscope.open
    """Open a model once for repeated encoding: ``layerscope.open("minilm").embed(texts, layers=[-1])``."""
    from layerscope.session import open_model

    return open_model(model, engine=engine, **engine_options)
