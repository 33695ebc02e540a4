#!/usr/bin/env bash
# The caps on what a rank writes, in real runs of ddp-worker (TAP): limits.log_bytes cuts the
# rank's log (stdout and stderr in one file, as ddpd opens rank-R.log) at the cap plus one closing
# line, which ends it, and the job still finishes (exit 0, its "done" line in metrics.jsonl); a
# second process of the rank appending to the full log adds nothing; the daemon's
# DDP_LIMIT_LOG_BYTES lowers a larger spec value and does not raise a smaller one; a malformed
# DDP_LIMIT_* is refused (exit 2); limits.metrics_bytes and limits.tensorboard_bytes keep whole
# lines and records under their caps. Without a cap the same run logs more than the cap, so the
# checks can fail.
#   test_log_cap.sh DDP_WORKER DDP_PREP
set -uo pipefail
worker=$1 prep=$2
tmp=$(mktemp -d /tmp/ddp-test-logcap.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
unset DDP_LIMIT_LOG_BYTES DDP_LIMIT_METRICS_BYTES DDP_LIMIT_TENSORBOARD_BYTES DDP_LOG_LEVEL
unset DDP_WORLD_SIZE DDP_RANK DDP_RDZV DDP_ELASTIC WORLD_SIZE RANK

. "$(dirname "$0")/../../tap.sh"
. "$(dirname "$0")/../../corpus.sh"

fox_corpus "$prep" "$tmp" 600 || { echo "1..0 # ddp-prep failed"; exit 1; }
cat >"$tmp/job.yaml" <<YAML
name: log-cap
model: {preset: gpt2-tiny}
data: {train: "$tmp/data/train_*.bin"}
train: {steps: 30, micro_batch: 2, seq_len: 32, log_every: 1, val_every: 0, sample_tokens: 0,
        threads: 1}
limits: {log_bytes: 2000}
YAML
# run NAME [options]: one rank, its stdout and stderr appended to one file, NAME.log, as ddpd
# does; run directory NAME/; exit status in NAME.rc
run() {
  local name=$1
  shift
  timeout 20 "$worker" "$tmp/job.yaml" --run-dir "$tmp/$name" "$@" >>"$tmp/$name.log" 2>&1
  echo $? >"$tmp/$name.rc"
}
closing() { echo "log cap of $1 bytes reached ($2): further output of this rank is discarded"; }
# capped NAME CAP SOURCE: the log is at most CAP plus its last line, which is the closing line
# (the only one), and the run finished: exit 0 and metrics.jsonl's "done" line
capped() {
  local log=$tmp/$1.log size last
  size=$(stat -c %s "$log") last=$(tail -n 1 "$log")
  [ "$(cat "$tmp/$1.rc")" = 0 ] || { echo "exit $(cat "$tmp/$1.rc")"; return 1; }
  [ "$size" -le $(($2 + ${#last} + 1)) ] || { echo "$size bytes > $2 + ${#last} + 1"; return 1; }
  case $last in *"$(closing "$2" "$3")") ;; *) echo "last line: $last"; return 1 ;; esac
  [ "$(grep -c "log cap of" "$log")" = 1 ] || { echo "closing lines: $(grep -c "log cap of" "$log")"; return 1; }
  grep -q '"event":"done"' "$tmp/$1/metrics.jsonl" || { echo "no done line"; return 1; }
}

echo "1..9"
# without a cap the same run logs more than 2000 bytes
run nocap --set limits.log_bytes=0
size=$(stat -c %s "$tmp/nocap.log")
check "without a cap the run logs more than 2000 bytes (here $size)" \
  bash -c "[ $size -gt 4000 ] && [ \$(cat '$tmp/nocap.rc') = 0 ] && grep -q 'step    30/30' '$tmp/nocap.log'"

run spec
check "limits.log_bytes: 2000 ends the log with the closing line within the cap; the job finishes" \
  capped spec 2000 limits.log_bytes

# a rank's next process appends to its full log: nothing more (the count starts at the file's size)
size=$(stat -c %s "$tmp/spec.log")
run spec --no-resume
check "a second process on the full log adds nothing and exits 0" \
  bash -c "[ \$(stat -c %s '$tmp/spec.log') = $size ] && [ \$(cat '$tmp/spec.rc') = 0 ]"

DDP_LIMIT_LOG_BYTES=1500 run daemon --set limits.log_bytes=1MiB
check "DDP_LIMIT_LOG_BYTES=1500 lowers limits.log_bytes 1MiB" \
  capped daemon 1500 "the daemon's per-user limit, DDP_LIMIT_LOG_BYTES"

DDP_LIMIT_LOG_BYTES=1000000 run higher
check "DDP_LIMIT_LOG_BYTES above limits.log_bytes leaves the spec's cap" \
  capped higher 2000 limits.log_bytes

DDP_LIMIT_LOG_BYTES=0 run zero --set limits.log_bytes=0
check "DDP_LIMIT_LOG_BYTES=0 and limits.log_bytes 0: no cap" \
  bash -c "[ \$(stat -c %s '$tmp/zero.log') -gt 4000 ] && ! grep -q 'log cap of' '$tmp/zero.log'"

DDP_LIMIT_METRICS_BYTES=12abc run bad
check "a malformed DDP_LIMIT_METRICS_BYTES is refused with exit 2, naming it" \
  bash -c "[ \$(cat '$tmp/bad.rc') = 2 ] && grep -q \"DDP_LIMIT_METRICS_BYTES='12abc' is not a byte count\" '$tmp/bad.log'"

# metrics.jsonl and the event files under small caps: whole lines and records, one warning each
run files --set limits.log_bytes=0 --set limits.metrics_bytes=1000 --set limits.tensorboard_bytes=3KiB
check "limits.metrics_bytes 1000: whole JSON lines within the cap, one warning, exit 0" \
  bash -c "[ \$(cat '$tmp/files.rc') = 0 ] && [ \$(stat -c %s '$tmp/files/metrics.jsonl') -le 1000 ] &&
    python3 -c 'import json, sys; t = open(sys.argv[1]).read(); assert t.endswith(\"\\n\"); [json.loads(l) for l in t.splitlines()]' '$tmp/files/metrics.jsonl' &&
    [ \$(grep -c 'metrics.jsonl: the cap of 1000 bytes (limits.metrics_bytes) is reached' '$tmp/files.log') = 1 ]"
check "limits.tensorboard_bytes 3KiB: the event files stay within it, one warning" \
  bash -c "[ \$(cat '$tmp/files'/tb/events.out.tfevents.* | wc -c) -le 3072 ] &&
    [ \$(grep -c 'tensorboard: the cap of 3072 bytes on the event files (limits.tensorboard_bytes) is reached' '$tmp/files.log') = 1 ]"
exit $((TAP_FAILED > 0))
