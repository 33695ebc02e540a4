# Shared helpers for the daemon's shell integration tests: TAP output (tests/tap.sh), waits with a
# deadline (tests/wait.sh's wait_until), temporary daemons on private sockets, and a cleanup trap
# that ends every process a test started (by pid, never by name) so no test leaves anything behind.
# Needs DDP_BUILD_ROOT (set by meson's test_env) or BUILD=<build dir>.
BUILD=${BUILD:-${DDP_BUILD_ROOT:?DDP_BUILD_ROOT not set}}
SRC=${DDP_SOURCE_ROOT:-$(cd "$(dirname "$0")/../.." && pwd)}
DDPD=$BUILD/daemon/ddpd
DDPCTL=$BUILD/daemon/ddpctl
FAKE_WORKER=$SRC/tests/integration/fake-worker.sh
T=$(mktemp -d /tmp/ddpd-test.XXXXXX)
chmod 755 "$T" # another uid reaches the socket in the permission test
PIDS=""
. "$SRC/tests/tap.sh"
. "$SRC/tests/wait.sh" # wait_until

# The worker: DDP_TEST_WORKER=fake|real (default real when it is built).
worker_bin() {
    if [ "${DDP_TEST_WORKER:-real}" = real ] && [ -x "$BUILD/worker/ddp-worker" ]; then
        echo "$BUILD/worker/ddp-worker"
    else
        echo "$FAKE_WORKER"
    fi
}


cleanup() {
    for p in $PIDS; do kill -TERM "$p" 2>/dev/null; done
    for p in $PIDS; do
        for _ in $(seq 1 100); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
        kill -KILL "$p" 2>/dev/null
    done
    # a daemon stopped with SIGTERM leaves its jobs' ranks running (the next one adopts them):
    # end those of this test's daemons, found by their spec's path under $T
    pkill -KILL -f "$T/.*job.json" 2>/dev/null
    wait 2>/dev/null
    [ -n "${KEEP_TMP:-}" ] || rm -rf "$T"
}
trap cleanup EXIT

# start_daemon NAME [ddpd options...]: socket $T/NAME.sock, state $T/NAME; sets $NAME_PID.
# Its config is empty unless the options name one (-c): a root ddpd would otherwise read the
# machine's /etc/ddpd/ddpd.yaml, whose run_dir or socket_group are not this test's.
start_daemon() {
    local name=$1; shift
    "$DDPD" -c /dev/null --socket "$T/$name.sock" --state-dir "$T/$name" --metrics off \
        --grace 3 "$@" \
        >>"$T/$name.log" 2>&1 &
    local pid=$!
    PIDS="$PIDS $pid"
    eval "${name}_PID=$pid"
    local deadline=$((SECONDS + 30))
    while [ $SECONDS -lt $deadline ]; do
        "$DDPCTL" --socket "$T/$name.sock" info >/dev/null 2>&1 && return 0
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.05
    done
    echo "# daemon $name did not start:"; diag "$T/$name.log"
    return 1
}

# stop_daemon NAME [SIGNAL]: signals it and waits for it to exit.
stop_daemon() {
    local name=$1 sig=${2:-TERM}
    local pid; eval "pid=\$${name}_PID"
    kill "-$sig" "$pid" 2>/dev/null
    wait_until 30 bash -c "! kill -0 $pid" || kill -KILL "$pid" 2>/dev/null
    wait "$pid" 2>/dev/null
    PIDS=$(echo "$PIDS" | sed "s/ $pid\b//")
}

ctl() { local name=$1; shift; "$DDPCTL" --socket "$T/$name.sock" "$@"; }

# wait_state NAME ID STATE [TIMEOUT_S]
wait_state() {
    local name=$1 id=$2 want=$3 deadline=$((SECONDS + ${4:-60}))
    until [ "$(ctl "$name" --json status "$id" 2>/dev/null | jq -r .state)" = "$want" ]; do
        [ $SECONDS -ge $deadline ] && return 1
        sleep 0.1
    done
}

# Processes whose command line names this run dir's spec (the workers of one job).
workers_of() { pgrep -f "$1/job.json" || true; }
# n_workers_at_least RUN_DIR N: at least N worker processes of that job are alive.
n_workers_at_least() { [ "$(workers_of "$1" | wc -l)" -ge "$2" ]; }
# no_workers RUN_DIR: no worker process of that job is alive.
no_workers() { [ -z "$(workers_of "$1")" ]; }

# A small token-shard data set and a gpt2-tiny job spec (WORKERS ranks, STEPS steps).
make_job() {
    local out=$1 workers=$2 steps=$3
    mkdir -p "$T/data"
    if [ ! -f "$T/data/train_000000.bin" ]; then
        head -c 200000 "$SRC/daemon/job.c" "$SRC/daemon/api.c" > "$T/corpus.txt"
        "$BUILD/worker/ddp-prep" --out "$T/data" --val-fraction 0.1 "$T/corpus.txt" \
            >"$T/prep.log" 2>&1 || { # without ddp-prep the fake worker needs no data
            : > "$T/data/train_000000.bin"; }
    fi
    cat > "$out" <<SPEC
name: it-tiny
model: {preset: gpt2-tiny}
data: {train: "$T/data/train_*.bin"}
train: {steps: $steps, micro_batch: 2, seq_len: 32, lr: 1.0e-3, warmup: 2, log_every: 1, seed: 7}
ddp: {workers: $workers}
SPEC
}

finish() {
    tap_plan
    [ $TAP_FAILED -eq 0 ]
}
