"""What an extraction is asked to do, built once (by the CLI or ``extract``) and handed to an executor.

Every executor (in-process ``extract``, ``--shard i/N``, Ray) takes the same ``ExtractionRequest`` and
goes through the same steps: ``prepare`` (checks, claim, model, layers, poolings, prompt, settings),
``spool`` (texts.jsonl, its hash), resume checks and finish, so none can drift from the others.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable


@dataclass(frozen=True)
class ReaderOptions:
    """How the corpus reader reads ``source`` (``data/corpus.py``'s ``records_of`` options)."""

    text_field: str | None = None
    column: str | None = None
    id_field: str | None = None
    fmt: str | None = None

    def as_kwargs(self) -> dict[str, Any]:
        return {"text_field": self.text_field, "column": self.column, "id_field": self.id_field, "fmt": self.fmt}


@dataclass(frozen=True)
class ExtractionRequest:
    model: Any  # a name, a path or a ModelHandle
    source: Any  # a corpus path, "-", a HF dataset spec or an in-memory sequence of texts
    out: Path
    engine: Any = "auto"  # a registered engine name, an EngineChoice (resolved already) or an Engine instance
    layers: Any = "all"
    poolings: Any = None  # None: the model's own
    store_dtype: str = "float32"
    batch_tokens: int | None = None
    max_batch: int | None = None
    max_length: int | None = None
    resume: bool = False
    force: bool = False
    reader: ReaderOptions = field(default_factory=ReaderOptions)
    engine_options: tuple[tuple[str, Any], ...] = ()  # sorted (name, value) pairs
    prompt_name: str | None = None
    prompt: str | None = None
    trust_remote_code: bool = False
    tokens: bool = False  # also store every token's vector (in-process executor only)
    progress: bool | str | None | Callable = False

    @property
    def options(self) -> dict[str, Any]:
        return dict(self.engine_options)

    @classmethod
    def of(cls, model, source, out, *, engine_options: dict | None = None, text_field=None, column=None,
           id_field=None, fmt=None, dtype: str | None = None, **kw) -> "ExtractionRequest":
        """Build a request from ``extract``'s keyword arguments (``dtype`` is ``store_dtype``'s old name)."""
        if dtype is not None:
            kw.setdefault("store_dtype", dtype)
        return cls(model=model, source=source, out=Path(out),
                   reader=ReaderOptions(text_field=text_field, column=column, id_field=id_field, fmt=fmt),
                   engine_options=tuple(sorted((engine_options or {}).items())), **kw)

    def prepare_kwargs(self) -> dict[str, Any]:
        """The arguments of ``prepare.prepare_extraction``."""
        return dict(engine=self.engine, layers=self.layers, poolings=self.poolings, dtype=self.store_dtype,
                    batch_tokens=self.batch_tokens, max_batch=self.max_batch, max_length=self.max_length,
                    resume=self.resume, force=self.force, engine_options=self.options or None,
                    prompt_name=self.prompt_name, prompt=self.prompt, trust_remote_code=self.trust_remote_code)
