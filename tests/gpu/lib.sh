# shellcheck shell=bash
# Helpers for the scripts that run on a GPU machine (tests/gpu.sh, tests/bench/gpu_train.sh);
# sourced, not run.
losses() { grep -oE 'step +[0-9]+/[0-9]+ \| loss [0-9.]+' "$1" | awk '{print $NF}'; }
median_tps() { grep -oE '[0-9]+ tok/s' "$1" | awk 'NR > 3 {print $1}' | sort -n |
               awk '{a[NR] = $1} END {print NR ? a[int((NR + 1) / 2)] : 0}'; }
# peak GPU memory (MiB) while a command runs, sampled every 200 ms by nvidia-smi
with_mem() { # memfile command...
    local mf=$1; shift
    nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 200 >"$mf" 2>/dev/null &
    local smi=$!
    "$@"; local rc=$?
    kill "$smi" 2>/dev/null; wait "$smi" 2>/dev/null
    return $rc
}
peak() { sort -n "$1" 2>/dev/null | tail -n 1; }
# byte-level training shards of a word salad: DIR/data/train_*.bin (ddp-prep of BUILD_DIR)
word_salad_shards() { # BUILD_DIR DIR
    python3 -c 'import random
r = random.Random(7)
w = "the quick brown fox jumps over the lazy dog while a cat runs far away into night".split()
print("\n".join(" ".join(r.choice(w) for _ in range(14)) for _ in range(60000)))' >"$2/text.txt" &&
        "$1/worker/ddp-prep" --out "$2/data" "$2/text.txt" >/dev/null 2>&1
}
# the memory budget's total (MiB) that a worker's log printed before step 1
budget_mib() { # LOG
    grep -oE 'total +[0-9.]+ (GiB|MiB)' "$1" | head -n 1 |
        awk '{print ($3 == "GiB" ? $2 * 1024 : $2)}'
}
