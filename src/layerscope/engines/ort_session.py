"""Making an ONNX Runtime session: the module loaded once, the GPU libraries preloaded, and the native stderr
captured while providers load, so a requested provider that did not load becomes one clear error naming why.

Engines (``ort.py``), the export's validation, early exit's check and the lens heads all make their sessions here.
"""

from __future__ import annotations

import contextlib
import functools
import os
import re
import tempfile
from pathlib import Path
from typing import Any

from layerscope.errors import EngineUnavailableError


@contextlib.contextmanager
def captured_stderr():
    """Capture what native code writes to fd 2 (ONNX Runtime's provider-loading noise)."""
    box = {"text": ""}
    try:
        fd = os.dup(2)
    except OSError:  # no real stderr (some notebook kernels)
        yield box
        return
    import io
    import sys

    py_out, py_err = io.StringIO(), io.StringIO()
    with tempfile.TemporaryFile(mode="w+b") as tmp:
        sys.stderr.flush()
        os.dup2(tmp.fileno(), 2)
        try:
            # onnxruntime also print()s its fallback notice from Python
            with contextlib.redirect_stdout(py_out), contextlib.redirect_stderr(py_err):
                yield box
        finally:
            os.dup2(fd, 2)
            os.close(fd)
            tmp.seek(0)
            box["text"] = tmp.read().decode("utf-8", "replace") + py_out.getvalue() + py_err.getvalue()


def _reason(noise: str, provider: str) -> str:
    """The one line of ONNX Runtime's noise that says why a provider did not load."""
    if provider == "TensorrtExecutionProvider" and ("TensorRT" in noise or "nvinfer" in noise):
        return "the TensorRT libraries (libnvinfer) are not installed or no supported GPU is present"
    for pattern in (r"(lib[\w.+-]+\.so[\w.]*): cannot open shared object file",
                    r"(CUDA driver version is insufficient[^\n]*)",
                    r"(no CUDA-capable device is detected)",
                    r"(cudaErrorNoDevice[^\n]*)"):
        m = re.search(pattern, noise)
        if m:
            what = m.group(1)
            return f"{what} cannot be loaded" if what.startswith("lib") else what
    return "ONNX Runtime could not load it on this machine (no GPU, or its libraries are missing)"


def ort_module():
    try:
        import onnxruntime as ort
    except ImportError as exc:
        raise EngineUnavailableError(
            "onnxruntime is not installed: pip install onnxruntime (or onnxruntime-gpu on Linux x86-64)") from exc
    ort.set_default_logger_severity(3)
    return ort


_PROBED: dict[str, str] = {}  # provider -> "" when it loads, else the reason (per process)
_PRELOADED: list[bool] = []


def preload_gpu_libraries(ort) -> None:
    """Load the CUDA and cuDNN libraries once per process where this build knows how (onnxruntime-gpu >= 1.21:
    from PyTorch's lib dir or the ``nvidia-*`` pip packages), so the CUDA provider finds them without
    LD_LIBRARY_PATH. Where it cannot, the provider's own start reports the missing file by name."""
    if _PRELOADED or not hasattr(ort, "preload_dlls"):
        return
    _PRELOADED.append(True)
    with captured_stderr():
        try:
            ort.preload_dlls()
        except Exception:  # noqa: BLE001 - a failed preload leaves the provider to name what it misses
            pass


def make_session(model_path: str | Path | bytes, provider: str, provider_options: dict | None = None, *,
                 threads: int | None = None, opt_level: str = "all", extra: dict | None = None, options=None):
    """An InferenceSession that really runs on ``provider``, or EngineUnavailableError with the reason.
    ``options``: the SessionOptions of a session made here before (``threads``, ``opt_level`` and ``extra`` are
    then its own)."""
    ort = ort_module()
    if provider not in ort.get_available_providers():
        raise EngineUnavailableError(
            f"{provider} is not in this onnxruntime build (it has {', '.join(ort.get_available_providers())}); "
            "install onnxruntime-gpu for CUDA/TensorRT")
    if provider != "CPUExecutionProvider":
        preload_gpu_libraries(ort)
    if provider != "CPUExecutionProvider" and model_path != probe_model():
        # Find out on a one-node graph first: a GPU provider that cannot load fails in milliseconds
        # there, instead of after the full model was read and partitioned.
        reason = _PROBED.get(provider)
        if reason is None:
            try:
                make_session(probe_model(), provider, {"trt_engine_cache_enable": False}
                             if provider == "TensorrtExecutionProvider" else {})
                _PROBED[provider] = ""
            except EngineUnavailableError as exc:
                _PROBED[provider] = str(exc)
            reason = _PROBED[provider]
        if reason:
            raise EngineUnavailableError(reason)
    so = options if options is not None else _session_options(ort, threads, opt_level, extra)
    providers: list[Any] = [(provider, provider_options or {})]
    if provider != "CPUExecutionProvider":
        providers.append("CPUExecutionProvider")
    with captured_stderr() as noise:
        try:
            model = model_path if isinstance(model_path, bytes) else str(model_path)
            session = ort.InferenceSession(model, sess_options=so, providers=providers)
        except Exception as exc:  # onnxruntime raises its own untyped errors here
            session, error = None, exc
        else:
            error = None
    if session is None:
        raise EngineUnavailableError(f"{provider} failed to start: {str(error).splitlines()[0][:200]}")
    got = session.get_providers()
    if got[0] != provider:
        raise EngineUnavailableError(f"{provider} did not load: {_reason(noise['text'], provider)}")
    return session


def _session_options(ort, threads: int | None, opt_level: str, extra: dict | None):
    so = ort.SessionOptions()
    so.log_severity_level = 3
    so.graph_optimization_level = {
        "none": ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
        "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
        "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
        "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
    }[opt_level]
    if threads:
        so.intra_op_num_threads = int(threads)
    for key, value in (extra or {}).items():
        so.add_session_config_entry(key, str(value))
    return so


def physical_cores() -> int | None:
    try:
        import psutil

        return psutil.cpu_count(logical=False)
    except ImportError:
        return None


@functools.lru_cache(maxsize=1)
def probe_model() -> bytes:
    """A one-node ONNX model, enough to see whether a provider starts: made in memory and handed to ONNX Runtime
    as bytes, never a file (a fixed name in a shared /tmp is a file anyone may place or link first)."""
    from onnx import TensorProto, helper

    node = helper.make_node("Add", ["x", "x"], ["y"])
    graph = helper.make_graph([node], "probe", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model.SerializeToString()
