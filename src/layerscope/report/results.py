"""results.json, typed: ``Results`` (frozen) made once from a run, written, and read back validated.

The one place that reads results.json by key. ``Results.from_run`` builds it where a run ends,
``to_disk`` writes the document, ``from_disk`` reads one back and checks its shape section by section
(each bad field is one line naming the file and the field, never a traceback); everything else reads
attributes: ``per_model[name].summary`` / ``.tables`` / ``.extra``, ``models[name].num_layers``,
``settings.data``, ``combined.tables``. The JSON shape is the one results.json always had (``format`` 1;
files without it, format 0, still load), so older result folders open as before.

An analysis that declares its figures (``AnalysisMetadata.figures``, report/figures.py) also gets its
declared summary fields and table columns checked here (``figures_of``: the declaration of an analysis by name): a hostile or edited value is refused on load.
Paths a results file names (mteb's result files) must stay inside the result folder.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from layerscope.errors import InputError
from layerscope.report.results_fields import Bad as _Bad, check_declared as _check_declared, need as _need
from layerscope.report.results_fields import as_dict as _dict, tables as _tables, safe_relative

# results.json's format: 1 added "format", "spec" and "spec_hash" (a result without them is older).
RESULTS_FORMAT = 1
FILE = "results.json"


class GarbledResults(InputError):
    """A results.json whose fields are not what layerscope writes; ``reason`` names the field."""

    def __init__(self, message: str, reason: str):
        super().__init__(message)
        self.reason = reason


# ---------------------------------------------------------------- the sections

@dataclass(frozen=True)
class Headline:
    """One headline figure of a model's summary (analyses/intervals.py ``headline``): value, 95% interval, where."""

    figure: str
    value: Any = None
    ci_low: float | None = None
    ci_high: float | None = None
    where: str = ""
    chance: float | None = None

    @classmethod
    def read(cls, doc: Any, where: str) -> Headline:
        doc = _dict(doc, where)
        numbers = {k: _need(doc.get(k), (int, float), f"{where}.{k}", optional=True)
                   for k in ("ci_low", "ci_high", "chance")}
        return cls(figure=str(doc.get("figure")), value=doc.get("value"),
                   where=str(_need(doc.get("where") or "", str, f"{where}.where")), **numbers)


@dataclass(frozen=True)
class ModelFigures:
    """One model's figures (or the run's combined figures): ``summary``, ``tables`` and the rest (``extra``)."""

    summary: dict[str, Any] = field(default_factory=dict)
    tables: dict[str, tuple[dict[str, Any], ...]] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)
    headline: tuple[Headline, ...] = ()  # the summary's headline figures, read

    @property
    def intervals(self) -> str | None:
        """How the summary's 95% intervals were made, in words (None: it says nothing)."""
        text = self.summary.get("intervals")
        return str(text) if text else None

    def table(self, name: str) -> tuple[dict[str, Any], ...]:
        """The rows of table ``name`` (none where the run wrote no such table)."""
        return self.tables.get(name, ())

    def rows(self, path: str) -> tuple[dict[str, Any], ...]:
        """The rows a declaration names: table ``path``, else what the dotted ``path`` names among the other
        figures (``probe.rows``: a list of rows; ``probe``: one row); nothing where that is neither. A dict
        kept beside the tables is its one row even where a table has its name (sts keeps its probes' rows as
        table ``probe`` and their settings as the dict ``probe``)."""
        value = self.at(path)
        if isinstance(value, dict):
            return (value,)
        if path in self.tables:
            return self.tables[path]
        return tuple(r for r in value if isinstance(r, dict)) if isinstance(value, list) else ()

    @property
    def mteb_files(self) -> dict[str, Any]:
        """MTEB's own result files kept with the figures, by their path under ``mteb/`` (checked on load to stay
        inside the result folder)."""
        files = self.extra.get("mteb_files")
        return dict(files) if isinstance(files, dict) else {}

    def value(self, name: str, default: Any = None) -> Any:
        """A figure the analysis keeps beside its summary and tables (``layers``, ``neighbours``, ...)."""
        return self.extra.get(name, default)

    def at(self, path: str) -> Any:
        """What the dotted ``path`` names among the figures kept beside the tables (``grids.entropy``; None
        where a part is missing)."""
        head, *rest = path.split(".")
        value = self.extra.get(head)
        for part in rest:
            value = value.get(part) if isinstance(value, dict) else None
        return value

    def records(self, spec) -> tuple[Any, ...]:
        """The typed records of a ``Records`` declaration (report/figures.py): each item of the list ``spec.value``
        read by ``spec.read`` (none where the run kept no such list)."""
        items = self.value(spec.value)
        if not isinstance(items, list):
            return ()
        # a document handed in unchecked (a library caller's): a bad item is one line all the same
        return tuple(read_record(spec.read, item, f"{spec.value}[{i}]") for i, item in enumerate(items))

    @classmethod
    def read(cls, doc: Any, where: str) -> ModelFigures:
        doc = _dict(doc, where)
        summary = _dict(doc.pop("summary", None), f"{where}.summary")
        heads = _need(summary.get("headline") or [], list, f"{where}.summary.headline")
        headline = tuple(Headline.read(h, f"{where}.summary.headline[{i}]") for i, h in enumerate(heads))
        tables = _tables(doc.pop("tables", None), f"{where}.tables")
        files = doc.get("mteb_files")
        if files is not None:
            for rel in _dict(files, f"{where}.mteb_files"):
                safe_relative(rel, f"{where}.mteb_files")
        return cls(summary, tables, doc, headline)

    def to_json(self) -> dict[str, Any]:
        out = dict(self.extra)
        if self.summary or "summary" not in out:
            out["summary"] = self.summary
        out["tables"] = {name: list(rows) for name, rows in self.tables.items()}
        return out


@dataclass(frozen=True)
class ModelRecord:
    """What results.json records about one model: how it was named, its manifest (as embedded), its engine."""

    spec: str | None
    label: str | None
    manifest: dict[str, Any]
    engine: dict[str, Any]
    export: Any = None

    @property
    def num_layers(self) -> int | None:
        value = self.manifest.get("num_layers")
        return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None

    @property
    def facts(self) -> dict[str, Any]:
        """The model's facts a report shows, by their names there."""
        src = self.manifest.get("source") if isinstance(self.manifest.get("source"), dict) else {}
        return {"family": self.manifest.get("family"), "layers": self.manifest.get("num_layers"),
                "hidden size": self.manifest.get("hidden_size"),
                "source": src.get("id") or src.get("path") or src.get("alias"),
                "engine": self.engine.get("engine"), "execution provider": self.engine.get("provider"),
                "precision": self.engine.get("precision")}

    @classmethod
    def read(cls, doc: Any, where: str) -> ModelRecord:
        doc = _dict(doc, where)
        return cls(spec=_need(doc.get("spec"), str, f"{where}.spec", optional=True),
                   label=_need(doc.get("label"), str, f"{where}.label", optional=True),
                   manifest=_dict(doc.get("manifest"), f"{where}.manifest"),
                   engine=_dict(doc.get("engine"), f"{where}.engine"), export=doc.get("export"))

    def to_json(self) -> dict[str, Any]:
        out = {"spec": self.spec, "label": self.label, "manifest": self.manifest, "engine": self.engine,
               "export": self.export}
        return {k: v for k, v in out.items() if v is not None or k in ("manifest", "engine")}


@dataclass(frozen=True)
class Settings:
    """results.json's ``settings``: what the run was asked for (``raw`` keeps every key, for display)."""

    raw: dict[str, Any]

    @property
    def data(self) -> str | None:
        value = self.raw.get("data")
        return None if value is None else str(value)

    @property
    def layers(self) -> Any:
        return self.raw.get("layers")

    @property
    def poolings(self) -> list[str]:
        value = self.raw.get("poolings")
        return [str(p) for p in value] if isinstance(value, list) else []

    @property
    def options(self) -> dict[str, Any]:
        value = self.raw.get("options")
        return value if isinstance(value, dict) else {}

    @property
    def engine(self) -> Any:
        return self.raw.get("engine")

    @property
    def engines_resolved(self) -> list[str]:
        value = self.raw.get("engines_resolved")
        return [str(e) for e in value if e] if isinstance(value, list) else []

    @property
    def max_length(self) -> Any:
        return self.raw.get("max_length")


# ---------------------------------------------------------------- the document

@dataclass(frozen=True)
class Results:
    """One analysis run's results.json, typed (see the module's docstring)."""

    analysis: str
    description: str
    main_score: str | None
    layerscope_version: str | None
    created: str | None
    seconds: float | None
    settings: Settings
    models: dict[str, ModelRecord]
    per_model: dict[str, ModelFigures]
    combined: ModelFigures
    format: int = RESULTS_FORMAT  # 0: written before results carried a run spec
    spec_hash: str | None = None
    identity: dict[str, Any] | None = None
    spec: dict[str, Any] | None = None
    path: Path | None = None  # where it was read from (None: made by this run)
    default_data: str | None = None  # the analysis's built-in data, as its metadata names it (older files: None)
    document: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)  # the JSON as written

    # -- made by a run -------------------------------------------------------
    @classmethod
    def from_run(cls, meta, run_spec, *, seconds: float, models: dict[str, dict[str, Any]], per_model,
                 combined: dict[str, Any], stored: bool = False) -> Results:
        """The results of a finished run: ``meta`` the analysis's metadata, ``per_model`` each model's figures
        (``ModelOutput``s or dicts), ``stored``: the run read LayerStores, not models."""
        import layerscope

        from layerscope.report.jsonable import jsonable

        doc = jsonable({
            "format": RESULTS_FORMAT, "analysis": meta.name, "description": meta.description,
            "default_data": getattr(meta, "default_data", None),
            "main_score": meta.main_score, "layerscope_version": layerscope.__version__,
            "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "seconds": round(seconds, 2),
            "settings": run_spec.settings(list(models) if stored else None), "spec_hash": run_spec.hash,
            "identity": run_spec.identity(), "spec": run_spec.to_json(), "models": models,
            "per_model": {k: getattr(v, "figures", v) for k, v in per_model.items()}, "combined": combined})
        return cls.from_document(doc, "the run's results")

    # -- read back -----------------------------------------------------------
    @classmethod
    def from_disk(cls, path: str | Path, figures_of=None) -> Results:
        """Read ``DIR/results.json`` (or the file itself); a missing, garbled, foreign or hostile file is one line."""
        path = Path(path)
        if path.is_dir() or not path.name.endswith(".json"):
            path = path / FILE
        if not path.is_file():
            raise InputError(f"{path.parent} has no results.json; give a directory written by layerscope run")
        try:
            doc = json.loads(path.read_text(encoding="utf-8"), parse_constant=_no_constant)
        except (OSError, UnicodeDecodeError, ValueError) as exc:
            raise InputError(f"{path} is not valid JSON ({exc})") from None
        except RecursionError:  # nested deeper than the JSON reader goes: never what layerscope writes
            raise InputError(f"{path} is nested too deeply to read; it was not written by layerscope run: "
                             "re-run layerscope run") from None
        return cls.from_document(doc, str(path), path=path, figures_of=figures_of)

    @classmethod
    def from_document(cls, doc: Any, where: str, *, path: Path | None = None, figures_of=None) -> Results:
        if not isinstance(doc, dict) or not isinstance(doc.get("analysis"), str):
            raise InputError(f"{where} does not name its analysis; give a directory written by layerscope run")
        fmt = doc.get("format", 0)
        if not isinstance(fmt, int) or isinstance(fmt, bool) or fmt < 0:
            raise InputError(f"{where} has an unreadable format {fmt!r}; re-run layerscope run")
        if fmt > RESULTS_FORMAT:
            raise InputError(f"{where} was written by a newer layerscope (results format {fmt}, this one reads "
                             f"{RESULTS_FORMAT}); upgrade layerscope to read it")
        try:
            made = cls._read(doc, fmt, path)
            declared = figures_of(made.analysis) if figures_of is not None else None
            if declared is not None:
                _check_declared(made, declared)
        except _Bad as exc:
            raise GarbledResults(f"{where}: {exc}; it was edited or written by another version: "
                                 "re-run layerscope run", str(exc)) from None
        return made

    @classmethod
    def _read(cls, doc: dict[str, Any], fmt: int, path: Path | None) -> Results:
        seconds = _need(doc.get("seconds"), (int, float), "seconds", optional=True)
        ident = doc.get("identity")
        spec_hash = doc.get("spec_hash")
        return cls(analysis=doc["analysis"],
                   description=str(_need(doc.get("description", ""), str, "description")),
                   default_data=_need(doc.get("default_data"), str, "default_data", optional=True),
                   main_score=_need(doc.get("main_score"), str, "main_score", optional=True),
                   layerscope_version=None if doc.get("layerscope_version") is None
                   else str(doc.get("layerscope_version")),
                   created=_need(doc.get("created"), str, "created", optional=True),
                   seconds=None if seconds is None else float(seconds),
                   settings=Settings(_dict(doc.get("settings"), "settings")),
                   models={str(k): ModelRecord.read(v, f"models.{k}")
                           for k, v in _dict(doc.get("models"), "models").items()},
                   per_model={str(k): ModelFigures.read(v, f"per_model.{k}")
                              for k, v in _dict(doc.get("per_model"), "per_model").items()},
                   combined=ModelFigures.read(doc.get("combined"), "combined"),
                   format=fmt,
                   spec_hash=spec_hash if isinstance(spec_hash, str) else None,
                   identity=ident if isinstance(ident, dict) else None,
                   spec=doc.get("spec") if isinstance(doc.get("spec"), dict) else None,
                   path=path, document=doc)

    # -- written ---------------------------------------------------------------
    def to_json(self) -> dict[str, Any]:
        """The document (the shape results.json has always had)."""
        return self.document

    def to_disk(self, out: str | Path) -> Path:
        """Write ``out/results.json`` (``out``: a result folder being staged; see ``write_results``)."""
        path = Path(out) / FILE
        path.write_text(json.dumps(self.document, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
        return path

    # -- what callers ask --------------------------------------------------
    @property
    def complete(self) -> bool:
        """It holds the per-model figures (a folder with a run's figures, not a half-written one)."""
        return isinstance(self.document.get("per_model"), dict)

    @property
    def older(self) -> bool:
        return self.format < RESULTS_FORMAT

    @property
    def several(self) -> bool:
        return len(self.per_model) > 1

    def num_layers(self, model: str) -> int | None:
        record = self.models.get(model)
        return None if record is None else record.num_layers

    @property
    def depths(self) -> dict[str, int]:
        """Each model's number of layers (blocks), by its name in ``per_model``, where the manifest gives it."""
        return {m: n for m in self.per_model if (n := self.num_layers(m)) is not None}

    @property
    def data_origin(self) -> str | None:
        """Where built-in data came from, as the analysis recorded it (e.g. "generated zh-en (n=200, seed=0)")."""
        return self.data.origin

    @property
    def data(self) -> DataInfo:
        """What the run's data was, as the analysis recorded it in its combined figures (``data``)."""
        return DataInfo.read(self.combined.value("data"))


@dataclass(frozen=True)
class DataInfo:
    """The run's data as an analysis records it (``combined.data``): where it came from, a short label, how many
    items, and the vectors compared (``pooling``, or token vectors)."""

    origin: str | None = None
    label: str | None = None
    n: int | None = None
    pooling: str | None = None
    tokens: bool = False

    @classmethod
    def read(cls, doc: Any) -> DataInfo:
        if not isinstance(doc, dict):
            return cls()

        def text(key: str) -> str | None:
            return None if doc.get(key) is None else str(doc.get(key))

        n = doc.get("n")
        return cls(origin=text("origin"), label=text("label"),
                   n=n if isinstance(n, int) and not isinstance(n, bool) else None, pooling=text("pooling"),
                   tokens=bool(doc.get("tokens")))


def read_record(read, doc: Any, where: str) -> Any:
    """``read(doc, where)``, a typed record's reader over part of a document already read; a bad field is one
    line (``GarbledResults``)."""
    try:
        return read(doc, where)
    except _Bad as exc:
        raise GarbledResults(f"results: {exc}; it was edited or written by another version: re-run layerscope "
                             "run", str(exc)) from None


def as_results(results: Results | dict[str, Any], analysis: str | None = None) -> Results:
    """``results`` typed: a ``Results`` as it is, a results document (a library caller's dict) read and checked;
    ``analysis`` names the analysis of a document that does not name it."""
    if isinstance(results, Results):
        return results
    if analysis is not None and isinstance(results, dict) and "analysis" not in results:
        results = {**results, "analysis": analysis}
    return Results.from_document(results, "the results given")


def _no_constant(name: str):
    raise ValueError(f"{name} is not a JSON number")
