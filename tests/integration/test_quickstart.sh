#!/usr/bin/env bash
# The README's first command, shortened (TAP): deploy/quickstart.sh on a small corpus with a
# 100-step copy of deploy/examples/quickstart.yaml (QUICKSTART_SPEC; its checkpoints in a
# temporary directory) prepares data/quickstart/, trains through `ddpctl run` (an embedded
# daemon), follows the job to "succeeded" and prints the closing sample.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=${DDP_SOURCE_ROOT:-$here/../..}
tmp=$(mktemp -d /tmp/ddp-test-quickstart.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
. "$here/../tap.sh"
. "$here/../corpus.sh"

prep="$root/build/worker/ddp-prep"
[ -x "$prep" ] || { echo "1..0 # SKIP no build/worker/ddp-prep in the source tree"; exit 0; }
fox_corpus "$prep" "$tmp" 3000 || { not_ok "the corpus"; tap_plan; exit 1; }
sed -e 's/^  steps: .*/  steps: 100/' -e "s|dir: runs/quickstart/checkpoints|dir: $tmp/ck|" \
    "$root/deploy/examples/quickstart.yaml" >"$tmp/quickstart.yaml"
check "the short spec differs from the shipped one only in steps and the checkpoint dir" \
    bash -c "[ \$(diff '$root/deploy/examples/quickstart.yaml' '$tmp/quickstart.yaml' | grep -c '^>') -eq 2 ]"
(cd "$root" && XDG_RUNTIME_DIR="$tmp" QUICKSTART_SPEC="$tmp/quickstart.yaml" \
    deploy/quickstart.sh "$tmp/text.txt") >"$tmp/qs.log" 2>&1
rc=$?
check "deploy/quickstart.sh exits 0" test "$rc" -eq 0
check "it follows the job to its end" grep -Eq "job [0-9]+ succeeded: all 2 ranks exited 0" "$tmp/qs.log"
check "it prints the closing sample" grep -q "^--- sample" "$tmp/qs.log"
[ "$TAP_FAILED" -eq 0 ] || sed 's/^/# /' "$tmp/qs.log" | tail -20
tap_plan
exit $((TAP_FAILED > 0))
