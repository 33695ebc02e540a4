# Shared by tests/bench/train_throughput.sh and tests/bench/ddp_scaling.sh (sourced, not run).
# Expects $src (repository root) and $build (build directory) to be set.

PY=/usr/bin/python3   # Debian's python3-torch; the pyenv python3 has no torch

bench_header() {  # $1: the command line as invoked
    echo "command: $1"
    echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)  host: $(hostname)  cores: $(nproc)"
    if [ -n "${OPENBLAS_CORETYPE+x}" ]; then
        echo "OPENBLAS_CORETYPE is set (=$OPENBLAS_CORETYPE), OPENBLAS_L2_SIZE=${OPENBLAS_L2_SIZE-<unset>}; left as is for both sides"
    else
        echo "OPENBLAS_CORETYPE is not set (OPENBLAS_L2_SIZE=${OPENBLAS_L2_SIZE-<unset>}); left as is for both sides"
    fi
    echo "load average at start: $(cut -d' ' -f1-3 /proc/loadavg)"
    echo
}

bench_setup() {  # makes $work/data/train_*.bin and $work/job.yaml
    worker=$build/worker/ddp-worker
    prep=$build/worker/ddp-prep
    for b in "$worker" "$prep"; do
        [ -x "$b" ] || { echo "missing $b: build first (meson setup $build && ninja -C $build)" >&2; exit 1; }
    done
    if [ "${BENCH_DEBIAN_TORCH_OPTIONAL:-0}" = 1 ]; then  # train_throughput.sh: PyTorch 2.x suffices
        HAVE_DEBIAN_TORCH=0
        "$PY" -c 'import torch' 2>/dev/null && HAVE_DEBIAN_TORCH=1
    else
        "$PY" -c 'import torch' 2>/dev/null ||
            { echo "$PY has no torch: apt-get install python3-torch" >&2; exit 1; }
    fi
    work=$(mktemp -d "${TMPDIR:-/tmp}/ddp-bench.XXXXXX")
    trap 'rm -rf "$work"' EXIT
    text=$src/../shared/data/tinyshakespeare.txt
    if [ ! -f "$text" ]; then  # deterministic stand-in text, about 1 MB
        text=$work/input.txt
        "$PY" - "$text" <<'EOF'
import random, sys
r = random.Random(1337)
words = "the of and to in that is was he for it with as his on be at by had not are but from".split()
with open(sys.argv[1], "w") as f:
    for i in range(25000):
        f.write(" ".join(r.choice(words) for _ in range(8)).capitalize() + ".\n")
EOF
    fi
    "$prep" --val-fraction 0 --out "$work/data" "$text" >/dev/null
    cat >"$work/job.yaml" <<EOF
name: bench
model: {preset: gpt2-mini}
data:
  train: $work/data/train_*.bin
train:
  steps: 10
  micro_batch: 4
  seq_len: 64
  lr: 6.0e-4
  warmup: 0
  schedule: constant
  weight_decay: 0.1
  betas: [0.9, 0.95]
  clip: 1.0
  precision: fp32
  seed: 1337
  threads: 1
  val_every: 0
  sample_tokens: 0
  log_every: 1
checkpoint:
  dir: ""
EOF
}

# ddpd_stats RUN_DIR WARMUP: one JSON line of medians over metrics.jsonl's steps > WARMUP
ddpd_stats() {
    "$PY" - "$1/metrics.jsonl" "$2" <<'EOF'
import json, statistics as st, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
rows = [r for r in rows if "step_ms" in r and r["step"] > int(sys.argv[2])]
med = lambda k: st.median(r[k] for r in rows)
print(json.dumps({"steps": len(rows), "step_ms": med("step_ms"), "tokens_per_s": med("tokens_per_s"),
                  "compute_ms": med("compute_ms"), "comm_ms": med("comm_ms"),
                  "exposed_comm_ms": med("exposed_comm_ms"), "hidden": med("hidden"),
                  "world": rows[0]["world"], "loss_last": rows[-1]["loss"]}))
EOF
}

# maxrss_mb TIME_V_OUTPUT: "Maximum resident set size" of /usr/bin/time -v, in MB
maxrss_mb() {
    awk -F': ' '/Maximum resident set size/ {printf "%.1f", $2 / 1024}' "$1"
}

# jget JSON KEY
jget() {
    "$PY" -c 'import json, sys; v = json.loads(sys.argv[1])[sys.argv[2]]; print(round(v, 4) if isinstance(v, float) else v)' "$1" "$2"
}
