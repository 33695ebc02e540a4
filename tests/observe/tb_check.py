#!/usr/bin/env python3
"""Reads RUN_DIR/tb with TensorBoard's own EventAccumulator and checks that every number of
every line of RUN_DIR/metrics.jsonl is there as a scalar, at the line's step, with the line's
value (as float32). Prints TAP lines numbered from START + 1 (no plan); exits 1 on a mismatch.
With EVAL_TASK, that task's eval/<task>/acc_norm and acc must be there too.

    tb_check.py RUN_DIR START [EVAL_TASK]
"""
import json
import math
import struct
import sys

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

TAGS = {"loss": "loss/train", "val_loss": "loss/val", "lr": "train/lr",
        "grad_norm": "train/grad_norm", "loss_scale": "train/loss_scale",
        "tokens": "train/tokens", "tokens_per_s": "perf/tokens_per_s",
        "step_ms": "perf/step_ms", "compute_ms": "perf/compute_ms", "optim_ms": "perf/optim_ms",
        "wall_ms": "perf/wall_ms", "mfu": "perf/mfu", "comm_ms": "comm/comm_ms",
        "exposed_comm_ms": "comm/exposed_ms", "hidden": "comm/hidden_fraction",
        "world": "ddp/world", "generation": "ddp/generation"}
run_dir, n = sys.argv[1], int(sys.argv[2])
eval_task = sys.argv[3] if len(sys.argv) > 3 else None


def tag_of(key):
    """A key's tag; a named value "key/name" (a mixture's tokens/<source>, a validation set's
    val_loss/<set>) is tagged "<key's tag>/name", as worker/observe/metrics_sink.c does."""
    prefix, slash, name = key.partition("/")
    return TAGS.get(prefix, prefix) + slash + name if slash else TAGS.get(key, key)
failed = 0


def report(ok, what, detail=""):
    global n, failed
    n += 1
    print(("ok %d - %s" if ok else "not ok %d - %s") % (n, what))
    if not ok:
        failed = 1
        for line in detail.splitlines():
            print("# " + line)


ea = EventAccumulator(run_dir + "/tb", size_guidance={"scalars": 0})
ea.Reload()
got = {t: {e.step: e.value for e in ea.Scalars(t)} for t in ea.Tags()["scalars"]}
want = {}
for line in open(run_dir + "/metrics.jsonl"):
    o = json.loads(line)
    if not isinstance(o.get("step"), int):
        continue
    for k, v in o.items():
        if k in ("step", "steps") or isinstance(v, str):
            continue
        # an eval record's scalars are named by its task (worker/observe/metrics_sink.c)
        tag = "eval/%s/%s" % (o["task"], k) if o.get("event") == "eval" else tag_of(k)
        want.setdefault(tag, {})[o["step"]] = struct.unpack("f", struct.pack("f", v))[0]

steps = sorted(want["loss/train"])
report(steps == list(range(1, len(steps) + 1)) and len(steps) >= 2,
       "metrics.jsonl has a step line for every step", str(steps))
for tag in ("loss/train", "loss/val", "train/lr", "train/grad_norm", "perf/tokens_per_s",
            "perf/step_ms", "perf/compute_ms", "comm/comm_ms", "comm/exposed_ms",
            "comm/hidden_fraction", "ddp/world") + (
                ("eval/%s/acc_norm" % eval_task, "eval/%s/acc" % eval_task) if eval_task else ()):
    report(tag in got and tag in want, "TensorBoard has the scalar %s" % tag,
           "tensorboard tags: %s\nmetrics tags: %s" % (sorted(got), sorted(want)))
bad = []
for tag, by_step in sorted(want.items()):
    for step, v in sorted(by_step.items()):
        g = got.get(tag, {}).get(step)
        if g is None or not (g == v or (math.isnan(g) and math.isnan(v))):
            bad.append("%s at step %d: metrics.jsonl %r, tensorboard %r" % (tag, step, v, g))
extra = [t for t in got if t not in want]
report(not bad and not extra,
       "every scalar of metrics.jsonl reads back at its step with its value (%d scalars)"
       % sum(len(s) for s in want.values()), "\n".join(bad[:20] + ["extra tags: %s" % extra]))
comm = want.get("comm/comm_ms", {})
report(max(want["ddp/world"].values()) == 2 and comm and max(comm.values()) > 0,
       "a 2-rank run: world 2 and a non-zero communication time were logged",
       "world %s, comm %s" % (want["ddp/world"], comm))

sys.exit(failed)
