"""``RunRequest``: one analysis run as asked, the one thing the CLI (or a library caller) builds.

``run_analysis`` checks it and makes the run's ``RunSpec`` (analyses/spec.py) from it once; an analysis
reads that spec and its typed options through ``Context``, never the request.  What only steers the run
(where it writes, whether it reuses or replaces a result, whether model code may run, whether cached
vectors are reused) stays here and goes no further than ``run_analysis``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


def _tuple(values) -> tuple[str, ...] | None:
    if values is None:
        return None
    return (str(values),) if isinstance(values, (str, Path)) else tuple(str(v) for v in values)


@dataclass(frozen=True)
class RunRequest:
    """What was asked for one run (keywords as the CLI's options): models, engine, data, options, ..."""

    models: tuple[str, ...]  # as named (--model): paths, hub ids or aliases
    engine: str = "auto"
    layers: str = "all"
    poolings: tuple[str, ...] | None = None  # None: each model's default for the analysis
    data: str | None = None  # None: the analysis's default data, if it has one
    out: Path | None = None  # None: results/<model>/<revision>/<analysis>/<spec hash> (analyses/layout.py)
    seed: int = 0
    options: dict[str, Any] = field(default_factory=dict)  # the analysis's own options by name
    engine_options: dict[str, Any] | None = None  # variant, min_cosine, ... (also read from options["engine_options"])
    labels: tuple[str, ...] | None = None  # a short name per model (--label); default: analyses/labels.py
    max_length: int | None = None  # tokens per text (default: the model's); also caps TensorRT's profile
    batch_tokens: int | None = None  # padded tokens per batch (default: the engine's)
    cache: bool = True  # reuse a matching cached LayerStore of vectors
    trust_remote_code: bool = False  # run the model repo's own code (off unless asked)
    tower: str | None = None  # "vision": a two-tower checkpoint's image tower (the image analyses)
    recompute: bool = False  # run again even when the result dir holds this very run
    force: bool = False  # replace a result dir holding a different run
    console: Any = field(default=None, compare=False, repr=False)  # where progress lines go (None: nowhere)

    def __post_init__(self):
        set_ = object.__setattr__
        set_(self, "models", _tuple(self.models) or ())
        set_(self, "poolings", _tuple(self.poolings) or None)
        set_(self, "labels", _tuple(self.labels) or None)
        set_(self, "data", None if self.data is None else str(self.data))
        set_(self, "out", None if self.out is None else Path(self.out))
        set_(self, "options", dict(self.options or {}))

    def split_options(self) -> tuple[dict[str, Any], dict[str, Any]]:
        """``(analysis options, engine options)``: engine options given in ``options["engine_options"]``
        (a library caller's one options dict) join ``engine_options``."""
        given = dict(self.options)
        engine_options = {**(given.pop("engine_options", None) or {}), **(self.engine_options or {})}
        return given, engine_options
