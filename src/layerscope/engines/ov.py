"""OpenVINO Runtime engine ``ov``: the same ONNX export, compiled for the CPU by OpenVINO.

Precisions (``variant``):

- ``fp32`` (default): the fp32 export, fp32 inference precision.
- ``bf16``: the fp32 export with OpenVINO's bf16 inference precision; only where
  OpenVINO itself reports BF16 among the CPU's optimization capabilities
  (AVX-512 BF16 or AMX).  On a CPU without it OpenVINO would quietly run fp32,
  so asking for it here is one clear error instead.
- ``int8``: OpenVINO reading the export's ``int8`` variant (the ONNX Runtime
  dynamic-quantized graph: DynamicQuantizeLinear + MatMulInteger).

Each is recorded in the manifest (``layerscope optimize --variant ov-fp32,ov-bf16,ov-int8``)
with per-output parity against PyTorch fp32, like the ONNX Runtime variants.
The in-graph pooled outputs and every hidden state come from the same graph,
so ``run``/``run_tokens`` are the ONNX Runtime engine's.
"""

from __future__ import annotations

import queue
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable, Iterator

from layerscope.engines.base import Engine
from layerscope.engines.blocked import ATTENTION_OPTION, engine_blocks, pick_blocks

from layerscope.engines.registry import AutoRank, BenchRow, EngineOption, EngineSpec, Runtime, register
from layerscope.engines.ort import OrtEngine
from layerscope.engines.ort_session import physical_cores
from layerscope.engines.truncate import engine_graph
from layerscope.errors import EngineUnavailableError, InputError

if TYPE_CHECKING:  # numpy loads when an engine runs, not when the registry is read (the CLI's help)
    import numpy as np

    from layerscope.model.tokenize import Batch

OV_PRECISIONS = ("fp32", "bf16", "int8")
IN_FLIGHT = 2  # batches the throughput mode keeps in flight: one per core of the 2-core machines it was measured on


def ov_module():
    try:
        import openvino
    except ImportError as exc:
        raise EngineUnavailableError("openvino is not installed: pip install 'layerscope[openvino]'") from exc
    return openvino


_CORE = None


def ov_core():
    global _CORE
    if _CORE is None:
        _CORE = ov_module().Core()
    return _CORE


def cpu_capabilities() -> list[str]:
    """What OpenVINO says the CPU can compute in (``FP32``, ``BF16``, ``INT8``, ``FP16`` ...)."""
    return [str(c) for c in ov_core().get_property("CPU", "OPTIMIZATION_CAPABILITIES")]


def check_precision(precision: str) -> str:
    """``precision`` if this CPU runs it in OpenVINO, else EngineUnavailableError saying why."""
    if precision not in OV_PRECISIONS:
        raise InputError(f"unknown ov precision '{precision}'; choose from {', '.join(OV_PRECISIONS)}")
    caps = cpu_capabilities()
    if precision == "bf16" and "BF16" not in caps:
        raise EngineUnavailableError(
            f"this CPU has no bf16 compute (OpenVINO reports {', '.join(caps)}; bf16 needs AVX-512 BF16 or AMX): "
            "use ov fp32 or int8")
    return precision


class _Port:
    def __init__(self, name: str, type_: str = ""):
        self.name = name
        self.type = type_


class OvSession:
    """A compiled OpenVINO model behind the few calls layerscope makes on an ONNX Runtime session."""

    def __init__(self, model_path: Path, precision: str = "fp32", threads: int | None = None, requests: int = 1):
        ov = ov_module()
        self.args = (precision, threads, requests)  # what a session on another graph is made with (reopen)
        check_precision(precision)
        core = ov_core()
        config: dict[str, Any] = {
            # one stream when batches come one at a time; with several in flight, one stream per request
            "PERFORMANCE_HINT": "LATENCY" if requests == 1 else "THROUGHPUT",
            "INFERENCE_PRECISION_HINT": "bf16" if precision == "bf16" else "f32",
        }
        if requests > 1:
            config["NUM_STREAMS"] = int(requests)
        if threads:
            config["INFERENCE_NUM_THREADS"] = int(threads)
        graph_inputs, graph_outputs = _onnx_io_names(model_path)
        try:
            model = core.read_model(str(model_path))
            self.compiled = core.compile_model(model, "CPU", config)
        except Exception as exc:  # OpenVINO raises its own untyped errors
            raise EngineUnavailableError(
                f"OpenVINO could not compile {Path(model_path).name}: {str(exc).strip().splitlines()[0][:200]}"
            ) from exc
        self._requests: queue.Queue = queue.Queue()
        for _ in range(max(1, int(requests))):  # a request serves one batch at a time; a caller waits for a free one
            self._requests.put(self.compiled.create_infer_request())
        # a port carries every name its tensor had (BLOOM's mask input is also a Cast's output): the graph's
        self._inputs = [_Port(_graph_name(p, graph_inputs), "tensor(int64)") for p in self.compiled.inputs]
        self._outputs = [_Port(_graph_name(p, graph_outputs)) for p in self.compiled.outputs]
        self._index = {p.name: i for i, p in enumerate(self._outputs)}
        hint = self.compiled.get_property("INFERENCE_PRECISION_HINT")
        self.precision = hint.get_type_name() if hasattr(hint, "get_type_name") else str(hint)
        self.version = ov.__version__

    def get_inputs(self):
        return self._inputs

    def get_outputs(self):
        return self._outputs

    def run(self, names: list[str], feed: dict[str, np.ndarray]) -> list[np.ndarray]:
        import numpy as np

        request = self._requests.get()
        try:  # infer() leaves Python's lock while it runs, so two threads keep two requests busy
            results = request.infer(feed, share_inputs=True)
            # infer() returns views into the request's own buffers: copy what is kept past the next call
            return [np.array(results[self._index[n]], copy=True) for n in names]
        finally:
            self._requests.put(request)


def _onnx_io_names(path: Path) -> tuple[list[str], list[str]]:
    import onnx

    graph = onnx.load(str(path), load_external_data=False).graph
    return [i.name for i in graph.input], [o.name for o in graph.output]


def _graph_name(port, graph_outputs: list[str]) -> str:
    """The ONNX input or output name of a compiled port (a port carries every name its tensor had in the graph)."""
    names = port.get_names()
    for name in graph_outputs:
        if name in names:
            return name
    return port.any_name


def ov_variant_key(precision: str) -> str:
    return f"ov-{precision}"


@register(EngineSpec(
    "ov", "OpenVINO Runtime on the CPU (fp32, bf16 where the CPU has it, the int8 variant)", needs_export=True,
    device="cpu", attention=True,
    auto=(AutoRank(30, "bf16", "ov-bf16", at_export=True), AutoRank(40, "int8", "ov-int8"),
          AutoRank(60, None, "ov-fp32")),
    runtime=Runtime.OPENVINO, precision_variants=(("int8", "int8"),),  # int8 runs the export's int8 graph
    options=(EngineOption("variant", str, None, "the OpenVINO precision: fp32, bf16 or int8"),
             EngineOption("in_graph_pooling", bool, True, "pool inside the graph (False: token states pooled in numpy)"),
             ATTENTION_OPTION,
             EngineOption("requests", int, None, "batches in flight: 1 (one stream) or 2 (throughput mode, a stream "
                                                 "each); default: whichever layerscope bench measured faster on "
                                                 "this CPU, else 1")),
    bench=(BenchRow(note="OpenVINO fp32, in-graph pooling, one batch in flight", options=(("requests", 1),)),
           BenchRow(f"x{IN_FLIGHT}", note="OpenVINO fp32, two batches in flight (throughput mode, two streams)",
                    options=(("requests", IN_FLIGHT),)),
           BenchRow("bf16", "bf16", note="OpenVINO bf16 inference precision (CPUs with bf16 compute)",
                    options=(("requests", 1),)),
           BenchRow(f"bf16-x{IN_FLIGHT}", "bf16", note="OpenVINO bf16, two batches in flight (throughput mode)",
                    options=(("requests", IN_FLIGHT),)),
           BenchRow("int8", "int8", note="OpenVINO running the dynamic int8 variant", options=(("requests", 1),)))))
class OvEngine(OrtEngine):
    """OpenVINO on the CPU; ``variant`` is its precision (fp32, bf16, int8)."""

    name = "ov"
    uses_onnxruntime = False
    preferred_batch_tokens = 2048

    def __init__(self, model, *, threads: int | None = None, variant: str | None = None,
                 in_graph_pooling: bool = True, depth: int | None = None,
                 pooled_only: bool = False, requests: int | None = None, attention: str | None = None,
                 spec: EngineSpec | None = None, **options):
        handle = model  # an export: create_engine refuses a plain model for this engine
        Engine.__init__(self, handle, spec)
        self.options = options
        precision = variant if variant not in (None, "", "ov-fp32") else "fp32"
        precision = precision[3:] if precision.startswith("ov-") else precision
        if precision not in OV_PRECISIONS:
            raise InputError(f"the ov engine runs variants {', '.join(OV_PRECISIONS)}, not '{variant}'")
        from layerscope.model.variants import run_variant

        self.variant = run_variant(precision)  # fp32 runs the export's own graph: no variant
        path = handle.onnx_path
        if precision == "int8":
            from layerscope.model.variants import variant_onnx_file

            path = handle.export_dir / variant_onnx_file(handle.manifest, "int8")
            _check_sha(handle, "int8", path)
        self.in_graph_pooling = bool(in_graph_pooling)
        self.source_graph = path  # the graph the derived ones (early exit, blocks, resume) are made from
        path, self.pooled_layers = engine_graph(self, path, depth, pooled_only)  # early exit (engines/truncate.py)
        self.attention_asked = attention
        self.blocks_above = pick_blocks(attention, options.get("max_seq"))
        path = engine_blocks(self, path, self.pooled_layers, attention)  # long texts (engines/blocked.py)
        self.graph_path = path
        self.requests, why = in_flight(self.manifest, precision, requests)
        if why:
            self.info.notes.append(why)
        self.session = OvSession(path, precision, threads or physical_cores(), self.requests)
        self.input_names = [i.name for i in self.session.get_inputs()]
        self.input_types = {i.name: i.type for i in self.session.get_inputs()}
        self.output_names = [o.name for o in self.session.get_outputs()]
        self.info.provider = f"openvino {self.session.version} CPU ({self.session.precision})"
        self.info.device = "cpu"
        self.info.precision = precision
        recorded = self.manifest.variant(ov_variant_key(precision))
        if recorded is None and precision != "fp32":  # fp32 runs the export's graph: its parity is the export's
            self.info.notes.append(f"accuracy of ov {precision} not recorded yet (layerscope optimize "
                                   f"{handle.export_dir} --variant {ov_variant_key(precision)})")

    def reopen(self, path: Path) -> None:
        """Run the graph ``path`` from now on, compiled as this one was once it is released."""
        args = self.session.args
        self.session = None
        self.session = OvSession(path, *args)
        self.graph_path = path

    def open_graph(self, path: Path):
        """Another graph (a resume graph) compiled as this engine's own, one request."""
        precision, threads, _ = self.session.args
        return OvSession(path, precision, threads, 1)

    def run_stream(self, batches: Iterable[Batch], layers: list[str],
                   poolings: list[str]) -> Iterator[tuple[Batch, dict[str, np.ndarray]]]:
        """``run`` over ``batches`` with ``requests`` of them in flight at once (each on a thread of its own,
        each thread on an infer request of its own), handed back in order. Before a batch that moves the engine
        onto its graph in blocks, the batches in flight are handed back first: the graph it leaves is then
        released, never held beside the new one."""
        if self.requests < 2:
            yield from super().run_stream(batches, layers, poolings)
            return
        from collections import deque
        from concurrent.futures import ThreadPoolExecutor

        from layerscope.engines.blocked import next_graph

        with ThreadPoolExecutor(self.requests, thread_name_prefix="layerscope-ov") as pool:
            flying: deque = deque()
            try:
                for batch in batches:
                    if next_graph(self, batch) is not None:
                        while flying:
                            done, fut = flying.popleft()
                            yield done, fut.result()
                        self.blocks_for(batch)
                    flying.append((batch, pool.submit(self.run, batch, layers, poolings)))
                    if len(flying) >= self.requests:
                        done, fut = flying.popleft()
                        yield done, fut.result()
                while flying:
                    done, fut = flying.popleft()
                    yield done, fut.result()
            finally:
                for _, fut in flying:
                    fut.cancel()

    @classmethod
    def probe(cls, export_dir=None) -> tuple[bool, str]:
        """(works, detail): whether OpenVINO imports, and the CPU capabilities it reports."""
        try:
            version = ov_module().__version__.split("-")[0]
            caps = cpu_capabilities()
        except EngineUnavailableError as exc:
            return False, str(exc)
        bf16 = "bf16 too" if "BF16" in caps else "no bf16 on this CPU"
        return True, f"OpenVINO {version} on CPU ({', '.join(caps)}; {bf16})"

    @classmethod
    def variants_off_here(cls) -> tuple[str, ...]:
        """``bf16`` where OpenVINO reports no bf16 compute on this CPU (check_precision refuses it there)."""
        try:
            return () if "BF16" in cpu_capabilities() else ("bf16",)
        except EngineUnavailableError:
            return ()


def in_flight(manifest, precision: str, asked: int | None) -> tuple[int, str | None]:
    """(batches in flight, the note saying why) for OpenVINO at ``precision``: ``asked`` when given, else the
    faster of the one- and two-in-flight bench rows recorded on this CPU (engines/speed_order.py), else 1."""
    if asked is not None:
        if int(asked) not in (1, IN_FLIGHT):
            raise InputError(f"requests={asked}: the ov engine keeps 1 or {IN_FLIGHT} batches in flight")
        return int(asked), None
    from layerscope.engines.speed_order import IN_FLIGHT_SUFFIX, bench_name, measured_run

    one = bench_name("ov", None if precision == "fp32" else precision)
    two = one + IN_FLIGHT_SUFFIX
    speeds = (measured_run(manifest.onnx_sha256) or {}).get("texts_per_s") or {}
    if one not in speeds or two not in speeds:
        return 1, None
    pick = IN_FLIGHT if speeds[two] > speeds[one] else 1
    return pick, (f"{pick} batch{'es' if pick > 1 else ''} in flight: layerscope bench measured {two} at "
                  f"{speeds[two]:,.0f} texts/s and {one} at {speeds[one]:,.0f} on this CPU")


def _check_sha(handle, kind: str, path: Path) -> None:
    from layerscope.errors import ManifestError
    from layerscope.model.derived import variant_problem

    why = variant_problem(handle.export_dir, handle.manifest, kind)  # its files, and the graph it was made for
    if why is not None:
        raise ManifestError(f"{path}: {why}; re-make it with layerscope optimize {handle.export_dir} --variant {kind} "
                            "--force")
