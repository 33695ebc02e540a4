#!/usr/bin/env bash
# One command from a fresh Debian 12 machine to a trained model: installs the dependencies,
# builds ddpd, turns a text corpus into byte-level token shards, trains gpt2-mini on the local
# CPU cores (printing one line per step), and prints a text sample at the end.
#
#   deploy/quickstart.sh [TEXT_FILE...]
#
# Without arguments the corpus is Debian's `fortunes` package (about 2 MB of English text).
# Set STEPS=N to train longer or shorter (default 300).
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

mkdir -p data/quickstart runs/quickstart
build/worker/ddp-prep --out data/quickstart --val-fraction 0.05 "$@"
exec build/worker/ddp-worker deploy/examples/shakespeare-mini.yaml \
  --set data.train='"data/quickstart/train_*.bin"' \
  --set data.val='"data/quickstart/val_*.bin"' \
  --set train.steps="${STEPS:-300}" \
  --run-dir runs/quickstart
