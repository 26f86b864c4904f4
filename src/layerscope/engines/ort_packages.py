"""Which ONNX Runtime package is installed and active: ``onnxruntime`` (CPU) or ``onnxruntime-gpu``.

Both distributions install the same ``onnxruntime`` module, so with both present
the files of whichever was installed last are the ones that run, and pip cannot
tell.  ``ort_packages`` reports the installed distributions, the build that is
actually imported (the GPU build lists the CUDA provider), and a warning with the
fix when both are installed.
"""

from __future__ import annotations

from dataclasses import dataclass, field

DISTRIBUTIONS = ("onnxruntime", "onnxruntime-gpu")


@dataclass
class OrtPackages:
    installed: dict[str, str]  # distribution -> version
    active: str | None  # "onnxruntime" or "onnxruntime-gpu" (the build that imports), None if none
    active_version: str | None = None
    warnings: list[str] = field(default_factory=list)

    def line(self) -> str:
        if not self.installed:
            return "no ONNX Runtime installed: pip install onnxruntime (CPU) or 'layerscope[gpu]'"
        have = ", ".join(f"{k} {v}" for k, v in self.installed.items())
        return f"installed: {have}; active build: {self.active or 'none'}" + (
            f" {self.active_version}" if self.active_version else "")


def _installed() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    for name in DISTRIBUTIONS:
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            continue
    return out


_LOOK = object()


def ort_packages(installed: dict[str, str] | None = None, providers: list[str] | None | object = _LOOK,
                 module_version: str | None = None) -> OrtPackages:
    """What is installed and what runs (arguments override the look-ups, for tests;
    ``providers=None`` means "onnxruntime does not import")."""
    installed = _installed() if installed is None else installed
    if providers is _LOOK:
        try:
            import onnxruntime

            providers = list(onnxruntime.get_available_providers())
            module_version = onnxruntime.__version__
        except ImportError:
            providers = None
    active = None
    if providers is not None:
        active = "onnxruntime-gpu" if "CUDAExecutionProvider" in providers else "onnxruntime"
    info = OrtPackages(installed, active, module_version)
    if len(installed) > 1:
        info.warnings.append(
            "both onnxruntime and onnxruntime-gpu are installed; they share one module, so the build that "
            f"runs is whichever was installed last (now: {active or 'unknown'}). Keep one: for the GPU, "
            "pip uninstall -y onnxruntime onnxruntime-gpu && pip install onnxruntime-gpu; for the CPU, "
            "pip uninstall -y onnxruntime onnxruntime-gpu && pip install onnxruntime")
    if installed and providers is None:
        info.warnings.append("an ONNX Runtime distribution is installed but 'import onnxruntime' fails: "
                             "reinstall it (pip install --force-reinstall " + next(iter(installed)) + ")")
    return info
