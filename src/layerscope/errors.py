"""User-facing errors. Each message says what went wrong and what to do about it.

Only ``cli.py`` turns these into exit codes; library code raises them.
"""

from __future__ import annotations


class LayerscopeError(Exception):
    """Base class: the message is one line a user can act on."""

    exit_code = 2


class InputError(LayerscopeError):
    """Bad user input: a file, a column, an option value."""


class ModelNotFoundError(LayerscopeError):
    """A model id or path that cannot be resolved or loaded."""


class ExportError(LayerscopeError):
    """The ONNX export failed or did not match PyTorch."""


class ManifestError(LayerscopeError):
    """An export dir or store whose manifest does not match its contents."""


class EngineUnavailableError(LayerscopeError):
    """A requested engine cannot run on this machine."""


class StoreError(LayerscopeError):
    """A LayerStore that is missing, incomplete or does not match the request."""


class Interrupted(LayerscopeError):
    """Ctrl-C: the message says how much work was kept and how to continue."""

    exit_code = 130


class MissingExtraError(LayerscopeError):
    """An optional package is not installed."""

    def __init__(self, package: str, extra: str):
        super().__init__(
            f"this needs the optional package '{package}': pip install 'layerscope[{extra}]'"
        )
