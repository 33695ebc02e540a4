# The shell tests' training text, made the same way everywhere (sourced):
#   fox_corpus PREP DIR LINES [PREP_OPTIONS...]
#       DIR/text.txt: LINES numbered lines of "the quick brown fox" with varying numbers, a
#       text a tiny model learns fast; then PREP (ddp-prep) --out DIR/data with the options
#       (e.g. --val-fraction 0.1). Returns ddp-prep's status.
#   word_salad PREP DIR LINES WORDS SEED [PREP_OPTIONS...]
#       DIR/text.txt: LINES lines of WORDS words drawn (Python's random, seeded) from a small
#       vocabulary; then ddp-prep as above.
fox_corpus() {
    local prep=$1 dir=$2 lines=$3
    shift 3
    awk -v n="$lines" 'BEGIN { for (i = 0; i < n; i++) printf "line %d: the quick brown fox %d jumps over %d lazy dogs.\n", i, i * 7 % 13, i % 11 }' >"$dir/text.txt" &&
        "$prep" --out "$dir/data" "$@" "$dir/text.txt" >/dev/null
}

word_salad() {
    local prep=$1 dir=$2 lines=$3 words=$4 seed=$5
    shift 5
    python3 -c 'import random, sys
n, k, seed = (int(a) for a in sys.argv[1:4])
r = random.Random(seed)
w = "the quick brown fox jumps over lazy dog and cat runs far away into night".split()
print("\n".join(" ".join(r.choice(w) for _ in range(k)) for _ in range(n)))' "$lines" "$words" "$seed" >"$dir/text.txt" &&
        "$prep" --out "$dir/data" "$@" "$dir/text.txt" >/dev/null
}
