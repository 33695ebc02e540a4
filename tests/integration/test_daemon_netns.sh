#!/bin/bash
# Two daemons on two "hosts" made with network namespaces (a veth pair, 10.77.X.1/.2) run one
# 4-rank job together (2 slots each: ranks 0-1 on a, 2-3 on b); a third daemon with the wrong
# secret is refused and the refusal is logged. Elastic jobs across the two: a rank killed, hung
# or cut off on b; node b dying with its ranks (the job goes on, and grows back when b returns);
# either daemon restarting mid-job (every rank trains on and is taken back). Jobs are submitted
# by an unprivileged user (uid 65534): a root daemon starts no peer's ranks as root, and the
# ranks on both hosts run as that user. Skips (77) only if namespaces cannot be made.
. "$(dirname "$0")/lib.sh"
[ "$(id -u)" = 0 ] || { echo "1..0 # SKIP needs root for network namespaces"; exit 77; }
sfx=$$
NA=ddpd-a-$sfx NB=ddpd-b-$sfx
net=$((sfx % 200 + 20))
A=10.77.$net.1 Bip=10.77.$net.2
ns_cleanup() {
    cleanup
    ip netns del "$NA" 2>/dev/null
    ip netns del "$NB" 2>/dev/null
}
trap ns_cleanup EXIT
. "$SRC/tests/netns_pair.sh"
netns_pair "$NA" "$NB" "$sfx" "$A" "$Bip" ||
    { echo "1..0 # SKIP cannot create network namespaces"; exit 77; }

W=$(worker_bin)
echo "# worker: $W"
export DDP_RDZV_TIMEOUT_S=5 # a rank spawned again on the cut-off side gives up within seconds
export DDP_WORKER_BIN=$W FAKE_STEP_S=0.05
make_job "$T/job4.yaml" 4 6
echo "cluster-secret-$RANDOM$RANDOM" > "$T/secret"; chmod 600 "$T/secret"
echo "not-the-secret" > "$T/wrong"; chmod 600 "$T/wrong"

# start_ns NS NAME [ddpd options]: like start_daemon, inside a namespace
start_ns() {
    local ns=$1 name=$2; shift 2
    ip netns exec "$ns" "$DDPD" -c /dev/null --socket "$T/$name.sock" --state-dir "$T/$name" \
        --metrics off \
        --grace 3 --node-name "$name" "$@" >>"$T/$name.log" 2>&1 &
    local pid=$!
    PIDS="$PIDS $pid"
    eval "${name}_PID=$pid"
    wait_until 30 "$DDPCTL" --socket "$T/$name.sock" info &&
        chgrp 65534 "$T/$name.sock" && return 0 # the job user may use the socket
    diag "$T/$name.log"; return 1
}
# ctl_user NAME ARGS...: ddpctl as the job user
JOB_UID=65534
ctl_user() {
    local name=$1; shift
    setpriv --reuid=$JOB_UID --regid=$JOB_UID --clear-groups "$DDPCTL" --socket "$T/$name.sock" "$@"
}
start_ns "$NA" a --slots 2 --listen "$A:7450" --secret-file "$T/secret" --peer "b=$Bip:7450"
start_ns "$NB" b --slots 2 --listen "$Bip:7450" --secret-file "$T/secret" --peer "a=$A:7450"
start_ns "$NB" c --slots 2 --listen "$Bip:7451" --secret-file "$T/wrong" --peer "a=$A:7450"

peers_up() { [ "$(ctl a --json nodes | jq '[.[]|select(.up and (.self|not))]|length')" = "$1" ]; }
check "a sees peer b up" wait_until 30 peers_up 1
check "ddpctl nodes lists both with 2 slots" test "$(ctl a --json nodes | jq '[.[].slots]|add')" = 4

out=$(cd "$T" && ctl_user a run "$T/job4.yaml" 2>&1); rc=$?
echo "$out" | tail -3 | sed 's/^/# /'
[ $rc -eq 0 ] && ok "4-rank job across two namespaces succeeded" || {
    not_ok "4-rank job across two namespaces succeeded (rc $rc)"
    for f in "$T"/a/runs/job-1/rank-*.log "$T"/b/runs/a-job-1/rank-*.log; do echo "# == $f"; tail -5 "$f" | sed 's/^/# /'; done; }
check "placement a:0-1,b:2-3" test "$(ctl a --json status 1 | jq -r .nodes)" = "a:0-1,b:2-3"
check "ranks 2 and 3 ran on b" test -s "$T/b/runs/a-job-1/rank-2.log" -a -s "$T/b/runs/a-job-1/rank-3.log"
check "and as the job's user, in its own run directory" test \
    "$(stat -c %u "$T/b/runs/a-job-1/rank-2.log")-$(stat -c %u%a "$T/b/runs/a-job-1")" = "$JOB_UID-${JOB_UID}700"
check "the rendezvous is on a's address" bash -c "$DDPCTL --socket $T/a.sock --json status 1 | jq -r '.transitions[1].reason' | grep -q 'rendezvous $A:'"
check "a refused the daemon with the wrong secret and logged it" grep -q "refused" "$T/a.log"
check "c never came up as a's peer" bash -c "! grep -q 'peer c .* authenticated' '$T/a.log'"
check "c logs that a failed authentication" grep -q "authentication" "$T/c.log"

# elastic across the two hosts: rank 2 (on b) is SIGKILLed; b spawns it again, it rejoins a's
# coordinator over the veth, and the job succeeds with every step logged once
# el_submit: submits the elastic job and waits until it has done step 8; sets id and m
el_submit() {
    id=$(cd "$T" && ctl_user a submit "$T/el.yaml")
    m="$T/a/runs/job-$id/metrics.jsonl"
    wait_until 120 grep -q '{"step":8,"steps"' "$m"
}
b_rank_pid() { # the worker of job $id with DDP_RANK=$1 (on b)
    for p in $(pgrep -f "a-job-$id/job.json"); do
        tr '\0' '\n' <"/proc/$p/environ" 2>/dev/null | grep -qx "DDP_RANK=$1" && { echo "$p"; return 0; }
    done
    return 1
}
steps_once() { test "$(jq -s -c '[.[]|select(.loss and .steps)|.step]' "$m")" = "$(jq -n -c '[range(1;121)]')"; }
if [ "$W" = "$BUILD/worker/ddp-worker" ]; then
    make_job "$T/el.yaml" 4 120
    sed -i 's/^ddp: {workers: 4}/ddp: {workers: 4, min_workers: 2, restart: on-failure, max_restarts: 2, heartbeat_timeout_s: 2, check_every: 5}/; s/^train: {steps: 120, micro_batch: 2,/train: {steps: 120, micro_batch: 2, global_batch_tokens: 512, threads: 1,/' "$T/el.yaml"
    el_submit
    victim=$(b_rank_pid 2)
    echo "# killing rank 2 on b (pid ${victim:-none})"
    [ -n "$victim" ] && kill -KILL "$victim"
    check "elastic job across two hosts survives rank 2's death on b" wait_state a "$id" succeeded 180
    check "every step 1..120 logged exactly once" steps_once
    check "b spawned rank 2 again" grep -q "guest rank 2 of job $id spawned again" "$T/b.log"
    check "rank 2 rejoined a's coordinator and received the state" \
        grep -q "joined generation .* state of step" "$T/b/runs/a-job-$id/rank-2.log"

    # a hung rank on b (SIGSTOP): a's coordinator evicts it for silence, b kills it on a's word
    # and spawns it again
    el_submit
    victim=$(b_rank_pid 3)
    echo "# stopping rank 3 on b (pid ${victim:-none})"
    [ -n "$victim" ] && kill -STOP "$victim"
    check "elastic job across hosts survives a hung rank on b" wait_state a "$id" succeeded 180
    check "b killed the hung rank on its coordinator's word" grep -q "killing guest rank 3 of job $id (pid $victim)" "$T/b.log"

    # a partition: b's link goes silent; a's side (2 ranks = min_workers) finishes the job, b's
    # ranks stop by themselves (no second brain)
    el_submit
    ip -n "$NB" link set "vb$sfx" down
    check "a partitioned job finishes on the coordinator's side" wait_state a "$id" succeeded 180
    check "every step 1..120 logged exactly once across the partition" steps_once
    check "b's ranks stopped by themselves, cut off from the coordinator" \
        wait_until 60 grep -q "cut off from it: this side stops" "$T/b/runs/a-job-$id/rank-2.log"
    ip -n "$NB" link set "vb$sfx" up

    # node death: b's daemon and its ranks are SIGKILLed; the job goes on on a (min_workers 2),
    # and once b's daemon is back, a places the two lost ranks there again: the job grows back
    sed 's/steps: 120,/steps: 600,/' "$T/el.yaml" >"$T/el_long.yaml"
    id=$(cd "$T" && ctl_user a submit "$T/el_long.yaml"); m="$T/a/runs/job-$id/metrics.jsonl"
    wait_until 120 grep -q '{"step":8,"steps"' "$m"
    guests=$(pgrep -f "a-job-$id/job.json")
    kill -KILL "$b_PID" $guests
    wait "$b_PID" 2>/dev/null
    check "a goes on without node b" wait_until 60 grep -q "job $id: node b went down with 2 rank(s)" "$T/a.log"
    # (timed out at 60 s twice on loaded machines, cause unknown: on failure, show what the
    # coordinator and the survivors said)
    if wait_until 120 grep -q '"event":"generation".*"world":2' "$m"; then
        ok "the survivors form a generation of 2"
    else
        not_ok "the survivors form a generation of 2" \
            "$(grep -h "job $id" "$T/a.log" | tail -20; tail -5 "$T/a/runs/job-$id"/rank-*.log)"
    fi
    start_ns "$NB" b --slots 2 --listen "$Bip:7450" --secret-file "$T/secret" --peer "a=$A:7450"
    check "a places the lost ranks on b again" wait_until 60 grep -q "job $id: 2 lost rank(s) placed again on b" "$T/a.log"
    check "the job grows back to 4 ranks" wait_until 120 grep -q '"event":"generation".*"world":4' "$m"
    check "the job that lost a node succeeds" wait_state a "$id" succeeded 300
    check "every step 1..600 logged exactly once" test \
        "$(jq -s -c '[.[]|select(.loss and .steps)|.step]' "$m")" = "$(jq -n -c '[range(1;601)]')"

    # daemon restarts across the two hosts leave every rank training: (1) the coordinating
    # daemon a (its ranks on b wait for it as orphans, and its new coordinator adopts the running
    # generation of 4), (2) b (it takes its guest ranks back from their records and they are a's
    # again when its link returns); no new generation forms for either
    id=$(cd "$T" && ctl_user a submit "$T/el_long.yaml"); m="$T/a/runs/job-$id/metrics.jsonl"
    wait_until 120 grep -q '{"step":8,"steps"' "$m"
    stop_daemon a
    start_ns "$NA" a --slots 2 --listen "$A:7450" --secret-file "$T/secret" --peer "b=$Bip:7450"
    check "the new a adopts the multi-node job" bash -c "$DDPCTL --socket $T/a.sock --json status $id | jq -r '.transitions[].reason' | grep -q 'adopted after a daemon restart: 2 of 2 local rank(s) still running'"
    check "b kept a's ranks and gives them back" wait_until 60 grep -q "job $id: node b still runs 2 of its rank(s)" "$T/a.log"
    check "a's coordinator adopts the generation of 4" wait_until 60 grep -q "adopted the running generation 1: all 4 member(s) came back" "$T/a.log"
    wait_until 120 grep -q '{"step":300,"steps"' "$m"
    stop_daemon b
    check "b's guest ranks outlive b" test -n "$(pgrep -f "a-job-$id/job.json")"
    start_ns "$NB" b --slots 2 --listen "$Bip:7450" --secret-file "$T/secret" --peer "a=$A:7450"
    check "the new b takes its guest ranks back" wait_until 60 grep -q "took back 2 of 2 guest rank(s) of a's job $id" "$T/b.log"
    check "and they are a's again" wait_until 60 bash -c "[ \$(grep -c 'job $id: node b still runs 2 of its rank(s)' '$T/a.log') -ge 2 ]"
    check "the job through both restarts succeeds" wait_state a "$id" succeeded 300
    check "every step 1..600 logged exactly once" test \
        "$(jq -s -c '[.[]|select(.loss and .steps)|.step]' "$m")" = "$(jq -n -c '[range(1;601)]')"
    check "no new generation formed through either restart" bash -c "! grep -q '\"event\":\"generation\"' '$m'"

    # ddpctl dump of a job across the two hosts: a signals its own ranks, b its guest ranks on
    # a's word (each dumps on its host); a's coordinator gathers all 4 dumps into one diagnosis
    sed 's/steps: 120,/steps: 100000,/' "$T/el.yaml" >"$T/el_dump.yaml"
    id=$(cd "$T" && ctl_user a submit "$T/el_dump.yaml"); m="$T/a/runs/job-$id/metrics.jsonl"
    wait_until 120 grep -q '{"step":8,"steps"' "$m"
    out=$(ctl_user a dump "$id" --timeout 30 2>&1)
    sed 's/^/# /' <<<"$out"
    check "ddpctl dump: a's 2 ranks dumped in a's run directory" grep -q "2 of 4 rank(s) dumped" <<<"$out"
    check "it says the coordinator's diagnosis covers b's ranks too" grep -q \
        "2 rank(s) on other nodes dumped to their nodes' run directories; the coordinator's diagnosis covers every rank" <<<"$out"
    check "b asked its guest ranks for a dump" \
        wait_until 30 grep -q "job $id: flight recorder dump requested of 2 guest rank(s) here" "$T/b.log"
    check "b's ranks wrote their dumps on b" wait_until 30 test -s "$T/b/runs/a-job-$id/flight/rank-2.json" \
        -a -s "$T/b/runs/a-job-$id/flight/rank-3.json"
    check "the coordinator's diagnosis is from all 4 ranks" grep -q "flight recorder (4 dump(s)" "$T/a.log"
    check "the job trains on after the dump" test "$(ctl_user a --json status "$id" | jq -r .state)" = running
    ctl_user a cancel "$id" >/dev/null
else
    for i in $(seq 1 29); do ok "elastic across hosts # SKIP needs the real worker"; done
fi
finish
