#!/usr/bin/env bash
# Slurm for real (TAP): a one-node Slurm cluster in a temporary directory (munged, slurmctld and
# slurmd in the foreground, a generated slurm.conf on free ports, the node on 127.0.0.1), then
# `sbatch deploy/slurm.sbatch` with 2 tasks, once with ranks from PMIx through MPI (the default)
# and once with the environment rendezvous (DDP_SLURM_BOOTSTRAP=env). Each job must succeed,
# train (step lines), and dump weights bitwise equal to `deploy/launch-local.sh 2` on the same
# spec. Installs Debian's slurm-wlm and munge when they are missing (apt-get, as root).
# Skips (77) only where they cannot be installed or the daemons cannot start; says which.
# Every daemon it starts is ended by pid on exit.
#
#   test_slurm.sh DDP-WORKER DDP-PREP ST-COMPARE
set -uo pipefail
worker=$1 prep=$2 compare=$3
src=${DDP_SOURCE_ROOT:-$(cd "$(dirname "$0")/../.." && pwd)}
skip() { echo "1..0 # SKIP $*"; exit 77; }

need=(munged slurmctld slurmd sbatch srun sinfo scontrol)
missing() { for b in "${need[@]}"; do command -v "$b" >/dev/null || return 0; done; return 1; }
if missing; then
    [ "$(id -u)" = 0 ] || skip "slurm-wlm/munge not installed and not root to install them"
    command -v apt-get >/dev/null || skip "slurm-wlm/munge not installed and no apt-get"
    echo "# installing slurm-wlm and munge (apt-get)"
    export DEBIAN_FRONTEND=noninteractive
    apt-get install -y -qq --no-install-recommends slurm-wlm munge >/dev/null 2>&1 ||
        { apt-get update -qq >/dev/null 2>&1 &&
          apt-get install -y -qq --no-install-recommends slurm-wlm munge >/dev/null 2>&1; } ||
        skip "apt-get could not install slurm-wlm and munge"
    missing && skip "slurm-wlm installed but its programs are not on PATH"
fi
# slurmd runs the tasks as the submitting user and must be root to do so for others
[ "$(id -u)" = 0 ] || skip "a private slurmd needs root here"

T=$(mktemp -d /tmp/ddp-slurm.XXXXXX)
chmod 755 "$T"
daemons=() # munged, slurmctld, slurmd, and a running sbatch: ended by pid on exit
cleanup() {
    [ -f "$T/slurm.conf" ] && SLURM_CONF=$T/slurm.conf timeout 10 scancel --quiet --user=root \
        >/dev/null 2>&1
    for p in "${daemons[@]}"; do kill -TERM "$p" 2>/dev/null; done
    for p in "${daemons[@]}"; do
        for _ in $(seq 1 100); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
        kill -KILL "$p" 2>/dev/null
    done
    wait 2>/dev/null
    [ -n "${KEEP_TMP:-}" ] || rm -rf "$T"
}
trap cleanup EXIT
. "$(dirname "$0")/../tap.sh"
. "$(dirname "$0")/../corpus.sh"
# wait_until TIMEOUT_S COMMAND...: polls every 100 ms until COMMAND succeeds or the deadline.
wait_until() {
    local deadline=$((SECONDS + $1)); shift
    until "$@" >/dev/null 2>&1; do [ $SECONDS -ge $deadline ] && return 1; sleep 0.1; done
}

# munge with a private key and socket
dd if=/dev/urandom of="$T/munge.key" bs=1024 count=1 2>/dev/null
chmod 400 "$T/munge.key"
munged -F -f --socket="$T/munge.sock" --key-file="$T/munge.key" --pid-file="$T/munged.pid" \
    --seed-file="$T/munge.seed" --log-file="$T/munged.log" >"$T/munged.out" 2>&1 &
daemons+=($!)
wait_until 30 test -S "$T/munge.sock" || { sed 's/^/# /' "$T/munged.out"; skip "munged did not start"; }

ports=$(python3 -c 'import socket
s = [socket.socket() for _ in range(2)]
for x in s: x.bind(("127.0.0.1", 0))
print(*[x.getsockname()[1] for x in s])')
read -r pctld pd <<<"$ports"
host=$(hostname -s)
mkdir -p "$T/ctld" "$T/spool"
cat >"$T/slurm.conf" <<EOF
ClusterName=ddptest
SlurmctldHost=$host(127.0.0.1)
SlurmctldPort=$pctld
SlurmdPort=$pd
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=$T/munge.sock
CredType=cred/munge
StateSaveLocation=$T/ctld
SlurmdSpoolDir=$T/spool
SlurmctldPidFile=$T/slurmctld.pid
SlurmdPidFile=$T/slurmd.pid
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SwitchType=switch/none
MpiDefault=none
ReturnToService=2
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
JobCompType=jobcomp/none
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
SlurmctldLogFile=$T/slurmctld.log
SlurmdLogFile=$T/slurmd.log
NodeName=ddpnode NodeHostname=$host NodeAddr=127.0.0.1 CPUs=$(nproc) State=UNKNOWN
PartitionName=ddp Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
EOF
export SLURM_CONF=$T/slurm.conf
slurmctld -D -f "$SLURM_CONF" >"$T/slurmctld.out" 2>&1 &
daemons+=($!)
slurmd -D -N ddpnode -f "$SLURM_CONF" >"$T/slurmd.out" 2>&1 &
daemons+=($!)
node_idle() { sinfo -h -n ddpnode -o %T | grep -q idle; }
if ! wait_until 60 node_idle; then
    tail -5 "$T/slurmctld.out" "$T/slurmd.out" "$T/slurmctld.log" "$T/slurmd.log" 2>&1 |
        sed 's/^/# /'
    skip "slurmctld/slurmd did not bring the node up"
fi
echo "1..7"
ok "one-node Slurm cluster up (munged, slurmctld, slurmd; node idle)"

# the job: gpt2-tiny, 10 steps, 2 ranks, on a word salad made here
cd "$T" || exit 1
word_salad "$prep" . 4000 12 7 || { not_ok "ddp-prep"; exit 1; }
cat >job.yaml <<YAML
name: slurm-test
model: {preset: gpt2-tiny}
data: {train: $T/data/train_*.bin}
train: {steps: 10, micro_batch: 2, seq_len: 32, global_batch_tokens: 128, lr: 1e-3, warmup: 2,
        seed: 5, threads: 1, sample_tokens: 0}
ddp: {workers: 2}
YAML
DDP_WORKER=$worker RUN_DIR=$T/run "$src/deploy/launch-local.sh" 2 job.yaml --quiet \
    --dump-weights local.st >local.log 2>&1 &
daemons=("$!" "${daemons[@]}")
wait "$!"
check "deploy/launch-local.sh 2 trains the reference" test -s local.st

# sbatch with 2 tasks on the one node; --wait returns the job's exit code
# (in the background and waited for, so that a signal to this script runs the cleanup at once)
run_sbatch() { # label bootstrap
    DDP_WORKER=$worker DDP_SLURM_BOOTSTRAP=$2 timeout 300 sbatch --wait --parsable \
        --job-name="ddp-$1" --nodes=1 --ntasks-per-node=2 --cpus-per-task=1 --gpus-per-node=0 \
        --time=10 --output="$T/$1-%j.out" "$src/deploy/slurm.sbatch" job.yaml \
        --dump-weights "$T/$1.st" >"$T/$1.sbatch" 2>&1 &
    local pid=$!
    daemons=("$pid" "${daemons[@]}")
    wait "$pid"
}
for mode in mpi env; do
    run_sbatch "$mode" "$mode"; rc=$?
    outs=("$T/$mode"-*.out)
    out=${outs[0]}
    check "sbatch slurm.sbatch ($mode bootstrap), 2 tasks: exit 0 and 10 steps logged (rc $rc)" \
        bash -c "[ $rc -eq 0 ] && grep -q 'step    10/10' '$out' &&
                 grep -q '2 rank(s)' '$out'"
    [ $rc -eq 0 ] || { tail -n 15 "$out" "$T/$mode.sbatch" 2>/dev/null | sed 's/^/# /'; }
    check "$mode bootstrap: the 2 Slurm ranks' weights == launch-local.sh 2, bitwise" \
        "$compare" "$T/$mode.st" local.st
done
check "no job left in the queue" test -z "$(squeue -h -o %i)"
exit $((TAP_FAILED > 0))
