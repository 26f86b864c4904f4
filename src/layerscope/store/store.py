"""LayerStore: per (pooling, layer) arrays ``[n_texts, hidden]`` on disk, with ids, texts and provenance.

Layout of a store directory::

    store.json             what is in it: layers, poolings, dtype, n, model manifest, run settings
    texts.jsonl            {"id": ..., "text": ...} per row, in corpus order
    arrays/<pooling>/<layer>.npy   float32 or float16 [n, hidden] (memory-mapped)
    done.npy               uint8 [n]: 1 once a row's vectors are on disk

Rows are written where they belong (by corpus index), arrays are flushed before
their rows are marked done, and ``store.json`` is replaced atomically, so a
killed run resumes with no row lost, duplicated or shifted.
"""

from __future__ import annotations

import copy
import json
import os
import secrets
import shutil
import time
from pathlib import Path
from typing import Any, Iterator

import numpy as np

from layerscope.atomic import write_json_atomic
from layerscope.errors import LayerscopeError, StoreError
from layerscope.store import store_dtype as sd
from layerscope.model.manifest_type import Manifest, as_manifest, manifest_dict
from layerscope.store.npy_files import release_pages
from layerscope.store.store_check import checksums, layout_problems
from layerscope.store.store_record import HalfError, StoreRecord
from layerscope.store.store_space import FULL, allocate_npy, check_free, no_space
from layerscope.store.store_spec import FORMAT_VERSION, StoreSpec

from layerscope.store.store_layout import DONE, STORE_JSON, TEXTS, StoreLayout, array_rels


class LayerStore:
    """Open with ``LayerStore.open(path)``; index with ``store["mean", 6]``, ``store["cls", "raw"]``, ``store["mean", -1]``."""

    def __init__(self, path: Path, record: StoreRecord, mode: str = "r"):
        self.path = Path(path)
        self.record = record  # store.json, typed; replaced (never changed in place) by update and finish
        self.mode = mode
        self._arrays: dict[tuple[str, str], np.ndarray] = {}
        self._done: np.ndarray | None = None

    # -- opening -----------------------------------------------------------
    @classmethod
    def open(cls, path: str | Path, *, allow_incomplete: bool = False) -> "LayerStore":
        """The store at ``path`` (a folder ``layerscope extract`` wrote), read-only; its vectors are memory-mapped,
        not read, until asked for: ``store["mean", -1]`` is ``[n_texts, hidden]`` float32 (layers by name or
        index, as ``--layers`` takes them), ``store.tokens(layer)`` the token vectors of a ``--tokens`` store,
        ``store.ids()`` and ``store.texts()`` the rows' ids and texts, ``store.layers``, ``store.poolings`` and
        ``store.manifest`` what it holds and which model made it.

        A damaged store (files missing or of the wrong size, a record that does not parse) raises ``StoreError``
        in one line naming the first problem (``layerscope verify PATH`` lists them all); an incomplete one
        (an interrupted extraction) too, unless ``allow_incomplete``, which opens it as it is (``done_mask()``
        says which rows were written)."""
        path = Path(path)
        record = StoreRecord.read(path)
        problems = layout_problems(path, record)
        if problems:
            more = f" (and {len(problems) - 1} more problems)" if len(problems) > 1 else ""
            raise StoreError(f"{path} is damaged: {problems[0]}{more}; extract again into another --out, or delete "
                             f"this folder yourself first (--force replaces only files layerscope wrote, unchanged; "
                             f"layerscope verify {path} lists every problem)")
        store = cls(path, record, "r")
        # the settings are typed (and refused in one line) before anything relies on them
        store._spec = StoreSpec.load(record.settings, format_version=record.format_version,
                                     where=str(path / STORE_JSON))
        if not record.complete and not allow_incomplete:
            done = int(store.done_mask().sum())
            raise StoreError(f"{path} is incomplete ({done:,} of {record.n:,} rows); finish it with "
                             "layerscope extract ... --resume")
        return store

    @classmethod
    def create(cls, path: str | Path, *, n: int, spec: StoreSpec, hidden_size: int,
               manifest: Manifest | dict) -> "LayerStore":
        """Reserve the arrays of ``spec`` for ``n`` rows and write ``store.json`` (its settings: ``spec``, once)."""
        path = Path(path)
        layers, poolings, dtype = list(spec.layers), list(spec.poolings), spec.dtype
        path.mkdir(parents=True, exist_ok=True)
        where = StoreLayout(path)
        staging = where.staging
        from layerscope.ownership import note

        note(path, files=array_rels(poolings, layers, staging.name) + array_rels(poolings, layers)
             + [f"{staging.name}/{DONE}", DONE, STORE_JSON])  # named before they are written
        if staging.exists():
            shutil.rmtree(staging)
        disk = sd.disk_dtype(dtype)
        needed = n * hidden_size * disk.itemsize * len(layers) * len(poolings) + n
        check_free(path, needed)
        try:
            for pooling in poolings:
                for layer in layers:
                    where.staged_array(pooling, layer).parent.mkdir(parents=True, exist_ok=True)
                    allocate_npy(where.staged_array(pooling, layer), disk, (n, hidden_size))
            allocate_npy(staging / DONE, np.dtype(np.uint8), (n,))
        except OSError as exc:
            shutil.rmtree(staging, ignore_errors=True)
            if exc.errno in FULL:
                raise no_space(path, needed, exc) from None
            raise
        os.replace(staging / DONE, path / DONE)
        if where.arrays.exists():
            shutil.rmtree(where.arrays)
        os.replace(staging, where.arrays)
        doc = {"format_version": FORMAT_VERSION, "n": n, "layers": layers, "poolings": poolings,
               "hidden_size": hidden_size, "dtype": dtype, "complete": False, "manifest": manifest_dict(manifest),
               "settings": spec.to_json(), "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
               "store_id": secrets.token_hex(16)}  # this store, not another made later at the same path
        record = StoreRecord.from_json(doc, where=str(where.store_json))  # what is written is what is read
        record = record.replace(structure_sha256=record.structure_hash(),
                                texts_bytes=where.texts.stat().st_size if where.texts.is_file() else None)
        write_json_atomic(where.store_json, record.to_json())
        store = cls(path, record, "r+")
        store._spec = spec
        return store

    # -- facts ---------------------------------------------------------------
    @property
    def meta(self) -> dict[str, Any]:
        """``store.json`` as written (a copy), for people and tests; layerscope itself reads ``record``."""
        return copy.deepcopy(self.record.to_json())

    @property
    def n(self) -> int:
        return self.record.n

    @property
    def layers(self) -> list[str]:
        return list(self.record.layers)

    @property
    def poolings(self) -> list[str]:
        return list(self.record.poolings)

    @property
    def manifest(self) -> Manifest:
        """The model's manifest as the store recorded it, typed once (a copy made before format versions opens)."""
        if getattr(self, "_manifest", None) is None:
            self._manifest = as_manifest(self.record.manifest, where=f"{self.path / STORE_JSON}'s model manifest")
        return self._manifest

    @property
    def spec(self) -> StoreSpec:
        """What the store holds and how it was asked for (``store.json``'s settings), typed once."""
        if getattr(self, "_spec", None) is None:
            self._spec = StoreSpec.load(self.record.settings, format_version=self.record.format_version,
                                        where=str(self.path / STORE_JSON))
        return self._spec

    @property
    def settings(self) -> dict:
        """``store.json``'s settings as written (the JSON of ``spec``), for readers outside the store."""
        return self.spec.to_json()

    @property
    def hidden_size(self) -> int:
        return self.record.hidden_size

    @property
    def store_id(self) -> str | None:
        """The identity the store was made with (every claim and done mark names it); None in older stores."""
        return self.record.store_id

    @property
    def empty_texts(self) -> int:
        return self.record.empty_texts

    @property
    def nul_texts(self) -> int:
        return self.record.nul_texts

    @property
    def range_rows(self) -> int | None:
        """Rows per range of the store's range plan (None: made before stores recorded one)."""
        return self.record.ranges.rows if self.record.ranges else None

    @property
    def half_error(self) -> dict[str, HalfError]:
        """Per ``pooling/layer``: the largest error and lowest cosine a half-size dtype cost so far."""
        return dict(self.record.half_error)

    @property
    def nul_dropped_by_tokenizer(self) -> bool | None:
        """Whether the tokenizer ignores the corpus's NUL bytes (None: the corpus has none)."""
        return self.record.nul_dropped_by_tokenizer

    @property
    def engine_info(self) -> dict[str, Any]:
        """The engine that wrote the store, as its ``EngineInfo.to_dict()`` recorded it ({} when none yet)."""
        return dict(self.record.engine)

    @property
    def internal_sha256(self) -> dict[str, str]:
        """The sha256 of each internal file a writer relies on (ray-offsets.npy, lengths.npy)."""
        return dict(self.record.internal_sha256)

    @property
    def structure_sha256(self) -> str | None:
        """The hash of store.json's structural fields recorded when the store was made (store_check)."""
        return self.record.structure_sha256

    def file_sha256(self, rel: str) -> str | None:
        """The sha256 recorded for file ``rel`` when the store was finished (None: not recorded)."""
        rec = (self.record.checksums or {}).get(rel)
        return rec.sha256 if rec is not None else None

    @property
    def token_layers(self) -> list[str]:
        """The layers whose token vectors the store holds (``extract --tokens``; [] without them)."""
        sec = self.record.token_arrays
        return list(sec.layers) if sec is not None else []

    @property
    def range_writers(self) -> bool:
        """Whether the store is written range by range (``--shard``, Ray) rather than by one process."""
        return self.record.range_writers

    @property
    def complete(self) -> bool:
        return self.record.complete

    def resolve_layer(self, layer: int | str) -> str:
        """Canonical layer name for ``6``, ``-1``, ``"raw"`` or ``"3"``, checked against what is stored."""
        num_layers = self.manifest.num_layers
        name = str(layer)
        if name != "raw":
            try:
                i = int(name)
            except ValueError:
                raise StoreError(f"layer {layer!r} is not a layer name; use 'raw' or an index") from None
            if i < 0:
                i += num_layers + 1
            name = str(i)
        if name not in self.layers:
            raise StoreError(f"layer {layer} is not in {self.path} (it holds layers {', '.join(self.layers)})")
        return name

    @property
    def dtype(self) -> str:
        """How the vectors are stored on disk (float32, float16 or bfloat16); readers always get float32."""
        return self.record.dtype

    def __getitem__(self, key: tuple[str, int | str]) -> np.ndarray:
        """The float32 vectors ``[n, hidden]`` of one (pooling, layer): memory-mapped for a float32 store,
        decoded into memory for a half-size one."""
        raw = self.raw(key)
        return raw if self.dtype == "float32" else sd.decode(raw, self.dtype)

    def raw(self, key: tuple[str, int | str]) -> np.ndarray:
        """The on-disk array of one (pooling, layer), memory-mapped (bfloat16: uint16 upper halves)."""
        pooling, layer = key
        if pooling not in self.poolings:
            raise StoreError(self._missing_pooling(pooling))
        name = self.resolve_layer(layer)
        k = (pooling, name)
        if k not in self._arrays:
            mode = "r+" if self.mode == "r+" else "r"
            self._arrays[k] = np.load(StoreLayout(self.path).array(pooling, name), mmap_mode=mode)
        return self._arrays[k]

    def _missing_pooling(self, pooling: str) -> str:
        from layerscope.model.stconfig import pooling_words

        try:
            manifest = self.manifest
        except (KeyError, LayerscopeError):  # a store whose manifest cannot be read still names what it holds
            manifest = None
        held = "; ".join(pooling_words(p, manifest) for p in self.poolings)
        return (f"pooling '{pooling}' is not in {self.path} (it holds {held}); ask for one of those, or extract "
                f"again with --pooling {','.join([*self.poolings, str(pooling)])} to store {pooling} too")

    def tokens(self, layer: int | str):
        """Token-level vectors of ``layer`` (stores made with ``extract --tokens``), memory-mapped: a
        ``TokenLayer`` (store/token_store.py) with ``offsets``, ``ids``, ``special``, ``spans`` and
        float32 reads per text (``text(i)``), per token id (``of_id``) or per slice (``rows``)."""
        from layerscope.store.token_store import open_token_layer

        return open_token_layer(self.path, self.record.token_arrays, self.resolve_layer(layer))

    def done_mask(self) -> np.ndarray:
        if self._done is None:
            self._done = np.load(self.path / DONE, mmap_mode="r+" if self.mode == "r+" else "r")
        return self._done

    def iter_records(self) -> Iterator[dict]:
        with open(self.path / TEXTS, encoding="utf-8") as fh:
            for line in fh:
                yield json.loads(line)

    def texts(self) -> list[str]:
        return [r["text"] for r in self.iter_records()]

    def ids(self) -> list[str]:
        return [r["id"] for r in self.iter_records()]

    # -- writing -------------------------------------------------------------
    def write(self, index: np.ndarray, pooled: dict[str, np.ndarray], layers: list[str]) -> None:
        """Write rows ``index`` from engine output ``{pooling: [len(layers), batch, hidden]}``."""
        half = self.dtype != "float32"
        errors = dict(self.record.half_error)
        for pooling, arr in pooled.items():
            for li, layer in enumerate(layers):
                self.raw((pooling, layer))[index] = sd.encode(arr[li], self.dtype)
                if half:
                    key = f"{pooling}/{layer}"
                    errors[key] = errors.get(key, HalfError()).worst(*sd.error_stats(arr[li], self.dtype))
        if half:
            self.record = self.record.replace(half_error=errors)

    def commit(self, index: np.ndarray) -> None:
        """Flush the arrays, then mark rows done (in that order).

        A memmap's flush is ``msync(MS_SYNC)``: it returns once the rows are on the disk, not only in the
        page cache, so an OS crash can lose rows that are not marked done, never mark rows whose vectors
        were lost. ``done`` is changed only after that (a shared mapping reaches the file as soon as it is
        written to). Once flushed, the written pages are released from this process's mapping
        (they stay in the file and the page cache), so the resident memory of a long
        extraction stays flat instead of growing with the store.
        """
        for arr in self._arrays.values():
            arr.flush()
            release_pages(arr)
        if self.record.half_error:  # what the rows about to be marked done lost, kept for a resumed run
            self._write_record()
        done = self.done_mask()
        done[index] = 1
        done.flush()

    def finish(self, **facts: Any) -> None:
        """Record what the run did (``StoreRecord`` fields; ``extra``: what it records for people), mark the
        store complete and write every file's checksum."""
        extra = {**self.record.extra, **facts.pop("extra", {})}
        self.record = self.record.replace(**facts, extra=extra, complete=True,
                                          finished=time.strftime("%Y-%m-%dT%H:%M:%S%z"))
        self.close()
        self.update(checksums=checksums(self.path, self.record))

    def update(self, **changes: Any) -> None:
        """Change ``StoreRecord`` fields and write ``store.json`` again (atomically)."""
        self.record = self.record.replace(**changes)
        self._write_record()

    def add_token_arrays(self, section) -> None:
        """Record the token arrays just reserved (``token_store.TokenSection``); they are part of the
        structure hash, so it is taken again."""
        self.record = self.record.with_token_arrays(section)
        self._write_record()

    def _write_record(self) -> None:
        write_json_atomic(self.path / STORE_JSON, self.record.to_json())

    def close(self) -> None:
        for arr in self._arrays.values():
            if isinstance(arr, np.memmap) and self.mode == "r+":
                arr.flush()
        self._arrays.clear()
        self._done = None

    @staticmethod
    def verify(path: str | Path) -> tuple[int, list[str]]:
        """Re-hash every file of the store at ``path``: (files checked, one line per problem)."""
        path = Path(path)
        try:
            record = StoreRecord.read(path)
        except StoreError as exc:
            return 0, [str(exc)]
        try:
            StoreSpec.load(record.settings, format_version=record.format_version, where=str(path / STORE_JSON))
            unread = []
        except StoreError as exc:
            unread = [str(exc)]
        from layerscope.store.store_check import verify

        checked, problems = verify(path, record)
        return checked, unread + problems

    def __repr__(self) -> str:
        state = "complete" if self.complete else "incomplete"
        return (f"LayerStore({str(self.path)!r}, n={self.n}, layers={self.layers}, "
                f"poolings={self.poolings}, {state})")


def recorded_store_id(path: str | Path) -> str | None:
    """The identity store.json at ``path`` names now, read afresh (None: no store there, or one without)."""
    try:
        return StoreRecord.read(path).store_id
    except StoreError:
        return None
