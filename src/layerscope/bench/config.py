"""What one in-process bench run is asked for: the model, the rows, the texts and the knobs of each row."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable


@dataclass
class BenchConfig:
    model: str
    engines: list[str]
    texts: list[str]
    corpus: str
    layers: str = "all-hidden"
    pooling: str = "mean"
    batch_tokens: int | None = None  # None: each engine's preferred budget
    max_batch: int = 256
    hf_batch_size: int = 64
    st_batch_size: int = 32
    max_length: int | None = None
    sts: str | None = None
    make_variants: bool = True
    include_st: bool = True
    threads: int | None = None
    trust_remote_code: bool = False  # the user's flag: rows loading the model (hf-eager, torch, peers) run its code
    accuracy_rows: int = 4096
    progress: Callable[[str], None] | None = None
    extra: dict[str, Any] = field(default_factory=dict)
