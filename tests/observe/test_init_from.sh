#!/bin/bash
# model.init_from reads the architecture from config.json (TAP): a directory written by ddpd's
# own checkpoint loads with init_from alone; the same weights as a Hugging Face directory
# (save_pretrained's layout: one model.safetensors, or shards with an index) give bitwise the
# same first loss; dimensions or a preset that disagree with config.json fail naming the field;
# a missing or foreign config.json fails clearly; a daemon accepts and runs such a spec.
. "$(dirname "$0")/../integration/lib.sh"
here=$(cd "$(dirname "$0")" && pwd)
W=$BUILD/worker/ddp-worker
[ -x "$W" ] || { echo "1..0 # SKIP ddp-worker is not built"; exit 77; }
python3 -c 'import safetensors, numpy' 2>/dev/null || { echo "1..0 # SKIP python3 safetensors/numpy missing (deploy/install-deps.sh)"; exit 77; }

make_job "$T/base.yaml" 1 6
sed -i 's/log_every: 1, seed: 7}/log_every: 1, seed: 7, threads: 1, sample_tokens: 0}/' "$T/base.yaml"
echo "checkpoint: {dir: $T/ck}" >>"$T/base.yaml"
check "a 6-step run writes a checkpoint with config.json" \
    bash -c "'$W' '$T/base.yaml' --quiet && test -s '$T/ck/step-00000006/config.json'"
ck=$T/ck/step-00000006

# a spec with init_from and no model: what config.json says (gpt2-tiny: 2/4/128/256/128)
cat >"$T/init.yaml" <<YAML
name: init-from
model: {init_from: "$ck"}
data: {train: "$T/data/train_*.bin"}
train: {steps: 2, micro_batch: 2, seq_len: 32, threads: 1, sample_tokens: 0}
YAML
first_loss() { jq -s '[.[]|select(.loss)][0].loss' "$1/metrics.jsonl"; }
run() { # run NAME [--set ...]: the worker on init.yaml; output in $T/NAME.log, metrics in $T/NAME/
    local name=$1; shift
    "$W" "$T/init.yaml" --run-dir "$T/$name" "$@" >"$T/$name.log" 2>&1
}
if run own && grep -q "model 2 layers, 4 heads, 128 channels, vocab 256" "$T/own.log"; then
    ok "init_from alone: the model comes from the checkpoint's config.json"
else
    not_ok "init_from alone: the model comes from config.json"; diag "$T/own.log"
fi
ref=$(first_loss "$T/own")
check "the weights are the checkpoint's: same first loss with the dimensions spelled out" \
    bash -c "'$W' '$T/init.yaml' --run-dir '$T/dims' --set model.n_layer=2 --set model.n_head=4 \
        --set model.n_embd=128 --set model.vocab_size=256 --set model.block_size=128 >'$T/dims.log' 2>&1 &&
        test \"\$(jq -s '[.[]|select(.loss)][0].loss' '$T/dims/metrics.jsonl')\" = '$ref'"
check "and with a matching preset" \
    bash -c "'$W' '$T/init.yaml' --run-dir '$T/preset' --set model.preset=gpt2-tiny >'$T/preset.log' 2>&1 &&
        test \"\$(jq -s '[.[]|select(.loss)][0].loss' '$T/preset/metrics.jsonl')\" = '$ref'"
for layout in single shards; do
    args=(); [ $layout = shards ] && args=(--shards 2)
    python3 "$here/make_hf_dir.py" "$ck" "$T/hf-$layout" "${args[@]}"
    files=$(cd "$T/hf-$layout" && ls | tr '\n' ' ')
    if run "r-$layout" --set "model.init_from=\"$T/hf-$layout\"" && [ "$(first_loss "$T/r-$layout")" = "$ref" ]; then
        ok "a Hugging Face directory ($layout: $files) loads as is: same first loss $ref"
    else
        not_ok "a Hugging Face directory ($layout) loads as is"; diag "$T/r-$layout.log"
    fi
done

expect_error() { # expect_error WHAT PATTERN [--set ...]: exit 2 and the message
    local what=$1 pattern=$2; shift 2
    "$W" "$T/init.yaml" --run-dir "$T/bad" "$@" >"$T/bad.log" 2>&1
    local rc=$?
    if [ $rc -eq 2 ] && grep -q -- "$pattern" "$T/bad.log"; then ok "$what"; else
        not_ok "$what (exit $rc)"; diag "$T/bad.log"; fi
}
expect_error "a dimension that disagrees names the field and config.json's value" \
    "ddp-worker: model.n_embd: disagrees with $ck/config.json (model.init_from): n_embd is 256 and 128" \
    --set model.n_layer=2 --set model.n_head=4 --set model.n_embd=256 --set model.vocab_size=256 \
    --set model.block_size=128
expect_error "a preset that disagrees names model.preset" \
    "ddp-worker: model.preset: gpt2-mini disagrees with $ck/config.json (model.init_from): n_layer is 6 and 2" \
    --set model.preset=gpt2-mini
expect_error "seq_len beyond config.json's block_size names train.seq_len" \
    "train.seq_len: must be <= the model's block_size (128, from its config.json), got 256" --set train.seq_len=256
mkdir -p "$T/noconfig" && cp "$ck/model.safetensors" "$T/noconfig/"
expect_error "no config.json and no dimensions: says what to add" \
    "model.init_from: $T/noconfig/config.json does not exist: add model.preset, model.config or the dimensions" \
    --set "model.init_from=\"$T/noconfig\""
check "no config.json but a preset: loads as before" \
    "$W" "$T/init.yaml" --quiet --run-dir "$T/np" --set "model.init_from=\"$T/noconfig\"" --set model.preset=gpt2-tiny
mkdir -p "$T/llama" && cp "$ck/model.safetensors" "$T/llama/" &&
    jq '.model_type="mistral"' "$ck/config.json" >"$T/llama/config.json"
expect_error "a config.json of another model type is refused" 'model_type "mistral" is not implemented' \
    --set "model.init_from=\"$T/llama\""

# through a daemon: it accepts the spec without the model, and the worker resolves it
export DDP_WORKER_BIN=$W
start_daemon a --slots 1 || { echo "1..0 # SKIP daemon did not start"; exit 1; }
out=$(ctl a run "$T/init.yaml" 2>&1); rc=$?
[ $rc -eq 0 ] && ok "ddpctl run: the daemon accepts and runs a spec with init_from alone" ||
    { not_ok "ddpctl run with init_from alone (exit $rc)"; echo "$out" | tail -5 | diag /dev/stdin; }
finish
