#!/usr/bin/env bash
# Checkpoint benchmark (issue 5), one invocation: the training stall per save and the save's write
# throughput against a plain write. Not a timed test.
#
#   tests/bench/checkpoint_stall.sh [BUILD_DIR] [STEPS] [EVERY] [PAIRS]   (defaults: build 52 5 3)
#
# Stall: GPT-2 124M on the CPU, B=4, T=64, the same job run without and with
# checkpoint.every=EVERY, PAIRS times each, alternating. d[i] = wall[i] - wall[i-1] is step i's
# duration from metrics.jsonl's wall_ms (time since the training loop started, taken at the end
# of each step), so it holds everything the training loop spent between the two ends: the update
# that completes step s computes the CRC32C of what it writes when a save of step s is planned
# (in d[s]); the save starts after wall[s] is taken, so its work at the boundary, the freeze
# before the next update and the writer running beside the next steps fall in d[s+1], d[s+2].
#
# 1. Within a run (the primary measure). For each save s with s-2 >= 2 and s+4 <= STEPS:
#        stall(s) = d[s] + d[s+1] + d[s+2] - 3 x (d[s-2] + d[s-1] + d[s+3] + d[s+4]) / 4
#    i.e. the three steps the save touches against the two clean steps before and the two after
#    it (with EVERY >= 5 no other save touches them). Comparing neighbours cancels the slow drift
#    of this VM's speed (the whole-run windows below differ by seconds between runs of the same
#    job). The script checks that every such save was committed before step s+2 ended (else the
#    window would miss part of it and it says so). Reported: median and quartiles over all saves
#    of all pairs, in ms and in % of the median clean step, and a distribution-free 95%
#    confidence interval of the median (order statistics of the binomial): the target is met
#    when its upper end is under 5% of a step, missed when its lower end is over.
# 2. The same formula on the runs without saves, at the same steps (a placebo): its median and
#    quartiles are what this estimator reads when there is nothing to find, i.e. its noise.
# 3. Whole runs, as before: ((wall[STEPS] - wall[1]) with saves - the same without) / saves in
#    that window, per pair. Kept because it is free; its spread is the VM's run-to-run noise.
#
# Throughput: BUILD_DIR/tests/unit/checkpoint/bench_checkpoint (ninja -C BUILD_DIR
# tests/unit/checkpoint/bench_checkpoint) on the same disk: the saver alone writing the same
# 1.5 GB state, against a plain sequential write + fsync of the same bytes.
#
# The analysis is checkpoint_stall.py; `checkpoint_stall.py pool OUTPUT...` pools the per-save
# values of several invocations' saved outputs.
#
# RECYCLE_AB=1: each pair also runs the job with saves under DDP_CKPT_RECYCLE=0 (new files, the
# retired checkpoint deleted), before or after the default run in turn, and the analysis is
# printed for those runs too, against the same runs without saves.
#
# KEEP_RUNS=DIR: the runs' metrics.jsonl and logs are copied into DIR (created) before the
# temporary directory is removed, so `checkpoint_stall.py runs DIR STEPS EVERY PAIRS` can analyse
# them again later.
#
# Other shapes: MICRO_BATCH and SEQ_LEN (default 4 and 64) set the job's batch. TOUCHED (default
# 3) is how many steps from s on the within-run measure counts as the save's; it needs EVERY >=
# TOUCHED + 2. Where steps are long enough for the writer to finish beside step s+1 (T=1024),
# TOUCHED=2 with EVERY=4 measures more saves per minute; the script still checks that each
# probed save was committed before its last touched step ended. PLACEBO=0 skips the runs without
# saves (no placebo, no whole-run rows), so every run probes saves.
#
# Time on 2 cores: about 10 minutes with the defaults (6 runs of 52 steps at ~1.7 s, 27 saves
# probed, then the throughput benchmark); half as long again with RECYCLE_AB=1.
set -euo pipefail
build=${1:-build} steps=${2:-52} every=${3:-5} pairs=${4:-3}
micro_batch=${MICRO_BATCH:-4} seq_len=${SEQ_LEN:-64} touched=${TOUCHED:-3} placebo=${PLACEBO:-1}
ab=${RECYCLE_AB:-0}
if [ "$ab" = 1 ] && [ "$placebo" != 1 ]; then
    echo "RECYCLE_AB=1 compares against the runs without saves: it needs PLACEBO=1" >&2
    exit 2
fi
here=$(cd "$(dirname "$0")/../.." && pwd)
worker=$here/$build/worker/ddp-worker prep=$here/$build/worker/ddp-prep
bench=$here/$build/tests/unit/checkpoint/bench_checkpoint
tmp=$(mktemp -d "${TMPDIR:-/tmp}/ddp-ckpt-stall.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
echo "command: MICRO_BATCH=$micro_batch SEQ_LEN=$seq_len TOUCHED=$touched PLACEBO=$placebo" \
     "$0 $build $steps $every $pairs; OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE:-unset};" \
     "load at start: $(cut -d' ' -f1-3 /proc/loadavg)"
python3 -c "
import random
r = random.Random(1)
w = 'the of and to in a is that for it as was with be by on not he this are or his'.split()
print('\n'.join(' '.join(r.choice(w) for _ in range(16)) for _ in range(20000)))" >"$tmp/text.txt"
"$prep" --out "$tmp/data" "$tmp/text.txt" >/dev/null
cat >"$tmp/job.yaml" <<YAML
name: ckpt-stall
model: {preset: gpt2-124M}
data: {train: $tmp/data/train_*.bin}
train: {steps: $steps, micro_batch: $micro_batch, seq_len: $seq_len, lr: 3e-4, warmup: 1, seed: 1,
        sample_tokens: 0}
YAML
placebo_json=$([ "$placebo" = 1 ] && echo true || echo false)
echo "{\"micro_batch\": $micro_batch, \"seq_len\": $seq_len, \"touched\": $touched," \
     "\"placebo\": $placebo_json}" >"$tmp/bench.json"
if [ "$ab" = 1 ]; then
    mkdir "$tmp/norecycle"
    cp "$tmp/bench.json" "$tmp/norecycle/"
fi
ckpt_run() { # OUT [VAR=VALUE...]: a run with saves; its metrics and log go to OUT/ckpt$p.*
    local out=$1
    shift
    rm -rf "$tmp/ck"
    env "$@" "$worker" "$tmp/job.yaml" --run-dir "$tmp" --set checkpoint.dir=\"$tmp/ck\" \
        --set checkpoint.every="$every" --set checkpoint.keep_last=1 >"$out/ckpt$p.log" 2>&1
    mv "$tmp/metrics.jsonl" "$out/ckpt$p.jsonl"
}
for p in $(seq 1 "$pairs"); do
    if [ "$placebo" = 1 ]; then
        "$worker" "$tmp/job.yaml" --run-dir "$tmp" >"$tmp/base$p.log" 2>&1
        mv "$tmp/metrics.jsonl" "$tmp/base$p.jsonl"
    fi
    if [ "$ab" = 1 ]; then
        ln -s "$tmp/base$p.jsonl" "$tmp/norecycle/base$p.jsonl"
        [ $((p % 2)) = 1 ] || ckpt_run "$tmp/norecycle" DDP_CKPT_RECYCLE=0
    fi
    ckpt_run "$tmp"
    if [ "$ab" = 1 ] && [ $((p % 2)) = 1 ]; then ckpt_run "$tmp/norecycle" DDP_CKPT_RECYCLE=0; fi
done
if [ -n "${KEEP_RUNS:-}" ]; then
    mkdir -p "$KEEP_RUNS"
    cp "$tmp"/*.jsonl "$tmp"/*.log "$tmp/bench.json" "$KEEP_RUNS"/
    if [ "$ab" = 1 ]; then cp -rL "$tmp/norecycle" "$KEEP_RUNS"/; fi
fi
python3 "$here/tests/bench/checkpoint_stall.py" runs "$tmp" "$steps" "$every" "$pairs"
if [ "$ab" = 1 ]; then
    echo
    echo "The same with DDP_CKPT_RECYCLE=0 (new files, the retired checkpoint deleted at the" \
         "commit), against the same runs without saves:"
    echo
    python3 "$here/tests/bench/checkpoint_stall.py" runs "$tmp/norecycle" "$steps" "$every" "$pairs"
fi
if [ -x "$bench" ]; then
    "$bench" --dir "$tmp" --runs 3
else
    echo "(write throughput: build $bench with: ninja -C $build tests/unit/checkpoint/bench_checkpoint)"
fi
echo "load at end: $(cut -d' ' -f1-3 /proc/loadavg)"
