"""``IndexRecord``: an index folder's ``index.json``, typed, read and checked once.

This module is the only reader of ``index.json`` by key. What the FAISS index is (``kind``, ``n``, ``dim``,
its build ``params``, the backend that built it) is required; what it was built from (the store, its
identity, the model, layer and pooling, the max length queries are embedded with) is there for every index
``index build`` makes, and absent (None) for one saved by a library caller without it. A field of the wrong
type is refused in one line naming it and saying to rebuild the index.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Mapping

from layerscope.errors import StoreError

KINDS = ("flat", "ivf", "hnsw", "binary")
INDEX_FORMAT = 1
IDENTITY_FIELDS = ("corpus_sha256", "texts_sha256", "array_sha256", "structure_sha256", "n")


@dataclass(frozen=True)
class StoreIdentity:
    """What an index must find again in its store: the corpus hash, the recorded checksums of the texts and
    of the indexed array, the store's structure hash and its row count."""

    corpus_sha256: str | None
    texts_sha256: str | None
    array_sha256: str | None
    structure_sha256: str | None
    n: int

    def changed(self, now: "StoreIdentity") -> list[str]:
        """The fields ``now`` differs in, in ``IDENTITY_FIELDS`` order."""
        return [k for k in IDENTITY_FIELDS if getattr(self, k) != getattr(now, k)]

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class Recall:
    """Recall@k of an approximate index against exact search, on ``queries`` stored vectors."""

    recall_at_k: float
    k: int
    queries: int

    def to_json(self) -> dict[str, Any]:
        return {"recall@k": self.recall_at_k, "k": self.k, "queries": self.queries}


@dataclass(frozen=True)
class BuildSeconds:
    """How long the build took: normalising the vectors, building the index."""

    normalize: float
    build: float

    def to_json(self) -> dict[str, float]:
        return {"normalize": self.normalize, "build": self.build}


@dataclass(frozen=True)
class IndexRecord:
    kind: str
    n: int
    dim: int
    backend: str  # the backend that built it
    params: Mapping[str, Any] = field(default_factory=dict)
    normalized: bool = True
    format: int = INDEX_FORMAT
    # what it was built from (None: saved without it)
    model_key: str | None = None
    model: Mapping[str, Any] | None = None  # the model's source entry as its store's manifest records it
    family: str | None = None
    num_layers: int | None = None
    layer: str | None = None
    pooling: str | None = None
    store: str | None = None  # the store's absolute path
    store_created: str | None = None
    store_identity: StoreIdentity | None = None
    max_length: int | None = None
    seconds: BuildSeconds | None = None
    recall_vs_exact: Recall | None = None
    backend_detail: str | None = None
    created: str | None = None
    backend_used: str | None = None  # where this process searched (never written)

    def replace(self, **changes: Any) -> "IndexRecord":
        return dataclasses.replace(self, **changes)

    @property
    def model_label(self) -> str:
        """The name people know the index's model by (its alias, spec, or path or hub id)."""
        src = self.source
        return (src.alias or src.spec or src.path_or_id or "?") if src is not None else "?"

    @property
    def source(self):
        """The model's ``SourceInfo`` (None: not recorded)."""
        from layerscope.model.manifest_type import SourceInfo

        return SourceInfo.from_dict(self.model) if self.model else None

    def to_json(self) -> dict[str, Any]:
        doc = {"format": self.format, "kind": self.kind, "n": self.n, "dim": self.dim, "normalized": self.normalized,
               "params": dict(self.params), "backend": self.backend, "model_key": self.model_key,
               "model": None if self.model is None else dict(self.model), "family": self.family,
               "num_layers": self.num_layers, "layer": self.layer, "pooling": self.pooling, "store": self.store,
               "store_created": self.store_created,
               "store_identity": self.store_identity.to_json() if self.store_identity else None,
               "max_length": self.max_length, "seconds": self.seconds.to_json() if self.seconds else None,
               "recall_vs_exact": self.recall_vs_exact.to_json() if self.recall_vs_exact else None,
               "backend_detail": self.backend_detail, "created": self.created}
        return {k: v for k, v in doc.items() if v is not None}

    @classmethod
    def from_json(cls, doc: Any, *, where: str) -> "IndexRecord":
        """The record of an ``index.json`` document; one line when a field is missing or of the wrong type."""
        if not isinstance(doc, dict):
            raise StoreError(f"{where} is not a JSON object; rebuild the index")
        if doc.get("format") != INDEX_FORMAT:
            raise StoreError(f"{where} has index format {doc.get('format')}, this layerscope reads {INDEX_FORMAT}")
        kind, n, dim = doc.get("kind"), doc.get("n"), doc.get("dim")
        if kind not in KINDS or not _count(n) or not _count(dim):
            raise StoreError(f"{where} is damaged (kind {kind!r}, n {n!r}, dim {dim!r}; kinds: {', '.join(KINDS)}); "
                             "rebuild the index")
        try:
            return cls(kind=str(kind), n=int(n), dim=int(dim), backend=str(doc.get("backend") or ""),
                       params=dict(_of(doc, "params", dict) or {}), normalized=bool(doc.get("normalized", True)),
                       model_key=_text(doc, "model_key"), model=_of(doc, "model", dict), family=_text(doc, "family"),
                       num_layers=_int(doc, "num_layers"), layer=_text(doc, "layer"), pooling=_text(doc, "pooling"),
                       store=_text(doc, "store"), store_created=_text(doc, "store_created"),
                       store_identity=_identity(_of(doc, "store_identity", dict)),
                       max_length=_int(doc, "max_length"),
                       seconds=_seconds(_of(doc, "seconds", dict)),
                       recall_vs_exact=_recall(_of(doc, "recall_vs_exact", dict)),
                       backend_detail=_text(doc, "backend_detail"), created=_text(doc, "created"))
        except _Bad as bad:
            raise StoreError(f"{where} is damaged: its {bad} is not what an index records; rebuild the index") \
                from None
        except (KeyError, TypeError, ValueError) as exc:
            raise StoreError(f"{where} is damaged ({exc!r}); rebuild the index") from None


class _Bad(Exception):
    pass


def _count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _of(doc: dict, key: str, kind: type) -> Any:
    value = doc.get(key)
    if value is not None and not isinstance(value, kind):
        raise _Bad(key)
    return value


def _text(doc: dict, key: str) -> str | None:
    value = _of(doc, key, (str, int))
    return None if value is None else str(value)


def _int(doc: dict, key: str) -> int | None:
    value = doc.get(key)
    if value is None:
        return None
    if not _count(value):
        raise _Bad(key)
    return int(value)


def _identity(value: dict | None) -> StoreIdentity | None:
    if value is None:
        return None
    n = value.get("n")
    if not _count(n):
        raise _Bad("store_identity")
    texts = {k: value.get(k) for k in IDENTITY_FIELDS if k != "n"}
    if not all(v is None or isinstance(v, str) for v in texts.values()):
        raise _Bad("store_identity")
    return StoreIdentity(n=int(n), **texts)


def _seconds(value: dict | None) -> BuildSeconds | None:
    return None if value is None else BuildSeconds(float(value["normalize"]), float(value["build"]))


def _recall(value: dict | None) -> Recall | None:
    if value is None:
        return None
    return Recall(float(value["recall@k"]), int(value["k"]), int(value["queries"]))
