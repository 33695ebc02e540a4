#!/bin/bash
# A full state filesystem (TAP): new jobs are refused with a clear error while a cancel of a
# running job is still taken and recorded (it survives a restart), and jobs are taken again once
# there is room. The state directory is a 16 MiB tmpfs in a mount namespace of the test's own.
. "$(dirname "$0")/../integration/lib.sh"
. "$(dirname "$0")/lib.sh"
job_spec "$T/job.yaml" 1 20
job_spec "$T/long.yaml" 1 100000
unshare -m --propagation private sleep 600 & holder=$!; PIDS="$PIDS $holder"
mkdir -p "$T/full" "$T/runs"
# (until unshare has made the namespace, the holder's is still ours: mount nothing there)
other_ns() { [ "$(readlink "/proc/$holder/ns/mnt")" != "$(readlink /proc/$$/ns/mnt)" ]; }
if wait_until 5 other_ns &&
    nsenter -t $holder -m mount -t tmpfs -o size=16m tmpfs "$T/full" 2>/dev/null; then
    cat > "$T/f.yaml" <<CFG
socket_group: users
run_dir: $T/runs
CFG
    fstart() {
        nsenter -t $holder -m "$DDPD" -c "$T/f.yaml" --socket "$T/f.sock" --state-dir "$T/full" \
            --metrics off --grace 3 --slots 2 >> "$T/f.log" 2>&1 &
        f_PID=$!; PIDS="$PIDS $f_PID"
        wait_until 30 "$DDPCTL" --socket "$T/f.sock" info && chmod o+x "$T/runs"
    }
    fctl() { "$DDPCTL" --socket "$T/f.sock" "$@"; }
    fstart
    id=$(submit_as A f "$T/long.yaml")
    for _ in $(seq 1 300); do [ "$(fctl --json status "$id" | jq -r .state)" = running ] && break; sleep 0.1; done
    nsenter -t $holder -m sh -c "dd if=/dev/zero of='$T/full/ballast' bs=64k 2>/dev/null; sync"
    uctl A f --json submit "$T/job.yaml" > /dev/null 2> "$T/full.json"
    check "a full state filesystem refuses a new job (1008)" test "$(jq .code "$T/full.json")" = 1008
    check "with a message that says so" grep -q "is full" "$T/full.json"
    check "a cancel on the full filesystem is taken" uctl A f cancel "$id"
    for _ in $(seq 1 300); do [ "$(fctl --json status "$id" | jq -r .state)" = cancelled ] && break; sleep 0.1; done
    kill -TERM $f_PID; wait_until 30 bash -c "! kill -0 $f_PID"
    fstart
    check "and recorded: after a restart the job is cancelled" \
        test "$(fctl --json status "$id" | jq -r .state)" = cancelled
    nsenter -t $holder -m rm -f "$T/full/ballast"
    for _ in $(seq 1 50); do submit_as A f "$T/job.yaml" >/dev/null 2>&1 && break; sleep 0.2; done
    check "once there is room, new jobs are taken again" submit_as A f "$T/job.yaml"
else
    skip_all "cannot mount a tmpfs in a mount namespace here"
fi
finish
