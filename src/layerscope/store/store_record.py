"""``StoreRecord``: a LayerStore's ``store.json``, typed, read and checked once.

This module and ``store_spec.py`` (the ``settings`` section) are the only readers of ``store.json`` by key.
Everything else (the store, its checks, the writers, the index, the report) reads attributes of a
``StoreRecord``, and changes one by ``replace`` and ``LayerStore.update``. A field of the wrong type is
refused here in one line naming it (a ``StoreError``), before any array is opened, never a ``KeyError`` later.

What the file holds, by the format it was written in (``store_spec.READS``: 1 and 2 open):

* what the arrays are: ``n``, ``layers``, ``poolings``, ``hidden_size``, ``dtype``, the model ``manifest``
  (as embedded: typed by ``LayerStore.manifest``; its ``num_layers``, ``hidden_size`` and ``modality`` are
  checked here) and ``token_arrays`` (``TokenSection``); their hash, ``structure_sha256``;
* how it was asked for: ``settings`` (``StoreSpec``, loaded by ``LayerStore.spec``);
* what the corpus was: ``empty_texts``, ``nul_texts``, ``id_field``, ``nul_dropped_by_tokenizer``,
  ``texts_bytes``;
* how it is written: ``ranges`` (``RangePlan``), ``range_writers``, ``internal_sha256``, ``store_id``;
* what the run did: ``complete``, ``engine``, ``truncated_texts``, ``tokens``, ``warnings``, ``half_error``,
  ``ran``, ``checksums`` (``FileSum`` per file), ``created``, ``finished``;
* ``extra``: what a run recorded for people (timings, Ray's counts, an image count): written back as it
  was, never read by layerscope.

A store written before a field existed opens with that field's default.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from layerscope.errors import StoreError
from layerscope.store.store_dtype import STORE_DTYPES
from layerscope.store.store_layout import STORE_JSON
from layerscope.store.store_spec import READS
from layerscope.store.token_store import TokenSection

REMAKE = "extract again into another --out (layerscope verify lists every problem)"


@dataclass(frozen=True)
class FileSum:
    """One file's checksum, recorded when the store completed."""

    sha256: str
    bytes: int

    def to_json(self) -> dict[str, Any]:
        return {"sha256": self.sha256, "bytes": self.bytes}


@dataclass(frozen=True)
class RangePlan:
    """How the store is cut into ranges for range writers (``--shard``, Ray): rows per range, ranges."""

    rows: int
    count: int

    def to_json(self) -> dict[str, Any]:
        return {"rows": self.rows, "count": self.count}


@dataclass(frozen=True)
class HalfError:
    """What a half-size dtype cost one (pooling, layer) so far: the largest error, the lowest cosine."""

    max_abs_error: float = 0.0
    min_cosine: float = 1.0

    def worst(self, err: float, cos: float) -> "HalfError":
        return HalfError(max(self.max_abs_error, float(err)), min(self.min_cosine, float(cos)))

    def to_json(self) -> dict[str, float]:
        return {"max_abs_error": self.max_abs_error, "min_cosine": self.min_cosine}


@dataclass(frozen=True)
class StoreRecord:
    format_version: int
    n: int
    layers: tuple[str, ...]
    poolings: tuple[str, ...]
    hidden_size: int
    dtype: str  # float32, float16 or bfloat16: how the vectors are on disk
    manifest: Mapping[str, Any]  # the model's manifest as embedded (LayerStore.manifest types it)
    num_layers: int  # the manifest's
    manifest_hidden_size: int | None  # the manifest's (None: it does not say)
    modality: str  # the manifest's: text or image
    settings: Mapping[str, Any] | None  # StoreSpec's JSON (store_spec.StoreSpec.load reads it)
    corpus_sha256: str | None = None  # the settings' (hashed with the structure)
    complete: bool = False
    created: str | None = None
    finished: str | None = None
    store_id: str | None = None  # None: made before stores had an identity
    structure_sha256: str | None = None  # None: made before it was recorded
    texts_bytes: int | None = None
    checksums: Mapping[str, FileSum] | None = None  # None: none recorded (incomplete, or an older store)
    internal_sha256: Mapping[str, str] = field(default_factory=dict)  # files a writer relies on
    empty_texts: int = 0
    nul_texts: int = 0
    id_field: str | None = None
    nul_dropped_by_tokenizer: bool | None = None  # None: the corpus has no NUL bytes
    ranges: RangePlan | None = None  # None: made before stores recorded a range plan
    range_writers: bool = False  # written range by range (--shard, Ray) rather than by one process
    engine: Mapping[str, Any] = field(default_factory=dict)  # EngineInfo.to_dict() of the engine that wrote it
    half_error: Mapping[str, HalfError] = field(default_factory=dict)  # per "pooling/layer"
    token_arrays: TokenSection | None = None
    tokens: int | None = None  # tokens the run fed (the count; token_arrays says what is stored)
    truncated_texts: int | None = None
    warnings: tuple[str, ...] | None = None  # None: not finished yet
    ran: Mapping[str, Any] | None = None  # what range writers ran with (variant, batch tokens)
    extra: Mapping[str, Any] = field(default_factory=dict)  # written for people, never read

    def replace(self, **changes: Any) -> "StoreRecord":
        return dataclasses.replace(self, **changes)

    def with_token_arrays(self, section: TokenSection) -> "StoreRecord":
        """This record holding ``section``, its structure hash taken again (the section is part of it)."""
        got = self.replace(token_arrays=section)
        return got.replace(structure_sha256=got.structure_hash())

    def structure_hash(self) -> str:
        """Hash of the fields that say what the arrays hold; recorded at creation, checked on every open."""
        fields = {"format_version": self.format_version, "n": self.n, "layers": list(self.layers),
                  "poolings": list(self.poolings), "hidden_size": self.hidden_size, "dtype": self.dtype,
                  "manifest": self.manifest, "corpus_sha256": self.corpus_sha256}
        if self.token_arrays is not None:
            fields["token_arrays"] = self.token_arrays.to_dict()
        fields = json.loads(json.dumps(fields))  # as store.json holds them (keys as strings, tuples as lists)
        blob = json.dumps(fields, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
        return hashlib.sha256(blob.encode("utf-8")).hexdigest()

    # -- JSON -------------------------------------------------------------------
    def to_json(self) -> dict[str, Any]:
        """``store.json`` as written (fields without a value left out; ``extra`` as it was)."""
        doc: dict[str, Any] = {
            "format_version": self.format_version, "n": self.n, "layers": list(self.layers),
            "poolings": list(self.poolings), "hidden_size": self.hidden_size, "dtype": self.dtype,
            "complete": self.complete, "manifest": self.manifest, "settings": self.settings,
            "created": self.created, "store_id": self.store_id, "structure_sha256": self.structure_sha256,
            "texts_bytes": self.texts_bytes, "empty_texts": self.empty_texts, "nul_texts": self.nul_texts,
            "id_field": self.id_field, "nul_dropped_by_tokenizer": self.nul_dropped_by_tokenizer,
            "internal_sha256": dict(self.internal_sha256) or None,
            "ranges": self.ranges.to_json() if self.ranges else None, "range_writers": self.range_writers,
            "token_arrays": self.token_arrays.to_dict() if self.token_arrays else None,
            "engine": dict(self.engine) or None, "ran": dict(self.ran) if self.ran is not None else None,
            "truncated_texts": self.truncated_texts, "tokens": self.tokens,
            "warnings": None if self.warnings is None else list(self.warnings),
            "half_error": {k: v.to_json() for k, v in self.half_error.items()} or None,
            "finished": self.finished,
            "checksums": None if self.checksums is None else {k: v.to_json() for k, v in self.checksums.items()},
        }
        doc = {k: v for k, v in doc.items() if v is not None}
        return {**doc, **{k: v for k, v in self.extra.items() if k not in doc}}

    @classmethod
    def read(cls, root: str | Path) -> "StoreRecord":
        """The record of the store at ``root``; one line when there is none or it cannot be read."""
        path = Path(root) / STORE_JSON
        try:
            text = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            raise StoreError(f"{root} is not a layer store (no {STORE_JSON}); make one with layerscope extract") \
                from None
        except (OSError, UnicodeDecodeError) as exc:
            raise StoreError(f"{path} cannot be read ({exc}); {REMAKE}") from None
        try:
            doc = json.loads(text)
        except json.JSONDecodeError as exc:
            raise StoreError(f"{path} is damaged ({exc}); re-run layerscope extract") from None
        return cls.from_json(doc, where=str(path))

    @classmethod
    def of(cls, value: "StoreRecord | Mapping[str, Any]", *, where: str = STORE_JSON) -> "StoreRecord":
        """``value`` as a record (a document read elsewhere is checked here)."""
        return value if isinstance(value, StoreRecord) else cls.from_json(value, where=where)

    @classmethod
    def from_json(cls, doc: Any, *, where: str = STORE_JSON) -> "StoreRecord":
        """The record of a ``store.json`` document; a field of the wrong type is one line naming it."""
        if not isinstance(doc, dict):
            raise StoreError(f"{where} is not a JSON object; {REMAKE}")
        version = doc.get("format_version")
        if isinstance(version, bool) or version not in READS:
            raise StoreError(f"{where} has store format {version}, this layerscope reads "
                             f"{', '.join(map(str, READS))}; re-run layerscope extract")
        f = _Fields(doc, where)
        manifest = f.get("manifest", dict, required=True)
        mf = _Fields(manifest, f"{where}'s model manifest")
        settings = f.get("settings", dict)
        known = {fl.name for fl in dataclasses.fields(cls)} - {"num_layers", "manifest_hidden_size", "modality",
                                                               "corpus_sha256", "extra"}
        return cls(
            format_version=int(version), n=f.count("n", required=True), layers=f.names("layers"),
            poolings=f.names("poolings"), hidden_size=f.count("hidden_size", required=True),
            dtype=f.choice("dtype", STORE_DTYPES), manifest=manifest, num_layers=mf.count("num_layers", required=True),
            manifest_hidden_size=mf.count("hidden_size"), modality=str(manifest.get("modality") or "text"),
            settings=settings,
            corpus_sha256=_text((settings or {}).get("corpus_sha256")),
            complete=bool(doc.get("complete")), created=_text(doc.get("created")), finished=_text(doc.get("finished")),
            store_id=_text(doc.get("store_id")), structure_sha256=_text(doc.get("structure_sha256")),
            texts_bytes=f.count("texts_bytes"), checksums=_checksums(doc.get("checksums"), where),
            internal_sha256={str(k): str(v) for k, v in (f.loose("internal_sha256", dict) or {}).items()},
            empty_texts=f.count("empty_texts") or 0, nul_texts=f.count("nul_texts") or 0,
            id_field=_text(doc.get("id_field")),
            nul_dropped_by_tokenizer=None if doc.get("nul_dropped_by_tokenizer") is None
            else bool(doc.get("nul_dropped_by_tokenizer")),
            ranges=_ranges(f.loose("ranges", dict)), range_writers=bool(doc.get("range_writers")),
            engine=dict(f.loose("engine", dict) or {}), half_error=_half_error(f.get("half_error", dict), where),
            token_arrays=_token_arrays(doc.get("token_arrays"), where),
            tokens=f.count("tokens"), truncated_texts=f.count("truncated_texts"),
            warnings=_warnings(f.get("warnings", list)), ran=f.get("ran", dict),
            extra={k: v for k, v in doc.items() if k not in known})


def embedded_manifest(doc: Any) -> Mapping[str, Any]:
    """The model manifest a ``store.json`` document embeds, read leniently ({} when it has none): the cache
    listing names the model of a store it cannot open too, so that it can be cleared."""
    manifest = doc.get("manifest") if isinstance(doc, dict) else None
    return manifest if isinstance(manifest, dict) else {}


class _Fields:
    """Typed reads of one JSON object, each refused in one line naming the field."""

    def __init__(self, doc: dict[str, Any], where: str):
        self.doc, self.where = doc, where

    def _bad(self, key: str, what: str) -> StoreError:
        return StoreError(f"{self.where} is damaged: its {key} is {str(self.doc.get(key))[:60]!r}, not {what}; "
                          f"{REMAKE}")

    def get(self, key: str, kind: type, *, required: bool = False) -> Any:
        value = self.doc.get(key)
        if value is None and not required:
            return None
        if not isinstance(value, kind):
            raise self._bad(key, f"a JSON {'object' if kind is dict else 'list'}")
        return value

    def loose(self, key: str, kind: type) -> Any:
        """A field older stores may hold in another shape: anything else reads as absent."""
        value = self.doc.get(key)
        return value if isinstance(value, kind) else None

    def count(self, key: str, *, required: bool = False) -> int | None:
        value = self.doc.get(key)
        if value is None and not required:
            return None
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise self._bad(key, "a count")
        return value

    def names(self, key: str) -> tuple[str, ...]:
        value = self.doc.get(key)
        if not isinstance(value, list) or not all(isinstance(x, str) for x in value):
            raise self._bad(key, "a list of names")
        return tuple(value)

    def choice(self, key: str, choices: tuple[str, ...]) -> str:
        value = self.doc.get(key)
        if value not in choices:
            raise self._bad(key, f"one of {', '.join(choices)}")
        return str(value)


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


def _warnings(value: list | None) -> tuple[str, ...] | None:
    return None if value is None else tuple(str(w) for w in value)


def _checksums(value: Any, where: str) -> dict[str, FileSum] | None:
    if value is None:
        return None
    try:
        if not isinstance(value, dict):
            raise TypeError
        return {str(rel): FileSum(str(rec["sha256"]), int(rec["bytes"])) for rel, rec in value.items()}
    except (KeyError, TypeError, ValueError):
        raise StoreError(f"{where}'s checksums are not a table of files (sha256 and bytes of each); {REMAKE}") \
            from None


def _ranges(value: dict | None) -> RangePlan | None:
    rows = value.get("rows") if value else None
    if isinstance(rows, bool) or not isinstance(rows, int) or rows <= 0:
        return None
    count = value.get("count")
    return RangePlan(rows, int(count) if isinstance(count, int) else 0)


def _half_error(value: dict | None, where: str) -> dict[str, HalfError]:
    try:
        return {str(k): HalfError(float(v["max_abs_error"]), float(v["min_cosine"])) for k, v in (value or {}).items()}
    except (KeyError, TypeError, ValueError):
        raise StoreError(f"{where}'s half_error is not a table of errors per pooling/layer; {REMAKE}") from None


def _token_arrays(value: Any, where: str) -> TokenSection | None:
    if not value:
        return None
    try:
        if not isinstance(value, dict):
            raise TypeError(type(value).__name__)
        layers = value["layers"]
        if not isinstance(layers, list) or value["dtype"] not in STORE_DTYPES:
            raise ValueError(f"layers {layers!r}, dtype {value['dtype']!r}")
        return TokenSection(layers=[str(x) for x in layers], total_tokens=int(value["total_tokens"]),
                            dtype=str(value["dtype"]), hidden_size=int(value["hidden_size"]))
    except (KeyError, TypeError, ValueError) as exc:
        raise StoreError(f"{where}'s token_arrays section is damaged ({exc}); re-run layerscope extract "
                         "--force") from None
