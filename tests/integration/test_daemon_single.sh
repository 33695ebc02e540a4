#!/bin/bash
# Single-node daemon, real processes: submit a 2-rank gpt2-tiny job with ddpctl and follow it to
# succeeded; logs, metrics.jsonl and Prometheus; cancel a running job and see both workers
# gone; permissions on cancel; restart the daemon and see the history; a daemon killed during
# a job: its ranks train on and the next daemon adopts the job, which completes; a rank that
# dies while no daemon runs fails the job with that reason; `ddpctl run` with no daemon starts
# an embedded one.
. "$(dirname "$0")/lib.sh"
W=$(worker_bin)
echo "# worker: $W"
export DDP_WORKER_BIN=$W FAKE_STEP_S=0.05
make_job "$T/job2.yaml" 2 6
make_job "$T/long.yaml" 2 100000

start_daemon a --slots 4 --metrics 127.0.0.1:0 || { echo "1..0 # SKIP daemon did not start"; exit 1; }
check "daemon.status answers" ctl a info

out=$(ctl a run "$T/job2.yaml" 2>&1); rc=$?
echo "$out" | tail -3 | sed 's/^/# /'
[ $rc -eq 0 ] && ok "ddpctl run: 2-rank job exits 0" || { not_ok "ddpctl run: 2-rank job exits 0 (rc $rc)"; diag "$T/a/runs/job-1/rank-0.log"; }
check "job 1 is succeeded" test "$(ctl a --json status 1 | jq -r .state)" = succeeded
check "transitions queued->starting->running->succeeded" \
    test "$(ctl a --json status 1 | jq -r '[.transitions[].to]|join(",")')" = "queued,starting,running,succeeded"
check "rank-0 and rank-1 logs captured" test -s "$T/a/runs/job-1/rank-0.log" -a -s "$T/a/runs/job-1/rank-1.log"
check "ddpctl logs --rank 1 prints rank 1's log" \
    cmp <(ctl a logs 1 --rank 1) "$T/a/runs/job-1/rank-1.log"
check "metrics.jsonl has a step per line" test "$(jq -s '[.[]|select(.step)]|length' "$T/a/runs/job-1/metrics.jsonl")" -ge 6
check "final loss recorded" test "$(ctl a --json status 1 | jq '.final_loss|type')" = '"number"'
murl=$(grep -o 'http://[0-9.:]*' "$T/a.log" | head -1)
check "prometheus endpoint counts the success" \
    bash -c "curl -sf $murl/metrics | grep -q 'ddpd_jobs_finished_total{state=\"succeeded\"} 1'"

# cancel a running job: both workers gone
id=$(ctl a submit "$T/long.yaml")
check "long job reaches running" wait_state a "$id" running 30
rd="$T/a/runs/job-$id"
check "two workers are alive" wait_until 30 n_workers_at_least "$rd" 2
# another user may not cancel it (the socket group lets them connect)
chgrp nogroup "$T/a.sock" 2>/dev/null
if command -v setpriv >/dev/null && [ "$(id -u)" = 0 ]; then
    setpriv --reuid=65534 --regid=65534 --groups=65534 "$DDPCTL" --socket "$T/a.sock" --json cancel "$id" 2>"$T/deny.json"
    check "cancel by another uid is refused with 1003" test "$(jq .code "$T/deny.json")" = 1003
fi
check "ddpctl cancel" ctl a cancel "$id"
check "job is cancelled" wait_state a "$id" cancelled 20
check "no worker of the cancelled job is left" test -z "$(workers_of "$rd")"
ctl a --json call job.cancel "{\"id\":$id}" >/dev/null 2>"$T/again.json"
check "cancel of a finished job: code 1004" test "$(jq .code "$T/again.json")" = 1004

# restart: history is there
before=$(ctl a --json ls | jq -c '[.[]|[.id,.state]]')
stop_daemon a
check "daemon stopped on SIGTERM" test -z "$(kill -0 "$a_PID" 2>/dev/null && echo alive)"
start_daemon a --slots 4
check "after restart ls shows the same jobs and states" test "$(ctl a --json ls | jq -c '[.[]|[.id,.state]]')" = "$before"

# a daemon that dies during a job (a crash: SIGKILL) leaves its ranks training; the next daemon
# adopts them from its store and the job completes with every step logged once
make_job "$T/adopt.yaml" 2 1500
id=$(ctl a submit "$T/adopt.yaml")
rd="$T/a/runs/job-$id"
wait_until 60 grep -q '{"step":5,' "$rd/metrics.jsonl"
stop_daemon a KILL
check "its two ranks outlive the daemon" n_workers_at_least "$rd" 2
n=$(grep -c '"loss"' "$rd/metrics.jsonl")
check "they go on training while no daemon runs" \
    wait_until 60 bash -c "[ \$(grep -c '\"loss\"' '$rd/metrics.jsonl') -gt $((n + 3)) ]"
start_daemon a --slots 4
check "the restarted daemon adopts the job and both live ranks" bash -c \
    "$DDPCTL --socket $T/a.sock --json status $id | jq -r '.transitions[].reason' | grep -q 'adopted after a daemon restart: 2 of 2 local rank(s) still running'"
check "the adopted job completes" wait_state a "$id" succeeded 180
check "every step 1..1500 logged exactly once" test \
    "$(jq -s -c '[.[]|select(.loss and .steps)|.step]' "$rd/metrics.jsonl")" = "$(jq -n -c '[range(1;1501)]')"
check "each rank recorded its exit status for the daemon" bash -c "grep -qx '[0-9]* 0' $rd/rank-0.exit && grep -qx '[0-9]* 0' $rd/rank-1.exit"

# a rank that dies while no daemon watches: the next daemon finds it gone without an exit status,
# fails the job with that reason and stops the other rank
id=$(ctl a submit "$T/long.yaml")
rd="$T/a/runs/job-$id"
wait_state a "$id" running 30
wait_until 30 n_workers_at_least "$rd" 2
stop_daemon a
victim=$(for p in $(workers_of "$rd"); do tr '\0' '\n' <"/proc/$p/environ" | grep -qx DDP_RANK=1 && echo "$p"; done)
kill -KILL $victim
start_daemon a --slots 4
check "the job is failed once the daemon is back" wait_state a "$id" failed 30
check "its reason names the rank that died unwatched" bash -c \
    "$DDPCTL --socket $T/a.sock --json status $id | jq -r .reason | grep -q 'rank 1 ended without recording an exit status'"
check "the other rank was stopped" wait_until 30 no_workers "$rd"

# bad spec through ddpctl: exit 1 and the field path
printf 'name: x\ndata: {train: "a"}\ntrain: {steps: -3}\n' > "$T/bad.yaml"
ctl a submit "$T/bad.yaml" 2>"$T/bad.err"; rc=$?
check "bad spec: exit 1" test $rc -eq 1
check "bad spec: names train.steps" grep -q "train.steps" "$T/bad.err"
stop_daemon a

# ddpctl run with no daemon: an embedded one runs the job and goes away
out=$(DDPD_STATE_DIR="$T/emb" "$DDPCTL" --socket "$T/embedded.sock" run "$T/job2.yaml" 2>&1); rc=$?
echo "$out" | tail -2 | sed 's/^/# /'
check "embedded run exits 0" test $rc -eq 0
check "embedded daemon is gone afterwards" test ! -S "$T/embedded.sock"
check "embedded daemon kept its history in DDPD_STATE_DIR" test -s "$T/emb/ddpd.db"
finish
