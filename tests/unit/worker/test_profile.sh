#!/usr/bin/env bash
# train.profile end to end (TAP): ddp-worker profiles steps 3-4 of a 4-step run on the CPU and on
# the simulated GPU, logs the table, writes RUN_DIR/profile-rank0.txt and .json with matmul_fwd
# counted exactly (n_layer x 3 + 1 per step for GPT-2, whose fc product is matmul_gelu_fwd), times that add up to no more than the
# window, and final weights bitwise those of the same run unprofiled.
#   test_profile.sh DDP_WORKER DDP_PREP
set -uo pipefail
worker=$1 prep=$2
tmp=$(mktemp -d /tmp/ddp-test-profile.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
export DDP_LOG_LEVEL=info

. "$(dirname "$0")/../../tap.sh"
. "$(dirname "$0")/../../corpus.sh"

fox_corpus "$prep" "$tmp" 4000 --val-fraction 0.1
# fp32: the simulated GPU's weights are then the CPU's bitwise; validation on, to show that the
# boundary's forward passes stay out of the window
cat >"$tmp/job.yaml" <<YAML
name: profile-test
model: {preset: gpt2-tiny}
data: {train: "$tmp/data/train_*.bin", val: "$tmp/data/val_*.bin"}
train: {steps: 4, micro_batch: 2, seq_len: 32, lr: 1.0e-3, warmup: 1, val_every: 1,
        val_batches: 2, sample_tokens: 0, threads: 1, precision: fp32}
YAML
layers=2 # gpt2-tiny
want=$((2 * (3 * layers + 1))) # matmul_fwd per step: q/k/v, projection, fc projection; LM head

run() { # name backend [options]: weights in $tmp/name.st, run dir $tmp/name/, log $tmp/name.log
  local name=$1 backend=$2; shift 2
  "$worker" "$tmp/job.yaml" --backend "$backend" --run-dir "$tmp/$name" \
    --dump-weights "$tmp/$name.st" "$@" >"$tmp/$name.log" 2>&1 ||
    { sed 's/^/# /' "$tmp/$name.log" | tail -20; return 1; }
}

# the figures of RUN_DIR/profile-rank0.json: matmul_fwd's calls, steps, and the time checks
check_json() { # dir
  python3 - "$1/profile-rank0.json" "$want" <<'PY'
import json, sys
p = json.load(open(sys.argv[1]))
ops = {o["op"]: o for o in p["ops"]}
calls = ops["matmul_fwd"]["calls"]
assert calls == int(sys.argv[2]), f"matmul_fwd: {calls} calls, want {sys.argv[2]}"
assert (p["steps"]["from"], p["steps"]["to"], p["steps"]["count"]) == (3, 4, 2), p["steps"]
total = sum(o["ms"] for o in p["ops"])
assert all(o["ms"] >= 0 and o["host_ms"] >= 0 for o in p["ops"]), "a negative time"
assert 0 < total <= p["wall_ms"], f"ops {total} ms in a window of {p['wall_ms']} ms"
mm = ops["matmul_fwd"]
assert mm["flops"] > 0 and mm["tflop_per_s"] > 0 and mm["gb_per_s"] > 0, mm
assert abs(p["total"]["ms"] - total) < 1e-6 * max(1, total), p["total"]
PY
}

check_text() { # dir
  local f=$1/profile-rank0.txt
  [ -s "$f" ] || { echo "$f: missing or empty"; return 1; }
  awk -v want="$want" '$1 == "matmul_fwd" { found = 1; if ($2 != want) { print "matmul_fwd calls " $2 ", want " want; exit 1 } }
                       $1 == "total" { total = 1 }
                       END { if (!found || !total) { print "no matmul_fwd or total row"; exit 1 } }' "$f"
}

echo "1..8"
run plain cpu # its weights are compared below (a failed run fails those checks)
if run prof cpu --set train.profile=2; then
  check "CPU: profile-rank0.txt has matmul_fwd x $want and a total row" check_text "$tmp/prof"
  check "CPU: profile-rank0.json: counts, steps 3-4, times within the window" check_json "$tmp/prof"
  check "CPU: the table is in the log" grep -q "per-op profile, rank 0, cpu kernels: steps 3-4" "$tmp/prof.log"
  check "CPU: weights with the profile equal those without, bitwise" cmp "$tmp/plain.st" "$tmp/prof.st"
else
  for _ in 1 2 3 4; do not_ok "CPU run with train.profile 2"; done
fi
if run sim sim --set train.profile=2; then
  check "sim: profile-rank0.txt has matmul_fwd x $want" check_text "$tmp/sim"
  check "sim: profile-rank0.json: counts, steps 3-4, times within the window" check_json "$tmp/sim"
  check "sim: weights equal the CPU's unprofiled run, bitwise" cmp "$tmp/plain.st" "$tmp/sim.st"
else
  for _ in 1 2 3; do not_ok "sim run with train.profile 2"; done
fi
# more steps than the run has: the ones it has, and the table says so
if run long cpu --set train.profile=10; then
  check "a profile longer than the run takes steps 3-4 and says so" \
    grep -q "steps 3-4 (2 steps after 2 warm-up; the run has no more)" "$tmp/long/profile-rank0.txt"
else
  not_ok "CPU run with train.profile 10"
fi
exit $((TAP_FAILED > 0))
