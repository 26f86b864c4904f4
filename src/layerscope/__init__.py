"""layerscope: look inside embedding models layer by layer, fast."""

__version__ = "0.1.0"
