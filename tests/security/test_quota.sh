#!/bin/bash
# Quotas and fairness (TAP): a user's queued jobs are capped; users take turns in the queue (one
# user's many jobs do not keep another's behind them); a job that waited reserve_after_s holds
# the queue until it starts; a user's running ranks are capped; the byte caps reach the worker
# and a real worker keeps its log under its cap.
. "$(dirname "$0")/../integration/lib.sh"
. "$(dirname "$0")/lib.sh"
job_spec "$T/job.yaml" 1 20
job_spec "$T/long.yaml" 1 100000
job_spec "$T/gang.yaml" 2 20
started_ms() { ctl a --json status "$1" | jq '[.transitions[]|select(.to=="starting")|.ts_ms][0] // 1e18'; }
state_of() { ctl "$1" --json status "$2" | jq -r .state; }

sec_daemon a "reserve_after_s: 3
quotas:
  default: {queued_jobs: 3, log_bytes: 5000}
  users: {\"$UB\": {log_bytes: 7000, running_ranks: 1}}" --slots 2 || exit 1

# B may hold one running rank: its second job waits while A's runs in the other slot
b1=$(submit_as B a "$T/long.yaml"); b2=$(submit_as B a "$T/long.yaml")
wait_state a "$b1" running 30
a1=$(submit_as A a "$T/long.yaml")
wait_state a "$a1" running 30
check "B's second job waits at its running_ranks quota while A's starts" \
    test "$(state_of a "$a1")-$(state_of a "$b2")" = running-queued
check "the worker gets the daemon's byte caps for its user (A: the default)" \
    wait_until 10 grep -qx "DDP_LIMIT_LOG_BYTES=5000" "$T/a/runs/job-$a1/rank-0.log"
check "and B's own" grep -qx "DDP_LIMIT_LOG_BYTES=7000" "$T/a/runs/job-$b1/rank-0.log"
uctl B a cancel "$b2" >/dev/null

# A queues three more; the fourth is over its quota
for i in 1 2 3; do q[$i]=$(submit_as A a "$T/job.yaml"); done
uctl A a --json submit "$T/job.yaml" > /dev/null 2> "$T/quota.json"
check "A's fourth queued job is refused with 1010" test "$(jq .code "$T/quota.json")" = 1010
check "and the message names the quota" grep -q "queued_jobs" "$T/quota.json"
# B queues one behind A's three; when slots free up, B's goes before A's second
bq=$(submit_as B a "$T/job.yaml")
uctl B a cancel "$b1" >/dev/null; uctl A a cancel "$a1" >/dev/null
wait_state a "$bq" succeeded 60; wait_state a "${q[3]}" succeeded 60
check "users take turns: B's job starts before A's last two" \
    bash -c "[ $(started_ms "$bq") -lt $(started_ms "${q[2]}") ] && [ $(started_ms "$bq") -lt $(started_ms "${q[3]}") ]"

# a 2-rank job waits behind a long 1-rank one while short 1-rank jobs could use the free slot:
# once it has waited reserve_after_s (3 s), nothing else starts before it
l=$(submit_as A a "$T/long.yaml"); wait_state a "$l" running 30
uctl B a --json submit "$T/gang.yaml" > /dev/null 2> "$T/gang.json"
check "a job of more ranks than B's running_ranks quota is refused at once (1010)" \
    test "$(jq .code "$T/gang.json")" = 1010
g=$(submit_as A a "$T/gang.yaml")
s1=$(submit_as A a "$T/job.yaml")
wait_until 10 bash -c "[ \$(date +%s%3N) -gt \$(( $(ctl a --json status "$g" | jq '.submitted_ms') + 3500 )) ]"
s2=$(submit_as A a "$T/job.yaml")
uctl A a cancel "$l" >/dev/null
wait_state a "$g" succeeded 60; wait_state a "$s2" succeeded 60
check "a job that waited reserve_after_s starts before later small ones" \
    bash -c "[ $(started_ms "$g") -lt $(started_ms "$s2") ]"
stop_daemon a

# a real worker keeps its log under the daemon's cap
if [ -x "$BUILD/worker/ddp-worker" ] && [ -x "$BUILD/worker/ddp-prep" ]; then
    head -c 100000 "$SRC/daemon/job.c" > "$T/corpus.txt"
    "$BUILD/worker/ddp-prep" --out "$T/data" --val-fraction 0.1 "$T/corpus.txt" > /dev/null 2>&1
    chmod -R a+rX "$T/data"
    job_spec "$T/real.yaml" 1 40
    sed -i 's/seq_len: 32}/seq_len: 32, log_every: 1}/' "$T/real.yaml"
    DDP_WORKER_BIN=$BUILD/worker/ddp-worker sec_daemon r "quotas: {default: {log_bytes: 3000}}" --slots 1 || exit 1
    id=$(submit_as A r "$T/real.yaml")
    check "a real job under a 3000-byte log cap succeeds" wait_state r "$id" succeeded 120
    log="$T/r/runs/job-$id/rank-0.log"
    check "its log stops at the cap, with one closing line" bash -c \
        "[ \$(stat -c %s '$log') -le 3200 ] && tail -1 '$log' | grep -q 'log cap of 3000 bytes reached'"
    stop_daemon r
else
    skip "a real job under a log cap" "ddp-worker is not built"
    skip "its log stops at the cap" "ddp-worker is not built"
fi

finish
