"""ONNX Runtime engines: ``ort`` (CPU EP), ``cuda`` (CUDA EP, IO binding), ``trt`` (TensorRT EP).

ONNX Runtime falls back to the CPU silently when a GPU provider cannot load,
and prints pages of library errors while doing so.  Here the native stderr is
captured while a session is made, the providers the session really got are
checked, and a requested-but-unavailable provider becomes one clear error (``ort_session.py``).
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

from layerscope.engines.base import Engine, pool_states
from layerscope.engines.blocked import ATTENTION_OPTION, engine_blocks, next_graph, pick_blocks, took_blocks
from layerscope.engines.ort_session import make_session, ort_module, physical_cores, probe_model
from layerscope.engines.registry import AutoRank, BenchRow, EngineOption, EngineSpec, Runtime, register
from layerscope.engines.truncate import check_depth, check_pooled_only, engine_graph
from layerscope.errors import EngineUnavailableError
from layerscope.model.stconfig import st_recipe
from layerscope.vocab.outputs import OWN_LAST, layer_output, pooled_output
from layerscope.vocab.pooling import ST, with_st

if TYPE_CHECKING:  # numpy loads when an engine runs, not when the registry is read (the CLI's help)
    import numpy as np

    from layerscope.model.tokenize import Batch

_SWITCH = threading.Lock()  # one engine at a time moves onto its graph in blocks
ORT_OPTIONS = (
    EngineOption("variant", str, None, "a variant recorded by layerscope optimize (int8, fp16, opt)"),
    EngineOption("in_graph_pooling", bool, True, "pool inside the graph (False: token states pooled in numpy)"),
    EngineOption("opt_level", str, "all", "ONNX Runtime graph optimizations: all, extended, basic or none"),
)
CUDA_OPTIONS = ORT_OPTIONS + (EngineOption("device_id", int, 0, "the CUDA device"),)


class OrtEngine(Engine):
    """Shared session logic; subclasses choose the provider and how outputs come back."""

    name = "ort"
    provider = "CPUExecutionProvider"
    uses_onnxruntime = True  # an InferenceSession on ``provider`` (OpenVINO's subclass says False)
    depth: int | None = None  # the deepest layer this engine computes (None: every layer; engines/truncate.py)
    pooled_only = False  # its graph hands back the in-graph pooled outputs alone (hidden states stay inside)
    attention = "whole"  # "blocked": each layer's attention over blocks of query rows (engines/blocked.py)
    attention_asked: str | None = None  # the engine option that decided it
    attention_rows: int | None = None  # query rows whose scores it holds at once in blocks (None: all; memory.py)
    blocks_above: int | None = None  # batches wider than this run in blocks (0: every batch; None: none)
    blocks_graph = None  # the derived graph it moves onto at the first batch past blocks_above (auto)
    _resumer = None  # its resume graphs (engines/resume.py), made when a state is first written

    def __init__(self, model, *, threads: int | None = None, opt_level: str = "all",
                 variant: str | None = None, in_graph_pooling: bool = True,
                 depth: int | None = None, pooled_only: bool = False, spec: EngineSpec | None = None, **options):
        from layerscope.model.variants import run_variant, variant_onnx_file

        handle = model  # an export: create_engine refuses a plain model for this engine
        super().__init__(handle, spec)
        self.options = options
        onnx_file = variant_onnx_file(handle.manifest, variant)  # refuses an OpenVINO precision in one line
        self.variant = run_variant(variant)
        self.in_graph_pooling = bool(in_graph_pooling)
        path = handle.export_dir / onnx_file if onnx_file else handle.onnx_path
        if self.variant:
            from layerscope.errors import ManifestError
            from layerscope.model.derived import variant_problem

            why = variant_problem(handle.export_dir, handle.manifest, self.variant)  # its files, and its source
            if why is not None:
                raise ManifestError(f"{path}: {why}; re-make it with layerscope optimize {handle.export_dir} "
                                    f"--variant {self.variant} --force")
        self.source_graph = path  # the graph the derived ones (early exit, blocks, resume) are made from
        source, (path, self.pooled_layers) = path, engine_graph(self, path, depth, pooled_only)  # early exit
        path = engine_blocks(self, path, self.pooled_layers, self.attention_asked)  # long texts
        self.graph_path = path  # the graph file its session runs
        self.session = make_session(path, self.provider, self.provider_options(), threads=threads,
                                    opt_level=opt_level, extra=self.session_entries())
        self.input_names = [i.name for i in self.session.get_inputs()]
        self.input_types = {i.name: i.type for i in self.session.get_inputs()}
        self.output_names = [o.name for o in self.session.get_outputs()]
        self.info.provider = self.session.get_providers()[0]
        self.info.device = "cpu" if self.provider == "CPUExecutionProvider" else "cuda"
        self.info.precision = self.manifest.variants[self.variant].precision if self.variant else self.manifest.precision
        if self.variant:
            self.info.notes.append(f"variant {self.variant} ({source.name})")

    def provider_options(self) -> dict:
        return {}

    def session_entries(self) -> dict:
        return {}

    @classmethod
    def probe(cls, export_dir: Path | None = None) -> tuple[bool, str]:
        """(works, detail): whether a session on this engine's provider really starts here."""
        return probe_providers(export_dir, only=cls)[cls.name]

    def _feed(self, batch: Batch) -> dict[str, np.ndarray]:
        import numpy as np

        feed = {}
        for name in self.input_names:
            arr = batch.inputs[name]
            if self.input_types[name] == "tensor(int32)":
                arr = arr.astype(np.int32)
            feed[name] = np.ascontiguousarray(arr)
        return feed

    def _run(self, batch: Batch, names: list[str]) -> list[np.ndarray]:
        self.blocks_for(batch)
        return self.session.run(names, self._feed(batch))

    def blocks_for(self, batch: Batch) -> None:
        """Under ``attention=auto``, before the first batch wider than ``blocks_above`` tokens: the session moves
        onto the graph with attention in blocks (engines/blocked.py), the whole graph's released first."""
        if next_graph(self, batch) is None:
            return
        with _SWITCH:
            got = next_graph(self, batch)
            if got is None:  # another thread moved it
                return
            self.reopen(got.path)
            took_blocks(self, got)

    def reopen(self, path: Path) -> None:
        """Run the graph ``path`` from now on, in a session made with this one's options once it is released."""
        options = self.session.get_session_options()
        self.session = None
        self.session = make_session(path, self.provider, self.provider_options(), options=options)
        self.graph_path = path

    def open_graph(self, path: Path):
        """A session on another graph (a resume graph), made with this engine's provider and options."""
        return make_session(path, self.provider, self.provider_options(), options=self.session.get_session_options())

    def _resume(self, batch: Batch, layer: int, state, layers: list[int]) -> list[np.ndarray]:
        """Through the resume graph at ``layer`` (engines/resume.py), derived from the graph the engine was opened on."""
        if self._resumer is None:
            from layerscope.engines.resume import OnnxResume

            self._resumer = OnnxResume(self, self.source_graph, self.open_graph)
        return self._resumer.run(batch, layer, state, layers)

    def run_outputs(self, batch: Batch, names: list[str]) -> list[np.ndarray]:
        """Named graph outputs as they come (extra graphs such as the lens graph add their own)."""
        missing = [n for n in names if n not in self.output_names]
        if missing:
            raise EngineUnavailableError(f"this ONNX graph has no output(s) {', '.join(missing)}")
        import numpy as np

        return [np.asarray(o) for o in self._run(batch, names)]

    @staticmethod
    def token_output(name: str) -> str:
        return layer_output(name)

    def run_tokens(self, batch: Batch, layers: list[str]) -> list[np.ndarray]:
        check_depth(layers, self.depth, self.name)
        check_pooled_only(self.pooled_only, self.name)
        outs = self._run(batch, [self.token_output(n) for n in layers])
        import numpy as np

        return [np.asarray(o, dtype=np.float32) for o in outs]

    @property
    def carries_own_last(self) -> bool:
        return OWN_LAST in self.output_names

    def run(self, batch: Batch, layers: list[str], poolings: list[str]) -> dict[str, np.ndarray]:
        recipe = st_recipe(self.manifest) if ST in poolings else None
        run, own_row = self.st_plan(layers, poolings)
        return with_st(poolings, lambda modes: self._run_pooled(batch, run, modes), recipe, own_row=own_row)

    def run_with_tokens(self, batch: Batch, layers: list[str],
                        poolings: list[str]) -> tuple[dict[str, np.ndarray], list[np.ndarray]]:
        """Pooled vectors and token states from one ``session.run``: the graph's pooled outputs and its
        ``hidden_states.N`` outputs are fetched together, so the pooled rows equal a pooled-only run's."""
        got: dict[str, list] = {}
        recipe = st_recipe(self.manifest) if ST in poolings else None
        run, own_row = self.st_plan(layers, poolings)
        pooled = with_st(poolings, lambda modes: self._run_pooled(batch, run, modes, keep=got), recipe,
                         own_row=own_row)
        return pooled, got["states"]

    def _run_pooled(self, batch: Batch, layers: list[str], poolings: list[str],
                    keep: dict | None = None) -> dict[str, np.ndarray]:
        """Pooled vectors; with ``keep``, the token states of ``layers`` are fetched in the same run and
        left in ``keep["states"]``. ``layers`` may end with ``OWN_LAST`` (``st_plan``): the model's own last
        hidden state, fetched in the same run and pooled here (never kept)."""
        import numpy as np

        own = layers[-1:] if layers and layers[-1] == OWN_LAST else []
        real = layers[:len(layers) - len(own)]
        check_depth(real, self.depth, self.name)
        if keep is not None:
            check_pooled_only(self.pooled_only, self.name)
        in_graph = [p for p in poolings if pooled_output(p) in self.output_names] if self.in_graph_pooling else []
        token_names = [self.token_output(n) for n in real] if keep is not None else []
        states = own_states = None
        if in_graph and all(layer in self.pooled_layers for layer in real):
            rows = [self.pooled_layers.index(layer) for layer in real]
            outs = self._run(batch, [pooled_output(p) for p in in_graph] + token_names + own)
            result = {p: np.asarray(o, dtype=np.float32)[rows] for p, o in zip(in_graph, outs)}
            if keep is not None:
                states = [np.asarray(o, dtype=np.float32) for o in outs[len(in_graph):len(in_graph) + len(real)]]
            if own:
                own_states = np.asarray(outs[-1], dtype=np.float32)
                result = {p: np.concatenate([v, pool_states(self.manifest, batch, own_states, p)[None]])
                          for p, v in result.items()}
        else:
            in_graph, result = [], {}
        rest = [p for p in poolings if p not in in_graph]
        if states is None and (rest or keep is not None):
            got = self.run_tokens(batch, layers)
            states, own_states = (got[:-1], got[-1]) if own else (got, None)
        if keep is not None:
            keep["states"] = states
        for mode in rest:
            result[mode] = np.stack([pool_states(self.manifest, batch, s, mode)
                                     for s in [*states, *([own_states] if own else [])]])
        return {p: result[p] for p in poolings}

    def pooled_output(self, batch: Batch) -> np.ndarray | None:
        """The model's own pooled output (CLIP's ``pooler_output``) where the export has it as an output."""
        name = self.manifest.pooled_output
        if not name or name not in self.output_names:
            return None
        import numpy as np

        return np.asarray(self._run(batch, [name])[0], dtype=np.float32)

    def close(self) -> None:
        self.session = None
        if self._resumer is not None:
            self._resumer.close()


@register(EngineSpec(
    "ort", "ONNX Runtime, CPU execution provider", needs_export=True, device="cpu", attention=True,
    attention_default=True, runtime=Runtime.ONNXRUNTIME,
    auto=(AutoRank(45, "gqa", "gqa"), AutoRank(49, "int8-block", "int8-block"), AutoRank(50, "int8", "int8"), AutoRank(70, None, "fp32")),
    variant_files=True,
    options=ORT_OPTIONS + (EngineOption("spinning", bool, False, "let idle threads spin-wait between ops"),
                           ATTENTION_OPTION),
    bench=(BenchRow(note="fp32, session optimizations on, in-graph pooling"),
           BenchRow("tokens", options=(("in_graph_pooling", False),),
                    note="fp32, token-level states copied out and pooled in numpy"),
           BenchRow("noopt", options=(("opt_level", "none"),), note="fp32, graph optimizations off"),
           BenchRow("opt", "opt", note="offline transformer-optimizer variant"),
           BenchRow("gqa", "gqa", note="attention fused into GroupQueryAttention (rotary decoders)"),
           BenchRow("int8", "int8", note="dynamic int8 variant"),
           BenchRow("int8-block", "int8-block", note="int8 weights and activations per block of 32 (MatMulNBits)"),
           BenchRow("fp16", "fp16", note="fp16 variant (LayerNorm/Softmax fp32)"),
           BenchRow("bf16", "bf16", note="bf16 variant"))))
class CpuEngine(OrtEngine):
    """CPU EP, tuned from measurements on a 2-core AVX-512 machine (see benchmarks/README.md):

    - intra-op threads = physical cores (hyper-threads add nothing to GEMM-bound work);
    - no spin-waiting between ops (``spinning=False``): spinning threads burn the cores the
      tokenizer thread and other processes need; on a loaded machine it cost ~2x;
    - batches of about 2,048 padded tokens: the stacked ``[layers, batch, seq, hidden]``
      states of the in-graph pooling then stay in cache; 16,384 was ~1.5x slower per CPU-second.
    """

    name = "ort"
    provider = "CPUExecutionProvider"
    preferred_batch_tokens = 2048

    def __init__(self, model, *, threads: int | None = None, spinning: bool = False, attention: str | None = None,
                 **options):
        self.spinning = bool(spinning)
        self.attention_asked = attention
        self.blocks_above = pick_blocks(attention, options.get("max_seq"))
        super().__init__(model, threads=threads or physical_cores(), **options)

    def session_entries(self) -> dict:
        flag = "1" if self.spinning else "0"
        return {"session.intra_op.allow_spinning": flag, "session.inter_op.allow_spinning": flag}


@register(EngineSpec(
    "cuda", "ONNX Runtime, CUDA execution provider with IO binding", needs_export=True, device="gpu",
    auto=(AutoRank(20, None, "fp32"),), variant_files=True, options=CUDA_OPTIONS, runtime=Runtime.ONNXRUNTIME,
    bench=(BenchRow(note="CUDA EP, IO binding"), BenchRow("fp16", "fp16", note="CUDA EP, fp16 variant"))))
class CudaEngine(OrtEngine):
    """CUDA EP with IO binding: inputs copied once, outputs allocated by ORT on the device."""

    name = "cuda"
    provider = "CUDAExecutionProvider"

    def provider_options(self) -> dict:
        return {"device_id": int(self.options.get("device_id", 0)),
                "arena_extend_strategy": "kSameAsRequested",
                "cudnn_conv_algo_search": "HEURISTIC"}

    def _run(self, batch: Batch, names: list[str]) -> list[np.ndarray]:
        binding = self.session.io_binding()
        for name, arr in self._feed(batch).items():
            binding.bind_cpu_input(name, arr)
        for name in names:
            binding.bind_output(name, "cuda", int(self.options.get("device_id", 0)))
        self.session.run_with_iobinding(binding)
        return binding.copy_outputs_to_cpu()


@register(EngineSpec(
    "trt", "ONNX Runtime, TensorRT execution provider (engine and timing caches beside the export)",
    needs_export=True, device="gpu", auto=(AutoRank(10, None, "fp32"),), variant_files=True,
    runtime=Runtime.ONNXRUNTIME,
    options=CUDA_OPTIONS + (EngineOption("fp16", bool, False, "let TensorRT run in fp16"),
                            EngineOption("opt_batch", int, None, "the batch size TensorRT's profile is tuned for"),
                            EngineOption("opt_seq", int, None, "the length TensorRT's profile is tuned for")),
    bench=(BenchRow(note="TensorRT EP fp32"), BenchRow("fp16", options=(("fp16", True),), note="TensorRT EP fp16"))))
class TensorrtEngine(CudaEngine):
    """TensorRT EP: engine and timing caches next to the export, profiles from the batching plan."""

    name = "trt"
    provider = "TensorrtExecutionProvider"

    def __init__(self, model, **options):
        cache = Path(model.export_dir) / "trt_cache"
        made_here = not cache.exists()
        try:
            super().__init__(model, **options)
        except BaseException:
            if made_here and cache.is_dir() and not any(cache.iterdir()):
                cache.rmdir()  # TensorRT never started: leave no empty cache behind
            raise

    def provider_options(self) -> dict:
        cache = Path(self.model.export_dir) / "trt_cache"
        cache.mkdir(exist_ok=True)
        max_batch = int(self.options.get("max_batch", 256))
        max_seq = int(self.options.get("max_seq", self.manifest.max_length))
        opt_batch = int(self.options.get("opt_batch", min(64, max_batch)))
        opt_seq = int(self.options.get("opt_seq", min(128, max_seq)))
        names = self.manifest.inputs

        def shapes(b, s):
            return ",".join(f"{n}:{b}x{s}" for n in names)

        opts = {
            "device_id": int(self.options.get("device_id", 0)),
            "trt_fp16_enable": bool(self.options.get("fp16", False)),
            "trt_engine_cache_enable": True,
            "trt_engine_cache_path": str(cache),
            "trt_timing_cache_enable": True,
            "trt_timing_cache_path": str(cache),
            "trt_profile_min_shapes": shapes(1, 1),
            "trt_profile_opt_shapes": shapes(opt_batch, opt_seq),
            "trt_profile_max_shapes": shapes(max_batch, max_seq),
        }
        return opts


def probe_providers(export_dir: Path | None = None, only: type | None = None) -> dict[str, tuple[bool, str]]:
    """Which ONNX Runtime engines (or the engine class ``only``) really start here, with the reason when not."""
    from layerscope.engines.registry import engines

    ort_engines = {only.name: only} if only is not None else {
        name: spec.factory for name, spec in engines().items()
        if isinstance(spec.factory, type) and issubclass(spec.factory, OrtEngine) and spec.factory.uses_onnxruntime}
    results: dict[str, tuple[bool, str]] = {}
    try:
        ort = ort_module()
    except EngineUnavailableError as exc:
        return {name: (False, str(exc)) for name in ort_engines}
    model_path = probe_model() if export_dir is None else Path(export_dir) / "model.onnx"
    for name, cls in ort_engines.items():
        try:
            opts = {"trt_engine_cache_enable": False} if cls.provider == "TensorrtExecutionProvider" else {}
            make_session(model_path, cls.provider, opts)
        except EngineUnavailableError as exc:
            results[name] = (False, str(exc))
        else:
            results[name] = (True, f"onnxruntime {ort.__version__}, {cls.provider}")
    return results
