#!/usr/bin/env python3
"""Draws a merged trace (`ddpctl trace`) as a timeline picture with gnuplot, for the docs and as
a check that a trace reads as intended: one row per rank and lane, a box per span, coloured by
kind (forward, backward, collective, exposed wait, optimizer, data, checkpoint).

    trace_picture.py TRACE.json OUT.png [TITLE]
"""
import json
import subprocess
import sys
import tempfile

src, out = sys.argv[1], sys.argv[2]
title = sys.argv[3] if len(sys.argv) > 3 else "ddpd timeline trace"
d = json.load(open(src))
spans = [e for e in d["traceEvents"] if e["ph"] == "X" and not e["name"].startswith("step ")]
steps = [e for e in d["traceEvents"] if e["ph"] == "X" and e["name"].startswith("step ")]
ranks = sorted({e["pid"] for e in spans})
lanes = {1: "compute", 2: "comm", 3: "data", 4: "checkpoint"}
used = sorted({(e["pid"], e["tid"]) for e in spans})
row = {k: len(used) - 1 - i for i, k in enumerate(used)}
kinds = [("forward", "#1f77b4"), ("backward", "#ff7f0e"), ("all-reduce", "#d62728"),
         ("reduce-scatter", "#d62728"), ("wait", "#7f7f7f"), ("optimizer", "#2ca02c"),
         ("load", "#9467bd"), ("data", "#c5b0d5"), ("checkpoint", "#8c564b")]


def colour(name):
    return next((c for k, c in kinds if name.startswith(k)), "#bcbd22")


t_end = max(e["ts"] + e["dur"] for e in spans) / 1e3
with tempfile.NamedTemporaryFile("w", suffix=".gp", delete=False) as f:
    f.write("set terminal pngcairo size 1200,%d noenhanced font 'DejaVu Sans,10' background "
            "rgb 'white'\nset output '%s'\n" % (140 + 34 * len(used), out.replace("'", "''")))
    f.write("set title '%s'\nset xlabel 'ms'\nset xrange [0:%g]\nset yrange [-0.6:%g]\n"
            % (title.replace("'", "''"), t_end, len(used) - 0.4))
    f.write("set ytics (%s)\nset grid xtics lc rgb '#eeeeee'\nset key outside bottom center "
            "horizontal\nunset border\nset border 1\n" % ", ".join(
                "'rank %d %s' %d" % (p, lanes[t], row[(p, t)]) for p, t in used))
    labelled = set()
    for s in sorted(steps, key=lambda e: e["ts"]):  # step starts (each rank's), behind all
        x = s["ts"] / 1e3
        f.write("set arrow from %g, graph 0 to %g, graph 1 nohead dt 3 lc rgb '#999999' back\n"
                % (x, x))
        if s["name"] not in labelled:  # the first rank to start it names it
            labelled.add(s["name"])
            f.write("set label '%s' at %g, graph 1.03 tc rgb '#666666'\n" % (s["name"], x))
    for i, e in enumerate(spans):
        y = row[(e["pid"], e["tid"])]
        x0, x1 = e["ts"] / 1e3, (e["ts"] + e["dur"]) / 1e3
        f.write("set object %d rect from %g,%g to %g,%g fc rgb '%s' fs solid 0.9 noborder\n"
                % (i + 1, x0, y - 0.35, max(x1, x0 + t_end / 2000), y + 0.35, colour(e["name"])))
    f.write("plot NaN notitle, " + ", ".join("keyentry with boxes fc rgb '%s' fs solid title '%s'" % (c, k)
                                 for k, c in kinds if k not in ("reduce-scatter", "data")) + "\n")
subprocess.check_call(["gnuplot", f.name])
print("wrote %s: %d spans, %d rows" % (out, len(spans), len(used)))
