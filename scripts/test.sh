#!/usr/bin/env bash
# Install layerscope with its test extras and run the whole test suite.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
py="$("$here/scripts/setup_env.sh" test)"
cd "$here"
exec "$py" -m pytest -q -p no:cacheprovider "$@"
