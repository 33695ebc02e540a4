#!/bin/bash
# Who a job runs as and who sees it (TAP): a user's ranks run with the user's own gid and
# supplementary groups, also after a daemon restart re-queues the job (never gid = uid); users
# see, stream and watch only their own jobs; a job name that is not one is refused; the status
# page of a root daemon shows counts, not jobs, and carries security headers.
. "$(dirname "$0")/../integration/lib.sh"
. "$(dirname "$0")/lib.sh"

job_spec "$T/job.yaml" 1 20
job_spec "$T/long.yaml" 1 100000
sec_daemon a "" --slots 1 --metrics 127.0.0.1:0 || exit 1

id=$(submit_as B a "$T/long.yaml")
wait_state a "$id" running 30
pid=$(worker_pids "$T/a/runs/job-$id" | head -1)
gids() { awk '/^Gid:/ {print $2} /^Groups:/ {$1=""; print}' "/proc/$1/status" | tr -s ' ' | xargs; }
check "B's rank runs as uid $UB with its primary gid $GB, not gid = uid" \
    grep -qx "Gid:	$GB	$GB	$GB	$GB" "/proc/$pid/status"
check "and with its supplementary group $XB" bash -c "grep '^Groups:' /proc/$pid/status | grep -qw $XB"

# B's second job waits; the daemon restarts; the re-queued job keeps B's groups
id2=$(submit_as B a "$T/long.yaml")
stop_daemon a
pkill -KILL -f "$T/a/runs/job-$id/job.json" # the first job's rank: the queued one gets the slot
start_daemon a -c "$T/a.yaml" --slots 1 --metrics 127.0.0.1:0 || exit 1
chmod o+x "$T/a" "$T/a/runs"
check "the re-queued job starts" wait_state a "$id2" running 30
pid=$(worker_pids "$T/a/runs/job-$id2" | head -1)
check "the re-queued job's rank runs with B's gid $GB (not $UB)" \
    grep -qx "Gid:	$GB	$GB	$GB	$GB" "/proc/$pid/status"
check "and B's supplementary group" bash -c "grep '^Groups:' /proc/$pid/status | grep -qw $XB"

# A sees its own jobs only; B's job is not A's to read, stream or watch
ida=$(submit_as A a "$T/job.yaml")
check "A lists only its own job" test "$(uctl A a --json ls | jq -c '[.[].id]')" = "[$ida]"
for call in "get {\"id\":$id2}" "logs {\"id\":$id2}" "watch {\"id\":$id2}" "cancel {\"id\":$id2}"; do
    uctl A a --json call "job.${call%% *}" "${call#* }" > "$T/out.json" 2> "$T/err.json"
    check "job.${call%% *} of B's job by A is refused (1003)" test "$(jq .code "$T/err.json")" = 1003
    check "and tells A nothing of it" bash -c "! grep -q 'zebra-job\|$T\|\"uid\"' '$T/out.json' '$T/err.json'"
done
check "B sees its jobs" test "$(uctl B a --json ls | jq '[.[]|select(.id == '$id2')]|length')" = 1
check "root sees every job" test "$(ctl a --json ls | jq length)" -ge 3

# job names: only names
for bad in '<script>alert(1)</script>' $'x\nforged log line' '../x'; do
    spec=$(jq -Rs . < "$T/job.yaml")
    uctl A a --json call job.submit "{\"spec\": $spec, \"name\": $(jq -Rn --arg s "$bad" '$s')}" \
        > /dev/null 2> "$T/err.json"
    check "the job name $(printf %q "$bad") is refused (-32602)" test "$(jq .code "$T/err.json")" = -32602
done
check "no forged line in the daemon's log" bash -c "! grep -q '^forged log line' '$T/a.log'"

# the status page: counts, no names; security headers
url=$(grep -o 'status page on http://127.0.0.1:[0-9]*/' "$T/a.log" | tail -1 | sed 's/status page on //')
curl -s -D "$T/headers" "$url" > "$T/page.html"
check "the page of a root daemon names no job" bash -c "! grep -q 'zebra-job' '$T/page.html' && grep -q 'id=.counts' '$T/page.html'"
for h in "Cache-Control: no-store" "X-Content-Type-Options: nosniff" "Content-Security-Policy: default-src 'none'"; do
    check "the page carries $h" grep -qi "^$h" "$T/headers"
done
uctl B a cancel "$id2" >/dev/null
finish
