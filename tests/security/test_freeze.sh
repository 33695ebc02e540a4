#!/bin/bash
# One request must not freeze the daemon (TAP): a FIFO as a spec path, a FIFO as a job's
# metrics.jsonl, a 600 KB nested spec and hundreds of idle connections (control socket, status
# page, peer port) each leave a status query answered within 1 s, and a submission by another
# user succeeding; a spec path names nothing to a user who may not read it; a spec over the
# request limit gets a message that says so.
. "$(dirname "$0")/../integration/lib.sh"
. "$(dirname "$0")/lib.sh"

job_spec "$T/job.yaml" 1 20
job_spec "$T/long.yaml" 1 100000
head -c 32 /dev/urandom | base64 > "$T/secret"; chmod 0600 "$T/secret"
port=$((20000 + $$ % 20000))
# a descriptor limit a flood can reach (the unit's is 65,536: more connections, same story)
ulimit -n 256
SEC_STEP_S=5 sec_daemon a "" --slots 2 --metrics 127.0.0.1:0 --listen "127.0.0.1:$port" \
    --secret-file "$T/secret" || exit 1
http=$(grep -o 'status page on http://127.0.0.1:[0-9]*/' "$T/a.log" | head -1 | grep -o '[0-9]*/$' | tr -d /)

# a FIFO as a spec path (the daemon would read it as root)
mkfifo "$T/fifo.yaml" && chmod 0666 "$T/fifo.yaml"
(uctl A a --json call job.submit "{\"path\": \"$T/fifo.yaml\"}" > "$T/fifo-a.out" 2>&1 &)
(ctl a --json call job.submit "{\"path\": \"$T/fifo.yaml\"}" > "$T/fifo-root.out" 2>&1 &)
check "a FIFO spec path leaves the daemon answering within 1 s" within_ms 1000 ctl a info
check "a user's path is refused before anything is opened" \
    wait_until 5 grep -q "instead of a path" "$T/fifo-a.out"
check "root's FIFO path is refused as not a regular file" \
    wait_until 5 grep -q "not a regular file" "$T/fifo-root.out"
# a path a user may not read names nothing: the same answer whether or not it exists
printf 'name: x\n' > "$T/rootonly.yaml"; chmod 0600 "$T/rootonly.yaml"
uctl A a --json call job.submit "{\"path\": \"$T/rootonly.yaml\"}" 2>&1 | sed "s|$T/rootonly.yaml|P|" > "$T/p1"
uctl A a --json call job.submit "{\"path\": \"$T/nothere.yaml\"}" 2>&1 | sed "s|$T/nothere.yaml|P|" > "$T/p2"
check "a path tells a user nothing of root's files" cmp "$T/p1" "$T/p2"

# a FIFO as metrics.jsonl: the daemon's tail reads it as root
id=$(submit_as A a "$T/job.yaml" --workers 1)
check "A's job starts" wait_state a "$id" running 30
uctl A a cancel "$id" >/dev/null; wait_state a "$id" cancelled 30
blocker=$(submit_as B a "$T/long.yaml"); blocker2=$(submit_as B a "$T/long.yaml")
wait_state a "$blocker2" running 30
id=$(submit_as A a "$T/job.yaml")
as A mkfifo "$T/a/runs/job-$id/metrics.jsonl"
uctl B a cancel "$blocker" >/dev/null
wait_until 30 bash -c "[ \"\$($DDPCTL --socket $T/a.sock --json status $id | jq -r .state)\" = running ]"
check "a FIFO as a job's metrics.jsonl leaves the daemon answering within 1 s" within_ms 1000 ctl a info
uctl A a cancel "$id" >/dev/null; uctl B a cancel "$blocker2" >/dev/null

# a 600 KB nested spec, and a submission right behind it
bg_as A "$PY" "$CLIENT" nested "$T/a.sock" 300000
check "a 600 KB nested spec leaves the daemon answering within 1 s" within_ms 1000 ctl a info
check "and another user's job is taken meanwhile" within_ms 5000 submit_as B a "$T/job.yaml"

# idle connections: 300 to the status page and 300 to the peer port from nobody, 300 control
# connections from a socket-group user; then a submission from another user
bg_as N "$PY" "$CLIENT" idle-tcp 127.0.0.1 "$http" 300 > "$T/idle-http"
bg_as N "$PY" "$CLIENT" idle-tcp 127.0.0.1 "$port" 300 > "$T/idle-peer"
bg_as A "$PY" "$CLIENT" idle-unix "$T/a.sock" 300 > "$T/idle-unix"
wait_until 20 bash -c "grep -q open '$T/idle-http' && grep -q open '$T/idle-peer' && grep -q open '$T/idle-unix'"
check "with 900 idle connections open, the daemon answers within 1 s" within_ms 1000 ctl a info
check "and B's submission succeeds" within_ms 5000 submit_as B a "$T/job.yaml"
check "A is held to its share of the control socket" \
    bash -c "grep -q 'max_sessions_per_user' '$T/a.log'"
check "the peer port closes connections that never authenticate" \
    wait_until 20 bash -c "tail -1 '$T/idle-peer' | awk '{exit !(\$2 >= 8)}'"

# a spec over the request limit
head -c 2000000 /dev/zero | tr '\0' '#' > "$T/big.yaml"; chmod 0644 "$T/big.yaml"
uctl A a submit "$T/big.yaml" > "$T/big.out" 2>&1
check "a spec over the limit gets a message that says so (not 'Broken pipe')" \
    bash -c "grep -q 'larger than the daemon takes' '$T/big.out' && ! grep -qi 'broken pipe' '$T/big.out'"
finish
