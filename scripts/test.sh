#!/usr/bin/env bash
# Install layerscope with its test extras and run the whole test suite.
# Where this machine has two cores or more, the suite runs in two pytest-xdist workers: each test file runs whole
# on one worker (its module fixtures are made once), the longest files first (tests/conftest.py orders them).
# Options given to this script come after those and win: -n 0 runs every test in this one process, -n 4 runs four
# workers, --dist load hands out single tests; --pdb, --trace and -p no:xdist run in one process too.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
py="$("$here/scripts/setup_env.sh" test)"
cd "$here"
workers=()
if "$py" -c 'import os, sys, xdist  # noqa: F401
cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
sys.exit(0 if cores >= 2 else 1)' 2>/dev/null; then
  workers=(-n 2 --dist loadfile --no-loadscope-reorder)
fi
for arg in "$@"; do
  case "$arg" in
    --pdb|--trace|no:xdist|-pno:xdist) workers=() ;;
  esac
done
exec "$py" -m pytest -q -p no:cacheprovider ${workers[@]+"${workers[@]}"} "$@"
