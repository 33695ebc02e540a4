#!/usr/bin/env bash
# Starts N ddp-worker ranks on this machine with the environment rendezvous (no daemon, no MPI)
# and waits for them. Rank 0 prints the step lines; rank r > 0 logs to RUN_DIR/rank-r.log.
#
#   deploy/launch-local.sh N JOB.yaml [ddp-worker options...]
#
# Environment: DDP_WORKER (the ddp-worker binary; default build/worker/ddp-worker),
# RUN_DIR (default runs/local), PORT (rendezvous port; default a free one).
# Exit status: 0 when every rank succeeded, else the first failing rank's status. Ctrl-C or
# SIGTERM is passed to every rank (they finish their step and stop together).
set -uo pipefail
[ $# -ge 2 ] || { echo "usage: $0 N JOB.yaml [ddp-worker options...]" >&2; exit 2; }
n=$1; shift
here=$(cd "$(dirname "$0")/.." && pwd)
worker=${DDP_WORKER:-$here/build/worker/ddp-worker}
run_dir=${RUN_DIR:-runs/local}
port=${PORT:-$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')}
token=$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n')
mkdir -p "$run_dir"

pids=()
for ((r = 0; r < n; r++)); do
  env DDP_RANK=$r DDP_WORLD_SIZE=$n DDP_LOCAL_RANK=$r DDP_LOCAL_WORLD_SIZE=$n \
      DDP_RDZV=127.0.0.1:$port DDP_JOB_TOKEN=$token DDP_RUN_DIR="$run_dir" \
      "$worker" "$@" > >(if [ $r -eq 0 ]; then cat; else cat >"$run_dir/rank-$r.log"; fi) 2>&1 &
  pids+=($!)
done
trap 'kill -TERM "${pids[@]}" 2>/dev/null' INT TERM

status=0
for pid in "${pids[@]}"; do
  wait "$pid"; rc=$?
  [ $status -eq 0 ] && [ $rc -ne 0 ] && status=$rc
done
exit $status
