#!/usr/bin/env bash
# The flight recorder on real processes (TAP; collectives/flight.h, docs/observability.md).
#  1. deploy/launch-local.sh, 4 elastic ranks of gpt2-tiny; rank 3 stops for good as step 3
#     begins (DDP_TEST_HANG=3:3); the others' all-reduce times out (DDP_COLL_TIMEOUT_S=4: about
#     100 times a step here, so that ranks 0-2 have all reached it whatever the load); each
#     rank writes RUN_DIR/flight/rank-R.json (the stuck one from its coordinator connection's
#     thread), and the coordinator's diagnosis, RUN_DIR/flight/diagnosis.txt, names rank 3 and
#     the all-reduce that it never started, which the other ranks wait on.
#     `ddpctl dump RUN_DIR` names the same cause from the files.
#  2. SIGUSR2 (what `ddpctl dump` sends through the daemon) makes a running rank rewrite its
#     file with the trigger "request", from its dump thread.
# Budget: 6-25 s on 2 shared cores (registered with a 120 s timeout). Every wait is for a file or a
# line with a deadline; nothing sleeps to synchronise.
#   test_flight.sh DDP_WORKER DDP_PREP
set -uo pipefail
worker=$1 prep=$2
. "$(dirname "$0")/launch_lib.sh"
launch_setup flight

# wait_file FILE REGEX TIMEOUT_S: until FILE holds a line matching REGEX (fails at the deadline)
wait_file() {
    wait_until "$3" grep -Eq -- "$2" "$1" && return 0
    echo "# timed out waiting for /$2/ in $1"
    return 1
}

fox_corpus "$prep" "$tmp" 2000 --val-fraction 0.1
cat >"$tmp/job.yaml" <<YAML
name: flight-test
model: {preset: gpt2-tiny}
data: {train: "$tmp/data/train_*.bin", val: "$tmp/data/val_*.bin"}
train: {steps: 6, micro_batch: 2, seq_len: 32, global_batch_tokens: 512, lr: 1.0e-3,
        warmup: 2, val_every: 0, sample_tokens: 0, threads: 1, log_every: 1, precision: fp32}
ddp: {bucket_mb: 0.25, first_bucket_mb: 0.0625, workers: 4, min_workers: 4,
      restart: on-failure, max_restarts: 0, heartbeat_timeout_s: 10, rejoin_timeout_s: 30}
YAML

run="$tmp/hang"
mkdir -p "$run"
DDP_TEST_HANG=3:3 DDP_COLL_TIMEOUT_S=4 RUN_DIR="$run" "$launch" 4 "$tmp/job.yaml" \
    >"$run/out.log" 2>&1 &
launcher=$!

if wait_file "$run/flight/diagnosis.txt" "." 90; then
    diag=$(cat "$run/flight/diagnosis.txt")
    echo "# diagnosis: $diag"
    check "the diagnosis names rank 3 as the one that never started the operation" \
        grep -Eq '^rank 3 never started (allreduce|reduce-scatter) #[0-9]+ \(bucket [0-9]+, ' \
        "$run/flight/diagnosis.txt"
    check "the diagnosis says ranks 0-2 wait on it" grep -q "; ranks 0-2 wait on it" \
        "$run/flight/diagnosis.txt"
    check "the coordinator logged it" grep -q "flight recorder (4 dump(s)" "$run/rdzv.log"
    # the operation named is one rank 3 never recorded and ranks 0-2 did
    seq=$(grep -Eo '#[0-9]+' "$run/flight/diagnosis.txt" | head -1 | tr -d '#')
    check "every rank wrote its dump" test -s "$run/flight/rank-0.json" -a -s "$run/flight/rank-1.json" \
        -a -s "$run/flight/rank-2.json" -a -s "$run/flight/rank-3.json"
    check "the dumps agree with it (rank 3 stops at #$((seq - 1)), the others reached #$seq)" \
        python3 - "$run/flight" "$seq" <<'PY'
import json, sys
d, seq = sys.argv[1], int(sys.argv[2])
dumps = [json.load(open(f"{d}/rank-{r}.json")) for r in range(4)]
gen = max(x["generation"] for x in dumps[0]["records"])
def seqs(r): return {x["seq"]: x for x in dumps[r]["records"] if x["generation"] == gen}
assert max(seqs(3)) == seq - 1, (max(seqs(3)), seq)
assert seqs(3)[seq - 1]["state"] == "finished"
for r in range(3):
    s = seqs(r)[seq]
    assert s["state"] in ("started", "failed"), s
    assert s["bucket"] >= 0 and s["bytes"] > 0, s
assert dumps[3]["trigger"] == "coordinator", dumps[3]["trigger"]
PY
    check "a timeout started the collection" grep -q "sent a flight recorder dump (timeout)" \
        "$run/rdzv.log"
else
    for i in 1 2 3 4 5 6; do not_ok "no diagnosis"; done
    sed 's/^/# /' "$run/rdzv.log" | tail -20
fi

# ddpctl dump RUN_DIR: the same diagnosis from the files, without a daemon
ddpctl=$(dirname "$worker")/../daemon/ddpctl
if [ -x "$ddpctl" ] && [ -s "$run/flight/diagnosis.txt" ]; then
    # the same cause (what each waiting rank's record says may have moved on: failed, not started)
    cause=$(cut -d';' -f1 "$run/flight/diagnosis.txt")
    check "ddpctl dump RUN_DIR names the same cause from the files" \
        grep -qF "diagnosis: $cause;" <(DDPD_SOCKET=/nonexistent "$ddpctl" dump "$run")
else
    not_ok "ddpctl dump RUN_DIR: no ddpctl or no diagnosis"
fi

# 2. SIGUSR2 on the hung rank: its dump thread answers, its main thread still stuck
pid3=$(cat "$run/rank-3.pid" 2>/dev/null)
if [ -n "$pid3" ] && kill -0 "$pid3" 2>/dev/null; then
    kill -USR2 "$pid3"
    check "SIGUSR2 rewrites the hung rank's dump with the trigger \"request\"" \
        wait_file "$run/flight/rank-3.json" '"trigger":"request"' 30
else
    not_ok "rank 3 is not running (pid ${pid3:-none})"
fi

echo "# $TAP_FAILED of $TAP_N failed"
exit $((TAP_FAILED > 0))
