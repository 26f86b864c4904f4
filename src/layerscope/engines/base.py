"""The engine protocol and ``create_engine`` (the registry is registry.py; layer names: vocab/layers.py).

An engine takes a tokenized ``Batch`` and returns, per pooling, an array
``[len(layers), batch, hidden]`` (or token-level states).  Every engine
reports the execution provider that actually ran, not the one asked for.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, ClassVar, Iterable, Iterator

from layerscope.errors import InputError
from layerscope.vocab.layers import layer_names

if TYPE_CHECKING:  # numpy and the tokenizer load when an engine runs, not when the registry is read
    import numpy as np

    from layerscope.engines.registry import EngineSpec
    from layerscope.model.handle import ModelHandle
    from layerscope.model.manifest_type import Manifest
    from layerscope.model.tokenize import Batch, Encoder


@dataclass
class EngineInfo:
    name: str  # the engine's registered name (engines/registry.py)
    provider: str  # what actually ran: "torch-cpu", "CPUExecutionProvider", ...
    device: str
    precision: str = "fp32"
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"engine": self.name, "provider": self.provider, "device": self.device,
                "precision": self.precision, "notes": list(self.notes)}


class Engine(ABC):
    """One backend that runs a model and hands back per-layer outputs as numpy arrays.

    Everything callers use is declared here: the handle it runs (``model``, also ``handle``), its typed
    ``manifest``, the ``variant`` it loaded, what ran (``info``), ``encoder``, ``run`` and ``run_tokens``,
    ``run_outputs`` (named graph outputs), ``pooled_output`` (the model's own pooled output), ``resume`` (a
    state written at a layer, the layers after it run) and ``probe``.
    """

    name: ClassVar[str] = ""
    preferred_batch_tokens: int = 16384  # padded tokens per batch when the caller does not say
    variant: str | None = None  # the variant it loaded (None: the fp32 export, or a plain model)
    attention_scores: bool = True  # holds a layer's whole [heads, T, T] attention at once (engines/memory.py)
    depth: int | None = None  # the deepest layer it computes (early exit, engines/truncate.py); None: every layer
    model: ModelHandle
    info: EngineInfo
    _spec: EngineSpec | None = None  # the declaration it was made from (None: made by its class directly)

    def __init__(self, model: ModelHandle, spec: EngineSpec | None = None):
        self.model = model
        self._spec = spec
        self.info = EngineInfo(self.name, "unknown", "cpu")

    @property
    def handle(self) -> ModelHandle:
        """The model this engine runs (the same object as ``model``)."""
        return self.model

    @property
    def manifest(self) -> Manifest:
        return self.model.manifest

    @property
    def anatomy(self):
        """The model's anatomy as this engine reads it (model/anatomy.py): what it found on the model it loaded
        (the PyTorch engines), else the manifest's."""
        found = self.__dict__.get("_anatomy", self)
        return self.manifest.anatomy if found is self else found

    @property
    def carries_own_last(self) -> bool:
        """Whether this engine can give the model's own last hidden state (``OWN_LAST``) beside the layers."""
        from layerscope.vocab.outputs import OWN_LAST

        return OWN_LAST in self.manifest.outputs

    def st_plan(self, layers: list[str], poolings: list[str]) -> tuple[list[str], int | None]:
        """(the layers to run, ``st``'s row read from the model's own last hidden state or None): where ``st`` is
        asked at layer L of a model whose own last hidden state is not layer L (model/stconfig.py ``st_layers``),
        that state runs as one more layer, last; a derived anatomy says so in the notes."""
        from layerscope.vocab.pooling import ST

        if ST not in poolings:
            return list(layers), None
        from layerscope.model.stconfig import st_layers

        anatomy = self.anatomy
        run, row = st_layers(anatomy, self.manifest.num_layers, list(layers), list(poolings),
                             carried=self.carries_own_last)
        if row is not None and anatomy.derived_on_load and anatomy.note not in self.info.notes:
            self.info.notes.append(anatomy.note)
        return run, row

    @property
    def layer_names(self) -> list[str]:
        return layer_names(self.manifest.num_layers)

    def encoder(self, max_length: int | None = None, prompt: str = "") -> Encoder:
        from layerscope.model.tokenize import Encoder

        return Encoder(self.model.encoding_tokenizer(), list(self.manifest.inputs),
                       max_length or self.manifest.max_length, prompt)

    def image_encoder(self):
        """Images into batches for a vision tower's export (its own image processor; model/vision.py)."""
        from layerscope.model.vision import ImageEncoder

        source = self.manifest.source
        if not self.model.is_export and not source.is_local:
            raise InputError(f"{self.model.spec}: images are read through a vision export or a local checkpoint; "
                             "run layerscope export")
        folder = self.model.export_dir if self.model.is_export else source.path_or_id
        return ImageEncoder(folder, self.manifest, trust_remote_code=self.model.trust_remote_code)

    @property
    def spec(self) -> EngineSpec:
        """This engine's declaration (engines/registry.py): the one it was made from (``EngineSpec.make`` hands
        it to the constructor), else looked up by name (an engine made by its class directly)."""
        if self._spec is not None:
            return self._spec
        from layerscope.engines.registry import engine_spec

        return engine_spec(self.name)

    @property
    def pools_as_made(self) -> bool:
        """Whether its pooled runs hold one layer's states at a time, as its declaration says (an engine that
        finds it cannot, once started, says False: engines/memory.py then charges every layer)."""
        return self.spec.pools_as_made

    @classmethod
    def probe(cls, export_dir: Path | None = None) -> tuple[bool, str]:
        """(works, detail): whether this engine really starts on this machine (``layerscope engines``)."""
        return True, "no check declared"

    @classmethod
    def variants_off_here(cls) -> tuple[str, ...]:
        """The variants (as ``--variant`` names them) this engine has but cannot run on this machine."""
        return ()

    @abstractmethod
    def run(self, batch: Batch, layers: list[str], poolings: list[str]) -> dict[str, np.ndarray]:
        """Per pooling: float32 ``[len(layers), batch, hidden]``."""

    @abstractmethod
    def run_tokens(self, batch: Batch, layers: list[str]) -> list[np.ndarray]:
        """Per layer: float32 ``[batch, seq, dim]`` token-level states."""

    def run_stream(self, batches: Iterable[Batch], layers: list[str],
                   poolings: list[str]) -> Iterator[tuple[Batch, dict[str, np.ndarray]]]:
        """``(batch, run(batch, ...))`` for each batch, in order. An engine that can keep several batches in
        flight (OpenVINO's throughput mode) overrides this; the vectors are ``run``'s either way."""
        for batch in batches:
            yield batch, self.run(batch, layers, poolings)

    def run_outputs(self, batch: Batch, names: list[str]) -> list[np.ndarray]:
        """The graph outputs ``names`` (an engine that runs ONNX graphs); others refuse in one line."""
        raise InputError(f"engine '{self.name}' does not run named graph outputs; use an ONNX engine (ort, ov)")

    def pooled_output(self, batch: Batch) -> np.ndarray | None:
        """The model's own pooled output (e.g. CLIP's pooler) ``[batch, hidden]``; None when the model has none
        or this engine cannot give it (callers then leave the figure out)."""
        return None

    def run_with_tokens(self, batch: Batch, layers: list[str],
                        poolings: list[str]) -> tuple[dict[str, np.ndarray], list[np.ndarray]]:
        """``(run(...), run_tokens(...))`` from one forward pass: the pooled vectors are pooled here from
        the token states (engines whose graph pools in place override this to fetch both at once)."""
        import numpy as np

        from layerscope.model.stconfig import st_recipe
        from layerscope.vocab.pooling import ST, with_st

        run, own_row = self.st_plan(layers, poolings)
        states = self.run_tokens(batch, run)

        def compute(modes: list[str]) -> dict[str, np.ndarray]:  # an image batch pools over its patches
            return {m: np.stack([pool_states(self.manifest, batch, s, m) for s in states]) for m in modes}

        recipe = st_recipe(self.manifest) if ST in poolings else None
        return with_st(poolings, compute, recipe, own_row=own_row), states[:len(layers)]

    def run_keeping_tokens(self, batch: Batch, layers: list[str], poolings: list[str], token_layers: list[str],
                           keep: Callable[[str, np.ndarray], Any]) -> tuple[dict[str, np.ndarray], list[Any]]:
        """``(run(...), [keep(layer, states) for layer in token_layers])`` from one forward pass: ``keep`` gets
        a layer of ``token_layers`` (a subset of ``layers``) as float32 ``[batch, seq, hidden]`` and returns what
        the caller holds of it. Here every layer's states exist at once (``run_with_tokens``); an engine that
        hands over each layer as its block produces it (the PyTorch engines) overrides this to hold no more."""
        pooled, states = self.run_with_tokens(batch, layers, poolings)
        by_name = dict(zip(layers, states))
        del states
        return pooled, [keep(layer, by_name.pop(layer)) for layer in token_layers]

    def resume(self, batch: Batch, layer: int, state: np.ndarray, layers: list[int] | None = None) -> list[np.ndarray]:
        """Write ``state`` (float32 ``[batch, tokens, hidden]``) at ``layer`` (0..L: replacing ``hidden_states.layer``)
        and run the layers after it on ``batch``'s mask and positions: the hidden states of ``layers`` (default:
        the last; each at least ``layer``; ``layer`` itself is ``state``) as float32 ``[batch, tokens, hidden]``
        (engines/resume.py). A layer outside the model or a state of another shape is one line, before any work."""
        import numpy as np

        from layerscope.engines.resume import check_write, resume_layers

        if self.manifest.modality != "text":
            raise InputError(f"engine '{self.name}' writes states into text models only")
        j = check_write(self.manifest.num_layers, self.manifest.hidden_size, layer, state, batch)
        want = resume_layers(self.manifest.num_layers, j, layers)
        later = sorted({k for k in want if k > j})
        got = dict(zip(later, self._resume(batch, j, state, later))) if later else {}
        return [np.asarray(state, dtype=np.float32) if k == j else got[k] for k in want]

    def _resume(self, batch: Batch, layer: int, state: np.ndarray, layers: list[int]) -> list[np.ndarray]:
        """The hidden states of ``layers`` (all after ``layer``) from ``state`` written at ``layer`` (checked)."""
        raise InputError(f"engine '{self.name}' cannot write a state at a layer; use ort, ov or torch")

    def close(self) -> None:
        """Release sessions and memory."""


def pool_states(manifest, batch, states, mode: str):
    """One layer's (or stacked layers') token states pooled: over an image's patches (vocab/image_pooling.py)
    for an image batch, else over the text's tokens by its mask."""
    prefix = getattr(batch, "prefix_tokens", None)
    if prefix is not None:
        from layerscope.vocab.image_pooling import pool_image

        return pool_image(states, mode, prefix)
    from layerscope.vocab.pooling import pool

    return pool(states, batch.mask, mode, input_ids=batch.input_ids, eos_token_id=manifest.eos_token_id)


def check_engine_name(name) -> str:
    """``name`` if an engine declared it (engines/registry.py), else one line naming the closest one (an
    ``EngineChoice`` was checked when it was resolved)."""
    from layerscope.engines.registry import EngineChoice, engine_spec

    return name.name if isinstance(name, EngineChoice) else engine_spec(name).name


def needs_export(name) -> bool:
    """Whether engine ``name`` (a name or an ``EngineChoice``) runs an ONNX export (a plain model must be
    exported first)."""
    from layerscope.engines.registry import EngineChoice, engine_spec

    return name.needs_export if isinstance(name, EngineChoice) else engine_spec(name).needs_export


def create_engine(name, model: str | Any, **options) -> Engine:
    """Engine ``name`` (a name or an ``EngineChoice``, whose options come first) for a resolved model: a
    ``ModelHandle``, or an export dir / model that is resolved here.  Nothing is exported here:
    ``layerscope.export.open.open_engine`` exports on first use."""
    from layerscope.engines.registry import resolve_engine
    from layerscope.model.handle import ModelHandle

    choice = resolve_engine(name, options)  # a mistyped option is one line, before the model is read
    spec, options = choice.spec, dict(choice.options)
    handle = model if isinstance(model, ModelHandle) else ModelHandle.resolve(model)
    if spec.needs_export and not handle.is_export:
        raise InputError(f"engine '{spec.name}' runs an ONNX export and {handle.spec} is not one: open it with "
                         "layerscope.export.open.open_engine (exports on first use), or run layerscope export first")
    if not spec.picks_engine and options.pop("min_cosine", None) is not None:
        raise InputError("--min-cosine chooses among engines: use it with --engine auto")
    require_code_for(spec, handle)
    return spec.make(handle, **options)  # auto hands back the engine it picked, made from that one's declaration


def require_code_for(spec, handle) -> None:
    """One line, before any work, where engine ``spec`` loads the model in PyTorch, the model ran its own code
    when it was exported (``Manifest.needs_code``) and the user did not pass --trust-remote-code: the built-in
    class would compute other vectors under the export's identity."""
    from layerscope.engines.registry import Runtime
    from layerscope.model.own_code import require_code_flag

    if spec.runtime is Runtime.PYTORCH:
        require_code_flag(handle.manifest, handle.spec, handle.trust_remote_code, f"engine '{spec.name}' (PyTorch)")
