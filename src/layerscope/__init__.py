"""layerscope: look inside embedding models layer by layer, fast.

The public names are imported from the top (``from layerscope import LayerStore``) and load their
module on first use, so ``import layerscope`` stays light (no numpy, torch or ONNX Runtime).
"""

__version__ = "0.1.0"


def _telemetry_off() -> None:
    """Nothing leaves the machine: the telemetry of the libraries layerscope runs is off in every process that
    imports it (the CLI, and each process it starts: spawned workers, bench rows, export children, Ray actors
    all import layerscope before they run anything), before any of them is imported.

    OpenVINO has no switch of its own: ``import openvino`` sends an event through ``openvino_telemetry`` (and
    writes a client id under ``~/intel``) unless that package cannot be imported, when OpenVINO runs its own
    stub. Marking it absent in ``sys.modules`` is that case; where OpenVINO came first, its modules are handed
    the stub. ONNX Runtime (its 1DS events, with a device id and an event store under ``~/.cache/Microsoft``),
    Hugging Face Hub and Ray read their documented variables, set here for child processes too (a value the user
    set is kept); an ONNX Runtime imported before layerscope is told to stop its events."""
    import os
    import sys

    os.environ.setdefault("ORT_DISABLE_TELEMETRY", "1")
    os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    ort = sys.modules.get("onnxruntime")
    if ort is not None and os.environ["ORT_DISABLE_TELEMETRY"] == "1" and hasattr(ort, "disable_telemetry_events"):
        ort.disable_telemetry_events()
    if sys.modules.get("openvino_telemetry", None) is None:
        sys.modules["openvino_telemetry"] = None  # type: ignore[assignment]  # import raises ImportError
        return
    stub = sys.modules.get("openvino.tools.ovc.telemetry_stub")
    for name, module in list(sys.modules.items()):
        if name.startswith("openvino.tools.ovc") and getattr(module, "tm", None) is sys.modules["openvino_telemetry"]:
            if stub is None:
                import importlib

                stub = importlib.import_module("openvino.tools.ovc.telemetry_stub")
            module.tm = stub


_telemetry_off()

# public name -> the module that defines it, imported on first access
_LAZY = {"LayerStore": "layerscope.store.store", "embed": "layerscope.extraction.pipeline",
         "extract": "layerscope.extraction.pipeline"}
__all__ = ["LayerStore", "embed", "extract", "open", "__version__"]


def __getattr__(name: str):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'layerscope' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


def open(model, *, engine: str = "auto", **engine_options):  # noqa: A001 - the public name is layerscope.open
    """Open a model once for repeated encoding: ``layerscope.open("minilm").embed(texts, layers=[-1])``."""
    from layerscope.session import open_model

    return open_model(model, engine=engine, **engine_options)
