"""The engine registry: engines join it by declaring themselves; everything else reads it.

An engine module (any module of this package) declares each engine it defines with
``@register(EngineSpec(...))``: its name, a one-line description, whether it runs an ONNX
export, the device it runs on, the candidates ``--engine auto`` may pick with their rank,
and the rows ``layerscope bench`` measures.  Adding an engine is one file here; ``auto``,
``layerscope engines``, the bench, the CLI's help and every "unknown engine" message read
the names and facts from ``engines()``.

``auto`` tries candidates in the order of their declared ``rank`` (lower first): today the
fixed order the benchmarks measured (benchmarks/README.md), GPU engines before CPU ones.
Ranks are plain declared numbers, so a ranking from measured speeds can replace them
without touching the engines.
"""

from __future__ import annotations

import importlib
import pkgutil
from dataclasses import dataclass, field, replace
from enum import Enum
from typing import Any, Callable


@dataclass(frozen=True)
class AutoRank:
    """One candidate ``--engine auto`` may pick: this engine with ``variant``, tried in ``rank`` order."""

    rank: int  # lower is tried first
    variant: str | None  # None: the fp32 export
    parity: str  # the manifest's key for this candidate's recorded accuracy ("fp32", "int8", "ov-bf16", ...)
    # the export records this candidate's accuracy by itself where the machine can run it (export/cpu_precision.py),
    # so auto may pick it for a fresh export
    at_export: bool = False


@dataclass(frozen=True)
class BenchRow:
    """A row ``layerscope bench`` can measure: this engine under a suffix (``ort`` + ``int8`` -> ``ort-int8``)."""

    suffix: str = ""  # "" is the engine's plain row
    variant: str | None = None
    options: tuple[tuple[str, Any], ...] = ()
    note: str = ""


@dataclass(frozen=True)
class EngineOption:
    """One option an engine takes (``layerscope.open(model, engine=..., name=value)``, ``--threads``, ...)."""

    name: str
    type: type  # int, float, bool or str; None is always allowed and means the default
    default: Any = None
    help: str = ""

    def check(self, engine: str, value: Any) -> None:
        """One line when ``value`` is not of this option's type."""
        import numbers

        if value is None:
            return
        ok = {bool: lambda v: isinstance(v, bool),
              int: lambda v: isinstance(v, numbers.Integral) and not isinstance(v, bool),
              float: lambda v: isinstance(v, numbers.Real) and not isinstance(v, bool),
              str: lambda v: isinstance(v, str)}.get(self.type, lambda v: isinstance(v, self.type))
        if not ok(value):
            from layerscope.errors import InputError

            raise InputError(f"engine '{engine}' option {self.name}={value!r} must be {self.type.__name__}"
                             f"{f' ({self.help})' if self.help else ''}")


# Options every engine takes: hints the batching plan or the CLI hands to whichever engine runs (an engine
# that has no use for one ignores it; TensorRT builds its profile from max_seq and max_batch).
COMMON_OPTIONS = (
    EngineOption("threads", int, None, "intra-op threads"),
    EngineOption("max_seq", int, None, "the longest input the run feeds, in tokens"),
    EngineOption("max_batch", int, None, "the most texts in one batch"),
    EngineOption("depth", int, None, "the deepest layer the run reads, from --layers (-1: raw only); the engine "
                 "computes no further (engines/truncate.py)"),
    EngineOption("pooled_only", bool, False, "the run fetches in-graph pooled vectors only (no token states): an "
                 "ONNX engine's graph then hands back no hidden state (none is copied out)"),
    EngineOption("min_cosine", float, None, "auto only: the lowest recorded cosine to PyTorch fp32 it accepts"),
)


class Runtime(Enum):
    """The library an engine runs a model in (what it loads, how its threads and memory behave)."""

    PYTORCH = "pytorch"  # the checkpoint in PyTorch; its thread pool is the process's (torch.set_num_threads)
    ONNXRUNTIME = "onnxruntime"  # the ONNX export in an ONNX Runtime session
    OPENVINO = "openvino"  # the ONNX export compiled by OpenVINO


@dataclass(frozen=True)
class EngineSpec:
    name: str
    description: str  # one line, shown by ``layerscope engines`` and the docs
    needs_export: bool  # runs an ONNX export: a plain model is exported first (export/open.py)
    device: str  # "cpu", "gpu" or "any" (placement on a Ray cluster, auto's GPU-first order)
    auto: tuple[AutoRank, ...] = ()  # candidates for --engine auto (none: auto never picks it by rank)
    variant_files: bool = False  # loads a variant's own .onnx file for --variant (auto keeps rank order then)
    fallback: bool = False  # auto's last resort when no ranked candidate starts
    gradients: bool = False  # can run the analyses that need gradients (auto: by picking such an engine)
    attention: bool = False  # runs the attention graph (model.attn.onnx, or eager attention in PyTorch)
    options: tuple[EngineOption, ...] = ()  # what it takes besides COMMON_OPTIONS; anything else is refused
    # the precision it computes in whatever the export holds (the PyTorch engines; they pick their attention by
    # it, engines/torch.py pick_attention); None: the export's or its variant's (the ONNX engines)
    precision: str | None = None
    picks_engine: bool = False  # starts another engine and hands it the options (auto): takes any engine's options
    runtime: Runtime | None = None  # what it runs a model in; None: it runs none itself (auto starts another)
    reference: bool = False  # the PyTorch fp32 reference every export is held to (the lens decodes with its head)
    # the engine an engine that picks another (auto) runs the attention graph on: ONNX Runtime, where the
    # attention variant's parity was held
    attention_default: bool = False
    # a pooled run pools each layer as the model makes it and keeps no earlier one (engines/torch_pooled.py), so
    # one layer's states are alive at a time; False: every layer a run reads is alive at once (the in-graph
    # pooling stacks them before it pools, export/graph.py), pooled-only or not (engines/memory.py)
    pools_as_made: bool = False
    # its --variant names a precision of its own (OpenVINO's), not an export variant: (precision, the export
    # variant that precision runs) for those that run one; None: --variant is the export variant it loads
    precision_variants: tuple[tuple[str, str], ...] | None = None
    bench: tuple[BenchRow, ...] = ()
    factory: Callable[..., Any] | None = field(default=None, compare=False)  # the engine class (or auto's picker);
    # called as factory(handle, spec=this declaration, **options) by ``make``

    def make(self, handle, **options) -> Any:
        """The engine this declares, started on ``handle``: its factory gets the declaration itself (``spec``),
        so an engine knows what it was made from while it starts (an engine that picks another, auto, hands
        back one made from that engine's declaration)."""
        return self.factory(handle, spec=self, **options)

    @property
    def first_rank(self) -> float:
        return min((r.rank for r in self.auto), default=float("inf"))

    def export_variant(self, variant: str | None) -> str | None:
        """The export variant (export/variants.py makes it) that this engine needs to run ``variant``, or None."""
        if self.precision_variants is None:
            return variant or None
        return dict(self.precision_variants).get(variant) if variant else None


_ENGINES: dict[str, EngineSpec] = {}
_DISCOVERED = False


def register(spec: EngineSpec):
    """Class (or factory) decorator: declare ``spec`` with the decorated object as its factory."""

    def deco(factory):
        if spec.name in _ENGINES and _ENGINES[spec.name].factory is not factory:
            raise RuntimeError(f"engine name '{spec.name}' is declared twice")
        _ENGINES[spec.name] = replace(spec, factory=factory)
        return factory

    return deco


def _discover() -> None:
    """Import every module of the engines package once, so each declares its engines."""
    global _DISCOVERED
    if _DISCOVERED:
        return
    import layerscope.engines as package

    for info in sorted(pkgutil.iter_modules(package.__path__), key=lambda m: m.name):
        importlib.import_module(f"{package.__name__}.{info.name}")
    _DISCOVERED = True


def engines() -> dict[str, EngineSpec]:
    """Every declared engine, ``auto`` last, the others in the order their modules declare them."""
    _discover()
    return {n: s for n, s in sorted(_ENGINES.items(), key=lambda kv: kv[0] == "auto")}


def engine_names() -> tuple[str, ...]:
    return tuple(engines())


def names_text(names=None, last: str = "or") -> str:
    """``torch, ort, ... or auto``: the engine names for help texts and messages."""
    names = list(engine_names() if names is None else names)
    return ", ".join(names[:-1]) + f" {last} {names[-1]}" if len(names) > 1 else "".join(names)


def engine_spec(name: str) -> EngineSpec:
    """The declaration of engine ``name``; an unknown name is one line with the closest known name."""
    known = engines()
    if name not in known:
        from layerscope.errors import unknown_name

        raise unknown_name("engine", str(name), list(known))
    return known[name]


@dataclass(frozen=True)
class EngineChoice:
    """An engine as a run asked for it, resolved from its name once (``resolve_engine``): its declaration and
    the options the run passes, checked against the declared ones (name and type). Everything below the
    place a run resolves it (the model's resolution, the export, ``open_engine``, ``create_engine``, a Ray
    placement) reads this instead of looking the name up again."""

    spec: EngineSpec
    options: tuple[tuple[str, Any], ...] = ()  # sorted (name, value) pairs, each declared and of its type

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def needs_export(self) -> bool:
        return self.spec.needs_export

    @property
    def device(self) -> str:
        return self.spec.device

    @property
    def variant(self) -> str | None:
        """The variant asked for (None: the export's own, or auto's pick)."""
        return dict(self.options).get("variant")


def resolve_engine(engine: "str | EngineChoice", options: dict[str, Any] | None = None) -> EngineChoice:
    """Engine ``engine`` resolved once, with ``options`` checked (one line for an unknown name or option);
    a choice made already is returned as it is when no options are added."""
    if isinstance(engine, EngineChoice):
        if not options:
            return engine
        spec, merged = engine.spec, {**dict(engine.options), **options}
    else:
        spec, merged = engine_spec(engine), dict(options or {})
    choice = EngineChoice(spec, tuple(sorted(merged.items())))
    check_engine_options(choice, merged)
    return choice


def auto_order(*, explicit_variant: bool, at_export: bool = False) -> list[tuple[str, str | None, str]]:
    """``(engine, variant, parity key)`` in the order ``--engine auto`` tries them.

    Without ``--variant``: every declared candidate by rank (``at_export``: those an export records by
    itself).  With one: the engines that load a variant's own file, each once, by its best rank (the
    variant is the caller's; no parity key)."""
    specs = engines().values()
    if explicit_variant:
        return [(s.name, None, "") for s in sorted((s for s in specs if s.variant_files), key=lambda s: s.first_rank)]
    ranked = sorted((r.rank, s.name, r.variant, r.parity) for s in specs for r in s.auto if r.at_export or not at_export)
    return [(name, variant, parity) for _, name, variant, parity in ranked]


def fallback_engine() -> EngineSpec:
    return next(s for s in engines().values() if s.fallback)


def gpu_engines() -> list[str]:
    """Engines that run on a GPU only, in auto's order."""
    return [s.name for s in sorted(engines().values(), key=lambda s: s.first_rank) if s.device == "gpu"]


def bench_rows() -> dict[str, tuple[str, BenchRow]]:
    """``{bench row name: (engine, row)}`` for every row the engines declare."""
    out: dict[str, tuple[str, BenchRow]] = {}
    for spec in engines().values():
        for row in spec.bench:
            out[spec.name + (f"-{row.suffix}" if row.suffix else "")] = (spec.name, row)
    return out


def engine_options(name: str) -> dict[str, EngineOption]:
    """Every option engine ``name`` takes, by name (an engine that picks another takes any engine's)."""
    return _declared_options(engine_spec(name))


def _declared_options(spec: EngineSpec) -> dict[str, EngineOption]:
    declared = [*COMMON_OPTIONS, *spec.options]
    if spec.picks_engine:
        declared += [o for s in engines().values() for o in s.options]
    out: dict[str, EngineOption] = {}
    for opt in declared:
        out.setdefault(opt.name, opt)
    return out


def check_engine_options(name: "str | EngineChoice", options: dict[str, Any]) -> None:
    """Refuse, in one line and before anything starts, an option engine ``name`` does not take (with the
    closest one it does) or a value of the wrong type."""
    spec = name.spec if isinstance(name, EngineChoice) else engine_spec(name)
    name = spec.name
    known = _declared_options(spec)
    for key, value in options.items():
        if key not in known:
            from layerscope.errors import InputError, did_you_mean

            raise InputError(f"engine '{name}' has no option '{key}'{did_you_mean(key, known)}; it takes "
                             f"{', '.join(sorted(known))}")
        known[key].check(name, value)


def attention_engines() -> tuple[str, ...]:
    """The engines whose declaration says they run the attention graph."""
    return tuple(s.name for s in engines().values() if s.attention)


def attention_default() -> str:
    """The engine that runs the attention graph for an engine that picks another (auto)."""
    return next(s.name for s in engines().values() if s.attention_default)


def attention_engine(name: str) -> str | None:
    """The engine a run on engine ``name`` reads the attention graph with: ``name`` where it runs the graph, the
    attention default where ``name`` picks another engine (auto), else None (an unknown name too)."""
    spec = engines().get(str(name))
    if spec is None:
        return None
    if spec.attention:
        return spec.name
    return attention_default() if spec.picks_engine else None


def gradient_engine(name: str) -> str:
    """The engine an analysis that needs gradients runs on when ``name`` was asked: ``name`` itself when it
    declares gradients, or, for an engine that picks another (auto), the first by rank that declares them."""
    spec = engine_spec(name)
    if not spec.gradients:
        from layerscope.errors import InputError

        able = [s.name for s in engines().values() if s.gradients]
        raise InputError(f"engine '{name}' cannot compute gradients; use --engine {' or '.join(able)}")
    if not spec.picks_engine:
        return spec.name
    able = [s for s in engines().values() if s.gradients and not s.picks_engine]
    return min(able, key=lambda s: (s.first_rank, not s.fallback)).name  # unranked: the fallback first
