"""``layerscope.open(model)``: a model kept open for repeated encoding.

The engine (an ONNX Runtime session or a PyTorch model) is made once and reused
by every ``embed`` / ``encode`` call, and results are keyed by the layer names
the caller used: ask for ``-1`` and the key is ``-1``, not the canonical ``'6'``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Iterable

import numpy as np

from layerscope.errors import InputError

if TYPE_CHECKING:
    from layerscope.model.manifest_type import Manifest

LayerKey = Any  # a layer as the caller named it: -1, "-1", "raw", "last", or a canonical name from a range


def _requested_layers(layers, num_layers: int, *, raw_in_all: bool = True) -> list[tuple[LayerKey, str]]:
    """(key the caller used, canonical name) for each layer asked for, in order, without repeats (``all`` holds
    ``raw`` where ``raw_in_all``: the word embeddings are as wide as the other layers)."""
    from layerscope.vocab.layers import resolve_layers

    if layers is None or isinstance(layers, str) and layers.strip() == "all":
        return [(n, n) for n in resolve_layers("all", num_layers, with_raw=raw_in_all)]
    if isinstance(layers, (int, np.integer)):
        items: list = [int(layers)]
    elif isinstance(layers, str):
        items = [p.strip() for p in layers.split(",") if p.strip()]
    else:
        items = list(layers)
    pairs: list[tuple[LayerKey, str]] = []
    for item in items:
        text = str(item)
        names = resolve_layers(text, num_layers)
        if len(names) == 1 and ":" not in text and text != "all":
            pairs.append((item, names[0]))
        else:  # a range or 'all' stands for several layers: those get their canonical names
            pairs.extend((n, n) for n in names)
    seen, out = set(), []
    for key, name in pairs:
        if key not in seen:
            seen.add(key)
            out.append((key, name))
    if not out:
        raise InputError("layers selected no layer; use 'all', 'raw', or indices such as 0,3,-1")
    return out


class EmbeddingModel:
    """One model and its engine, open for repeated ``embed`` calls (close it, or use ``with``)."""

    def __init__(self, model: str, *, engine: str = "auto", **engine_options):
        from layerscope.export.open import open_engine

        self.engine = open_engine(model, engine, **engine_options)
        self._closed = False

    @classmethod
    def from_engine(cls, engine) -> "EmbeddingModel":
        """Wrap an engine that is already running (it is not closed by this object's owner)."""
        obj = cls.__new__(cls)
        obj.engine = engine
        obj._closed = False
        return obj

    # -- what the model is --------------------------------------------------
    @property
    def manifest(self) -> Manifest:
        """The model's typed manifest (model/manifest_type.py); ``manifest.to_dict()`` gives its JSON form."""
        return self.engine.manifest

    @property
    def num_layers(self) -> int:
        return self.manifest.num_layers

    @property
    def hidden_size(self) -> int:
        return self.manifest.hidden_size

    @property
    def default_poolings(self) -> list[str]:
        from layerscope.vocab.pooling import default_poolings

        return default_poolings(self.manifest)

    @property
    def prompts(self) -> dict[str, str]:
        return self.manifest.st_prompts

    @property
    def similarity_fn_name(self) -> str:
        return self.manifest.similarity_fn_name

    # -- encoding -------------------------------------------------------------
    def embed(self, texts: str | Iterable[str], *, layers="all", poolings=None, prompt_name: str | None = None,
              prompt: str | None = None, batch_tokens: int | None = None,
              max_length: int | None = None) -> dict[tuple[str, LayerKey], np.ndarray]:
        """``{(pooling, layer): [n, hidden]}`` with each layer keyed as it was asked for.

        ``poolings`` defaults to the model's own (``st`` for a sentence-transformers checkpoint)."""
        from layerscope.extraction.pipeline import embed

        self._check_open()
        texts = [texts] if isinstance(texts, str) else list(texts)
        pairs = _requested_layers(layers, self.num_layers, raw_in_all=self.manifest.raw_width == self.hidden_size)
        pool_list = poolings.split(",") if isinstance(poolings, str) else list(poolings or self.default_poolings)
        canonical = list(dict.fromkeys(name for _, name in pairs))
        got = embed(self.engine.model, texts, engine=self.engine, layers=canonical, poolings=pool_list,
                    batch_tokens=batch_tokens, max_length=max_length, prompt_name=prompt_name, prompt=prompt)
        from layerscope.vocab.layers import LayerVectors

        return LayerVectors({(p.strip(), key): got[p.strip(), name] for p in pool_list for key, name in pairs},
                            self.num_layers)  # takes ("mean", 6), ("mean", -1) or ("mean", "6") as a LayerStore does

    def encode(self, texts: str | Iterable[str], *, pooling: str | None = None, layer=-1,
               prompt_name: str | None = None, prompt: str | None = None) -> np.ndarray:
        """One ``[n, hidden]`` array: the model's own embedding (or ``pooling``) of one layer (the last)."""
        self._check_open()
        mode = pooling or self.default_poolings[0]
        out = self.embed(texts, layers=[layer], poolings=[mode], prompt_name=prompt_name, prompt=prompt)
        return out[mode, layer]

    def _check_open(self) -> None:
        if getattr(self, "_closed", False):
            raise InputError(f"{self.manifest.source.spec} is closed (close() or the end of its 'with' block "
                             "released its engine); open it again with layerscope.open(...)")

    def close(self) -> None:
        """Release the engine; ``embed`` and ``encode`` then refuse in one line. Closing twice is harmless."""
        if not getattr(self, "_closed", False):
            self._closed = True
            self.engine.close()

    def __enter__(self) -> "EmbeddingModel":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return (f"EmbeddingModel({self.manifest.source.spec!r}, engine={self.engine.info.name}, "
                f"layers=raw,0..{self.num_layers}, default pooling={self.default_poolings[0]})")


def open_model(model: str, *, engine: str = "auto", **engine_options) -> EmbeddingModel:
    return EmbeddingModel(model, engine=engine, **engine_options)
