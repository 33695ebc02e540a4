#!/bin/bash
# ddpctl without a daemon (TAP): `ddpctl run` trains a tiny 2-rank job in an embedded daemon,
# which goes away with the run; then the read-only commands that take a job id (status, plot,
# trace, logs) and ls read the job from the store in the state dir ($DDPD_STATE_DIR, as the
# embedded daemon used it, or --state-dir) and its run directory, saying so on stderr, and leave
# the store's file as it was; the commands that change a job (cancel, submit) refuse, saying
# that they need a daemon; a missing job or store is a clear error; `ddpctl --state-dir DIR run`
# keeps its embedded daemon's store in DIR, where the reads find it.
. "$(dirname "$0")/lib.sh"
. "$SRC/tests/corpus.sh"
if [ ! -x "$BUILD/worker/ddp-worker" ] || [ ! -x "$BUILD/worker/ddp-prep" ]; then
    skip_all "ddp-worker or ddp-prep not built"
fi
export DDP_WORKER_BIN=$BUILD/worker/ddp-worker
sock=$T/emb.sock state=$T/state
fox_corpus "$BUILD/worker/ddp-prep" "$T" 3000 --val-fraction 0.1 ||
    { not_ok "ddp-prep made the shards"; finish; exit 1; }
cat > "$T/job.yaml" <<SPEC
name: nodaemon
model: {preset: gpt2-tiny}
data: {train: "$T/data/train_*.bin", val: "$T/data/val_*.bin"}
train: {steps: 6, micro_batch: 2, seq_len: 32, lr: 1.0e-3, warmup: 1, val_every: 3,
        val_batches: 1, sample_tokens: 0, threads: 1, seed: 7, trace: "3-4"}
ddp: {workers: 2}
SPEC

# ddpctl returns when the job has ended, and its embedded daemon with it
DDPD_STATE_DIR=$state "$DDPCTL" --socket "$sock" run "$T/job.yaml" >"$T/run.out" 2>"$T/run.err"
rc=$?
diag "$T/run.err"
check "ddpctl run with no daemon: the job succeeds (exit 0)" test $rc -eq 0
id=$(sed -n 's/^job \([0-9]*\) submitted.*/\1/p' "$T/run.err")
check "ddpctl run named the job's id ($id)" test -n "$id"
check "the embedded daemon is gone: nothing listens at $sock" \
    bash -c "! '$DDPCTL' --socket '$sock' info"
rd=$state/runs/job-$id
sum0=$(md5sum <"$state/ddpd.db")

export DDPD_STATE_DIR=$state
says_store() { grep -Fqx "ddpctl: no daemon at $sock; reading job $id from the store at $state/ddpd.db" "$1"; }

# ---- status: the record, from the store ----
"$DDPCTL" --socket "$sock" status "$id" >"$T/status.out" 2>"$T/status.err"
rc=$?
diag "$T/status.out" "$T/status.err"
check "status $id without a daemon: exit 0" test $rc -eq 0
check "status: says on stderr that it reads the store, and where" says_store "$T/status.err"
check "status: the job succeeded, all 2 ranks exited 0" \
    grep -q "state:   succeeded (all 2 ranks exited 0)" "$T/status.out"
check "status: the run dir and the final loss" \
    bash -c "grep -Fq 'run dir: $rd' '$T/status.out' && grep -q 'final loss: [0-9]' '$T/status.out'"
check "status --json: the record as job.get gives it (state, run_dir, spec, 4 transitions)" \
    test "$("$DDPCTL" --socket "$sock" --json status "$id" 2>/dev/null |
            jq -c '[.state, .run_dir == "'"$rd"'", .spec.name, (.transitions|length)]')" \
         = '["succeeded",true,"nodaemon",4]'

# ---- plot and trace: the run directory found through the store ----
if command -v gnuplot >/dev/null; then
    "$DDPCTL" --socket "$sock" plot "$id" -o "$T/loss.svg" >"$T/plot.out" 2>"$T/plot.err"
    rc=$?
    diag "$T/plot.out" "$T/plot.err"
    check "plot $id without a daemon: exit 0" test $rc -eq 0
    check "plot: says it reads the store" says_store "$T/plot.err"
    check "plot: an SVG of the 6 steps and 2 validations" \
        bash -c "grep -q '6 steps (1..6), 2 validations' '$T/plot.out' && grep -q '<svg' '$T/loss.svg'"
else
    skip "plot $id without a daemon" "gnuplot not installed"
fi
"$DDPCTL" --socket "$sock" trace "$id" -o "$T/trace.json" >"$T/trace.out" 2>"$T/trace.err"
rc=$?
diag "$T/trace.out" "$T/trace.err"
check "trace $id without a daemon: exit 0" test $rc -eq 0
check "trace: says it reads the store" says_store "$T/trace.err"
check "trace: one trace of both ranks' spans" \
    test "$(jq -c '[.traceEvents[]|select(.ph=="X")|.pid]|unique' "$T/trace.json")" = '[0,1]'

# ---- logs (not -f) and ls ----
"$DDPCTL" --socket "$sock" logs "$id" --rank 1 >"$T/logs.out" 2>"$T/logs.err"
rc=$?
check "logs $id --rank 1 without a daemon: exit 0, rank 1's log as written" \
    bash -c "test $rc -eq 0 && test -s '$T/logs.out' && cmp '$T/logs.out' '$rd/rank-1.log'"
check "logs: says it reads the store" says_store "$T/logs.err"
"$DDPCTL" --socket "$sock" ls >"$T/ls.out" 2>"$T/ls.err"
rc=$?
diag "$T/ls.out" "$T/ls.err"
check "ls without a daemon: the job, succeeded" \
    bash -c "test $rc -eq 0 && grep -Eq '^$id +nodaemon +succeeded +2 +6/6 ' '$T/ls.out'"
check "ls: says it reads the store" \
    grep -Fqx "ddpctl: no daemon at $sock; reading the job list from the store at $state/ddpd.db" "$T/ls.err"

# ---- what changes a job, or follows one, needs the daemon ----
"$DDPCTL" --socket "$sock" cancel "$id" >/dev/null 2>"$T/cancel.err"
rc=$?
diag "$T/cancel.err"
check "cancel without a daemon: exit 69, 'cancel needs a running daemon'" \
    bash -c "test $rc -eq 69 && grep -Fq 'ddpctl: cancel needs a running daemon, and none answers at $sock' '$T/cancel.err'"
check "cancel: the store is not offered in its place" bash -c "! grep -q 'store' '$T/cancel.err'"
"$DDPCTL" --socket "$sock" submit "$T/job.yaml" >/dev/null 2>"$T/submit.err"
rc=$?
check "submit without a daemon: exit 69, 'submit needs a running daemon'" \
    bash -c "test $rc -eq 69 && grep -Fq 'ddpctl: submit needs a running daemon' '$T/submit.err'"
"$DDPCTL" --socket "$sock" logs -f "$id" >/dev/null 2>"$T/follow.err"
rc=$?
check "logs -f without a daemon: exit 69, it needs one" \
    bash -c "test $rc -eq 69 && grep -Fq 'logs -f (following a live job) needs a running daemon' '$T/follow.err'"
check "the reads left the store's file as it was" test "$(md5sum <"$state/ddpd.db")" = "$sum0"

# ---- a job the store lacks; no store; the state dir given on the command line ----
"$DDPCTL" --socket "$sock" status 999 >/dev/null 2>"$T/missing.err"
rc=$?
check "status of a job the store lacks: exit 1, 'no job 999 in the store at ...'" \
    bash -c "test $rc -eq 1 && grep -Fq 'ddpctl: no job 999 in the store at $state/ddpd.db' '$T/missing.err'"
unset DDPD_STATE_DIR
"$DDPCTL" --socket "$sock" --state-dir "$T/nowhere" plot "$id" >/dev/null 2>"$T/nostore.err"
rc=$?
check "no daemon and no store: exit 69, naming both" \
    bash -c "test $rc -eq 69 && grep -Fq 'ddpctl: no daemon at $sock, and no job store at $T/nowhere/ddpd.db' '$T/nostore.err'"
# `ddpctl --state-dir DIR run` gives DIR to its embedded daemon, and the reads find it there
"$DDPCTL" --socket "$sock" --state-dir "$T/state2" run "$T/job.yaml" >/dev/null 2>"$T/run2.err"
rc=$?
check "ddpctl --state-dir DIR run: the job succeeds, its store in DIR" \
    bash -c "test $rc -eq 0 && test -s '$T/state2/ddpd.db' && grep -Fq 'run dir $T/state2/runs/job-1' '$T/run2.err'"
check "ddpctl --state-dir DIR status reads the store in DIR" \
    test "$("$DDPCTL" --socket "$sock" --state-dir "$T/state2" --json status 1 2>/dev/null |
            jq -r .run_dir)" = "$T/state2/runs/job-1"
finish
