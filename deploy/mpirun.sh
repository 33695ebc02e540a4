#!/usr/bin/env bash
# Launches a job with Open MPI, no daemon: one ddp-worker per slot, ranks and addresses from MPI,
# the ring (or MPI) data plane on CPU, NCCL on GPU. Works across hosts with -H/--hostfile.
#
#   deploy/mpirun.sh -np 8 -H a:4,b:4 JOB.yaml [ddp-worker options...]
#
# Everything before the job file goes to mpirun; everything after it to ddp-worker. Set
# DDP_WORKER to the ddp-worker binary (default: the one in build/, else ddp-worker on PATH).
# There is no elastic rejoin under mpirun: a dead rank stops the job. Open MPI then SIGTERMs the
# survivors and SIGKILLs them after odls_base_sigkill_timeout (1 s by default); in between, one
# survivor saves the last completed step from memory (checkpoint.dir), so relaunching the same
# command loses no completed step. A GPT-2 124M save took 0.97 s here (1.5 GB at 1.5 GB/s), so
# this script grants 10 s (DDP_MPI_SIGKILL_TIMEOUT=S overrides it; Open MPI waits that long after
# a failure even when every survivor has exited, so larger is slower to give up).
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
worker=${DDP_WORKER:-$here/build/worker/ddp-worker}
[ -x "$worker" ] || worker=$(command -v ddp-worker)

mpi_args=()
while [ $# -gt 0 ] && [[ "$1" != *.yaml && "$1" != *.yml && "$1" != *.json ]]; do
  mpi_args+=("$1"); shift
done
[ $# -ge 1 ] || { echo "usage: $0 [mpirun options] JOB.yaml [ddp-worker options]" >&2; exit 2; }

extra=()
[ "$(id -u)" -eq 0 ] && extra+=(--allow-run-as-root)
# --bind-to none: the worker sizes its own thread pool (cores / local ranks); MPI's default
# core binding would pin every thread of a rank to one core.
exec mpirun "${extra[@]}" --bind-to none \
  --mca odls_base_sigkill_timeout "${DDP_MPI_SIGKILL_TIMEOUT:-10}" "${mpi_args[@]}" \
  -x DDP_LOG_LEVEL -x OPENBLAS_CORETYPE "$worker" "$@"
