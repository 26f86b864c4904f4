"""The analysis framework: metadata, registry, the run loop, and saving.

An analysis is a class with a ``metadata`` object and a ``compute`` method
that turns one model into a JSON-able dict of figures.  The base class owns
the loop over models, the engines, the cached vectors, the result directory
and the report.  Plots and ``report.md`` are made from the saved results
alone (``layerscope report`` re-renders them without touching a model).
"""

from __future__ import annotations

import json
import logging
import math
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

import layerscope
from layerscope.errors import InputError

log = logging.getLogger("layerscope")


@dataclass(frozen=True)
class Option:
    """An analysis-specific option, e.g. ``--probe`` or ``--n 200``.

    The CLI builds ``layerscope run NAME`` from these declarations: its parsing, its ``--help``
    and its one-line errors (see layerscope/cli/analysis_cmds.py).
    """

    name: str  # python name; the flag is --name with _ as -
    type: type = str  # str, int, float, or bool (a flag)
    default: Any = None
    help: str = ""
    choices: tuple[str, ...] | None = None  # the only values accepted, when they are a fixed few

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")

    @property
    def help_text(self) -> str:
        """The help line, with the accepted values when they are declared."""
        return self.help + (f" (one of: {', '.join(self.choices)})" if self.choices else "")


# What an analysis can read (AnalysisMetadata.inputs), as `layerscope run NAME --help` describes it.
INPUTS = {
    "pairs": "sentence pairs with a human score (STS Benchmark files, or CSV/TSV/JSONL with named columns)",
    "aligned": "paired texts: source, target and an optional category (CSV/TSV/JSONL with named columns)",
    "items": "compositionality items (JSONL: positive, negative, paraphrases)",
    "texts": "one text per row (.txt, .jsonl, .csv, .tsv or .parquet)",
    "labeled": "texts with a label (.jsonl, .csv or .tsv with text and label fields)",
    "text_pairs": "pairs of texts, no score needed (STS Benchmark files, JSONL with sentence1/sentence2, or "
                  "'text A<TAB>text B' lines)",
    "engine": "runs the model itself rather than reading cached vectors",
}


@dataclass(frozen=True)
class AnalysisMetadata:
    name: str
    description: str
    inputs: tuple[str, ...]  # what it reads (see INPUTS); shown in `layerscope run NAME --help`
    main_score: str  # the headline figure, a key in each model's "summary"
    default_poolings: tuple[str, ...] = ("mean",)
    default_data: str | None = None  # built-in data used when --data is not given
    needs_gradients: bool = False  # runs the model itself on the torch engine
    options: tuple[Option, ...] = ()


@dataclass
class ModelRun:
    """One model inside a run: its handle and engine, created once."""

    spec: str
    handle: Any
    engine: Any
    layers: list[str] | None = None  # --layers resolved for this model where the run started (vocab/layers.py)
    poolings: list[str] | None = None  # --pooling checked for this model where the run started

    @property
    def name(self) -> str:
        return self.handle.manifest.source.alias or self.spec

    @property
    def num_layers(self) -> int:
        return self.handle.manifest.num_layers


@dataclass(frozen=True)
class ModelOutput:
    """What ``compute`` returns for one model: its figures (saved in results.json) and what ``combine``
    needs across models without saving it: the rows a model-vs-model comparison resamples
    (``analyses/compare.py``'s ``ModelRows``) and anything else the analysis hands on (``kept``).
    ``compute`` may also return the figures dict alone."""

    figures: dict[str, Any]
    compare: Any = None
    kept: Any = None


def as_output(value) -> ModelOutput:
    return value if isinstance(value, ModelOutput) else ModelOutput(value)


class PerModel(dict):
    """What ``combine`` is handed: each model's figures by name (a plain dict to read), and in ``outputs``
    the ``ModelOutput`` each came in."""

    def __init__(self, outputs: dict[str, ModelOutput]):
        super().__init__({name: out.figures for name, out in outputs.items()})
        self.outputs = dict(outputs)


@dataclass
class Context:
    """Settings common to every analysis run."""

    models: list[str]
    engine: str = "auto"
    layers: str = "all"
    poolings: list[str] | None = None
    data: str | None = None
    out: Path | None = None  # None: results/<model>/<revision>/<analysis> (see analyses/layout.py)
    seed: int = 0
    options: dict[str, Any] = field(default_factory=dict)
    cache: bool = True
    console: Any = None
    trust_remote_code: bool = False  # run the model repo's own code (off unless asked)
    recompute: bool = False  # run again even when the result dir holds this very run
    force: bool = False  # replace a result dir holding a different run
    max_length: int | None = None  # tokens per text (default: the model's); also caps TensorRT's profile
    batch_tokens: int | None = None  # padded tokens per batch (default: the engine's)
    opts: Any = None  # the analysis's typed options (analyses/spec.py), set on run_analysis's own copy
    spec: Any = None  # the run's RunSpec (analyses/spec.py), set on run_analysis's own copy
    labels: list[str] | None = None  # a short name per model (--label); default: analyses/labels.py

    def say(self, msg: str) -> None:
        if self.console is not None:
            from rich.markup import escape

            self.console.print(f"[dim]- {escape(msg)}[/dim]")

    def vectors(self, run: ModelRun, texts: list[str], *, layers: list[str], poolings: list[str],
                tag: str = "") -> dict[tuple[str, str], np.ndarray]:
        """Pooled vectors of ``texts`` (reusing a matching cached LayerStore when there is one)."""
        from layerscope.analyses.cache import cached_vectors

        spec = self.spec if self.spec is not None else self  # the run's spec; a bare context for library callers
        return cached_vectors(run, texts, layers=layers, poolings=poolings, use_cache=self.cache,
                              say=self.say, tag=tag, max_length=spec.max_length, batch_tokens=spec.batch_tokens)


class Analysis(ABC):
    metadata: ClassVar[AnalysisMetadata]

    def prepare(self, ctx: Context) -> Any:
        """Read and check the data once, before any model is loaded (bad input fails fast)."""
        return None

    def default_poolings(self, handle) -> list[str]:
        """The poolings of a model when the run names none: the metadata's own (an analysis may choose them
        per model, e.g. from the family: ``vocab.pooling.family_poolings``)."""
        return list(self.metadata.default_poolings)

    def option_values(self, ctx: Context) -> dict[str, Any]:
        """Every declared option: its value in ``ctx.options``, else its default (library callers may give few)."""
        from layerscope.analyses.spec import options_dict

        return options_dict(self.options(ctx))

    def options(self, ctx: Context):
        """The typed options of this run (a frozen dataclass made from the declared ``Option``s)."""
        if ctx.opts is not None:
            return ctx.opts
        from layerscope.analyses.spec import make_options

        return make_options(self.metadata, {k: v for k, v in ctx.options.items() if k != "engine_options"})

    @abstractmethod
    def compute(self, ctx: Context, run: ModelRun, data: Any) -> ModelOutput | dict[str, Any]:
        """Figures for one model (a JSON-able dict with at least ``summary`` and ``tables``), as a
        ``ModelOutput`` when ``combine`` needs more from each model than its saved figures."""

    def stored_sources(self, ctx: Context, data: Any) -> list[tuple[str, dict, str]] | None:
        """For a run made from LayerStores instead of models: ``(path, manifest, identity)`` per store.

        None (the default): the run uses ``--model``. Analyses that override ``offline`` override this too.
        """
        return None

    def offline(self, ctx: Context, data: Any) -> tuple[dict[str, Any], dict[str, Any]] | None:
        """Figures made without loading any model (e.g. from LayerStores): ``(per_model, models_meta)``;
        each model's value is its figures or a ``ModelOutput``.

        Return None (the default) to run ``compute`` once per ``--model``.
        """
        return None

    def combine(self, ctx: Context, per_model: PerModel, data: Any) -> dict[str, Any]:
        """Figures across models (optional); ``per_model.outputs`` holds each model's ``ModelOutput``."""
        return {}

    # -- rendering from saved results only ---------------------------------
    def plots(self, results: dict[str, Any], out_dir: Path) -> list[str]:
        return []

    def report(self, results: dict[str, Any]) -> str:
        return ""

    def console_summary(self, results: dict[str, Any], console) -> None:
        pass


_REGISTRY: dict[str, type[Analysis]] = {}


def register(cls: type[Analysis]) -> type[Analysis]:
    _REGISTRY[cls.metadata.name] = cls
    return cls


def registry() -> dict[str, type[Analysis]]:
    from layerscope.analyses import _load_all

    _load_all()
    return dict(_REGISTRY)


def get_analysis(name: str) -> type[Analysis]:
    reg = registry()
    if name not in reg:
        from layerscope.errors import unknown_name

        raise unknown_name("analysis", name, sorted(reg))
    return reg[name]


# ---------------------------------------------------------------- running

def _jsonable(obj):
    if isinstance(obj, dict):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    if isinstance(obj, (np.floating, float)):
        v = float(obj)
        return None if math.isnan(v) or math.isinf(v) else v
    if isinstance(obj, np.integer):
        return int(obj)
    if isinstance(obj, np.bool_):
        return bool(obj)
    if isinstance(obj, np.ndarray):
        return _jsonable(obj.tolist())
    if isinstance(obj, Path):
        return str(obj)
    return obj


def check_layers(spec: str, handle, model: str) -> list[str]:
    """Resolve ``--layers`` against one model; a bad spec names the option and the model."""
    from layerscope.vocab.layers import resolve_layers

    try:
        return resolve_layers(spec, handle.manifest.num_layers)
    except InputError as exc:
        raise InputError(f"--layers {spec} for model {model}: {exc}") from None


@dataclass(frozen=True)
class RunOutcome:
    """What ``run_analysis`` hands back: the result dir, its results, whether it was reused, and the run's spec.

    It unpacks as ``(dir, results)`` (and indexes so), as the Python API always returned.
    """

    out: Path
    results: dict[str, Any]
    reused: bool
    spec: Any  # the RunSpec (analyses/spec.py)

    def __iter__(self):
        return iter((self.out, self.results))

    def __getitem__(self, i):
        return (self.out, self.results)[i]

    def __len__(self) -> int:
        return 2


def _resolved_engine(engine_name: str, engine_options: dict[str, Any], opened) -> tuple[str, str | None]:
    """The engine that runs a model and its variant: auto's pick (``opened``), else the one asked for."""
    if opened is not None:
        variant = getattr(opened, "variant", None)
        return opened.info.name, (None if variant in (None, "", "fp32") else str(variant))
    variant = engine_options.get("variant")
    return engine_name, (None if variant in (None, "", "fp32") else str(variant))


def run_analysis(name: str, ctx: Context) -> RunOutcome:
    """Run analysis ``name`` over ``ctx.models``; write the result dir; return (dir, results) as a RunOutcome.
    The result folder's write lock is held from its claim to its last file (one writer per folder)."""
    import contextlib

    with contextlib.ExitStack() as hold:
        return _run_analysis(name, ctx, hold)


def _run_analysis(name: str, ctx: Context, hold) -> RunOutcome:
    """``run_analysis``; ``hold`` (an ExitStack) keeps the result folder's lock until the run returns.

    Every check (engine, options, data, models, layers, poolings) runs before any result folder is touched;
    the run's ``RunSpec`` is made once here and everything else (identity, settings, folder) derives from it.
    ``ctx`` is not changed: the run works on its own copy.
    """
    from dataclasses import replace

    from layerscope.analyses.common import resolve_poolings
    from layerscope.analyses.layout import (claim_result_dir, default_result_dir, model_name, model_revision,
                                            check_runs_index, check_summary, write_runs_index)
    from layerscope.analyses.spec import RESULTS_FORMAT, ModelSpec, RunSpec, make_options, options_dict
    from layerscope.engines.registry import check_engine_options, engine_spec, gradient_engine
    from layerscope.export.open import open_engine, resolve_model

    cls = get_analysis(name)
    analysis = cls()
    meta = cls.metadata
    if not ctx.models:
        raise InputError("give at least one --model")
    if ctx.out is not None:  # a read-only --out is one line before any model starts
        from layerscope.ownership import check_output_path

        check_output_path(Path(ctx.out))
    declared = engine_spec(ctx.engine)  # an unknown --engine is one line, before anything runs
    if meta.needs_gradients and not declared.gradients:
        raise InputError(f"analysis '{name}' needs gradients and runs on the torch engine only; "
                         f"drop --engine {ctx.engine} or use --engine torch")
    from layerscope.export.open import require_engine
    from layerscope.vocab.pooling import check_poolings

    if not meta.needs_gradients:
        require_engine(ctx.engine)  # can it start here at all? before any model is read, hashed or exported
    if ctx.poolings:
        check_poolings(ctx.poolings)
    t0 = time.perf_counter()
    given = dict(ctx.options)
    engine_options = dict(given.pop("engine_options", None) or {})
    check_engine_options(ctx.engine, engine_options)  # a mistyped engine option: one line, before any folder
    opts = make_options(meta, given, say=ctx.say)  # every default filled in
    ctx = replace(ctx, options=options_dict(opts), opts=opts)  # the run's own copy; the caller's is untouched

    from layerscope.analyses.labels import model_labels

    model_labels(ctx.models, [None] * len(ctx.models), ctx.labels)  # a --label count or clash: one line, first
    data = analysis.prepare(ctx)  # bad input fails here, before anything is written
    handles, layers, poolings = [], [], []
    sources = analysis.stored_sources(ctx, data)
    if sources is None:
        engine_name = gradient_engine(ctx.engine) if meta.needs_gradients else ctx.engine
        # a cached export is found without transformers or torch when the engine runs exports
        handles = [resolve_model(spec, trust_remote_code=ctx.trust_remote_code, engine=engine_name)
                   for spec in ctx.models]
        # --layers and --pooling resolved once per model, here: a bad one fails before any folder is touched
        layers = [check_layers(ctx.layers, handle, spec) for spec, handle in zip(ctx.models, handles)]
        poolings = [resolve_poolings(ctx, handle, analysis.default_poolings(handle)) for handle in handles]
        sources = [(spec, h.manifest, h.key) for spec, h in zip(ctx.models, handles)]
    elif ctx.poolings:
        from layerscope.vocab.pooling import check_poolings

        check_poolings(ctx.poolings)
    labels = model_labels(ctx.models, [h.manifest.source.alias for h in handles], ctx.labels) if handles else []
    engine_name = gradient_engine(ctx.engine) if meta.needs_gradients else ctx.engine
    limits = {"max_seq": ctx.max_length} if ctx.max_length else {}
    opened: list[Any] = [None] * len(handles)
    try:
        if engine_name == "auto":  # what auto picks is part of the run: start the engines to learn it
            for i, (spec, handle) in enumerate(zip(ctx.models, handles)):
                ctx.say(f"{spec}: starting engine auto")
                opened[i] = open_engine(handle, "auto", **{**limits, **engine_options})
        models = []
        for i, (spec, man, key) in enumerate(sources):
            resolved, variant = (_resolved_engine(engine_name, engine_options, opened[i]) if handles
                                 else (None, None))
            models.append(ModelSpec(given=spec, key=key, folder=model_name(spec, man),
                                    revision=model_revision(man, key),
                                    layers=tuple(layers[i]) if handles else None,
                                    poolings=tuple(poolings[i]) if handles else None,
                                    engine=resolved, variant=variant))
        run_spec = RunSpec.make(name, models, engine=ctx.engine, layers=ctx.layers, poolings=ctx.poolings,
                                max_length=ctx.max_length, batch_tokens=ctx.batch_tokens,
                                engine_options=engine_options, data=ctx.data, seed=ctx.seed, options=opts,
                                labels=ctx.labels)
        ctx = replace(ctx, spec=run_spec)
        default_layout = ctx.out is None
        out = Path(ctx.out) if not default_layout else default_result_dir(run_spec)
        from layerscope.out_lock import out_lock

        hold.enter_context(out_lock(out))
        if default_layout:
            check_runs_index(out.parent)  # before the work: the index is written after it
        action, earlier = claim_result_dir(out, run_spec, recompute=ctx.recompute, force=ctx.force,
                                           inputs=[ctx.data, *ctx.models], default_layout=default_layout)
        if action == "reuse":
            ctx.say(f"{out} already holds this result (same models, data and options); reusing it "
                    "(--recompute to run again)")
            check_summary(out, earlier, analysis)
            if default_layout:
                write_runs_index(out.parent)
            return RunOutcome(out, earlier, True, run_spec)
        offline = analysis.offline(ctx, data) if handles == [] else None  # from stores alone: no model runs
        if offline is not None:
            per_model, models_meta = offline
        else:
            per_model, models_meta = {}, {}
        for i, (spec, handle) in enumerate(zip(ctx.models, handles)):
            engine = opened[i]
            if engine is None:
                ctx.say(f"{spec}: starting engine {engine_name}")
                engine = open_engine(handle, engine_name, **{**limits, **engine_options})
            opened[i] = None
            run = ModelRun(spec, engine.model if hasattr(engine, "model") else handle, engine, layers[i],
                           poolings[i])
            try:
                figures = analysis.compute(ctx, run, data)
            finally:
                engine.close()
            key = labels[i]
            per_model[key] = as_output(figures)
            from layerscope.export.cache import export_record

            models_meta[key] = {"spec": spec, "label": key, "manifest": run.handle.manifest.to_dict(), "engine": engine.info.to_dict(),
                                "export": export_record(run.handle)}
    finally:
        for engine in opened:
            if engine is not None:
                engine.close()
    per_model = PerModel({key: as_output(value) for key, value in per_model.items()})
    combined = analysis.combine(ctx, per_model, data)
    results = {
        "format": RESULTS_FORMAT,
        "analysis": name,
        "description": meta.description,
        "main_score": meta.main_score,
        "layerscope_version": layerscope.__version__,
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "seconds": round(time.perf_counter() - t0, 2),
        "settings": run_spec.settings(None if offline is None else list(models_meta)),
        "spec_hash": run_spec.hash,
        "identity": run_spec.identity(),
        "spec": run_spec.to_json(),
        "models": models_meta,
        "per_model": per_model,
        "combined": combined,
    }
    results = _jsonable(results)
    write_results(out, results, analysis)
    if default_layout:
        write_runs_index(out.parent)
    return RunOutcome(out, results, False, run_spec)


def write_results(out: Path, results: dict[str, Any], analysis: Analysis | None = None) -> None:
    """Write results.json, CSV tables, plots and report.md into ``out`` atomically (staging dir + rename)."""
    from layerscope.atomic import staged_dir

    analysis = analysis or get_analysis(results["analysis"])()
    with staged_dir(Path(out), kind="result") as stage:
        (stage / "results.json").write_text(json.dumps(results, indent=2, ensure_ascii=False) + "\n",
                                            encoding="utf-8")
        render(stage, results, analysis)


@dataclass(frozen=True)
class Rendered:
    """What a render (re)wrote from results alone: plot and CSV file names, report.md, and report.html
    (None where plotly is missing and the page was not written)."""

    plots: tuple[str, ...]
    tables: tuple[str, ...]
    report: str
    page: str | None

    def files(self) -> list[str]:
        return [self.report] + ([self.page] if self.page else [])

    def written(self) -> list[str]:
        """Every file named here, each plot's SVG twin included (``report.plots.save`` writes both)."""
        return [*self.files(), *self.tables, *self.plots,
                *(p[:-4] + ".svg" for p in self.plots if p.endswith(".png"))]


def render(out: Path, results: dict[str, Any], analysis: Analysis | None = None) -> Rendered:
    """(Re)write CSV tables, plots, report.md and report.html from results alone."""
    from layerscope.report.html_page import write_html_report
    from layerscope.report.writer import md_data, write_report, write_tables

    from layerscope.report.depth import relative_depths
    from layerscope.report.plots import depth_axis

    analysis = analysis or get_analysis(results["analysis"])()
    tables = write_tables(out, results)
    with depth_axis(relative_depths(results)):  # the axis report.html draws for the same results
        plots = analysis.plots(results, out)
    page = write_html_report(out, results)
    body = analysis.report(md_data(results))  # every string from data escaped for Markdown
    write_report(out, results, body, tables, plots, page=page)
    return Rendered(tuple(plots), tuple(tables), "report.md", page)


def rerender(result_dir: Path) -> Rendered:
    result_dir = Path(result_dir)
    from layerscope.analyses.spec import load_results

    saved = load_results(result_dir)  # older results (no run spec) still render
    path, results = saved.path, saved.document
    from layerscope.out_lock import out_lock
    from layerscope.ownership import writing

    try:
        with out_lock(result_dir), writing(result_dir, "result") as wrote:  # what it rewrites stays layerscope's
            rendered = render(result_dir, results)
            wrote.add(*rendered.written())
            return rendered
    except (KeyError, TypeError, ValueError, IndexError, AttributeError) as exc:
        raise InputError(f"{path} lacks or garbles a field its report needs ({type(exc).__name__}: {exc}); "
                         "it was edited or written by another version: re-run layerscope run") from exc
