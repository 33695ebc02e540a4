#!/bin/bash
# Users' files touched by a root daemon (TAP): a symlink planted as rank-0.log or job.json in
# one's own run directory while the job waits must not hand a root file to the user or
# overwrite it; job.logs must not read a root file through one's log; a working directory the
# user may not enter is not entered for them; a log holding NUL bytes reaches ddpctl logs whole;
# pruning old run directories (runs_keep_days) removes a user's links, not what they point at.
. "$(dirname "$0")/../integration/lib.sh"
. "$(dirname "$0")/lib.sh"

printf 'root secret\n' > "$T/rootfile"; chmod 0600 "$T/rootfile"
printf 'root config\n' > "$T/rootfile2"; chmod 0600 "$T/rootfile2"
job_spec "$T/job.yaml" 1 20
job_spec "$T/long.yaml" 1 100000
sec_daemon a "" --slots 1 || exit 1

# B's job holds the only slot; A's waits, and A plants links in its run directory meanwhile
blocker=$(submit_as B a "$T/long.yaml")
wait_state a "$blocker" running 30
id=$(submit_as A a "$T/job.yaml")
rd="$T/a/runs/job-$id"
check "A's job waits in the queue" test "$(ctl a --json status "$id" | jq -r .state)" = queued
as A ln -s "$T/rootfile" "$rd/rank-0.log"
as A ln -s "$T/rootfile2" "$rd/job.json"
check "A planted both links in its own run directory" test -L "$rd/rank-0.log" -a -L "$rd/job.json"
uctl B a cancel "$blocker" >/dev/null
wait_until 30 bash -c "[ \"\$($DDPCTL --socket $T/a.sock --json status $id | jq -r .state)\" != queued ]"
wait_until 30 bash -c "$DDPCTL --socket $T/a.sock --json status $id | jq -e '.state|test(\"succeeded|failed|cancelled\")'"
check "the root file behind rank-0.log is still root's" test "$(stat -c %u:%a "$T/rootfile")" = 0:600
check "and unchanged" test "$(cat "$T/rootfile")" = "root secret"
check "the root file behind job.json is unchanged" test "$(cat "$T/rootfile2")" = "root config"
check "the rank was not started on a log behind a link: the job failed and says why" bash -c \
    "$DDPCTL --socket $T/a.sock --json status $id | jq -e '.state == \"failed\" and (.reason|test(\"could not be started\"))'"

# A job that ran; then A makes its log a link to a root file and asks the daemon for it
id2=$(submit_as A a "$T/job.yaml")
wait_state a "$id2" succeeded 30
rd2="$T/a/runs/job-$id2"
check "A's job ran as A" grep -q "^uid=$UA gid=$GA" "$rd2/rank-0.log"
as A rm -f "$rd2/rank-0.log" && as A ln -s "$T/rootfile" "$rd2/rank-0.log"
uctl A a logs "$id2" > "$T/logs.out" 2>&1
check "job.logs does not read a root file through the user's link" bash -c "! grep -q 'root secret' '$T/logs.out'"
as A rm -f "$rd2/rank-0.log" && as A mkfifo "$rd2/rank-0.log"
uctl A a logs "$id2" & # the old daemon blocked in open() here, its loop frozen
check "job.logs on a FIFO in its place leaves the daemon answering" within_ms 1000 ctl a info

# a working directory the user may not enter: the rank starts in its run directory instead
mkdir -p "$T/private" && chmod 0700 "$T/private"
spec=$(jq -Rs . < "$T/job.yaml")
uctl A a --json call job.submit "{\"spec\": $spec, \"cwd\": \"$T/private\"}" > "$T/sub.json"
id3=$(jq -r .id "$T/sub.json")
wait_until 30 bash -c "$DDPCTL --socket $T/a.sock --json status $id3 | jq -e '.state|test(\"succeeded|failed\")'"
check "a cwd the user may not enter is not entered for it (it starts in its run directory)" \
    grep -q "cwd=$T/a/runs/job-$id3\$" "$T/a/runs/job-$id3/rank-0.log"

# a log with NUL bytes (a byte-level model's closing sample has them) through ddpctl logs
stop_daemon a
SEC_MODE=nul sec_daemon b "" --slots 1 || exit 1
id4=$(submit_as A b "$T/job.yaml")
wait_state b "$id4" succeeded 30
uctl A b logs "$id4" > "$T/nul.out"; rc=$?
check "ddpctl logs of a log with NUL bytes exits 0" test $rc -eq 0
check "and passes every byte through" cmp "$T/nul.out" "$T/b/runs/job-$id4/rank-0.log"

# pruning: the ended job's run directory holds the user's link to a root directory and a
# directory of its own; a daemon that keeps run directories 0.00001 days (0.9 s) removes it
ended=$(ctl b --json status "$id4" | jq .ended_ms)
stop_daemon b
mkdir -p "$T/keep/sub" && echo kept > "$T/keep/sub/file" && chmod -R go-rwx "$T/keep"
rd4="$T/b/runs/job-$id4"
as A ln -s "$T/keep" "$rd4/link" && as A mkdir -p "$rd4/deep/er" && as A touch "$rd4/deep/er/x"
wait_until 10 bash -c "[ \$(date +%s%3N) -gt $((ended + 1000)) ]"
sec_daemon b "runs_keep_days: 0.00001" --slots 1 || exit 1
check "a run directory older than runs_keep_days is pruned" wait_until 10 test ! -e "$rd4"
check "through none of the user's links: the root directory it pointed at is whole" \
    test "$(cat "$T/keep/sub/file")" = kept
check "and the job's record stays" test "$(ctl b --json status "$id4" | jq -r .state)" = succeeded
finish
