#!/usr/bin/env bash
# Recovery after a killed rank, elastic against restart-everything (see elastic.py).
#   tests/bench/elastic.sh [build-dir] [elastic.py options...]
set -euo pipefail
src=$(cd "$(dirname "$0")/../.." && pwd)
build=${1:-$src/build}
shift || true
exec python3 "$src/tests/bench/elastic.py" --build "$build" "$@"
