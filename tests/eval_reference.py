#!/usr/bin/env python3
"""ddpd's multiple-choice scores against Hugging Face transformers' (tests/fixtures/eval/
reference.json, made by tests/fixtures/eval/make_reference.py with lm-evaluation-harness's
formulas): for each model (GPT-2 and Llama checkpoints, bytes; the Llama again with a BPE
tokenizer.json that adds BOS, as transformers' tokenizer encodes) and task (generic and
HellaSwag rows),
`ddp-worker --eval TASK --init-from DIR --eval-details FILE` must give every choice's summed
log-likelihood within 1e-4 relative of the reference's, the same token counts, and the same
choice for acc, acc_norm and acc_tok except where the reference's top two (by that score)
differ by less than 1e-4 relative. Prints the largest relative error seen. Then bad input: a
label out of range and a missing file exit 2 naming the file (and line and field).

Usage: eval_reference.py DDP_WORKER SOURCE_ROOT TMPDIR
"""
import json
import os
import subprocess
import sys

TOL = 1e-4


def top_two_close(vals):
    s = sorted(vals, reverse=True)
    return len(s) > 1 and abs(s[0] - s[1]) <= TOL * max(abs(s[0]), 1e-30)


def main():
    worker, root, tmp = sys.argv[1], sys.argv[2], sys.argv[3]
    ref = json.load(open(os.path.join(root, "tests/fixtures/eval/reference.json")))
    failures, worst, checked = [], 0.0, 0
    for name, m in ref["models"].items():
        for task, rows in m["tasks"].items():
            details = os.path.join(tmp, f"eval_ref_{name}_{task}")
            cmd = [worker, "--eval", os.path.join(root, "tests/fixtures/eval", task),
                   "--init-from", os.path.join(root, m["dir"]), "--eval-details", details]
            p = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
            if p.returncode != 0:
                failures.append(f"{name} {task}: exit {p.returncode}: {p.stderr.strip()}")
                continue
            summary = json.loads(p.stdout.splitlines()[0])
            got = [json.loads(l) for l in open(details)]
            if len(got) != len(rows):
                failures.append(f"{name} {task}: {len(got)} examples, reference {len(rows)}")
                continue
            right = {"acc": 0, "acc_norm": 0, "acc_tok": 0}
            for g, r in zip(got, rows):
                where = f"{name} {task} line {r['line']}"
                if g["line"] != r["line"] or g["label"] != r["label"]:
                    failures.append(f"{where}: line/label {g['line']}/{g['label']} vs "
                                    f"{r['line']}/{r['label']}")
                if g["n_tok"] != r["n_tok"]:
                    failures.append(f"{where}: tokens {g['n_tok']} vs {r['n_tok']}")
                for i, (a, b) in enumerate(zip(g["ll"], r["ll"])):
                    rel = abs(a - b) / max(abs(b), 1e-30)
                    worst = max(worst, rel)
                    checked += 1
                    if rel > TOL:
                        failures.append(f"{where}: choice {i}: ll {a!r} vs {b!r} ({rel:.2e})")
                for key in ("acc", "acc_norm", "acc_tok"):
                    if key == "acc":
                        scores = r["ll"]
                    elif key == "acc_tok":
                        scores = [l / n for l, n in zip(r["ll"], r["n_tok"])]
                    else:
                        scores = [l / c for l, c in zip(r["ll"], r["chars"])]
                    right[key] += g[key] == g["label"]
                    if top_two_close(scores):
                        continue
                    if g[key] != r[key]:
                        failures.append(f"{where}: {key} picks {g[key]}, reference {r[key]}")
            n = len(rows)
            for key in right:
                if abs(summary[key] - right[key] / n) > 1e-9 and not failures:
                    failures.append(f"{name} {task}: {key} {summary[key]} vs {right[key]}/{n}")
            print(f"{name} {task}: {n} examples, acc {summary['acc']:.4f} acc_norm "
                  f"{summary['acc_norm']:.4f} acc_tok {summary['acc_tok']:.4f}")
    # --eval-delimiter: with "" a choice " c" is scored as the default " " scores "c" (bytes:
    # the same tokens), so the reference's log-likelihoods hold exactly
    model = os.path.join(root, ref["models"]["gpt2_tiny"]["dir"])
    rows = ref["models"]["gpt2_tiny"]["tasks"]["shakespeare.jsonl"]
    spaced = os.path.join(tmp, "eval_ref_spaced.jsonl")
    with open(os.path.join(root, "tests/fixtures/eval/shakespeare.jsonl")) as f, \
            open(spaced, "w") as out:
        for line in f:
            row = json.loads(line)
            row["choices"] = [" " + c for c in row["choices"]]
            out.write(json.dumps(row) + "\n")
    for delim, same in (("", True), (" ", False)):
        details = os.path.join(tmp, "eval_ref_spaced_details")
        p = subprocess.run([worker, "--eval", spaced, "--init-from", model, "--eval-delimiter",
                            delim, "--eval-details", details], capture_output=True, text=True,
                           timeout=120)
        if p.returncode != 0:
            failures.append(f"--eval-delimiter {delim!r}: exit {p.returncode}: {p.stderr.strip()}")
            continue
        got = [json.loads(l) for l in open(details)]
        close = all(abs(a - b) <= TOL * max(abs(b), 1e-30)
                    for g, r in zip(got, rows) for a, b in zip(g["ll"], r["ll"]))
        if len(got) != len(rows) or close != same:
            failures.append(f"--eval-delimiter {delim!r} on choices with a leading space: "
                            f"{'not ' if same else ''}the reference's log-likelihoods")
    p = subprocess.run([worker, "--eval", spaced, "--init-from", model, "--eval-delimiter",
                        "0123456789abcdef"], capture_output=True, text=True, timeout=60)
    if p.returncode != 2 or "--eval-delimiter: at most 15 bytes, got 16" not in p.stderr:
        failures.append(f"--eval-delimiter of 16 bytes: exit {p.returncode}, {p.stderr.strip()!r}")
    # bad input: exit 2, naming the file, the line and the field
    bad = os.path.join(tmp, "eval_ref_bad.jsonl")
    with open(bad, "w") as f:
        f.write('{"context": "a", "choices": ["b"], "label": 0}\n')
        f.write('{"context": "a", "choices": ["b", "c"], "label": "2"}\n')
    for task, want in ((bad, f"{bad}:2:1: label: 2 is out of range for 2 choices"),
                       (os.path.join(tmp, "missing.jsonl"), "missing.jsonl: cannot read")):
        p = subprocess.run([worker, "--eval", task, "--init-from", model], capture_output=True,
                           text=True, timeout=60)
        if p.returncode != 2 or want not in p.stderr:
            failures.append(f"--eval {task}: exit {p.returncode}, stderr {p.stderr.strip()!r}, "
                            f"want exit 2 and {want!r}")
    print(f"{checked} log-likelihoods compared; largest relative error {worst:.3e} "
          f"(tolerance {TOL:g})")
    for f in failures:
        print("FAIL:", f)
    if checked == 0:
        print("FAIL: nothing compared")
        return 1
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
