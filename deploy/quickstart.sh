#!/usr/bin/env bash
# One command from a fresh Debian 12 machine to a trained model: installs the dependencies,
# builds ddpd, turns a text corpus into byte-level token shards, and runs
# deploy/examples/quickstart.yaml (a 0.83M-parameter byte-level GPT-2, 2 data-parallel ranks on
# the local CPU) with `ddpctl run`, which starts an embedded daemon when none is running and
# follows the job.
# Prints live progress and, at the end, a text sample from the trained model.
#
#   deploy/quickstart.sh [TEXT_FILE...]
#
# Without arguments the corpus is Debian's `fortunes` package (about 2 MB of English text).
# QUICKSTART_SPEC=FILE runs another spec over the same data (the CI test runs a short one).
set -euo pipefail
cd "$(dirname "$0")/.."

deploy/install-deps.sh
if [ $# -eq 0 ]; then
  if [ ! -d /usr/share/games/fortunes ]; then
    sudo=""; [ "$(id -u)" -eq 0 ] || sudo="sudo"
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq fortunes >/dev/null
  fi
  set -- $(find /usr/share/games/fortunes -maxdepth 1 -type f ! -name '*.dat' ! -name '*.u8' | sort)
fi

[ -f build/build.ninja ] || meson setup build >/dev/null
ninja -C build >/dev/null

build/worker/ddp-prep --out data/quickstart --val-fraction 0.05 "$@"
out=$(mktemp)
trap 'rm -f "$out"' EXIT
build/daemon/ddpctl run "${QUICKSTART_SPEC:-deploy/examples/quickstart.yaml}" | tee "$out"
run_dir=$(sed -n 's/^run dir: //p' "$out" | tail -n 1)
if [ -n "$run_dir" ] && [ -f "$run_dir/rank-0.log" ]; then
  sed -n '/^--- sample/,$p' "$run_dir/rank-0.log"
fi
