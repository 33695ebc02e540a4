#!/bin/bash
# What ddpctl prints, against a real daemon and real workers:
# - a spec error names the spec's file first, as ddp-worker does ("job.yaml:4:7: train.lr: ..."),
#   never the field as if it were a file ("train.lr:4:7: ...");
# - the last progress line of a finished job shows the final loss and the run's average
#   tokens/s, not placeholders ("loss -  0 tok/s"), even when the last record the worker wrote
#   is a validation line (which carries no training loss or rate).
. "$(dirname "$0")/lib.sh"
if [ ! -x "$BUILD/worker/ddp-worker" ] || [ ! -x "$BUILD/worker/ddp-prep" ]; then
    echo "1..0 # SKIP ddp-worker or ddp-prep not built"
    exit 0
fi
export DDP_WORKER_BIN=$BUILD/worker/ddp-worker
start_daemon a --slots 2 || { echo "1..1"; echo "not ok 1 - daemon did not start"; exit 1; }

# ---- a spec error: the file first, then line, column and the field ----
mkdir -p "$T/specs"
cat > "$T/specs/job.yaml" <<'SPEC'
name: msg
model: {preset: gpt2-tiny}
data: {train: "nowhere/train_*.bin"}
train: {steps: 2, no_such_key: true}
SPEC
(cd "$T/specs" && "$DDPCTL" --socket "$T/a.sock" submit job.yaml) >/dev/null 2>"$T/rel.err"
rc=$?
diag "$T/rel.err"
check "bad spec (relative name): exit 1" test $rc -eq 1
check "bad spec: 'ddpctl: job.yaml:4:COL: train.no_such_key: unknown key'" \
    grep -Eq '^ddpctl: job\.yaml:4:[0-9]+: train\.no_such_key: unknown key' "$T/rel.err"
check "bad spec: the field is not printed where a file name goes" \
    bash -c "! grep -q '^ddpctl: train\\.no_such_key' '$T/rel.err'"
check "bad spec: the position is printed once" test "$(grep -c 'line 4' "$T/rel.err")" -eq 0

ctl a submit "$T/specs/job.yaml" >/dev/null 2>"$T/abs.err"
check "bad spec (absolute name): that name first" \
    grep -Fq "ddpctl: $T/specs/job.yaml:4:" "$T/abs.err"

# the API: params.origin names an inline spec; without it the spec is "<inline>"
inline=$(jq -Rs . "$T/specs/job.yaml")
ctl a call job.submit "{\"spec\":$inline,\"origin\":\"mine.yaml\"}" >/dev/null 2>"$T/api1.json"
check "job.submit origin: message 'mine.yaml:4:COL: train.no_such_key: ...'" \
    bash -c "jq -r .message '$T/api1.json' | grep -Eq '^mine\\.yaml:4:[0-9]+: train\\.no_such_key: unknown key'"
check "job.submit origin: data keeps path, line and origin" \
    test "$(jq -c '[.code,.data.path,.data.line,.data.origin]' "$T/api1.json")" = '[1001,"train.no_such_key",4,"mine.yaml"]'
ctl a call job.submit "{\"spec\":$inline}" >/dev/null 2>"$T/api2.json"
check "job.submit without origin: '<inline>:4:COL: train.no_such_key: ...'" \
    bash -c "jq -r .message '$T/api2.json' | grep -Eq '^<inline>:4:[0-9]+: train\\.no_such_key: unknown key'"

# ---- a spec whose min_workers means nothing without restart: on-failure: a warning ----
cat > "$T/specs/minw.yaml" <<'SPEC'
name: minw
model: {preset: gpt2-tiny}
data: {train: "nowhere/train_*.bin"}
train: {steps: 2}
ddp: {workers: 2, min_workers: 1}
SPEC
ctl a submit "$T/specs/minw.yaml" >/dev/null 2>"$T/minw.err"
diag "$T/minw.err"
check "min_workers < workers with restart: never: ddpctl warns, naming both fields" \
    grep -q "^ddpctl: warning: ddp.min_workers (1) is below ddp.workers (2) but ddp.restart is never" "$T/minw.err"
check "... and the daemon's log says it too" grep -q "minw): ddp.min_workers (1) is below" "$T/a.log"

# ---- the final progress line ----
head -c 60000 "$SRC/daemon/job.c" > "$T/corpus.txt"
"$BUILD/worker/ddp-prep" --out "$T/data" --val-fraction 0.2 "$T/corpus.txt" >"$T/prep.log" 2>&1
check "ddp-prep made train and val shards" test -s "$T/data/train_000000.bin" -a -s "$T/data/val_000000.bin"
cat > "$T/job.yaml" <<SPEC
name: final-line
model: {preset: gpt2-tiny}
data: {train: "$T/data/train_*.bin", val: "$T/data/val_*.bin"}
train: {steps: 6, micro_batch: 2, seq_len: 32, lr: 1.0e-3, warmup: 2, val_every: 3, val_batches: 1,
        sample_tokens: 0, seed: 7}
ddp: {workers: 2}
SPEC
# stdout is a file, so ddpctl prints plain lines (one per state change at least)
ctl a run "$T/job.yaml" >"$T/run.out" 2>"$T/run.err"
rc=$?
diag "$T/run.out"
check "short job succeeds" test $rc -eq 0
id=$(sed -n 's/^job \([0-9]*\) succeeded.*/\1/p' "$T/run.out")
rd="$T/a/runs/job-$id"
check "its last step record is a validation line (the case that showed placeholders)" \
    test "$(jq -s -c '[.[]|select(.step==6 and (has("event")|not))]|last|has("val_loss")' "$rd/metrics.jsonl")" = true
last=$(grep "^job $id \[succeeded\] step" "$T/run.out" | tail -1)
echo "# last progress line: $last"
check "final line: step 6/6" grep -q "step 6/6 " <<<"$last"
want=$(ctl a --json status "$id" | jq -r '.final_loss|tostring')
got=$(sed -n 's/.*final loss \([0-9.]*\) .*/\1/p' <<<"$last")
check "final line: the final loss ($got) is the job's ($want)" \
    awk -v a="$got" -v b="$want" 'BEGIN { exit !(a != "" && (a - b) ^ 2 < 1e-8) }'
tps=$(sed -n 's/.*  \([0-9.]*k\{0,1\}\) tok\/s average$/\1/p' <<<"$last")
check "final line: an average rate ($tps tok/s) above zero" \
    awk -v t="${tps%k}" 'BEGIN { exit !(t != "" && t + 0 > 0) }'
check "final line: no placeholders" bash -c "! grep -Eq 'loss -|  0 tok/s|ETA' <<<'$last'"
stop_daemon a
finish
