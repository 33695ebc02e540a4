#!/usr/bin/env bash
# The flight recorder's cost (collectives/flight.h; docs/observability.md): not pass/fail.
#  1. a microbenchmark: one operation's four records (queued, started, waiting, finished), and
#     formatting a dump of 64 records, in ns and us;
#  2. a step: gpt2-tiny on 2 ranks (deploy/launch-local.sh, 40 steps, fp32, 1 thread each) with
#     DDP_FLIGHT_RECORDER_SIZE=0 (off) and 64 (the default), in ROUNDS interleaved rounds; the
#     median step_ms of steps 6..40 of each run, and the per-round ratio on/off.
#   tests/bench/flight_overhead.sh BUILD_DIR [ROUNDS]
set -uo pipefail
build=$(cd "${1:?usage: flight_overhead.sh BUILD_DIR [ROUNDS]}" && pwd)
rounds=${2:-3}
root=$(cd "$(dirname "$0")/../.." && pwd)
tmp=$(mktemp -d /tmp/ddp-flight-bench.XXXXXX)
trap '[ -n "${KEEP_TMP:-}" ] || rm -rf "$tmp"' EXIT
cat >"$tmp/bench.c" <<'C'
#include <stdio.h>
#include "collectives/flight.h"
#include "common/clock.h"
int main(void)
{
    ddp_flight_cfg_t cfg = {.records = 64, .rank = 0};
    ddp_flight_setup(&cfg);
    const int n = 2000000;
    int64_t t0 = ddp_now_ns();
    for (int i = 0; i < n; i++) {
        uint64_t id = ddp_flight_queued(1, (uint64_t)i, 0, 4, "allreduce", 1 << 20, i % 8);
        ddp_flight_started(id);
        ddp_flight_waiting(id, 3);
        ddp_flight_finished(id, 0);
    }
    int64_t t1 = ddp_now_ns();
    static char buf[64 * 400 + 256];
    for (int i = 0; i < 1000; i++) ddp_flight_format(buf, sizeof buf, "x");
    int64_t t2 = ddp_now_ns();
    printf("one operation's records: %.0f ns; a dump of 64 records: %.1f us\n",
           (double)(t1 - t0) / n, (double)(t2 - t1) / 1000 / 1000);
    return 0;
}
C
cc -O2 -I"$root" -I"$build" "$tmp/bench.c" "$build/collectives/libddp_coll.a" \
    "$build/collectives/libddp_flight_diag.a" "$build/common/libddp_common.a" -ljansson -lpthread \
    -lm -o "$tmp/bench" && "$tmp/bench"

export DDP_WORKER=$build/worker/ddp-worker DDP_LOG_LEVEL=warn
. "$root/tests/corpus.sh"
fox_corpus "$build/worker/ddp-prep" "$tmp" 4000 --val-fraction 0.1
cat >"$tmp/job.yaml" <<YAML
name: flight-bench
model: {preset: gpt2-tiny}
data: {train: "$tmp/data/train_*.bin", val: "$tmp/data/val_*.bin"}
train: {steps: 40, micro_batch: 4, seq_len: 64, global_batch_tokens: 1024, lr: 1.0e-3, warmup: 2,
        val_every: 0, sample_tokens: 0, threads: 1, log_every: 1, precision: fp32}
ddp: {bucket_mb: 0.25, first_bucket_mb: 0.0625, workers: 2}
YAML
median_ms() {
    python3 -c 'import json,statistics,sys
v=[json.loads(l)["step_ms"] for l in open(sys.argv[1]) if "\"step_ms\"" in l]
print("%.2f" % statistics.median(v[5:]))' "$1/metrics.jsonl"
}
echo "round  off_ms  on_ms  on/off"
for r in $(seq 1 "$rounds"); do
    for n in 0 64; do
        rm -rf "$tmp/run-$n"
        DDP_FLIGHT_RECORDER_SIZE=$n RUN_DIR="$tmp/run-$n" "$root/deploy/launch-local.sh" 2 \
            "$tmp/job.yaml" >"$tmp/run-$n.log" 2>&1 || { tail -5 "$tmp/run-$n.log"; exit 1; }
    done
    off=$(median_ms "$tmp/run-0") on=$(median_ms "$tmp/run-64")
    echo "$r      $off   $on   $(python3 -c "print('%.3f' % ($on / $off))")"
done
