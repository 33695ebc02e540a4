# The security suite's shared set-up (sourced after tests/integration/lib.sh): a root ddpd as a
# shared node runs it, unprivileged users made with numeric ids (setpriv: no useradd), a
# stand-in worker they can run, and helpers to act as them. Every test here is an attack from
# the hardening issue (docs/security.md): it must fail against ddpd before the hardening and
# pass after. Needs root (skipped with the reason elsewhere).
[ "$(id -u)" = 0 ] || skip_all "the security suite needs root (it runs ddpd as a root daemon and acts as other users)"
command -v setpriv >/dev/null || skip_all "setpriv (util-linux) is missing"
# a python the users may run (root's PATH may lead to a python under /root)
PY=/usr/bin/python3
[ -x "$PY" ] || PY=$(command -v python3)
setpriv --reuid=65534 --regid=65534 --clear-groups "$PY" -c pass 2>/dev/null ||
    skip_all "no python3 that an unprivileged user may run"
SEC=$SRC/tests/security

# The users: A and B are socket-group members (gid 100, "users"); B's primary group is not its
# uid, and it has a supplementary group only it is in.
UA=1001 GA=1001
UB=1002 GB=2002 XB=3003
SOCKGRP=100
# as NAME CMD...: runs CMD as user A or B (or N = uid 65534, nobody, in no group of the socket)
as() {
    local who=$1; shift
    case $who in
        A) setpriv --reuid=$UA --regid=$GA --groups=$SOCKGRP "$@" ;;
        B) setpriv --reuid=$UB --regid=$GB --groups=$SOCKGRP,$XB "$@" ;;
        N) setpriv --reuid=65534 --regid=65534 --clear-groups "$@" ;;
    esac
}
# bg_as WHO CMD...: as(), in the background, its pid among those the test's cleanup ends
bg_as() {
    local who=$1; shift
    case $who in
        A) setpriv --reuid=$UA --regid=$GA --groups=$SOCKGRP "$@" & ;;
        B) setpriv --reuid=$UB --regid=$GB --groups=$SOCKGRP,$XB "$@" & ;;
        N) setpriv --reuid=65534 --regid=65534 --clear-groups "$@" & ;;
    esac
    PIDS="$PIDS $!"
}
# uctl WHO DAEMON ARGS...: ddpctl as a user, from $T (a directory every user may enter)
uctl() { local who=$1 name=$2; shift 2; (cd "$T" && as "$who" "$DDPCTL" --socket "$T/$name.sock" "$@"); }

# The stand-in worker, where every user may run it.
mkdir -p "$T/bin"
install -m 0755 "$SEC/worker.sh" "$T/bin/worker"
install -m 0755 "$SEC/client.py" "$T/bin/client.py"
export DDP_WORKER_BIN=$T/bin/worker
CLIENT=$T/bin/client.py

# sec_daemon NAME [CONFIG_LINES] [ddpd options...]: a root daemon whose socket the users may
# use (socket_group), with CONFIG_LINES (YAML) added to its config; its state directory is made
# traversable as an administrator would, so that an older ddpd (0750) could run users' jobs at
# all (the attacks need their jobs to run).
sec_daemon() {
    local name=$1 extra=${2:-}; shift 2
    printf 'socket_group: users\n%s\n' "$extra" > "$T/$name.yaml"
    start_daemon "$name" -c "$T/$name.yaml" "$@" || return 1
    chmod o+x "$T/$name" "$T/$name/runs" 2>/dev/null
    return 0
}

# job_spec FILE [WORKERS] [STEPS]: a spec for the stand-in worker (its steps: SEC_STEPS).
job_spec() {
    cat > "$1" <<SPEC
name: zebra-job
model: {preset: gpt2-tiny}
data: {train: "$T/data/train_*.bin"}
train: {steps: ${3:-20}, micro_batch: 2, seq_len: 32}
ddp: {workers: ${2:-1}}
SPEC
    chmod 0644 "$1"
}
mkdir -p "$T/data" && : > "$T/data/train_000000.bin"

# submit_as WHO DAEMON SPEC [ctl args]: the job id (the job's run dir is $T/DAEMON/runs/job-ID).
submit_as() { local who=$1 name=$2 spec=$3; shift 3; uctl "$who" "$name" submit "$spec" "$@"; }

# within_ms MS CMD...: CMD succeeds and takes under MS milliseconds (it is killed a little
# after, so a frozen daemon fails the check instead of hanging the test).
within_ms() {
    local lim=$1; shift
    local t0=$(date +%s%N) deadline=$((SECONDS + lim / 1000 + 2))
    ("$@" >/dev/null 2>&1) &
    local pid=$!
    while kill -0 "$pid" 2>/dev/null; do
        if [ $SECONDS -ge $deadline ]; then
            pkill -KILL -P "$pid"; kill -KILL "$pid"; wait "$pid" 2>/dev/null
            return 1
        fi
        sleep 0.01
    done
    wait "$pid" || return 1
    [ $(( ($(date +%s%N) - t0) / 1000000 )) -lt "$lim" ]
}

# worker_pids RUN_DIR: the workers of that job.
worker_pids() { pgrep -f "$1/job.json" || true; }
