#!/bin/bash
# Single-node daemon, real processes: submit a 2-rank gpt2-tiny job with ddpctl and follow it to
# succeeded; logs, metrics.jsonl and Prometheus; cancel a running job and see both workers
# gone; permissions on cancel; restart the daemon and see the history; a daemon killed during
# a job marks it failed after restart; `ddpctl run` with no daemon starts an embedded one.
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

# a daemon that dies during a job: the job is failed after restart and its workers are gone
id=$(ctl a submit "$T/long.yaml")
wait_state a "$id" running 30
wait_until 30 n_workers_at_least "$T/a/runs/job-$id" 2 # its workers exist before the daemon dies
stop_daemon a KILL
start_daemon a --slots 4
check "job running when the daemon died is failed" test "$(ctl a --json status "$id" | jq -r .state)" = failed
check "its reason says the daemon stopped" bash -c "$DDPCTL --socket $T/a.sock --json status $id | jq -r .reason | grep -q 'daemon stopped'"
check "its leftover workers were ended" wait_until 30 no_workers "$T/a/runs/job-$id"

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
