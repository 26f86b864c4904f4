"""Packaging: plain onnxruntime for the CPU install, onnxruntime-gpu as an extra, a check of which one runs."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from layerscope.engines.ort_packages import ort_packages

ROOT = Path(__file__).resolve().parents[1]


def _project():
    try:
        import tomllib
    except ImportError:  # Python 3.10
        import tomli as tomllib
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def _name(req: str) -> str:
    return re.split(r"[<>=!~;\[ ]", req, maxsplit=1)[0].strip().lower()


def test_cpu_install_is_plain_onnxruntime_and_gpu_is_an_extra():
    project = _project()
    core = {_name(r): r for r in project["dependencies"]}
    assert "onnxruntime" in core and "onnxruntime-gpu" not in core
    assert [_name(r) for r in project["optional-dependencies"]["gpu"]] == ["onnxruntime-gpu"]
    assert not [r for r in project["dependencies"] if "==" in r or "~=" in r], "exact pins are back"
    extras = project["optional-dependencies"]
    assert "captum" not in {_name(r) for k, v in extras.items() if k != "test" for r in v}
    assert {"datasets", "mteb"} <= set(extras)


def test_check_warns_when_both_builds_are_installed():
    both = ort_packages({"onnxruntime": "1.31.1", "onnxruntime-gpu": "1.31.1"},
                        ["CPUExecutionProvider"], "1.31.1")
    assert both.active == "onnxruntime"
    assert len(both.warnings) == 1 and "both onnxruntime and onnxruntime-gpu" in both.warnings[0]
    gpu = ort_packages({"onnxruntime-gpu": "1.31.1"},
                       ["TensorrtExecutionProvider", "CUDAExecutionProvider", "CPUExecutionProvider"], "1.31.1")
    assert gpu.active == "onnxruntime-gpu" and gpu.warnings == []
    assert "active build: onnxruntime-gpu 1.31.1" in gpu.line()
    none = ort_packages({}, None)
    assert none.active is None and "pip install onnxruntime" in none.line()


def test_engines_command_says_which_build_is_active():
    import os

    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"))
    out = subprocess.run([sys.executable, "-m", "layerscope", "engines"], capture_output=True, text=True, env=env)
    assert out.returncode == 0, out.stderr
    assert "ONNX Runtime: installed:" in out.stdout and "active build:" in out.stdout


def test_help_names_layerscope_with_inspect_as_alias():
    import os

    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"))
    out = subprocess.run([sys.executable, "-m", "layerscope", "--help"], capture_output=True, text=True, env=env)
    assert "Usage: layerscope" in out.stdout
    assert "`inspect` is the same command" in " ".join(out.stdout.split())
