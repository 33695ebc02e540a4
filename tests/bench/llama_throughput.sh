#!/usr/bin/env bash
# Llama-family training throughput, ddpd against PyTorch 2.x + transformers' LlamaForCausalLM in
# the same invocation (issue 32): train_throughput.sh with Llama presets (its knobs apply; the
# PyTorch side is tests/bench/pytorch_train.py's transformers model, best of fp32/bf16 autocast,
# eager/torch.compile). Needs transformers in the PyTorch venv (pip install transformers).
#
#   tests/bench/llama_throughput.sh [build-dir]
#
# CONFIGS default: "smollm2-135m 4 256;llama-tiny 8 128". Never run in CI.
set -euo pipefail
export CONFIGS=${CONFIGS:-"smollm2-135m 4 256;llama-tiny 8 128"}
exec "$(dirname "$0")/train_throughput.sh" "$@"
