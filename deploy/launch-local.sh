#!/usr/bin/env bash
# Starts N ddp-worker ranks on this machine with the environment rendezvous (no daemon, no MPI)
# and waits for them. Rank 0 prints the step lines; rank r > 0 logs to RUN_DIR/rank-r.log.
#
#   deploy/launch-local.sh N JOB.yaml [ddp-worker options...]
#
# With `ddp.restart: on-failure` in the spec (or --set ddp.restart=on-failure among the options)
# the job is elastic: a coordinator (ddp-rdzv) forms the generations, a rank that dies or hangs
# is evicted while the others go on, and this script restarts it (up to ddp.max_restarts times
# per rank, with a short backoff); the restarted rank rejoins the running job and receives its
# state from a live rank. The job goes on with at least ddp.min_workers ranks (at most N).
#
# Environment: DDP_WORKER (the ddp-worker binary; default build/worker/ddp-worker), DDP_RDZV_BIN
# (ddp-rdzv; default beside it in build/daemon), RUN_DIR (default runs/local), PORT (rendezvous
# port; default a free one).
# Each rank's pid is in RUN_DIR/rank-R.pid while it runs.
# Exit status: 0 when every rank succeeded, else the first failing rank's status (elastic: the
# coordinator's verdict). Ctrl-C or SIGTERM is passed to every rank (they finish their step and
# stop together).
set -uo pipefail
[ $# -ge 2 ] || { echo "usage: $0 N JOB.yaml [ddp-worker options...]" >&2; exit 2; }
n=$1; shift
here=$(cd "$(dirname "$0")/.." && pwd)
worker=${DDP_WORKER:-$here/build/worker/ddp-worker}
rdzv_bin=${DDP_RDZV_BIN:-$(dirname "$worker")/../daemon/ddp-rdzv}
run_dir=${RUN_DIR:-runs/local}
token=$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n')
mkdir -p "$run_dir"

# The spec decides whether the job is elastic (the same overrides the ranks get).
spec_json=$("$worker" --print-spec "$@") || exit 2
field() { python3 -c 'import json,sys; print(json.loads(sys.argv[1])["ddp"][sys.argv[2]])' "$spec_json" "$1"; }
restart=$(field restart)

log_of() { if [ "$1" -eq 0 ]; then cat; else cat >>"$run_dir/rank-$1.log"; fi; }
# start_rank R ELASTIC ARGS...: starts rank R in the background ($! is its pid, also in rank-R.pid)
start_rank() {
  local r=$1 elastic=$2
  shift 2
  env DDP_ELASTIC=$elastic DDP_RANK=$r DDP_WORLD_SIZE=$n DDP_LOCAL_RANK=$r \
      DDP_LOCAL_WORLD_SIZE=$n DDP_RDZV=127.0.0.1:$port DDP_JOB_TOKEN=$token \
      DDP_RUN_DIR="$run_dir" "$worker" "$@" > >(log_of "$r") 2>&1 &
  echo $! >"$run_dir/rank-$r.pid"
}
# wait_all PIDS...: waits for every one; the first non-zero status, else 0
wait_all() {
  local status=0 rc
  for pid in "$@"; do
    wait "$pid"; rc=$?
    [ $status -eq 0 ] && [ $rc -ne 0 ] && status=$rc
  done
  return $status
}

if [ "$restart" != "on-failure" ]; then
  port=${PORT:-$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')}
  pids=()
  for ((r = 0; r < n; r++)); do
    start_rank $r 0 "$@"
    pids+=($!)
  done
  trap 'kill -TERM "${pids[@]}" 2>/dev/null' INT TERM
  wait_all "${pids[@]}"
  exit $?
fi

# ---- elastic: a coordinator, and a supervisor per rank that restarts it ----
min=$(field min_workers); [ "$min" -gt "$n" ] && min=$n
max_restarts=$(field max_restarts)
port_file="$run_dir/rdzv.port"
rm -f "$port_file"
DDP_JOB_TOKEN=$token "$rdzv_bin" --listen "127.0.0.1:${PORT:-0}" --port-file "$port_file" \
  --world "$n" --min-workers "$min" --max-workers "$n" \
  --heartbeat-timeout "$(field heartbeat_timeout_s)" --rejoin-timeout "$(field rejoin_timeout_s)" \
  --run-dir "$run_dir" \
  >"$run_dir/rdzv.events" 2>"$run_dir/rdzv.log" &
rdzv=$!
for ((i = 0; i < 600; i++)); do  # the coordinator writes it once it listens
  [ -s "$port_file" ] && break
  kill -0 $rdzv 2>/dev/null || { cat "$run_dir/rdzv.log" >&2; exit 1; }
  sleep 0.05
done
[ -s "$port_file" ] || { echo "launch-local: the coordinator did not start" >&2; exit 1; }
port=$(cat "$port_file")

supervise() { # rank: runs it, and restarts it while the job goes on
  local r=$1 tries=0 rc
  shift
  while :; do
    start_rank "$r" 1 "$@"
    wait $!; rc=$?
    [ $rc -eq 0 ] || [ $rc -eq 2 ] || [ $rc -eq 143 ] && return $rc   # done, bad spec, stopped
    kill -0 $rdzv 2>/dev/null || return 0   # the job is over: its outcome is the coordinator's
    [ $tries -ge "$max_restarts" ] && { echo "launch-local: rank $r exited with $rc; no restarts left (ddp.max_restarts = $max_restarts)" >&2; return $rc; }
    tries=$((tries + 1))
    echo "$(date +%H:%M:%S.%3N) launch-local: rank $r exited with $rc; restarting it ($tries of $max_restarts)" >&2
    sleep "0.$((tries < 9 ? tries : 9))"   # backoff
  done
}
sups=()
for ((r = 0; r < n; r++)); do supervise $r "$@" & sups+=($!); done
trap 'kill -TERM $(cat "$run_dir"/rank-*.pid 2>/dev/null) 2>/dev/null' INT TERM
wait_all "${sups[@]}"; status=$?
kill -TERM $rdzv 2>/dev/null
wait $rdzv; rdzv_rc=$?
[ $rdzv_rc -eq 1 ] && [ $status -eq 0 ] && status=1
grep -h '"event":"failed"' "$run_dir/rdzv.events" >&2
exit $status
