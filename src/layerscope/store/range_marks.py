"""What a range writer leaves under a store's ``ranges/`` (store/store_ranges.py), typed: the done mark
``<k>.done`` (``DoneMark``: the range's rows, tokens, who wrote it and with what engine, variant and batch size,
the half-size error per pooling/layer, the store it was written for) and the claim ``<k>.claim``
(``ClaimRecord``: host, pid, the process's start time, the machine's boot id, a token, when, the store).

Each is written by ``to_json`` and read by ``read``, which checks every field it holds: a done mark with an
ill-typed field is one ``StoreError`` line naming the file and the field; a claim that no worker could have
written is reported as the reason it is damaged (``ClaimRecord.problem``), which makes it stale. A done mark from
an older writer lacks some fields: they read as not recorded.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from layerscope.errors import StoreError

MAX_PID = 1 << 22  # Linux's largest pid_max; a larger "pid" was not written by a worker


class _Bad(Exception):
    pass


def _get(doc: Mapping[str, Any], key: str, kind, default: Any = None) -> Any:
    """``doc[key]`` checked to be ``kind`` (a bool is never a number); ``default`` where absent or null."""
    value = doc.get(key)
    if value is None:
        return default
    if (isinstance(value, bool) and kind is not bool) or not isinstance(value, kind):
        wanted = kind.__name__ if isinstance(kind, type) else " or ".join(k.__name__ for k in kind)
        raise _Bad(f"{key} is {type(value).__name__}, not {wanted}")
    return value


def _half_error(value: Any) -> dict[str, tuple[float, float]]:
    """``{"pooling/layer": [max abs error, min cosine]}``."""
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise _Bad(f"half_error is {type(value).__name__}, not an object")
    out = {}
    for key, pair in value.items():
        if (not isinstance(pair, list) or len(pair) != 2
                or any(isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) for v in pair)):
            raise _Bad(f"half_error.{key} is not [max abs error, min cosine]")
        out[str(key)] = (float(pair[0]), float(pair[1]))
    return out


@dataclass(frozen=True)
class DoneMark:
    """Range ``k`` is durable: rows ``[start, stop)``, its tokens, the host and pid that wrote it and how long it
    took, the batch size, the engine (``EngineInfo.to_dict()``), the variant it ran, the half-size error per
    ``pooling/layer`` and the identity of the store it was written for (None where not recorded)."""

    k: int
    start: int | None = None
    stop: int | None = None
    tokens: int = 0
    host: str | None = None
    pid: int | None = None
    seconds: float | None = None
    write_s: float = 0.0
    batch_tokens: int | None = None
    engine: Mapping[str, Any] | None = None
    half_error: Mapping[str, tuple[float, float]] = field(default_factory=dict)
    variant: str | None = None
    variant_known: bool = True  # False: written before marks recorded the variant (no claim either way)
    store: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {"k": self.k, "start": self.start, "stop": self.stop, "tokens": self.tokens, "host": self.host,
                "pid": self.pid, "seconds": self.seconds, "write_s": self.write_s, "batch_tokens": self.batch_tokens,
                "engine": dict(self.engine) if self.engine is not None else None,
                "half_error": {key: list(pair) for key, pair in self.half_error.items()}, "variant": self.variant,
                "store": self.store}

    @classmethod
    def read(cls, doc: Any, path: str | Path, k: int) -> DoneMark:
        """The mark of range ``k`` as read from ``path`` (``doc``: its JSON, None where it could not be parsed:
        a mark that records nothing); an ill-typed field is one line naming the file and the field."""
        if doc is None:
            return cls(k, variant_known=False)
        try:
            if not isinstance(doc, Mapping):
                raise _Bad(f"it holds a JSON {type(doc).__name__}, not an object")
            engine = _get(doc, "engine", dict)
            seconds = _get(doc, "seconds", (int, float))
            return cls(k=_get(doc, "k", int, k), start=_get(doc, "start", int), stop=_get(doc, "stop", int),
                       tokens=_get(doc, "tokens", int, 0), host=_get(doc, "host", str), pid=_get(doc, "pid", int),
                       seconds=None if seconds is None else float(seconds),
                       write_s=float(_get(doc, "write_s", (int, float), 0.0)),
                       batch_tokens=_get(doc, "batch_tokens", int), engine=None if engine is None else dict(engine),
                       half_error=_half_error(doc.get("half_error")), variant=_get(doc, "variant", str),
                       variant_known="variant" in doc, store=_get(doc, "store", str))
        except _Bad as exc:
            raise StoreError(f"{path}: {exc}; this done mark was edited or written by another version: delete it "
                             "and run its range again (layerscope extract ... --shard i/N)") from None


def marked_store(doc: Any) -> str | None:
    """The store identity a done mark's or claim's JSON names (None: none recorded, or not readable as one)."""
    value = doc.get("store") if isinstance(doc, Mapping) else None
    return value if isinstance(value, str) else None


@dataclass(frozen=True)
class ClaimRecord:
    """Who holds a range: host, pid, the process's start time (clock ticks since boot) and the machine's boot
    id (None where the system has none), the claim's random token, when it was made and the store's identity."""

    host: str
    pid: int
    started: int | None = None
    boot: str | None = None
    token: str | None = None
    since: float | None = None
    store: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {"host": self.host, "pid": self.pid, "started": self.started, "boot": self.boot, "token": self.token,
                "since": self.since, "store": self.store}

    @staticmethod
    def problem(doc: Any) -> str | None:
        """Why a parsed claim cannot have been written by a worker, or None when it is well formed."""
        if not isinstance(doc, Mapping):
            return f"it holds a JSON {type(doc).__name__}, not a claim"
        pid = doc.get("pid")
        if not isinstance(pid, int) or isinstance(pid, bool) or not 0 < pid <= MAX_PID:
            return f"its pid {str(pid)[:40]!r} is not a process id"
        if not isinstance(doc.get("host"), str):
            return "it names no host"
        started = doc.get("started")
        if started is not None and (not isinstance(started, int) or isinstance(started, bool)):
            return f"its start time {str(started)[:40]!r} is not a number"
        if doc.get("boot") is not None and not isinstance(doc.get("boot"), str):
            return "its boot id is not text"
        if doc.get("store") is not None and not isinstance(doc.get("store"), str):
            return "its store identity is not text"
        return None

    @classmethod
    def read(cls, doc: Any) -> ClaimRecord | None:
        """The claim, or None where no worker could have written it (``problem`` says why)."""
        if cls.problem(doc) is not None:
            return None
        token, since = doc.get("token"), doc.get("since")
        return cls(doc["host"], doc["pid"], doc.get("started"), doc.get("boot"),
                   token if isinstance(token, str) else None,
                   float(since) if isinstance(since, (int, float)) and not isinstance(since, bool) else None,
                   marked_store(doc))
