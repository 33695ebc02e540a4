#!/usr/bin/env bash
# docs/spec.md is what `ddp-worker --spec-reference` prints from the field table in
# proto/spec.c (TAP): the committed file equals the output byte for byte (on a difference the
# diff is printed with the command that regenerates the file), and the example spec in the
# reference validates.
#   test_spec_reference.sh DDP_WORKER DOCS_SPEC_MD
set -uo pipefail
worker=$1 doc=$2
tmp=$(mktemp -d /tmp/ddp-test-specref.XXXXXX)
trap 'rm -rf "$tmp"' EXIT

echo "1..2"
if ! "$worker" --spec-reference >"$tmp/spec.md" 2>"$tmp/err"; then
  cat "$tmp/err"
  echo "not ok 1 - ddp-worker --spec-reference failed"
elif ! diff -u "$doc" "$tmp/spec.md" >"$tmp/diff"; then
  sed 's/^/# /' "$tmp/diff"
  echo "# docs/spec.md differs from the field table in proto/spec.c; regenerate it with"
  echo "#   build/worker/ddp-worker --spec-reference > docs/spec.md"
  echo "not ok 1 - docs/spec.md equals ddp-worker --spec-reference"
else
  echo "ok 1 - docs/spec.md equals ddp-worker --spec-reference"
fi

# the example: the first ```yaml block of the reference
sed -n '/^```yaml$/,/^```$/p' "$tmp/spec.md" | sed '1d;$d' >"$tmp/example.yaml"
if [ -s "$tmp/example.yaml" ] && "$worker" "$tmp/example.yaml" --print-spec >"$tmp/json" 2>&1 &&
  grep -q '"preset": "gpt2-mini"' "$tmp/json"; then
  echo "ok 2 - the reference's example spec validates"
else
  sed 's/^/# /' "$tmp/json" "$tmp/example.yaml" 2>/dev/null
  echo "not ok 2 - the reference's example spec validates"
fi
