"""The analysis framework: the ``Analysis`` class, its ``Context``, and the run loop.

An analysis is a class with a ``metadata`` object (analyses/metadata.py) and a ``compute`` method
that turns one model into a JSON-able dict of figures, registered with ``@register``
(analyses/registry.py).  The base class owns the loop over models, the engines, the cached vectors
and the result directory; the run's results are typed (report/results.py) and its plots, report.md
and report.html are made from them alone (analyses/rendering.py), from the analysis's declared
figures where it has them (report/figures.py).  An analysis module imports what it needs from here.
"""

from __future__ import annotations

import logging
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from layerscope.analyses.metadata import INPUTS, AnalysisMetadata, Option
from layerscope.analyses.registry import _REGISTRY, get_analysis, register, registry
from layerscope.analyses.request import RunRequest
from layerscope.analyses.rendering import Rendered, render, rerender, write_results
from layerscope.errors import InputError
from layerscope.model.manifest_type import SourceInfo

if TYPE_CHECKING:
    from layerscope.analyses.spec import RunSpec
    from layerscope.extraction.engine_plan import EngineReads

# what an analysis module imports from here (the registration path every analysis uses)
__all__ = ["INPUTS", "Analysis", "AnalysisMetadata", "Context", "ModelOutput", "ModelRun", "Option", "PerModel",
           "Rendered", "RunOutcome", "RunRequest", "_REGISTRY", "get_analysis", "register", "registry", "render",
           "rerender", "run_analysis", "write_results"]

log = logging.getLogger("layerscope")


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


def _say(console, msg: str) -> None:
    if console is not None:
        from rich.markup import escape

        console.print(f"[dim]- {escape(msg)}[/dim]")


@dataclass(frozen=True)
class Context:
    """What an analysis reads of its run: the run's ``spec`` (a RunSpec, analyses/spec.py: models, engine,
    layers, poolings, data, seed, max length, ...) and its typed ``opts``; ``say`` prints a progress line.

    ``prepare`` sees the spec before the models are resolved (``spec.models`` empty, ``spec.given_models``
    as named); ``compute``, ``offline`` and ``combine`` see it whole. Made from a ``RunRequest`` by ``asked``.
    """

    spec: RunSpec
    opts: Any  # the analysis's typed options (analyses/spec.py), every default filled in
    console: Any = None
    cache: bool = True  # ``vectors`` reuses a matching cached LayerStore

    @classmethod
    def asked(cls, analysis: Analysis | type[Analysis] | str, request: RunRequest) -> Context:
        """The context of ``request`` (a RunRequest) for ``analysis``: its options typed (a name the analysis
        does not declare is said and left out), its data the request's or the analysis's default."""
        from layerscope.analyses.spec import RunSpec, make_options

        if isinstance(analysis, str):
            analysis = get_analysis(analysis)
        if isinstance(analysis, type):
            analysis = analysis()
        meta = analysis.metadata
        given, engine_options = request.split_options()
        opts = make_options(meta, given, say=lambda msg: _say(request.console, msg))
        data = request.data if request.data is not None else analysis.default_data_file()
        spec = RunSpec.asked(meta.name, request, options=opts, engine_options=engine_options, data=data,
                             content_options=tuple(o.name for o in meta.options if o.content))
        return cls(spec=spec, opts=opts, console=request.console, cache=request.cache)

    def say(self, msg: str) -> None:
        _say(self.console, msg)

    def vectors(self, run: ModelRun, texts: list[str], *, layers: list[str], poolings: list[str],
                tag: str = "") -> dict[tuple[str, str], np.ndarray]:
        """Pooled vectors of ``texts`` (reusing a matching cached LayerStore when there is one)."""
        from layerscope.analyses.cache import cached_vectors

        return cached_vectors(run, texts, layers=layers, poolings=poolings, use_cache=self.cache,
                              say=self.say, tag=tag, max_length=self.spec.max_length,
                              batch_tokens=self.spec.batch_tokens)


class Analysis(ABC):
    metadata: ClassVar[AnalysisMetadata]

    def default_data_file(self) -> str | None:
        """The data a run without ``--data`` reads, as recorded in its spec (None: the analysis makes its own
        or needs none; ``prepare`` decides)."""
        return None

    def prepare(self, ctx: Context) -> Any:
        """Read and check the data once, before any model is loaded (bad input fails fast)."""
        return None

    def default_poolings(self, handle) -> list[str]:
        """The poolings of a model when the run names none: the metadata's own (an analysis may choose them
        per model, e.g. from the family: ``vocab.pooling.family_poolings``)."""
        return list(self.metadata.default_poolings)

    def engine_reads(self, handle, layers: list[str], poolings: list[str]) -> EngineReads:
        """What ``compute`` reads from the engine of one model whose run asks ``layers`` and ``poolings``: the
        engine is opened for that and no more (the one early-exit rule, extraction/engine_plan.py). From the
        metadata's ``reads``; ``vectors`` counts every pooling the vector cache stores (analyses/cache.py)."""
        from layerscope.extraction.engine_plan import EngineReads

        if self.metadata.reads == "model":
            return EngineReads.of(None)
        if self.metadata.reads == "vectors":
            from layerscope.analyses.cache import model_poolings

            return EngineReads.of(layers, model_poolings(handle.manifest, poolings))
        return EngineReads.of(layers, poolings, tokens=True)

    def options(self, ctx: Context):
        """The typed options of this run (a frozen dataclass made from the declared ``Option``s)."""
        return ctx.opts

    def check_model(self, ctx: Context, given: str, handle) -> None:
        """Refuse, in one line, a model this analysis cannot read, from what is known before any export or engine
        start (``handle.manifest``: an export's manifest, or a plain model described from its config.json)."""

    @abstractmethod
    def compute(self, ctx: Context, run: ModelRun, data: Any) -> ModelOutput | dict[str, Any]:
        """Figures for one model (a JSON-able dict with at least ``summary`` and ``tables``), as a
        ``ModelOutput`` when ``combine`` needs more from each model than its saved figures."""

    def stored_sources(self, ctx: Context, data: Any) -> list[tuple[str, SourceInfo, str]] | None:
        """For a run made from LayerStores instead of models: ``(path, source, identity)`` per store, ``source``
        the model's ``SourceInfo`` as the store recorded it (``LayerStore.manifest.source``).

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
    # With declared figures (``metadata.figures``) these draw the declaration from typed results (a results
    # document is read and checked first); an analysis overriding one calls ``super()`` and adds to it. Without
    # a declaration they draw nothing, and an analysis of the older kind overrides them over the document.
    def plots(self, results, out_dir: Path) -> list[str]:
        if self.metadata.figures is None:
            return []
        from layerscope.report.declared import plots

        return plots(self.metadata.figures, _typed(results, self.metadata.name), Path(out_dir))

    def report(self, results) -> str:
        if self.metadata.figures is None:
            return ""
        from layerscope.report.declared import markdown

        return markdown(self.metadata.figures, _typed(results, self.metadata.name))

    def console_summary(self, results, console) -> None:
        if self.metadata.figures is not None:
            from layerscope.report.declared import console_summary

            console_summary(self.metadata.figures, _typed(results, self.metadata.name), console)


def _typed(results, name: str):
    from layerscope.report.results import as_results

    return as_results(results, name)


# ---------------------------------------------------------------- running

def check_layers(spec: str, handle, model: str) -> list[str]:
    """Resolve ``--layers`` against one model; a bad spec names the option and the model."""
    from layerscope.vocab.layers import resolve_widths

    manifest = handle.manifest
    try:  # an analysis reads layers of one width: raw only where it is as wide as the others
        return resolve_widths(spec, manifest.num_layers, raw_width=manifest.raw_width,
                              hidden_size=manifest.hidden_size, raw_alone=False)
    except InputError as exc:
        raise InputError(f"--layers {spec} for model {model}: {exc}") from None


@dataclass(frozen=True)
class RunOutcome:
    """What ``run_analysis`` hands back: the result dir, its typed results (``saved``, report/results.py),
    whether it was reused, and the run's spec.

    It unpacks as ``(dir, results)`` (and indexes so) with ``results`` the results document, as the Python
    API always returned.
    """

    out: Path
    saved: Any  # Results (report/results.py)
    reused: bool
    spec: Any  # the RunSpec (analyses/spec.py)

    @property
    def results(self) -> dict[str, Any]:
        """The results document (results.json as written)."""
        return self.saved.document

    def __iter__(self):
        return iter((self.out, self.results))

    def __getitem__(self, i):
        return (self.out, self.results)[i]

    def __len__(self) -> int:
        return 2


def _resolved_engine(engine_name: str, engine_options: dict[str, Any], opened) -> tuple[str, str | None]:
    """The engine that runs a model and its variant: auto's pick (``opened``), else the one asked for."""
    from layerscope.model.variants import run_variant

    if opened is not None:
        return opened.info.name, run_variant(getattr(opened, "variant", None))
    return engine_name, run_variant(engine_options.get("variant"))


def run_analysis(name: str, request: RunRequest) -> RunOutcome:
    """Run analysis ``name`` as ``request`` (a RunRequest, analyses/request.py) asks; write the result dir;
    return (dir, results) as a RunOutcome. The result folder's write lock is held from its claim to its last
    file (one writer per folder)."""
    import contextlib

    with contextlib.ExitStack() as hold:
        return _run_analysis(name, request, hold)


def _run_analysis(name: str, req: RunRequest, hold) -> RunOutcome:
    """``run_analysis``; ``hold`` (an ExitStack) keeps the result folder's lock until the run returns.

    Every check (engine, options, data, models, layers, poolings) runs before any result folder is touched;
    the run's ``RunSpec`` is made once here from the request (before ``prepare``), completed with the
    models as resolved, and everything else (identity, settings, folder, what ``compute`` reads) derives
    from it.
    """
    from layerscope.analyses.common import resolve_poolings
    from layerscope.analyses.layout import (claim_result_dir, default_result_dir, model_name, model_revision,
                                            check_runs_index, check_summary, write_runs_index)
    from layerscope.analyses.spec import ModelSpec
    from layerscope.engines.registry import check_engine_options, engine_spec, gradient_engine
    from layerscope.export.open import open_engine, resolve_model

    cls = get_analysis(name)
    analysis = cls()
    meta = cls.metadata
    if not req.models:
        raise InputError("give at least one --model")
    if req.tower is not None and not meta.images:
        raise InputError(f"--tower picks a two-tower checkpoint's image tower for the analyses that read images; "
                         f"{name} reads text: leave out --tower")
    if req.out is not None:  # a read-only --out is one line before any model starts
        from layerscope.ownership import check_output_path

        check_output_path(req.out)
    declared = engine_spec(req.engine)  # an unknown --engine is one line, before anything runs
    if meta.needs_gradients and not declared.gradients:
        raise InputError(f"analysis '{name}' needs gradients and runs on the torch engine only; "
                         f"drop --engine {req.engine} or use --engine torch")
    from layerscope.export.open import require_engine
    from layerscope.vocab.pooling import check_poolings

    if not meta.needs_gradients:
        require_engine(req.engine)  # can it start here at all? before any model is read, hashed or exported
    if req.poolings:
        check_poolings(list(req.poolings))
    t0 = time.perf_counter()
    check_engine_options(req.engine, req.split_options()[1])  # a mistyped engine option: one line, before any folder
    ctx = Context.asked(analysis, req)  # the spec as asked, every option default filled in
    spec = ctx.spec
    engine_options = dict(spec.engine_options)

    from layerscope.analyses.labels import model_labels

    # a --label count or clash: one line, first
    model_labels(list(spec.given_models), [None] * len(spec.given_models), spec.labels)
    data = analysis.prepare(ctx)  # bad input fails here, before anything is written
    handles, layers, poolings = [], [], []
    sources = analysis.stored_sources(ctx, data)
    engine_name = gradient_engine(spec.engine) if meta.needs_gradients else spec.engine
    if sources is None:
        if meta.images:  # a two-tower checkpoint without --tower: one line from its config.json, nothing exported
            from layerscope.analyses.common import check_tower_asked

            for model in spec.given_models:
                check_tower_asked(model, req.tower, trust_remote_code=req.trust_remote_code)
        # a cached export is found without transformers or torch when the engine runs exports
        handles = [resolve_model(model, trust_remote_code=req.trust_remote_code, engine=engine_name, tower=req.tower)
                   for model in spec.given_models]
        for model, handle in zip(spec.given_models, handles):  # from config.json or the manifest: before any export
            analysis.check_model(ctx, model, handle)
        # --layers and --pooling resolved once per model, here: a bad one fails before any folder is touched
        layers = [check_layers(spec.layers, handle, model) for model, handle in zip(spec.given_models, handles)]
        poolings = [resolve_poolings(ctx, handle, analysis.default_poolings(handle)) for handle in handles]
        sources = [(model, h.manifest.source, h.key) for model, h in zip(spec.given_models, handles)]
    labels = (model_labels(list(spec.given_models), [h.manifest.source.alias for h in handles], spec.labels)
              if handles else [])
    limits = {"max_seq": spec.max_length} if spec.max_length else {}
    from layerscope.extraction.engine_plan import early_exit

    # each model's engine computes what the analysis reads of it and no more: a run of layers 0..2 of a 28-layer
    # model runs 3 blocks (the vector cache then keeps those layers: analyses/cache.py)
    depths = [early_exit(handle.manifest, analysis.engine_reads(handle, layers[i], poolings[i])).as_kwargs()
              for i, handle in enumerate(handles)]
    opened: list[Any] = [None] * len(handles)
    try:
        if engine_spec(engine_name).picks_engine:  # what auto picks is part of the run: start the engines to learn it
            for i, (model, handle) in enumerate(zip(spec.given_models, handles)):
                ctx.say(f"{model}: starting engine {engine_name}")
                opened[i] = open_engine(handle, engine_name, **{**limits, **depths[i], **engine_options})
        models = []
        for i, (model, src, key) in enumerate(sources):
            resolved, variant = (_resolved_engine(engine_name, engine_options, opened[i]) if handles
                                 else (None, None))
            models.append(ModelSpec(given=model, key=key, folder=model_name(model, src),
                                    revision=model_revision(src, key),
                                    layers=tuple(layers[i]) if handles else None,
                                    poolings=tuple(poolings[i]) if handles else None,
                                    engine=resolved, variant=variant))
        run_spec = spec.with_models(models)
        ctx = replace(ctx, spec=run_spec)
        default_layout = req.out is None
        out = req.out if not default_layout else default_result_dir(run_spec)
        from layerscope.out_lock import out_lock

        hold.enter_context(out_lock(out))
        if default_layout:
            check_runs_index(out.parent)  # before the work: the index is written after it
        action, earlier = claim_result_dir(out, run_spec, recompute=req.recompute, force=req.force,
                                           inputs=[run_spec.data, *run_spec.given_models],
                                           default_layout=default_layout)
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
        for i, (model, handle) in enumerate(zip(run_spec.given_models, handles)):
            engine = opened[i]
            if engine is None:
                ctx.say(f"{model}: starting engine {engine_name}")
                engine = open_engine(handle, engine_name, **{**limits, **depths[i], **engine_options})
            opened[i] = None
            run = ModelRun(model, engine.model if hasattr(engine, "model") else handle, engine, layers[i],
                           poolings[i])
            try:
                figures = analysis.compute(ctx, run, data)
            finally:
                engine.close()
            key = labels[i]
            per_model[key] = as_output(figures)
            from layerscope.export.cache import export_record

            models_meta[key] = {"spec": model, "label": key, "manifest": run.handle.manifest.to_dict(), "engine": engine.info.to_dict(),
                                "export": export_record(run.handle)}
    finally:
        for engine in opened:
            if engine is not None:
                engine.close()
    per_model = PerModel({key: as_output(value) for key, value in per_model.items()})
    combined = analysis.combine(ctx, per_model, data)
    from layerscope.report.results import Results

    results = Results.from_run(meta, run_spec, seconds=time.perf_counter() - t0, models=models_meta,
                               per_model=per_model.outputs, combined=combined, stored=offline is not None)
    write_results(out, results, analysis)
    if default_layout:
        write_runs_index(out.parent)
    return RunOutcome(out, results, False, run_spec)
