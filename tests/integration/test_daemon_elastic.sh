#!/bin/bash
# An elastic job under ddpd, real processes: a 3-rank gpt2-tiny job with ddp.restart:
# on-failure; one rank SIGKILLed mid-run; the daemon spawns it again, it rejoins, and the job
# succeeds with every step logged once. The change of generation is a transition in ddpctl
# status and a Prometheus gauge; restarts are counted. Then ddp.max_restarts: 0 and
# ddp.min_workers equal to the world: the job fails with the coordinator's reason. A daemon
# restart mid-job: the ranks train on and the new daemon adopts the running generation; a rank
# killed while no daemon runs is spawned again by the next one. Last, a slowed rank is named a
# straggler.
. "$(dirname "$0")/lib.sh"
[ "$(worker_bin)" = "$BUILD/worker/ddp-worker" ] || { echo "1..0 # SKIP needs the real worker"; exit 77; }
export DDP_WORKER_BIN=$BUILD/worker/ddp-worker

# 160 steps: the survivors must not finish before the respawned rank has started and joined
make_job "$T/job.yaml" 3 160
sed -i 's/^ddp: {workers: 3}/ddp: {workers: 3, min_workers: 2, restart: on-failure, max_restarts: 2, heartbeat_timeout_s: 2, rejoin_timeout_s: 20, check_every: 5}/' "$T/job.yaml"
sed -i 's/^train: {steps: 160, micro_batch: 2,/train: {steps: 160, micro_batch: 2, global_batch_tokens: 384, threads: 1,/' "$T/job.yaml"

start_daemon a --slots 4 --metrics 127.0.0.1:0 || { echo "1..0 # SKIP daemon did not start"; exit 1; }

# rank_pid JOB RANK: the worker process of that rank (its environment names both)
rank_pid() {
    for p in $(workers_of "$T/a/runs/job-$1"); do
        tr '\0' '\n' <"/proc/$p/environ" 2>/dev/null | grep -qx "DDP_RANK=$2" && { echo "$p"; return 0; }
    done
    return 1
}
# wait_step JOB STEP: until metrics.jsonl has that step (deadline 120 s)
wait_step() { wait_until 120 grep -q "{\"step\":$2,\"steps\"" "$T/a/runs/job-$1/metrics.jsonl"; }

id=$(ctl a submit "$T/job.yaml")
if wait_step "$id" 8; then
    pid=$(rank_pid "$id" 1)
    echo "# killing rank 1 (pid $pid)"
    kill -KILL "$pid"
    check "the elastic job succeeds after a rank was killed" wait_state a "$id" succeeded 180
    rd="$T/a/runs/job-$id"
    check "every step 1..160 logged exactly once" test \
        "$(jq -s -c '[.[]|select(.loss and .steps)|.step]' "$rd/metrics.jsonl")" = "$(jq -n -c '[range(1;161)]')"
    check "the survivors formed a new generation" grep -q '"event":"generation"' "$rd/metrics.jsonl"
    check "the daemon spawned rank 1 again and it rejoined from a live rank" \
        grep -q "joined generation .* state of step" "$rd/rank-1.log" || diag "$rd/rank-1.log"
    # 2 of 3 when the survivors regrouped first, 3 of 3 when the respawned rank joined in time
    reasons=$(ctl a --json status "$id" | jq -r '.transitions[].reason')
    check "ddpctl status shows the generation change as a transition" \
        grep -q '^generation [0-9]*: [23] of 3 ranks (cause: ' <<<"$reasons" || diag <<<"$reasons"
    murl=$(grep -o 'http://[0-9.:]*' "$T/a.log" | head -1)
    check "Prometheus counts the restart" bash -c "curl -sf $murl/metrics | grep -qx 'ddpd_worker_restarts_total 1'"
    check "the daemon log names the restart" grep -q "rank 1 ended .* spawned again" "$T/a.log"
else
    not_ok "the elastic job reached step 8"; diag "$T/a.log"
fi

# no restarts and min_workers = world: the coordinator fails the job with its reason
sed 's/min_workers: 2, restart: on-failure, max_restarts: 2/min_workers: 3, restart: on-failure, max_restarts: 0/; s/rejoin_timeout_s: 20/rejoin_timeout_s: 1/' "$T/job.yaml" >"$T/strict.yaml"
id=$(ctl a submit "$T/strict.yaml")
if wait_step "$id" 4; then
    kill -KILL "$(rank_pid "$id" 2)"
    check "below min_workers with no restart left: the job fails" wait_state a "$id" failed 60
    check "its reason names min_workers and the timeout" \
        bash -c "\"$DDPCTL\" --socket \"$T/a.sock\" --json status $id | jq -r .reason | grep -q 'below ddp.min_workers = 3.*rejoin_timeout_s'"
    check "no worker of the failed job is left" test -z "$(workers_of "$T/a/runs/job-$id")"
else
    not_ok "the strict job reached step 4"; diag "$T/a.log"
fi

# a daemon restart (SIGTERM alone, then a new ddpd on the same store): the ranks train on,
# redial the coordinator, and the new daemon adopts the running generation with no new one
make_job "$T/adopt.yaml" 3 300
sed -i 's/^ddp: {workers: 3}/ddp: {workers: 3, min_workers: 2, restart: on-failure, max_restarts: 2, heartbeat_timeout_s: 2, rejoin_timeout_s: 30}/' "$T/adopt.yaml"
sed -i 's/^train: {steps: 300, micro_batch: 2,/train: {steps: 300, micro_batch: 2, global_batch_tokens: 384, threads: 1,/' "$T/adopt.yaml"
id=$(ctl a submit "$T/adopt.yaml")
rd="$T/a/runs/job-$id"
if wait_step "$id" 10; then
    stop_daemon a
    check "its three ranks outlive the daemon" n_workers_at_least "$rd" 3
    start_daemon a --slots 4 --metrics 127.0.0.1:0
    check "the new coordinator adopts the running generation" \
        wait_until 60 grep -q "adopted the running generation 1: all 3 member(s) came back" "$T/a.log"
    check "the adopted elastic job succeeds" wait_state a "$id" succeeded 180
    check "every step 1..300 logged exactly once" test \
        "$(jq -s -c '[.[]|select(.loss and .steps)|.step]' "$rd/metrics.jsonl")" = "$(jq -n -c '[range(1;301)]')"
    check "no new generation formed for it" bash -c "! grep -q '\"event\":\"generation\"' '$rd/metrics.jsonl'"
    check "the ranks logged the reconnection" grep -q "reconnected to the coordinator" "$rd/rank-2.log"
else
    not_ok "the adopted job reached step 10"; diag "$T/a.log"
fi

# a rank killed while no daemon runs: the new daemon spawns it again, the survivors' generation
# is not adopted but replaced, and the job completes with nothing lost
id=$(ctl a submit "$T/adopt.yaml")
rd="$T/a/runs/job-$id"
if wait_step "$id" 10; then
    stop_daemon a
    kill -KILL "$(rank_pid "$id" 1)"
    start_daemon a --slots 4 --metrics 127.0.0.1:0
    check "the job with a rank lost meanwhile succeeds" wait_state a "$id" succeeded 180
    check "every step 1..300 logged exactly once" test \
        "$(jq -s -c '[.[]|select(.loss and .steps)|.step]' "$rd/metrics.jsonl")" = "$(jq -n -c '[range(1;301)]')"
    check "the daemon spawned the lost rank again" grep -q "rank 1 ended .* spawned again" "$T/a.log"
    check "a new generation replaced the one that could not be adopted" \
        grep -q "the running generation cannot be adopted" "$T/a.log"
else
    not_ok "the second adopted job reached step 10"; diag "$T/a.log"
fi

# a deliberately slowed rank (test hook DDP_TEST_SLOW_RANK=1:US, read by the workers of this
# daemon only) is named a straggler in the log, metrics.jsonl, ddpctl status and Prometheus
DDP_TEST_SLOW_RANK=1:40000 start_daemon s --slots 4 --metrics 127.0.0.1:0 ||
    { not_ok "second daemon started"; finish; exit; }
make_job "$T/slow.yaml" 2 300
id=$(ctl s submit "$T/slow.yaml")
rd="$T/s/runs/job-$id"
check "the slowed rank 1 is named in metrics.jsonl" wait_until 120 grep -q '"straggler":1,' "$rd/metrics.jsonl"
check "rank 0 logs it with its compute time and the median" grep -q "rank 1 is a straggler: its forward and backward took .* above the median" "$rd/rank-0.log"
check "ddpctl status names it" bash -c "\"$DDPCTL\" --socket \"$T/s.sock\" status $id | grep -q 'straggler: rank 1'"
murl=$(grep -o 'http://[0-9.:]*' "$T/s.log" | head -1)
check "Prometheus names it" bash -c "curl -sf $murl/metrics | grep -qx 'ddpd_job_straggler_rank{job=\"$id\"} 1'"
check "rank 0 is never named" bash -c "! grep -q '\"straggler\":0,' '$rd/metrics.jsonl'"
ctl s cancel "$id" >/dev/null
finish
