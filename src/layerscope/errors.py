"""User-facing errors. Each message says what went wrong and what to do about it.

Only the CLI (``layerscope.cli``) turns these into exit codes; library code raises them.
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

    def __init__(self, package: str, extra: str, what: str = "this"):
        super().__init__(
            f"{what} needs the optional package '{package}': pip install 'layerscope[{extra}]'"
        )


def did_you_mean(word: str, choices, *, key=str) -> str:
    """`` (did you mean 'x'?)`` for the choice closest to a mistyped ``word``, or ``""`` when none is close.

    ``key`` turns a choice (and the word) into what is compared, e.g. a flag without its dashes.
    """
    from difflib import get_close_matches

    by_key = {key(c): str(c) for c in choices}
    hint = get_close_matches(key(word), list(by_key), n=1)
    return f" (did you mean '{by_key[hint[0]]}'?)" if hint else ""


def unknown_name(what: str, word: str, choices, *, listed=None) -> InputError:
    """The one-line error for a name that is not one of ``choices``: the closest one, then the full list.

    ``listed`` is what the line offers when it differs from what is matched (e.g. with aliases added).
    """
    shown = ", ".join(str(c) for c in (choices if listed is None else listed))
    return InputError(f"unknown {what} '{word}'{did_you_mean(word, choices)}; choose from {shown}")
