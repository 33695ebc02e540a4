#!/bin/bash
# `ddpctl dump` through a real ddpd (TAP; collectives/flight.h, docs/observability.md): a
# 2-rank job whose rank 1 stops for good as step 3 begins (DDP_TEST_HANG=3:1, passed through
# the daemon's environment; DDP_COLL_TIMEOUT_S=600 keeps rank 0 waiting in its all-reduce).
# `ddpctl dump ID` gets both ranks' dumps (SIGUSR2, answered by each rank's dump thread), prints
# the diagnosis naming rank 1 and the all-reduce it never started, and writes
# RUN_DIR/flight/diagnosis.txt, never through a symlink put there. Budget: about 10 s
# (registered with a 120 s timeout). Every wait is for a state, a line or a file, with a deadline.
. "$(dirname "$0")/lib.sh"
W=$(worker_bin)
[ "$W" = "$FAKE_WORKER" ] && skip_all "needs the real ddp-worker"
export DDP_WORKER_BIN=$W DDP_TEST_HANG=3:1 DDP_COLL_TIMEOUT_S=600
make_job "$T/job.yaml" 2 50

start_daemon a --slots 2 || { echo "1..0 # SKIP daemon did not start"; exit 1; }
id=$(ctl a submit "$T/job.yaml")
rd="$T/a/runs/job-$id"
check "the job runs" wait_state a "$id" running 30
if wait_until 60 grep -q "rank 1 hangs as step 3 begins" "$rd/rank-1.log"; then
    ok "rank 1 hangs at step 3"
    # rank 0 reaches its step-3 all-reduce a moment after rank 1 stops: dump until it waits
    # there (the event is only visible in the dumps), up to a deadline; out and rc are the last
    # dump's
    dump_names_rank1() {
        out=$(ctl a dump "$id" --timeout 30 2>&1); rc=$?
        grep -q "^diagnosis: rank 1 never started" <<<"$out"
    }
    wait_until 60 dump_names_rank1
    echo "$out" | sed 's/^/# /'
    check "ddpctl dump exits 0" test "$rc" = 0
    check "both ranks dumped" grep -q "^job $id: 2 of 2 rank(s) dumped" <<<"$out"
    check "the diagnosis names rank 1 and the reduction it never started" \
        grep -Eq '^diagnosis: rank 1 never started (allreduce|reduce-scatter) #[0-9]+ \(bucket [0-9]+, .*; rank 0 waits on it$' <<<"$out"
    check "diagnosis.txt holds it" grep -Eq "^rank 1 never started (allreduce|reduce-scatter) #" "$rd/flight/diagnosis.txt"
    check "each rank's file answers the request" \
        grep -q '"trigger":"request"' "$rd/flight/rank-0.json" "$rd/flight/rank-1.json"
    check "the daemon logged the request" grep -q "flight recorder dump requested of 2 local rank" "$T/a.log"
    check "--json gives the dumps" test "$(ctl a --json dump "$id" | jq '.dumps|length')" = 2
    # ddpctl may run as root: a symlink the job's user puts at diagnosis.txt is not followed
    echo "not a diagnosis" >"$T/victim"
    ln -sfn "$T/victim" "$rd/flight/diagnosis.txt"
    ctl a dump "$id" --timeout 30 >"$T/dump-link.out" 2>&1
    check "a symlink at diagnosis.txt is not followed (its target is unchanged)" \
        test "$(cat "$T/victim")" = "not a diagnosis"
    check "ddpctl says it did not write through the symlink" \
        grep -q "diagnosis.txt is a symlink: not written" "$T/dump-link.out"
else
    not_ok "rank 1 did not reach its hang"; diag "$rd/rank-1.log"
fi
check "ddpctl dump of an unknown job fails" bash -c "! '$DDPCTL' --socket '$T/a.sock' dump 999"
ctl a cancel "$id" >/dev/null
check "the job is cancelled" wait_state a "$id" cancelled 30
finish
