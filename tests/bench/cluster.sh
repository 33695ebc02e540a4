#!/usr/bin/env bash
# A cluster in a box (issue 46): ddpd against PyTorch DDP (gloo) across "hosts" that are network
# namespaces on one bridge, each host's uplink shaped by a token bucket.
#
#   tests/bench/cluster.sh [build-dir]      (as root; default build-dir: build)
#
# Hosts: namespaces ddpc-h0..h3, each with eth0 (10.99.0.(h+1)/24) on a veth whose other end is
# a port of bridge br0 in namespace ddpc-sw. A rate shapes every host's eth0 egress:
#   1gbit:   tc qdisc replace dev eth0 root tbf rate 1gbit  burst 256kb limit 2mb
#   10gbit:  tc qdisc replace dev eth0 root tbf rate 10gbit burst 2mb   limit 16mb
#   unshaped: no qdisc (veth through the bridge)
# (no netem on these machines: no latency is added). Each rate's link is measured first: one TCP
# stream from h1 to h0 for 2 s (tests/bench/cluster_link.py).
#
# Per round, interleaved (speed drifts within minutes here): one rank alone (ddpd and PyTorch, no
# network: the scaling's reference, same threads), then per rate and model: ddpd fp32 gradients,
# PyTorch DDP fp32, ddpd ddp.grad_dtype=bf16, PyTorch DDP with bf16_compress_hook; 2 hosts x 1
# rank, 1 compute thread per rank. Last, 2 hosts x 2 ranks of ddpd (4 ranks on the machine's
# cores: that it works and the bytes it sends, not its speed).
# ddpd runs with ddp.shard_optimizer=false, as PyTorch DDP keeps a whole optimizer per rank: with
# ZeRO-1 (ddpd's default for several ranks) the parameters' all-gather after the update adds the
# same bytes as the all-reduce's second half, in fp32 whatever ddp.grad_dtype (0.75x with bf16,
# not 0.5x), and it is exposed.
# Reported per row (medians over rounds): global tokens/s, scaling (tokens/s over twice one
# rank's), exposed communication (ddpd: its own accounting, metrics.jsonl's exposed_comm_ms;
# both: the step's time above one rank's), the bytes each host sent per step (eth0's tx counter
# read as the first and the last measured step end), and for ddpd the link's use while it
# all-reduces (bytes per step over comm_ms, against the measured rate).
#
# Environment: ROUNDS (2), STEPS (4 measured), WARMUP (2 untimed), RATES ("1gbit 10gbit
# unshaped"), MODELS ("gpt2-124M gpt2-mini"), B (4), T (64), TORCH_PY (a Python with torch 2.x;
# PyTorch's columns are skipped without one), RESULTS (a file that keeps every run's line; the
# table is `cluster_report.py RESULTS LINKS_JSON` again). Namespaces named ddpc-* left by an earlier run are
# removed at the start, and this run's at the end. About 20 minutes on 2 cores with the defaults.
set -euo pipefail
src=$(cd "$(dirname "$0")/../.." && pwd)
build=$(cd "${1:-$src/build}" && pwd)
rounds=${ROUNDS:-2} steps=${STEPS:-4} warmup=${WARMUP:-2}
[ "$steps" -ge 2 ] || { echo "STEPS must be at least 2 (bytes are counted between two steps)" >&2; exit 2; }
rates=${RATES:-1gbit 10gbit unshaped} models=${MODELS:-gpt2-124M gpt2-mini}
B=${B:-4} T=${T:-64}
BENCH_DEBIAN_TORCH_OPTIONAL=1
. "$src/tests/bench/bench_common.sh"
. "$src/tests/wait.sh"
TPY=${TORCH_PY:-}
if [ -n "$TPY" ] && ! "$TPY" -c 'import torch' 2>/dev/null; then
    echo "TORCH_PY=$TPY has no torch: PyTorch's columns are skipped"; TPY=""
fi

[ "$(id -u)" = 0 ] || { echo "SKIP: network namespaces need root"; exit 0; }
sweep() { for ns in $(ip netns list | awk '$1 ~ /^ddpc-/ {print $1}'); do ip netns del "$ns"; done; }
sweep
ip netns add ddpc-probe 2>/dev/null && ip netns del ddpc-probe ||
    { echo "SKIP: cannot create network namespaces here"; exit 0; }

bench_header "$0 $*  (ROUNDS=$rounds STEPS=$steps WARMUP=$warmup B=$B T=$T TORCH_PY=${TPY:-none})"
bench_setup
trap 'sweep; rm -rf "$work"' EXIT
[ -n "$TPY" ] && echo "PyTorch $("$TPY" -c 'import torch; print(torch.__version__)') (gloo)"

# hosts H: namespaces ddpc-h0..h(H-1) on bridge br0 in ddpc-sw
make_hosts() {
    ip netns add ddpc-sw
    ip -n ddpc-sw link add br0 type bridge
    ip -n ddpc-sw link set br0 up
    for ((h = 0; h < $1; h++)); do
        ip netns add ddpc-h$h
        ip link add eth0 netns ddpc-h$h type veth peer name p$h netns ddpc-sw
        ip -n ddpc-sw link set p$h master br0 up
        ip -n ddpc-h$h addr add 10.99.0.$((h + 1))/24 dev eth0
        ip -n ddpc-h$h link set lo up
        ip -n ddpc-h$h link set eth0 up
    done
}
shape() { # RATE H
    for ((h = 0; h < $2; h++)); do
        ip -n ddpc-h$h link set eth0 up # (re)applied: tbf's parameters per rate, none unshaped
        tc -n ddpc-h$h qdisc del dev eth0 root 2>/dev/null || true
        case $1 in
        1gbit) tc -n ddpc-h$h qdisc add dev eth0 root tbf rate 1gbit burst 256kb limit 2mb ;;
        10gbit) tc -n ddpc-h$h qdisc add dev eth0 root tbf rate 10gbit burst 2mb limit 16mb ;;
        unshaped) ;;
        *) echo "unknown rate $1" >&2; exit 2 ;;
        esac
    done
}
# tx of every host, space-separated (the counters are read inside each namespace)
tx_all() { for ((h = 0; h < $1; h++)); do ip netns exec ddpc-h$h cat /sys/class/net/eth0/statistics/tx_bytes; done | tr '\n' ' '; }
# step_or_exit FILE STEP PIDS...: 0 when FILE names STEP or one of the processes ended (then the
# step is missing), else 1
step_logged() { [ -f "$1" ] && grep -qE "(^$2\$|\"step\":$2,\"steps\")" "$1"; }
step_or_exit() {
    local f=$1 s=$2; shift 2
    step_logged "$f" "$s" && return 0
    for p in "$@"; do kill -0 "$p" 2>/dev/null || return 0; done
    return 1
}
# wait_file_step FILE STEP PIDS...: until FILE names STEP; fails when a process ended first or
# after 20 minutes
wait_file_step() { wait_until 1200 step_or_exit "$@" && step_logged "$1" "$2"; }

# count_and_wait FILE H PIDS...: sets tx0 and tx1 to the hosts' counters as the first and the last
# timed step end (each read as FILE names the step: the same lag at both ends; STEPS - 1 steps
# between them), then waits for the processes; fails when one failed
count_and_wait() {
    local f=$1 H=$2 rc=0
    shift 2
    tx0="" tx1=""
    wait_file_step "$f" "$warmup" "$@" && tx0=$(tx_all "$H")
    wait_file_step "$f" $((warmup + steps - 1)) "$@" && tx1=$(tx_all "$H")
    for p in "$@"; do wait "$p" || rc=1; done
    [ $rc = 0 ] && [ -n "$tx0" ] && [ -n "$tx1" ]
}

results=${RESULTS:-$work/results.jsonl} # RESULTS=FILE keeps every run's line (cluster_report.py)
: >"$results"
# record KIND JSON: one line of results
record() { echo "$2" | "$PY" -c 'import json,sys; d=json.load(sys.stdin); d.update(json.loads(sys.argv[1])); print(json.dumps(d))' "$1" >>"$results"; }

# ddpd_run H R RATE MODEL DTYPE [ALGO]: W = H x R ranks, ranks of a host contiguous; ALGO sets
# DDP_COLL_ALGO (flat, two-level; default auto)
ddpd_run() {
    local H=$1 R=$2 rate=$3 model=$4 dtype=$5 algo=${6:-auto} W=$(($1 * $2))
    local port=$((20000 + RANDOM % 20000)) dir=$work/d-$1$2-$3-$4-$5-${6:-auto}-$round ps=() r tx0 tx1
    mkdir -p "$dir"
    for ((r = 0; r < W; r++)); do
        ip netns exec ddpc-h$((r / R)) env DDP_RANK=$r DDP_WORLD_SIZE=$W DDP_LOCAL_RANK=$((r % R)) \
            DDP_LOCAL_WORLD_SIZE=$R DDP_RDZV=10.99.0.1:$port DDP_JOB_TOKEN=cluster-$$ \
            DDP_RUN_DIR="$dir" DDP_COLL_ALGO=$algo "$worker" "$work/job.yaml" \
            --set model.preset=$model --set train.micro_batch=$B --set train.seq_len=$T \
            --set train.steps=$((warmup + steps)) --set train.threads=1 \
            --set ddp.grad_dtype=\"$dtype\" --set ddp.shard_optimizer=false \
            >"$dir/rank-$r.out" 2>&1 &
        ps+=($!)
    done
    count_and_wait "$dir/metrics.jsonl" "$H" "${ps[@]}" ||
        { echo "  ddpd $H x $R failed:"; tail -n 5 "$dir"/rank-*.out; return 1; }
    local s; s=$(ddpd_stats "$dir" "$warmup")
    record "{\"impl\":\"ddpd\",\"H\":$H,\"R\":$R,\"rate\":\"$rate\",\"model\":\"$model\",\"dtype\":\"$dtype\",\"tx0\":\"$tx0\",\"tx1\":\"$tx1\",\"steps\":$((steps - 1)),\"algo_req\":\"$algo\",\"algo\":\"$(grep -ho 'all-reduce [a-z-]*[^,]*' "$dir"/rank-1.out | head -1)\"}" "$s"
    echo "  ddpd  $H x $R $rate $model $dtype $algo: $s"
}

# torch_run H RATE MODEL COMPRESS: H processes, one per host
torch_run() {
    local H=$1 rate=$2 model=$3 comp=$4 port=$((20000 + RANDOM % 20000))
    local dir=$work/t-$H-$rate-$model-$comp-$round ps=() r tx0 tx1
    mkdir -p "$dir"
    for ((r = 0; r < H; r++)); do
        ip netns exec ddpc-h$r env GLOO_SOCKET_IFNAME=eth0 "$TPY" "$src/tests/bench/pytorch_train.py" \
            --model $model -B $B -T $T --threads 1 --warmup $warmup --steps $steps --ddp $H \
            --rank $r --master 10.99.0.1:$port --compress $comp --progress "$dir/progress" \
            >"$dir/rank-$r.out" 2>&1 &
        ps+=($!)
    done
    count_and_wait "$dir/progress" "$H" "${ps[@]}" ||
        { echo "  PyTorch failed:"; tail -n 5 "$dir"/rank-*.out; return 1; }
    local s; s=$(grep '^{' "$dir/rank-0.out")
    record "{\"impl\":\"pytorch\",\"H\":$H,\"R\":1,\"rate\":\"$rate\",\"model\":\"$model\",\"dtype\":\"$comp\",\"tx0\":\"$tx0\",\"tx1\":\"$tx1\",\"steps\":$((steps - 1))}" "$s"
    echo "  torch $H x 1 $rate $model $comp: $(echo "$s" | cut -c1-160)"
}

# one_rank MODEL: the scaling's reference, on the root namespace (no network)
one_rank() {
    local dir=$work/one-$1-$round
    "$worker" "$work/job.yaml" --quiet --run-dir "$dir" --set model.preset=$1 \
        --set train.micro_batch=$B --set train.seq_len=$T --set train.steps=$((warmup + steps)) \
        --set train.threads=1 >"$dir.out" 2>&1 || { cat "$dir.out"; return 1; }
    local s; s=$(ddpd_stats "$dir" "$warmup")
    record "{\"impl\":\"ddpd\",\"H\":1,\"R\":1,\"rate\":\"none\",\"model\":\"$1\",\"dtype\":\"fp32\"}" "$s"
    echo "  ddpd  1 rank $1: $s"
    if [ -n "$TPY" ]; then
        s=$("$TPY" "$src/tests/bench/pytorch_train.py" --model $1 -B $B -T $T --threads 1 \
            --warmup $warmup --steps $steps)
        record "{\"impl\":\"pytorch\",\"H\":1,\"R\":1,\"rate\":\"none\",\"model\":\"$1\",\"dtype\":\"none\"}" "$s"
        echo "  torch 1 rank $1: $(echo "$s" | cut -c1-160)"
    fi
}

make_hosts 2
declare -A link_gbit
for rate in $rates; do
    shape "$rate" 2
    ip netns exec ddpc-h0 "$PY" "$src/tests/bench/cluster_link.py" serve 10.99.0.1 5201 &
    link_gbit[$rate]=$(ip netns exec ddpc-h1 "$PY" "$src/tests/bench/cluster_link.py" send 10.99.0.1 5201 2)
    wait
    echo "link at $rate: ${link_gbit[$rate]} Gbit/s measured (one TCP stream, 2 s)"
done
for ((round = 1; round <= rounds; round++)); do
    echo "== round $round"
    for model in $models; do one_rank "$model"; done
    for rate in $rates; do
        shape "$rate" 2
        for model in $models; do
            ddpd_run 2 1 "$rate" "$model" fp32 || true
            [ -n "$TPY" ] && { torch_run 2 "$rate" "$model" none || true; }
            ddpd_run 2 1 "$rate" "$model" bf16 || true
            [ -n "$TPY" ] && { torch_run 2 "$rate" "$model" bf16 || true; }
        done
    done
done
echo "== 2 hosts x 2 ranks (4 ranks on $(nproc) cores: it works, and the bytes it sends)"
shape unshaped 2
for ((round = 1; round <= rounds; round++)); do
    for model in $models; do
        ddpd_run 2 2 unshaped "$model" fp32 flat || true
        ddpd_run 2 2 unshaped "$model" fp32 || true
    done
done

links=""; for rate in $rates; do links+="\"$rate\":${link_gbit[$rate]},"; done
echo
echo "load average at end: $(cut -d' ' -f1-3 /proc/loadavg)"
"$PY" "$src/tests/bench/cluster_report.py" "$results" "{${links%,}}"
