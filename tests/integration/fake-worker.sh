#!/bin/sh
# A stand-in for ddp-worker that follows the worker contract (env, metrics.jsonl, SIGTERM ->
# exit 143), for daemon tests that must not depend on training speed.
# FAKE_STEPS (default 20), FAKE_STEP_S (default 0.05), FAKE_FAIL_RANK (exit 3 at step 2).
steps=${FAKE_STEPS:-20}
dt=${FAKE_STEP_S:-0.05}
trap 'echo "rank $DDP_RANK: SIGTERM at step $i"; exit 143' TERM
echo "rank $DDP_RANK/$DDP_WORLD_SIZE local $DDP_LOCAL_RANK/$DDP_LOCAL_WORLD_SIZE rdzv $DDP_RDZV job $DDP_JOB_ID threads $DDP_THREADS spec $1"
test -r "$1" || { echo "cannot read spec $1"; exit 2; }
i=0
while [ $i -lt $steps ]; do
    i=$((i + 1))
    if [ "${FAKE_FAIL_RANK:--1}" = "$DDP_RANK" ] && [ $i -eq 2 ]; then echo "rank $DDP_RANK failing"; exit 3; fi
    sleep $dt
    if [ "$DDP_RANK" = 0 ]; then
        echo "{\"step\":$i,\"steps\":$steps,\"loss\":$(awk "BEGIN{print 5.0/($i+1)}"),\"lr\":0.001,\"grad_norm\":1.0,\"tokens_per_s\":1000,\"step_ms\":50}" >> "$DDP_RUN_DIR/metrics.jsonl"
    fi
    echo "step $i"
done
[ "$DDP_RANK" = 0 ] && echo "{\"event\":\"done\",\"final_loss\":$(awk "BEGIN{print 5.0/($steps+1)}")}" >> "$DDP_RUN_DIR/metrics.jsonl"
exit 0
