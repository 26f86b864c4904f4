"""``RunSpec``: everything that makes one analysis run what it is, made once where the run starts.

The run's identity (whether a saved result is this very run), results.json's ``settings``, the
vector cache's extraction settings and the default result folder all derive from one frozen
``RunSpec``; none of them is rebuilt from the loose settings elsewhere, so they cannot disagree.

Also here: the typed options of an analysis (a frozen dataclass generated from its declared
``Option``s, every default filled in). results.json itself, typed: report/results.py.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from layerscope.errors import InputError

# ---------------------------------------------------------------- typed analysis options

def options_type(meta) -> type:
    """The frozen dataclass of an analysis's declared options (``meta``: its AnalysisMetadata), made once."""
    try:
        return _options_type(meta)
    except TypeError:  # a default that cannot be hashed: made afresh
        return _options_type.__wrapped__(meta)


@lru_cache(maxsize=None)
def _options_type(meta) -> type:
    from typing import Optional

    fields = [(o.name, o.type if o.default is not None or o.type is bool else Optional[o.type],
               dataclasses.field(default=o.default)) for o in meta.options]
    cls_name = "".join(part.capitalize() for part in meta.name.replace("-", "_").split("_")) + "Options"
    return dataclasses.make_dataclass(cls_name, fields, frozen=True)


def make_options(meta, given: dict[str, Any], say=None):
    """The analysis's options: ``given`` over the declared defaults.

    A name the analysis does not declare (a library caller sharing one options dict between analyses;
    the CLI refuses them while parsing) is left out, and ``say`` is told which, with the closest name.
    """
    from layerscope.errors import did_you_mean

    declared = [o.name for o in meta.options]
    for name in given:
        if name not in declared and say is not None:
            say(f"analysis '{meta.name}' has no option {name!r}{did_you_mean(name, declared)}; ignored "
                f"(its options: {', '.join(declared) or 'none'})")
    return options_type(meta)(**{k: v for k, v in given.items() if k in declared})


def options_dict(options) -> dict[str, Any]:
    return {f.name: getattr(options, f.name) for f in dataclasses.fields(options)}


# ---------------------------------------------------------------- the spec

@dataclass(frozen=True)
class ModelSpec:
    """One model of a run, resolved where the run started."""

    given: str  # as the user named it (--model)
    key: str  # its weights identity (ModelHandle.key), or a store's identity
    folder: str  # its folder name under the results root
    revision: str  # its revision folder (the hub revision, else a short weights hash)
    layers: tuple[str, ...] | None = None  # --layers resolved for this model (None: read from stores)
    poolings: tuple[str, ...] | None = None  # --pooling checked for this model
    engine: str | None = None  # the engine that runs it: what `auto` picked, else the one asked for
    variant: str | None = None  # the precision variant that engine loads (None: the fp32 graph)


def _frozen_items(d: dict[str, Any] | None) -> tuple[tuple[str, Any], ...]:
    return tuple(sorted((d or {}).items()))


@dataclass(frozen=True)
class RunSpec:
    """A whole analysis run: models, engine (as asked and as resolved), extraction settings, data, options.

    Made once from the run's request (``RunRequest``), before any model is read, with ``models`` empty:
    ``prepare`` reads that spec; ``with_models`` adds each model as resolved, and the result is what the
    identity, the settings, the folder and every ``compute`` read.
    """

    analysis: str
    models: tuple[ModelSpec, ...]  # each model as resolved (empty until the models are resolved)
    engine: str  # as asked (e.g. "auto"); each ModelSpec.engine is what runs
    layers: str  # as asked; each ModelSpec.layers is what it resolved to
    poolings: tuple[str, ...] | None  # as asked (None: each model's default)
    max_length: int | None
    batch_tokens: int | None
    engine_options: tuple[tuple[str, Any], ...]  # sorted (name, value): variant, min_cosine, ...
    data: str | None  # as given (a path, hf:..., a generator name)
    data_sha256: str | None  # the data file's content, when it is a file
    seed: int
    options: tuple[tuple[str, Any], ...]  # sorted (name, value): every declared option, defaults filled in
    labels: tuple[str, ...] | None = None  # --label, as given (None: names derived from the models)
    given_models: tuple[str, ...] = ()  # --model, as named (a run from stores resolves to the stores instead)
    contents: tuple[tuple[str, str | None], ...] = ()  # (option, sha256 of the file or folder it names): the
    # options declared ``content`` (a tuned lens's folder), so files changed under the same name make another run

    @classmethod
    def make(cls, analysis: str, models, *, engine: str, layers: str, poolings, max_length, batch_tokens,
             engine_options: dict[str, Any] | None, data: str | None, seed: int, options,
             labels=None, given_models=(), contents=()) -> RunSpec:
        return cls(analysis=analysis, models=tuple(models), engine=engine, layers=str(layers),
                   poolings=tuple(poolings) if poolings else None, max_length=max_length,
                   batch_tokens=batch_tokens, engine_options=_frozen_items(_plain(engine_options)),
                   data=None if data is None else str(data), data_sha256=_file_sha256(data), seed=int(seed),
                   options=_frozen_items(_plain(options_dict(options) if dataclasses.is_dataclass(options)
                                                else options)),
                   labels=tuple(labels) if labels else None, given_models=tuple(given_models),
                   contents=tuple(sorted(contents)))

    @classmethod
    def asked(cls, analysis: str, request, *, options, engine_options: dict[str, Any], data: str | None,
              content_options: tuple[str, ...] = ()) -> RunSpec:
        """The spec of ``request`` (a RunRequest) before its models are resolved: ``options`` typed with
        every default, ``data`` the request's or the analysis's default; ``content_options``: the options whose
        file or folder counts by its content."""
        contents = [(name, content_sha256(getattr(options, name))) for name in content_options
                    if getattr(options, name, None) is not None]
        return cls.make(analysis, (), engine=request.engine, layers=request.layers, poolings=request.poolings,
                        max_length=request.max_length, batch_tokens=request.batch_tokens,
                        engine_options=engine_options, data=data, seed=request.seed, options=options,
                        labels=request.labels, given_models=request.models, contents=contents)

    def with_models(self, models) -> RunSpec:
        """This spec with each model as resolved (``ModelSpec``s, in the order given)."""
        return dataclasses.replace(self, models=tuple(models))

    # -- what derives from it ---------------------------------------------
    def identity(self) -> dict[str, Any]:
        """What makes two runs the same, as flat JSON: a data file counts by its content, not its path."""
        data = Path(self.data).name if self.data_sha256 else self.data
        ident: dict[str, Any] = {"analysis": self.analysis, "engine": self.engine, "layers": self.layers,
                                 "poolings": list(self.poolings) if self.poolings else None,
                                 "max_length": self.max_length, "batch_tokens": self.batch_tokens,
                                 "data": data, "data_sha256": self.data_sha256, "seed": self.seed}
        ident.update({f"engine_options.{k}": v for k, v in self.engine_options})
        ident.update({f"options.{k}": v for k, v in self.options})
        ident.update({f"options.{k}.sha256": v for k, v in self.contents})
        if self.labels:  # named by the user: another naming is another run (derived names are not identity)
            ident["labels"] = list(self.labels)
        for i, m in enumerate(self.models):
            where = f"models[{i}]" if len(self.models) > 1 else "model"
            ident.update({f"{where}.weights": m.key, f"{where}.engine": m.engine, f"{where}.variant": m.variant,
                          f"{where}.layers": list(m.layers) if m.layers is not None else None,
                          f"{where}.poolings": list(m.poolings) if m.poolings is not None else None})
        return _plain(ident)

    @property
    def hash(self) -> str:
        """12 hex digits of the identity: the run's own folder under the default results root."""
        blob = json.dumps(self.identity(), sort_keys=True, ensure_ascii=True).encode("utf-8")
        return hashlib.sha256(blob).hexdigest()[:12]

    def settings(self, models: list[str] | None = None) -> dict[str, Any]:
        """results.json's ``settings`` (``models``: the names to record, default the ones given)."""
        return _plain({"models": models if models is not None else [m.given for m in self.models],
                       "engine": self.engine, "engines_resolved": [m.engine for m in self.models],
                       "variants": [m.variant for m in self.models], "layers": self.layers,
                       "poolings": list(self.poolings) if self.poolings else None, "data": self.data,
                       "data_sha256": self.data_sha256, "seed": self.seed, "max_length": self.max_length,
                       "batch_tokens": self.batch_tokens, "engine_options": dict(self.engine_options),
                       "options": dict(self.options)})

    def differences(self, earlier: dict[str, Any]) -> list[str]:
        """Each key whose value differs from an earlier run's identity, as ``key old -> new``."""
        now = self.identity()
        return [f"{key} {earlier.get(key)!r} -> {now.get(key)!r}" for key in sorted(set(earlier) | set(now))
                if earlier.get(key) != now.get(key)]

    def to_json(self) -> dict[str, Any]:
        return _plain(dataclasses.asdict(self))


def _plain(obj):
    """JSON's own values (tuples as lists, paths as strings), so an identity read back compares equal."""
    return json.loads(json.dumps(obj, sort_keys=True, default=str))


def content_sha256(path) -> str | None:
    """The content of the file or folder at ``path`` as one sha256 (a folder: every file's relative path and
    sha256, layerscope's record of its files left out); None where nothing is there. File hashes are remembered
    by stat signature (model/identity.py), so a large lens is read once."""
    from layerscope.model.identity import hash_files
    from layerscope.owned_record import MARKER

    p = Path(str(path))
    if p.is_file():
        return hash_files([p])
    if not p.is_dir():
        return None
    files = sorted(f for f in p.rglob("*") if f.is_file() and f.name != MARKER)
    listing = [[f.relative_to(p).as_posix(), hash_files([f])] for f in files]
    return hashlib.sha256(json.dumps(listing).encode("utf-8")).hexdigest()


def _file_sha256(path: str | None) -> str | None:
    if not path:
        return None
    p = Path(str(path))
    if not p.is_file():
        return None
    from layerscope.hashing import file_sha256

    return file_sha256(p)
