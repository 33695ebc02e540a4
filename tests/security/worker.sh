#!/bin/sh
# The security suite's stand-in for ddp-worker (the worker contract: env, metrics.jsonl, SIGTERM
# -> 143): first says who and where it runs, then steps: the spec's train.steps, each of
# SEC_STEP_S (default 0.05) s; SEC_MODE=nul writes bytes with NUL to its log first.
echo "uid=$(id -u) gid=$(id -g) groups=$(id -G | tr ' ' ',') cwd=$(pwd)"
env | grep '^DDP_LIMIT_' | sort
test -r "$1" || { echo "cannot read spec $1"; exit 2; }
steps=$(grep -o '"steps": *[0-9]*' "$1" | head -1 | grep -o '[0-9]*$')
[ "${SEC_MODE:-}" = nul ] && printf 'before\000after\000\n'
trap 'exit 143' TERM
i=0
while [ $i -lt "${steps:-20}" ]; do
    i=$((i + 1))
    sleep "${SEC_STEP_S:-0.05}"
    [ "$DDP_RANK" = 0 ] && echo "{\"step\":$i,\"steps\":${steps:-20},\"loss\":1.5}" >> "$DDP_RUN_DIR/metrics.jsonl"
done
[ "$DDP_RANK" = 0 ] && echo '{"event":"done","final_loss":1.5}' >> "$DDP_RUN_DIR/metrics.jsonl"
exit 0
