# TAP output for the shell tests, sourced by each (tests/integration/lib.sh for the daemon's):
#   ok DESCRIPTION               a passing test
#   not_ok DESCRIPTION [LINE...] a failing one, with diagnostic lines (each printed as "# ...")
#   skip DESCRIPTION REASON      a test not run here (TAP "# SKIP")
#   check DESCRIPTION CMD...     ok when CMD succeeds, else not_ok with the last lines of its
#                                output; returns 0 either way, so `a && check ... || not_ok ...`
#                                counts one test whichever way check goes
#   diag FILE...                 a file's lines as diagnostics
#   skip_all REASON              the whole script skipped (TAP "1..0 # SKIP", exit 77)
#   tap_plan                     prints "1..$TAP_N" (for scripts that count as they go)
# Counters: TAP_N (tests so far) and TAP_FAILED (how many failed); a script ends with
# `exit $((TAP_FAILED > 0))`.
TAP_N=0 TAP_FAILED=0

ok() { TAP_N=$((TAP_N + 1)); echo "ok $TAP_N - $1"; }
skip() { TAP_N=$((TAP_N + 1)); echo "ok $TAP_N - $1 # SKIP $2"; }
not_ok() {
    TAP_N=$((TAP_N + 1)) TAP_FAILED=$((TAP_FAILED + 1))
    echo "not ok $TAP_N - $1"
    shift
    local l
    for l in "$@"; do printf '%s\n' "$l" | sed 's/^/# /'; done
}
check() {
    local what=$1 log
    shift
    log=$(mktemp "${TMPDIR:-/tmp}/ddp-check.XXXXXX") || { not_ok "$what" "mktemp failed"; return 0; }
    if "$@" >"$log" 2>&1; then
        ok "$what"
    else
        not_ok "$what" "failed: $*" "$(tail -n 20 "$log")"
    fi
    rm -f "$log"
    return 0
}
diag() { sed 's/^/# /' "$@" 2>/dev/null; }
skip_all() { echo "1..0 # SKIP $*"; exit 77; }
tap_plan() { echo "1..$TAP_N"; }
