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
quiet_pip install -q -e "$spec"
echo "$py"
