"""The names of the exported graph's outputs, built and read here and nowhere else.

An export has ``raw_embeddings`` (the word-embedding lookup, layer ``raw``), one
``hidden_states.N`` per layer ``N`` = 0..L, and, for in-graph pooling, one
``pooled.<mode>`` per pooling mode (``[layers, batch, hidden]``).  Where the model's own last
hidden state (what it returns as its token embeddings, what sentence-transformers pools) is not
layer L (ModernBERT and CLIP's text tower apply their final norm after it), the export also has
``last_hidden_state``; engines read it under the same name (``OWN_LAST``) beside the layers.
"""

from __future__ import annotations

from collections.abc import Iterable

RAW_OUTPUT = "raw_embeddings"
OWN_LAST = "last_hidden_state"  # the model's own last hidden state, where it is not layer L
_HIDDEN = "hidden_states."
_POOLED = "pooled."


def hidden_output(index: int | str) -> str:
    """``hidden_states.N``: the output of layer ``N`` (0 is the embedding output)."""
    return f"{_HIDDEN}{int(index)}"


def hidden_outputs(num_layers: int) -> list[str]:
    """Every hidden-state output of a model with ``num_layers`` blocks, in layer order."""
    return [hidden_output(i) for i in range(int(num_layers) + 1)]


def layer_output(layer: str) -> str:
    """The output that holds a canonical layer name's token states (``raw`` or ``0``..``L``; ``OWN_LAST``: the
    model's own last hidden state)."""
    return RAW_OUTPUT if layer == "raw" else OWN_LAST if layer == OWN_LAST else hidden_output(layer)


def pooled_output(mode: str) -> str:
    """``pooled.<mode>``: the in-graph pooling of every pooled layer."""
    return _POOLED + mode


def hidden_index(name: str) -> int | None:
    """N for ``hidden_states.N``, else None."""
    if not name.startswith(_HIDDEN):
        return None
    try:
        return int(name[len(_HIDDEN):])
    except ValueError:
        return None


def pooled_mode(name: str) -> str | None:
    """The mode of a ``pooled.<mode>`` output, else None."""
    return name[len(_POOLED):] if name.startswith(_POOLED) else None


def output_layer(name: str) -> str | None:
    """The canonical layer name an output holds (``raw``, ``0``..``L``), else None."""
    if name == RAW_OUTPUT:
        return "raw"
    index = hidden_index(name)
    return None if index is None else str(index)


def sorted_hidden_outputs(names: Iterable[str]) -> list[str]:
    """The hidden-state outputs among ``names``, in layer order."""
    return sorted((n for n in names if hidden_index(n) is not None), key=hidden_index)


def is_layer_or_pooled(name: str) -> bool:
    """A hidden-state or pooled output, or the model's own last hidden state (what a parity record is made of,
    besides the raw embeddings)."""
    return hidden_index(name) is not None or pooled_mode(name) is not None or name == OWN_LAST
