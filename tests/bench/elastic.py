#!/usr/bin/env python3
"""Recovery after a killed rank: elastic (survivors go on, the restarted rank rejoins from a live
peer) against restart-everything (what torchrun does: every rank ends, the job is launched again
and resumes from the newest checkpoint), measured in the same invocation on the same spec.

    tests/bench/elastic.py [--model gpt2-mini] [--ranks 4] [--steps 40] [--kill-after 15]
                           [--ckpt-every 10] [--micro-batch 2] [--seq-len 64] [--micro-steps 2]
                           [--build build]

Both runs use deploy/launch-local.sh with N ranks; rank 2 gets SIGKILL once rank 0 has logged
step --kill-after. Reported: detection ms (kill -> the coordinator evicts it), reconfiguration ms
(the survivors' new generation), kill -> the survivors' next completed step, the joiner's time
from its restart to its first step and its state transfer MB/s (against the all-reduce bus
bandwidth of the same ranks in the same run), what admitting the joiner cost the survivors (the
regroup, with the transfer when they wait for it, and the step after it beyond the full
world's median step), completed steps lost, and each run's total time. The elastic run is repeated for each
ddp.state_transfer mode in --modes.
Not part of pass/fail; prints a table and the JSON of every figure.
"""
import argparse, datetime, json, os, re, shutil, signal, subprocess, sys, tempfile, threading, time

ap = argparse.ArgumentParser()
ap.add_argument("--build", default="build")
ap.add_argument("--model", default="gpt2-mini")
ap.add_argument("--ranks", type=int, default=4)
ap.add_argument("--steps", type=int, default=40)
ap.add_argument("--kill-after", type=int, default=15)
ap.add_argument("--ckpt-every", type=int, default=10)
ap.add_argument("--micro-batch", type=int, default=2)
ap.add_argument("--seq-len", type=int, default=64)
ap.add_argument("--micro-steps", type=int, default=2, help="micro-batches per rank per step")
ap.add_argument("--victim", type=int, default=2)
ap.add_argument("--modes", default="pause,overlap",
                help="ddp.state_transfer values to run, each an elastic run of its own")
args = ap.parse_args()

src = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
build = os.path.abspath(args.build)
worker, prep = f"{build}/worker/ddp-worker", f"{build}/worker/ddp-prep"
launch = f"{src}/deploy/launch-local.sh"
work = tempfile.mkdtemp(prefix="ddp-bench-elastic.")
TS = re.compile(r"^(\d\d):(\d\d):(\d\d)\.(\d\d\d) ")


def log_time(line):
    """Wall time (epoch s) of a log line's HH:MM:SS.mmm prefix (today)."""
    m = TS.match(line)
    if not m:
        return None
    h, mi, s, ms = map(int, m.groups())
    now = datetime.datetime.now()
    t = now.replace(hour=h, minute=mi, second=s, microsecond=ms * 1000)
    return t.timestamp()


def setup():
    text = os.path.join(src, "..", "shared", "data", "tinyshakespeare.txt")
    if not os.path.exists(text):
        text = f"{work}/text.txt"
        with open(text, "w") as f:
            for i in range(20000):
                f.write(f"line {i}: the quick brown fox {i * 7 % 13} jumps over {i % 11} dogs.\n")
    subprocess.run([prep, "--val-fraction", "0", "--out", f"{work}/data", text], check=True,
                   stdout=subprocess.DEVNULL)
    gbt = args.ranks * args.micro_steps * args.micro_batch * args.seq_len  # at N ranks
    with open(f"{work}/job.yaml", "w") as f:
        f.write(f"""name: bench-elastic
model: {{preset: {args.model}}}
data: {{train: "{work}/data/train_*.bin"}}
train: {{steps: {args.steps}, micro_batch: {args.micro_batch}, seq_len: {args.seq_len},
        global_batch_tokens: {gbt}, lr: 6.0e-4, warmup: 5, val_every: 0, sample_tokens: 0,
        threads: 1}}
ddp: {{workers: {args.ranks}, min_workers: 2, check_every: 0, heartbeat_timeout_s: 2}}
""")


class Run:
    """One launch-local.sh invocation whose rank-0 lines are read as they come."""

    def __init__(self, run_dir, extra):
        os.makedirs(run_dir, exist_ok=True)
        self.run_dir, self.lines = run_dir, []
        env = dict(os.environ, RUN_DIR=run_dir, DDP_WORKER=worker)
        self.p = subprocess.Popen([launch, str(args.ranks), f"{work}/job.yaml"] + extra, env=env,
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.cv = threading.Condition()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        for line in self.p.stdout:
            with self.cv:
                self.lines.append((time.time(), line.rstrip("\n")))
                self.cv.notify_all()
        with self.cv:
            self.lines.append((time.time(), None))
            self.cv.notify_all()

    def wait_line(self, pattern, timeout=1800):
        rx, deadline, seen = re.compile(pattern), time.time() + timeout, 0
        with self.cv:
            while time.time() < deadline:
                for t, l in self.lines[seen:]:
                    if l is None:
                        return None
                    if rx.search(l):
                        return t, l
                seen = len(self.lines)
                self.cv.wait(1)
        return None

    def kill_rank(self, r):
        pid = int(open(f"{self.run_dir}/rank-{r}.pid").read())
        t = time.time()
        os.kill(pid, signal.SIGKILL)
        return t

    def wait(self):
        return self.p.wait()


def step_lines(lines):
    out = []
    for t, l in lines:
        m = l and re.search(r"step +(\d+)/\d+ \| loss", l)
        if m:
            out.append((log_time(l) or t, int(m.group(1))))
    return out


setup()
res = {"model": args.model, "ranks": args.ranks, "steps": args.steps, "kill_after": args.kill_after}

# ---- elastic, once per ddp.state_transfer mode ----
def elastic(mode):
    t0 = time.time()
    el = Run(f"{work}/elastic-{mode}", ["--set", "ddp.restart=on-failure",
                                        "--set", f"ddp.state_transfer={mode}"])
    el.wait_line(rf"step +{args.kill_after}/")
    t_kill = el.kill_rank(args.victim)
    rc = el.wait()
    t_end = time.time()
    d = el.run_dir
    assert rc == 0, f"elastic run failed ({rc}): " + "\n".join(l or "" for _, l in el.lines[-20:])
    rdzv = open(f"{d}/rdzv.log").read().splitlines()
    evict = next(log_time(l) for l in rdzv if "evicting" in l)
    records = [json.loads(l) for l in open(f"{d}/metrics.jsonl")]
    gens = [e for e in records if e.get("event") == "generation"]
    xfer = next(e for e in records if e.get("event") == "state_transfer")
    join_gen = next(g for g in gens if g["generation"] == xfer["generation"])
    metrics = [m for m in records if "loss" in m]
    steps = step_lines(el.lines)
    next_step = next(t for t, s in steps if t > t_kill)
    joined = [l for l in open(f"{d}/rank-{args.victim}.log").read().splitlines()
              if "joined generation" in l]
    restart = [l for _, l in el.lines if l and "restarting it" in l]
    full = [m for m in metrics if m["world"] == args.ranks and m["step"] < args.kill_after]
    median = lambda xs: sorted(xs)[len(xs) // 2]
    comm = median([m["comm_ms"] for m in full])
    param_bytes = xfer["mb"] * 1e6 / 3
    bus = 2 * (args.ranks - 1) / args.ranks * param_bytes / (comm / 1e3) / 1e6
    # what admitting the joiner cost the survivors: the regroup (with the transfer when they
    # wait for it) and the step after it (which carries it when overlapped) beyond the median
    # step of the full world
    after = next(m for m in metrics if m["step"] == xfer["step"] + 1)
    cost = join_gen["reconfig_ms"] + after["step_ms"] - median([m["step_ms"] for m in full])
    seen = [m["step"] for m in metrics]
    return {
        "mode": xfer["mode"],
        "detection_ms": round((evict - t_kill) * 1e3, 1),
        "reconfig_ms": gens[0]["reconfig_ms"],
        "reconfig_parts_ms": {k: gens[0][k] for k in ("form_ms", "comm_ms", "attach_ms")},
        "join_parts_ms": {k: join_gen[k]
                          for k in ("reconfig_ms", "form_ms", "comm_ms", "attach_ms", "state_ms")},
        "kill_to_next_step_s": round(next_step - t_kill, 3),
        "step_s": round(median([m["step_ms"] for m in full]) / 1e3, 3),
        "joiner_restart_to_service_s": round(log_time(joined[-1]) - log_time(restart[-1]), 3)
        if joined and restart and TS.match(restart[-1]) else None,
        "state_mb": xfer["mb"], "state_ms": xfer["ms"], "state_mb_s": xfer["mb_per_s"],
        "allreduce_bus_mb_s": round(bus, 1),
        "join_cost_ms": round(cost, 1),
        "steps_lost": 0 if seen == list(range(1, args.steps + 1)) else f"lines {seen}",
        "total_s": round(t_end - t0, 2),
    }


for mode in args.modes.split(","):
    res[f"elastic_{mode}"] = elastic(mode)

# ---- restart everything from the newest checkpoint ----
ck = f"{work}/restart/checkpoints"
extra = ["--set", f"checkpoint.dir={ck}", "--set", f"checkpoint.every={args.ckpt_every}"]
t0 = time.time()
r1 = Run(f"{work}/restart", extra)
r1.wait_line(rf"step +{args.kill_after}/")
t_kill = r1.kill_rank(args.victim)
r1.wait()
t_relaunch = time.time()
reached = max(s for _, s in step_lines(r1.lines))
r2 = Run(f"{work}/restart", extra)
first = r2.wait_line(r"step +\d+/")
rc = r2.wait()
t_end = time.time()
assert rc == 0, "relaunch failed: " + "\n".join(l or "" for _, l in r2.lines[-20:])
resumed = min(s for _, s in step_lines(r2.lines)) - 1
res["restart_all"] = {
    "all_ranks_ended_s": round(t_relaunch - t_kill, 3),
    "kill_to_next_step_s": round(first[0] - t_kill, 3),
    "steps_lost": reached - resumed,
    "resumed_from": resumed,
    "total_s": round(t_end - t0, 2),
}

r = res["restart_all"]
es = [res[f"elastic_{m}"] for m in args.modes.split(",")]
print(f"model {args.model}, {args.ranks} ranks on {os.cpu_count()} cores, {args.steps} steps, "
      f"rank {args.victim} SIGKILLed after step {args.kill_after}; checkpoints every "
      f"{args.ckpt_every} steps for restart-everything")
print("| | " + " | ".join(f"elastic, {e['mode']}" for e in es) + " | restart everything |")
print("|---|" + "---|" * (len(es) + 1))
row = lambda name, cells, ref: print(f"| {name} | " + " | ".join(cells) + f" | {ref} |")
row("detection", [f"{e['detection_ms']} ms" for e in es], "-")
row("reconfiguration", [f"{e['reconfig_ms']:.0f} ms (" + ", ".join(
    f"{k[:-3]} {v:.0f}" for k, v in e["reconfig_parts_ms"].items()) + ")" for e in es],
    "all ranks end, relaunch, reload")
row("kill -> next completed step", [f"{e['kill_to_next_step_s']} s (step {e['step_s']} s)"
                                    for e in es], f"{r['kill_to_next_step_s']} s")
row("completed steps lost", [str(e["steps_lost"]) for e in es],
    f"{r['steps_lost']} (resumed from step {r['resumed_from']})")
row("joiner: restart -> in service", [f"{e['joiner_restart_to_service_s']} s" for e in es], "-")
row("state transfer", [f"{e['state_mb']} MB at {e['state_mb_s']} MB/s (all-reduce bus "
                       f"{e['allreduce_bus_mb_s']} MB/s)" for e in es], "from disk")
row("survivors' cost of the join", [f"{e['join_cost_ms']:.0f} ms" for e in es], "-")
row("total run time", [f"{e['total_s']} s" for e in es], f"{r['total_s']} s")
print(json.dumps(res))
if os.environ.get("KEEP_TMP"):
    print("kept", work)
else:
    shutil.rmtree(work, ignore_errors=True)
