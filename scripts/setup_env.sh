#!/usr/bin/env bash
# Make (or reuse) a Python environment with layerscope installed, and print its python path.
# - Inside an active virtual environment, that environment is used as it is.
# - Otherwise .venv/ in the repository is created (or reused).
# - PyTorch is installed only when the environment has none: an existing torch is never replaced.
#   (pip install torch==2.13.0 takes the CPU build where one is provided locally; elsewhere PyPI's
#   default build is used.)
# Usage: scripts/setup_env.sh [EXTRAS]   e.g. scripts/setup_env.sh test
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
extras="${1:-}"
if [ -n "${VIRTUAL_ENV:-}" ] && [ -x "${VIRTUAL_ENV}/bin/python" ]; then
  py="${VIRTUAL_ENV}/bin/python"
else
  if [ ! -x "$here/.venv/bin/python" ]; then
    python3 -m venv "$here/.venv" >&2
  fi
  py="$here/.venv/bin/python"
fi
# pip's warnings about index locations missing on this machine are noise, not errors
quiet_pip() { "$py" -m pip "$@" 2> >(grep -v "is ignored: it is neither a file nor a directory" >&2) >&2; }
quiet_pip install -q --upgrade pip || true
if ! "$py" -c "import torch" >/dev/null 2>&1; then
  echo "installing PyTorch (none in this environment)" >&2
  quiet_pip install -q "torch==2.13.0"
fi
spec="$here"
[ -n "$extras" ] && spec="$here[$extras]"
if "$py" -m pip show -q onnxruntime-gpu >/dev/null 2>&1 && ! "$py" -m pip show -q onnxruntime >/dev/null 2>&1; then
  # The environment runs the GPU build of ONNX Runtime. Plain onnxruntime (a core dependency) would
  # install over the same module, so install every other requirement and layerscope itself without it.
  mapfile -t reqs < <("$py" - "$here/pyproject.toml" "$extras" <<'PY'
import re, sys
try:
    import tomllib
except ImportError:  # Python 3.10
    import tomli as tomllib
project = tomllib.load(open(sys.argv[1], "rb"))["project"]
reqs = list(project["dependencies"])
for extra in filter(None, sys.argv[2].split(",")):
    reqs += project["optional-dependencies"][extra]
for r in reqs:
    if re.split(r"[<>=!~;\[ ]", r, maxsplit=1)[0].strip().lower() not in ("onnxruntime", "onnxruntime-gpu"):
        print(r)
PY
)
  quiet_pip install -q "${reqs[@]}"
  quiet_pip install -q --no-deps -e "$here"
else
  quiet_pip install -q -e "$spec"
fi
echo "$py"
