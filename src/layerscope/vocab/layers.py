"""Layer names and the one parser of a layer spec.

Canonical names: ``raw`` (the word-embedding lookup, before positions), ``0`` (the
embedding output, ``hidden_states[0]``), ``1``..``L`` (the output of block i).  A spec
is ``all``, ``last``, a comma list such as ``raw,0,3,-1`` (negatives count from the
end) or a range such as ``2:5``.

A spec is parsed once, where a run starts: ``resolve_layers`` returns ``Layers``, a
list of canonical names that remembers the model it was resolved for, and hands such
a list back as it is when it meets it again further down the run.
"""

from __future__ import annotations

from layerscope.errors import InputError

RAW = "raw"


class Layers(list):
    """Canonical layer names already resolved for a model with ``num_layers`` blocks."""

    def __init__(self, names, num_layers: int, with_raw: bool = True):
        super().__init__(names)
        self.num_layers = int(num_layers)
        self.with_raw = bool(with_raw)


def canonical_layer(layer: int | str, num_layers: int) -> str | None:
    """The canonical name of one layer given as ``6``, ``-1``, ``"6"`` or ``"raw"``, None if it is none."""
    name = str(layer).strip()
    if name == RAW:
        return RAW
    try:
        i = int(name)
    except ValueError:
        return None
    i = i + num_layers + 1 if i < 0 else i
    return str(i) if 0 <= i <= num_layers else None


class LayerVectors(dict):
    """``{(pooling, layer): vectors}`` that takes a layer as ``LayerStore`` does: ``("mean", 6)``,
    ``("mean", -1)``, ``("mean", "6")`` all name the last layer of a 6-layer model (keys iterate as made)."""

    def __init__(self, items, num_layers: int):
        super().__init__(items)
        self.num_layers = int(num_layers)

    def _key(self, key):
        if dict.__contains__(self, key):
            return key
        if not (isinstance(key, tuple) and len(key) == 2):
            return None
        pooling, layer = key
        name = canonical_layer(layer, self.num_layers)
        return next((k for k in dict.keys(self) if k[0] == pooling and name is not None
                     and canonical_layer(k[1], self.num_layers) == name), None)

    def __getitem__(self, key):
        found = self._key(key)
        if found is None:
            raise KeyError(key)
        return dict.__getitem__(self, found)

    def __contains__(self, key) -> bool:
        return self._key(key) is not None

    def get(self, key, default=None):
        found = self._key(key)
        return default if found is None else dict.__getitem__(self, found)


def layer_names(num_layers: int, *, with_raw: bool = True) -> list[str]:
    """Canonical names: ``raw`` (word embeddings), ``0`` (embedding output), ``1``..``L``."""
    return ([RAW] if with_raw else []) + [str(i) for i in range(num_layers + 1)]


def resolve_layers(spec: str | list | tuple | None, num_layers: int, *, with_raw: bool = True) -> Layers:
    """Parse ``all``, ``last``, ``raw,0,3,-1`` or ``2:5`` into canonical layer names (in the order given)."""
    if isinstance(spec, Layers) and spec.num_layers == num_layers and (with_raw or not spec.with_raw):
        return spec  # resolved where the run started: not parsed again
    return Layers(_parse(spec, num_layers, with_raw), num_layers, with_raw)


def resolve_widths(spec, num_layers: int, *, raw_width: int, hidden_size: int, raw_alone: bool = True) -> Layers:
    """``resolve_layers`` for a model whose word embeddings (``raw``) may be narrower than its hidden states
    (ALBERT, ELECTRA project them up). A run's vectors have one width, so there ``all`` means ``0..L``,
    ``raw`` is asked on its own (where ``raw_alone``: a store then holds it at its width), and a mix is
    refused in one line saying what to ask instead."""
    if raw_width == hidden_size:
        return resolve_layers(spec, num_layers)
    try:
        return resolve_layers(spec, num_layers, with_raw=False)
    except InputError:
        names = resolve_layers(spec, num_layers)  # anything else wrong with the spec is said as it is
    if list(names) == [RAW] and raw_alone:
        return names
    other = f"layers 0..{num_layers} (or all)"
    ask = f"ask --layers raw on its own, and {other} in another run" if raw_alone else f"ask {other}"
    raise InputError(f"layer 'raw' of this model is its word embeddings, {raw_width} wide, and its other layers "
                     f"are {hidden_size} wide; the vectors of one run have one width: {ask}")


def _parse(spec, num_layers: int, with_raw: bool) -> list[str]:
    names = layer_names(num_layers, with_raw=with_raw)
    if spec is None or spec == "all" or spec == ["all"]:
        return names
    items: list[str] = []
    parts = spec.split(",") if isinstance(spec, str) else [str(s) for s in spec]
    for part in (p.strip() for p in parts):
        if not part:
            continue
        if part == "all":
            items.extend(names)
        elif part == "last":
            items.append(str(num_layers))
        elif part == RAW:
            if not with_raw:
                raise InputError("layer 'raw' is not available here")
            items.append(RAW)
        elif ":" in part:
            lo, hi = part.split(":", 1)
            start = _layer_int(lo or "0", num_layers, part)
            stop = _layer_int(hi, num_layers, part) if hi else num_layers
            items.extend(str(i) for i in range(start, stop + 1))
        else:
            items.append(str(_layer_int(part, num_layers, part)))
    out: list[str] = []
    for it in items:
        if it not in out:
            out.append(it)
    if not out:
        raise InputError("--layers selected no layer; use 'all', 'raw', or indices such as 0,3,-1")
    return out


def _layer_int(text: str, num_layers: int, part: str) -> int:
    try:
        i = int(text)
    except ValueError:
        raise InputError(
            f"layer '{part}' is not a layer; use 'all', 'raw', 'last', an index 0..{num_layers} "
            "(negative counts from the end) or a range like 2:5"
        ) from None
    if i < 0:
        i += num_layers + 1
    if not 0 <= i <= num_layers:
        raise InputError(
            f"layer {text} is out of range: this model has layers raw, 0..{num_layers} "
            f"(or -1..-{num_layers + 1} from the end)"
        )
    return i
