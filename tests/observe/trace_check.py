#!/usr/bin/env python3
"""Validates a merged trace from `ddpctl trace` against the Chrome trace-event format that
Perfetto and chrome://tracing load, and checks its content: trace_check.py FILE RANKS STEPS...

Every event has a name, a phase (X: complete, M: metadata), an integer pid and tid; X events a
ts >= 0 and dur >= 0 in microseconds. Each rank is a process named "rank R" with its four lanes
named; for each traced step and rank there is exactly one "step N" span, and inside it the
forward and backward of every block, the head, the optimizer, and one collective per bucket on
the communication lane (the bucket count comes from the rank's otherData). No other step is
traced. Exits 1 with the reasons on stderr."""
import json
import re
import sys

path, ranks, steps = sys.argv[1], int(sys.argv[2]), [int(s) for s in sys.argv[3:]]
errs = []
d = json.load(open(path))
ev = d.get("traceEvents")
if not isinstance(ev, list) or not ev:
    sys.exit("no traceEvents array")
for e in ev:
    ok = (isinstance(e.get("name"), str) and e.get("ph") in ("X", "M") and
          isinstance(e.get("pid"), int))
    if ok and e["ph"] == "X":
        ok = (isinstance(e.get("tid"), int) and 1 <= e["tid"] <= 4 and
              isinstance(e.get("ts"), (int, float)) and e["ts"] >= 0 and
              isinstance(e.get("dur"), (int, float)) and e["dur"] >= 0)
    if not ok:
        errs.append("malformed event %r" % e)
        break
meta = {(e["pid"], e.get("tid"), e["name"]): e["args"]["name"] for e in ev
        if e["ph"] == "M" and "name" in e.get("args", {})}
spans = [e for e in ev if e["ph"] == "X"]
layers = None
for r in range(ranks):
    if meta.get((r, None, "process_name")) != "rank %d" % r:
        errs.append("rank %d: no process_name" % r)
    for tid, lane in ((1, "compute"), (2, "communication"), (3, "data loader")):
        if meta.get((r, tid, "thread_name")) != lane:
            errs.append("rank %d: lane %d is not named %s" % (r, tid, lane))
    buckets = d["otherData"]["ranks"][str(r)]["buckets"]
    if buckets < 3:
        errs.append("rank %d: only %d buckets: the test wants several" % (r, buckets))
    mine = [e for e in spans if e["pid"] == r]
    traced = sorted(int(e["name"].split()[1]) for e in mine if re.fullmatch(r"step \d+", e["name"]))
    if traced != steps:
        errs.append("rank %d: steps traced %s, want %s" % (r, traced, steps))
        continue
    blocks = sorted({int(m.group(1)) for e in mine for m in [re.fullmatch(r"forward h\.(\d+)", e["name"])] if m})
    layers = blocks
    for s in steps:
        st = next(e for e in mine if e["name"] == "step %d" % s)
        lo, hi = st["ts"], st["ts"] + st["dur"]
        inside = [e for e in mine if e is not st and lo <= e["ts"] and e["ts"] + e["dur"] <= hi + 1]
        names = [e["name"] for e in inside]
        want = (["forward h.%d" % b for b in blocks] + ["backward h.%d" % b for b in blocks] +
                ["forward ln_f, lm_head, loss (and their backward)", "backward ln_f"])
        for w in want:
            if names.count(w) != 1:
                errs.append("rank %d step %d: %d x %r" % (r, s, names.count(w), w))
        if not any(n.startswith("optimizer") for n in names):
            errs.append("rank %d step %d: no optimizer" % (r, s))
        comm = [e for e in inside if e["tid"] == 2]
        got = sorted(int(re.search(r"bucket (\d+)", e["name"]).group(1)) for e in comm)
        if got != list(range(buckets)):
            errs.append("rank %d step %d: buckets on the communication lane %s, want 0..%d"
                        % (r, s, got, buckets - 1))
if layers is not None and len(layers) < 2:
    errs.append("blocks traced: %s" % layers)
if errs:
    sys.exit("\n".join(errs[:30]))
print("ok: %d events, %d ranks, steps %s, %d blocks" % (len(ev), ranks, steps, len(layers or [])))
