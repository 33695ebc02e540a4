#!/usr/bin/env python3
"""The analysis of tests/bench/checkpoint_stall.sh (see there for the design).

    checkpoint_stall.py runs TMP STEPS EVERY PAIRS   the tables of one invocation, from its runs'
                                                    metrics and logs in TMP
    checkpoint_stall.py pool OUTPUT...               pools the per-save values that invocations
                                                    printed (their saved stdout): this VM's
                                                    per-step noise needs more saves than one
                                                    invocation holds
"""
import json
import math
import os
import re
import statistics
import sys


def quart(v):
    q = statistics.quantiles(v, n=4, method="inclusive") if len(v) > 1 else [v[0]] * 3
    return q[0], statistics.median(v), q[2]


def median_ci(v):
    """Distribution-free, at least 95%: order statistics j..n-1-j of the binomial."""
    v, n = sorted(v), len(v)
    cdf = lambda k: sum(math.comb(n, i) for i in range(k + 1)) / 2 ** n
    j = max([k for k in range(n // 2) if 2 * cdf(k) <= 0.05] or [0])
    return v[j], v[n - 1 - j]


def mean_ci(v):
    """The mean and the half-width of its 95% interval, by the normal approximation."""
    return statistics.mean(v), 1.96 * statistics.stdev(v) / math.sqrt(len(v))


def stall_rows(within, placebo, step, label):
    """The rows every report has. The mean is the save's cost averaged over saves, what a run
    pays; the median resists outliers but not skew: step times have a long slow tail, and the
    placebo's median sits below zero where its mean does not."""
    def pct(ms):
        return f"{100 * ms / step:+.1f}%"

    def quartile_row(name, v):
        q = quart(v)
        print(f"| {name} | {q[0]:+.0f} / **{q[1]:+.0f}** / {q[2]:+.0f} ms | {pct(q[0])} / "
              f"**{pct(q[1])}** / {pct(q[2])} |")

    def mean_row(name, m, h):
        print(f"| {name} | **{m:+.0f}** ({m - h:+.0f} .. {m + h:+.0f}) ms | **{pct(m)}** "
              f"({pct(m - h)} .. {pct(m + h)}) |")

    quartile_row(f"**within runs**: {label}, 25% / median / 75%", within)
    ci = median_ci(within)
    print(f"| within runs: 95% confidence interval of the median | {ci[0]:+.0f} .. {ci[1]:+.0f} "
          f"ms | {pct(ci[0])} .. {pct(ci[1])} |")
    mean_row("**within runs: mean** (95% interval)", *mean_ci(within))
    if not placebo:
        return
    quartile_row(f"placebo: the same formula on the runs without saves ({len(placebo)}), 25% / "
                 "median / 75%", placebo)
    mean_row("placebo: mean (95% interval)", *mean_ci(placebo))
    (mw, hw), (mp, hp) = mean_ci(within), mean_ci(placebo)
    mean_row("within-run mean minus placebo mean (95% interval)", mw - mp, math.hypot(hw, hp))


def runs(tmp, steps, every, pairs):
    def walls(name):
        return {r["step"]: r["wall_ms"] for r in map(json.loads, open(f"{tmp}/{name}.jsonl"))
                if "wall_ms" in r}

    # checkpoint_stall.sh writes bench.json; runs kept before it existed used these values
    cfg = {"micro_batch": 4, "seq_len": 64, "touched": 3, "placebo": True}
    if os.path.exists(f"{tmp}/bench.json"):
        cfg.update(json.load(open(f"{tmp}/bench.json")))
    touched = cfg["touched"]
    saves = [s for s in range(1, steps) if s % every == 0]          # inside the whole-run window
    probe = [s for s in saves if s - 2 >= 2 and s + touched + 1 <= steps]  # with clean neighbours
    clean_steps = [i for i in range(2, steps + 1)
                   if all(not (s <= i < s + touched) for s in saves)]
    if touched < 1 or every < touched + 2 or not probe:
        sys.exit(f"the within-run measure needs EVERY >= TOUCHED + 2 = {touched + 2} and STEPS "
                 f">= EVERY + TOUCHED + 3")

    def stalls(w):  # per save, the stall and its touched steps' excesses
        d = {i: w[i] - w[i - 1] for i in range(2, steps + 1)}
        clean = {s: (d[s - 2] + d[s - 1] + d[s + touched] + d[s + touched + 1]) / 4 for s in probe}
        excess = [[d[s + k] - clean[s] for s in probe] for k in range(touched)]
        return [sum(e) for e in zip(*excess)], excess, statistics.median(d[i] for i in clean_steps)

    def optim_ms(name):  # the update's time: steps whose save is planned (CRC32C) / the others
        r = {r["step"]: r["optim_ms"] for r in map(json.loads, open(f"{tmp}/{name}.jsonl"))
             if "optim_ms" in r}
        return [v for s, v in r.items() if s in saves], [v for s, v in r.items() if s not in saves]

    within, placebo, steps_ms, whole, upd_crc, upd = [], [], [], [], [], []
    by_step = [[] for _ in range(touched)]
    warn = []
    for p in range(1, pairs + 1):
        wc = walls(f"ckpt{p}")
        st, excess, step_c = stalls(wc)
        within += st
        for k, e in enumerate(excess):
            by_step[k] += e
        steps_ms.append(step_c)
        a, b = optim_ms(f"ckpt{p}")
        upd_crc += a
        upd += b
        if cfg["placebo"]:
            wb = walls(f"base{p}")
            pl, _, step_b = stalls(wb)
            placebo += pl
            steps_ms.append(step_b)
            b, c = wb[steps] - wb[1], wc[steps] - wc[1]
            whole.append((p, b, c, b / (steps - 1), (c - b) / len(saves)))
        # every probed save must be committed before its last touched step ended
        log = open(f"{tmp}/ckpt{p}.log").read()
        for s in probe:
            last = s + touched - 1
            mc = re.search(rf"checkpoint step {s}: [\d.]+ MB in .*committed", log)
            i_end = log.find(f"step {last:5d}/")
            if not mc or i_end < 0 or mc.start() > i_end:
                warn.append(f"run {p}: the save of step {s} was not committed before step "
                            f"{last} ended")
    step = statistics.median(steps_ms)
    runs_desc = (f"{pairs} pair(s) of runs without/with saves, alternating" if cfg["placebo"]
                 else f"{pairs} run(s) with saves (PLACEBO=0: no runs without)")
    print(f"GPT-2 124M, B={cfg['micro_batch']}, T={cfg['seq_len']}, {steps} steps, "
          f"checkpoint.every={every}, {touched} steps touched per save (CPU, fp32, ddp-worker "
          f"default threads), {runs_desc}")
    print()
    print(f"| measure | per save | % of a step (median clean step "
          f"{step:.0f} ms) |")
    print("|---|---|---|")
    stall_rows(within, placebo, step, f"steps beside a save vs clean neighbours ({len(within)} "
               f"saves: steps {probe[0]}..{probe[-1]} x {pairs})")
    if whole:
        q = quart([w[4] for w in whole])
        print(f"| whole runs: (window with saves - without) / {len(saves)} saves, {pairs} pair(s) "
              "| " + ", ".join(f"{w[4]:+.0f}" for w in whole) + f" ms (median {q[1]:+.0f}) | "
              + ", ".join(f"{100*w[4]/w[3]:+.1f}%" for w in whole) + " |")
        print()
        print("whole-run windows (end of step 1 to end of step %d), without / with saves: " % steps
              + "; ".join(f"pair {w[0]}: {w[1]:.0f} / {w[2]:.0f} ms" for w in whole))
    else:
        print()
    for w in warn:
        print("WARNING: " + w)
    log = open(f"{tmp}/ckpt{pairs}.log").read()
    waits = re.findall(r"the update waited ([\d.]+) ms for it \(([\d.]+) MB left to copy\)", log)
    m = re.search(r"checkpoint: (\d+) save\(s\); training thread paid ([\d.]+) ms at step "
                  r"boundaries", log)
    write_re = (r"checkpoint step (\d+): [\d.]+ MB in ([\d.]+) s \((\d+) MB/s, writer CPU (\d+) "
                r"ms, ([\d.]+) MB checksummed by the writer")
    writes = re.findall(write_re, log)
    cpu = [int(w[3]) for p in range(1, pairs + 1)
           for w in re.findall(write_re, open(f"{tmp}/ckpt{p}.log").read()) if int(w[0]) in saves]
    wt = [float(w[1]) for w in writes]
    print(f"last pair, per save: training thread at the boundary "
          f"{float(m.group(2)) / int(m.group(1)):.1f} ms (incl. the final save); update waited "
          f"{min(float(w) for w, _ in waits):.1f}-{max(float(w) for w, _ in waits):.1f} ms, "
          f"{max(float(mb) for _, mb in waits):.1f} MB copied at most")
    print(f"last pair, writer beside training: {min(wt):.1f}-{max(wt):.1f} s per save "
          f"({min(int(w[2]) for w in writes)}-{max(int(w[2]) for w in writes)} MB/s), "
          f"{max(float(w[4]) for w in writes):.1f} MB read for checksums at most")
    extra = statistics.median(upd_crc) - statistics.median(upd)
    print(f"update (optim_ms, median over all pairs): {statistics.median(upd_crc):.0f} ms when it "
          f"computes the CRC32C for a planned save, {statistics.median(upd):.0f} ms otherwise: "
          f"+{extra:.0f} ms = {100 * extra / step:.1f}% of a step")
    print("where it falls, mean over saves of each touched step minus its clean neighbours' mean: "
          + ", ".join(f"step s+{k} {statistics.mean(e):+.0f} ms" for k, e in enumerate(by_step))
          + " (s: the update with the CRC32C; s+1: the writer beside the step)")
    print(f"writer thread CPU per save (median): {statistics.median(cpu):.0f} ms (its io_uring "
          f"workers and the I/O interrupts are in the CPU time of the saver alone, below)")
    print(f"{SAVES_LINE} {' '.join(f'{v:.0f}' for v in within)}")
    if placebo:
        print(f"{PLACEBO_LINE} {' '.join(f'{v:.0f}' for v in placebo)}")


SAVES_LINE = "every save's stall, ms (to pool invocations):"
PLACEBO_LINE = "every placebo value, ms:"
STEP_RE = re.compile(r"median clean step (\d+) ms")
SHAPE_RE = re.compile(r"GPT-2 124M, (B=\d+, T=\d+)")


def pool(outputs):
    within, placebo, steps, shapes = [], [], [], set()
    for path in outputs:
        text = open(path).read()
        shapes.update(SHAPE_RE.findall(text))
        found = {}
        for line in text.splitlines():
            for key in (SAVES_LINE, PLACEBO_LINE):  # the first analysis (RECYCLE_AB adds one)
                if line.startswith(key) and key not in found:
                    found[key] = [float(v) for v in line[len(key):].split()]
        m = STEP_RE.search(text)
        if SAVES_LINE not in found or not m:
            sys.exit(f"{path}: no per-save values (an output of checkpoint_stall.sh from "
                     f"before they were printed?)")
        within += found[SAVES_LINE]
        placebo += found.get(PLACEBO_LINE, [])  # none with PLACEBO=0
        steps.append(float(m.group(1)))
    if len(shapes) > 1:  # their steps differ in length, and a save's share of them
        sys.exit("pool: these invocations ran different batch shapes: " + ", ".join(shapes))
    step = statistics.median(steps)
    print(f"pooled: {len(outputs)} invocation(s) of checkpoint_stall.sh: " + ", ".join(outputs))
    print()
    print(f"| measure | per save | % of a step (median of the invocations' "
          f"median clean steps, {step:.0f} ms) |")
    print("|---|---|---|")
    stall_rows(within, placebo, step, f"{len(within)} saves")


if __name__ == "__main__":
    if len(sys.argv) == 6 and sys.argv[1] == "runs":
        runs(sys.argv[2], *map(int, sys.argv[3:6]))
    elif len(sys.argv) >= 3 and sys.argv[1] == "pool":
        pool(sys.argv[2:])
    else:
        sys.exit(__doc__)
