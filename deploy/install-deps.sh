#!/usr/bin/env bash
# Installs every Debian package (and the PyPI packages) that building and testing ddpd
# needs. Idempotent: does nothing when everything is already there. Run as root or with sudo.
set -euo pipefail

packages=(
  build-essential meson ninja-build pkg-config
  libuv1-dev libjansson-dev libyaml-dev libopenblas-dev libsqlite3-dev
  libdnnl-dev  # native bf16 products on CPUs with AVX512_BF16/AMX (dlopen()ed when used)
  libsystemd-dev libsodium-dev libcmocka-dev liburing-dev
  libpcre2-dev libutf8proc-dev  # ddp-prep --tokenizer: the pre-tokenizer's regex; NFC
  libopenmpi-dev openmpi-bin
  iproute2 python3 python3-pip python3-numpy
  gnuplot-nox chromium fonts-dejavu-core  # ddpctl plot; the status page's browser test
  clang libclang-rt-dev   # tests/fuzz/run_fuzzers.sh: libFuzzer with ASan and UBSan
)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done

sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
if [ ${#missing[@]} -gt 0 ]; then
  echo "install-deps: installing ${missing[*]}"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends \
    "${missing[@]}" >/dev/null
fi

# The checkpoint format test reads shards with the reference safetensors reader.
if ! python3 -c 'import safetensors, numpy' 2>/dev/null; then
  python3 -m pip install -q safetensors numpy 2>/dev/null ||
    python3 -m pip install -q --break-system-packages safetensors numpy ||
    echo "install-deps: safetensors not installed; the Python format check will be skipped"
fi
# ddp-prep --tokenizer is compared with Hugging Face's `tokenizers` (optional: the test skips).
if ! python3 -c 'import tokenizers' 2>/dev/null; then
  python3 -m pip install -q tokenizers 2>/dev/null ||
    python3 -m pip install -q --break-system-packages tokenizers ||
    echo "install-deps: tokenizers not installed; the tokenizer comparison will be skipped"
fi
# The TensorBoard test reads event files with TensorBoard's own reader (it installs it too).
if ! python3 -c 'import tensorboard' 2>/dev/null; then
  python3 -m pip install -q tensorboard 2>/dev/null ||
    python3 -m pip install -q --break-system-packages tensorboard ||
    echo "install-deps: tensorboard not installed; its test will install it or skip"
fi
echo "install-deps: ok"
