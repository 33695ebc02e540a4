"""The table of tests/bench/cluster.sh: medians over its rounds, and the issue's targets checked.

    cluster_report.py RESULTS.jsonl LINKS_JSON
RESULTS: one line per run (cluster.sh's record); LINKS_JSON: {rate: measured Gbit/s}.
"""
import json
import statistics as st
import sys
from collections import defaultdict

runs = [json.loads(line) for line in open(sys.argv[1])]
links = json.loads(sys.argv[2])
groups = defaultdict(list)
for r in runs:
    groups[(r["impl"], r["H"], r["R"], r["rate"], r["model"], r["dtype"])].append(r)


def med(key, impl, H, R, rate, model, dtype):
    rows = groups.get((impl, H, R, rate, model, dtype), [])
    vals = [f(r) for r in rows for f in [key] if f(r) is not None]
    return st.median(vals) if vals else None


def step_ms(r):
    return r["step_ms"] if "step_ms" in r else r["median_step_s"] * 1000


def tps(r):
    return r["tokens_per_s"]


def host_mb(r):  # bytes each host sent per measured step, mean over hosts, MB
    # the counters are read as step lines appear, polled every 50 ms (and each read starts a
    # process per host): with steps under 200 ms the window is not the steps' (gpt2-mini's 240-320
    # ms steps gave the bytes its gradient predicts)
    if "tx0" not in r or step_ms(r) < 200:
        return None
    a = [int(x) for x in r["tx0"].split()]
    b = [int(x) for x in r["tx1"].split()]
    return st.mean(y - x for x, y in zip(a, b)) / r["steps"] / 1e6


def spread(key, impl, H, R, rate, model, dtype):
    """ "min-max" over the rounds, or "" with fewer than two."""
    vals = [key(r) for r in groups.get((impl, H, R, rate, model, dtype), [])]
    return f" ({min(vals):.0f}-{max(vals):.0f})" if len(vals) > 1 else ""


def fmt(v, f="{:.0f}"):
    return "-" if v is None else f.format(v)


def ratio(a, b, f="{:.2f}x"):
    return "-" if a is None or b is None or b == 0 else f.format(a / b)


models = list(dict.fromkeys(r["model"] for r in runs))  # in the order they ran
rates = [k for k in links]
print("| link (measured) | model | gradients | ddpd tokens/s (rounds' range) | PyTorch DDP tokens/s "
      "| ddpd / PyTorch "
      "| scaling ddpd / PyTorch | ddpd exposed comm (own) | step above one rank: ddpd / PyTorch "
      "| MB per host per step: ddpd / PyTorch | ddpd's link use in its all-reduce |")
print("|---|---|---|---|---|---|---|---|---|---|---|")
checks = []
for rate in rates:
    for model in models:
        one_d = med(tps, "ddpd", 1, 1, "none", model, "fp32")
        one_t = med(tps, "pytorch", 1, 1, "none", model, "none")
        one_d_ms = med(step_ms, "ddpd", 1, 1, "none", model, "fp32")
        one_t_ms = med(step_ms, "pytorch", 1, 1, "none", model, "none")
        for dtype, tdtype, label in (("fp32", "none", "fp32 (PyTorch: fp32)"),
                                     ("bf16", "bf16", "bf16 (PyTorch: bf16_compress_hook)")):
            k = (2, 1, rate, model)
            d = med(tps, "ddpd", *k, dtype)
            t = med(tps, "pytorch", *k, tdtype)
            d_ms = med(step_ms, "ddpd", *k, dtype)
            t_ms = med(step_ms, "pytorch", *k, tdtype)
            exp = med(lambda r: r.get("exposed_comm_ms"), "ddpd", *k, dtype)
            comm = med(lambda r: r.get("comm_ms"), "ddpd", *k, dtype)
            d_mb = med(host_mb, "ddpd", *k, dtype)
            t_mb = med(host_mb, "pytorch", *k, tdtype)
            use = None
            if d_mb and comm:
                use = d_mb * 8e6 / (comm / 1000) / (links[rate] * 1e9)
            sd = d / (2 * one_d) if d and one_d else None
            stt = t / (2 * one_t) if t and one_t else None
            print(f"| {rate} ({links[rate]} Gbit/s) | {model} | {label} "
                  f"| {fmt(d)}{spread(tps, 'ddpd', *k, dtype)} | {fmt(t)}{spread(tps, 'pytorch', *k, tdtype)} "
                  f"| {ratio(d, t)} | {fmt(sd, '{:.2f}')} / {fmt(stt, '{:.2f}')} "
                  f"| {fmt(exp, '{:.0f} ms')} ({fmt(exp / d_ms * 100 if exp is not None and d_ms else None, '{:.0f}%')}) "
                  f"| {fmt(d_ms - one_d_ms if d_ms and one_d_ms else None, '{:.0f} ms')} / "
                  f"{fmt(t_ms - one_t_ms if t_ms and one_t_ms else None, '{:.0f} ms')} "
                  f"| {fmt(d_mb, '{:.1f}')} / {fmt(t_mb, '{:.1f}')} | {fmt(use * 100 if use else None, '{:.0f}%')} |")
            if d and t and rate != "1gbit":
                checks.append((f"{rate} {model} {dtype}: ddpd >= 1.5x PyTorch", d / t >= 1.5, f"{d / t:.2f}x"))
            if d and t and rate == "1gbit":
                checks.append((f"1gbit {model} {dtype}: ddpd >= 1.0x PyTorch", d / t >= 1.0, f"{d / t:.2f}x"))
            if use is not None and rate == "1gbit":
                checks.append((f"1gbit {model} {dtype}: ddpd uses >= 90% of the link", use >= 0.9, f"{use * 100:.0f}%"))
            if exp is not None and d_ms and rate == "10gbit":
                checks.append((f"10gbit {model} {dtype}: exposed comm <= 10% of the step",
                               exp <= 0.1 * d_ms, f"{exp / d_ms * 100:.0f}%"))
        f32 = med(host_mb, "ddpd", 2, 1, rate, model, "fp32")
        b16 = med(host_mb, "ddpd", 2, 1, rate, model, "bf16")
        if f32 and b16:
            checks.append((f"{rate} {model}: bf16 sends 0.5x fp32's bytes (within 5%)",
                           abs(b16 / f32 - 0.5) <= 0.025, f"{b16 / f32:.3f}"))
        e32 = med(lambda r: r.get("exposed_comm_ms"), "ddpd", 2, 1, rate, model, "fp32")
        e16 = med(lambda r: r.get("exposed_comm_ms"), "ddpd", 2, 1, rate, model, "bf16")
        if rate == "1gbit" and model == "gpt2-124M" and e32 and e16 is not None:
            checks.append(("1gbit gpt2-124M: bf16 cuts exposed comm by >= 40%", e16 <= 0.6 * e32,
                           f"{(1 - e16 / e32) * 100:.0f}% less"))

print()
for model in models:  # 2 hosts x 2 ranks: the flat ring against the two-level all-reduce
    mb = {}
    for algo in ("flat", "auto"):
        rows = [r for r in runs if r["H"] == 2 and r["R"] == 2 and r["model"] == model
                and r.get("algo_req") == algo]
        if not rows:
            continue
        mbs = [host_mb(r) for r in rows if host_mb(r) is not None]
        if mbs:
            mb[algo] = st.median(mbs)
        print(f"2 hosts x 2 ranks, {model}, DDP_COLL_ALGO={algo} ({rows[0].get('algo') or '?'}): "
              f"{st.median(tps(r) for r in rows):.0f} tokens/s, {fmt(mb.get(algo), '{:.1f}')} MB "
              "per host per step")
    if len(mb) == 2:
        checks.append((f"2x2 {model}: the automatic choice sends <= 0.7x the flat ring's bytes "
                       "across hosts", mb["auto"] <= 0.7 * mb["flat"], f"{mb['auto'] / mb['flat']:.3f}"))
print()
for name, ok, val in checks:
    print(f"{'met ' if ok else 'MISS'}  {name}: {val}")
