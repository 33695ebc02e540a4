"""One training step's kernels from Nsight Compute's CSV (tests/gpu/kernel_times.sh).

Reads `ncu --csv --metrics gpu__time_duration.sum` output, keeps the kernels of the second step
(after the first AdamW kernel, through the second: each step ends with one), groups them by
name, grid and block, and prints each group's calls, total and mean time and share of the
step, largest first, then the step's sum. Kernel names are cut to 90 characters.

    python3 kernel_times.py NCU_CSV [ROWS]
"""
import csv
import sys
from collections import defaultdict

SCALE = {"nsecond": 1e-6, "ns": 1e-6, "usecond": 1e-3, "us": 1e-3, "msecond": 1.0, "ms": 1.0,
         "second": 1e3, "s": 1e3}


def kernels(path):
    """(name, grid, block, ms) per kernel launch, in launch order."""
    with open(path, newline="") as f:
        lines = [line for line in f if line.startswith('"')]
    out = []
    for row in csv.DictReader(lines):
        if row.get("Metric Name") != "gpu__time_duration.sum":
            continue
        value = float(row["Metric Value"].replace(",", ""))
        unit = row.get("Metric Unit", "nsecond").strip()
        name = row.get("Kernel Name") or row.get("Function Name") or "?"
        out.append((name, row.get("Grid Size", ""), row.get("Block Size", ""),
                    value * SCALE.get(unit, 1e-6)))
    return out


def main():
    path, rows = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 40
    ks = kernels(path)
    ends = [i for i, k in enumerate(ks) if "adamw" in k[0]]
    if len(ends) < 2:
        with open(path) as f:  # what ncu wrote instead, to adapt the reader to
            head = [line.rstrip() for line in f][:4]
        sys.exit(f"kernel_times: {len(ks)} kernels, {len(ends)} AdamW launches: no whole step; "
                 "the file begins:\n" + "\n".join(head))
    step = ks[ends[0] + 1:ends[1] + 1]
    groups = defaultdict(lambda: [0, 0.0])
    for name, grid, block, ms in step:
        g = groups[(name[:90], grid, block)]
        g[0] += 1
        g[1] += ms
    total = sum(ms for *_, ms in step)
    print(f"{len(step)} kernels in the step, {total:.3f} ms of kernel time "
          "(ncu runs them one at a time: no overlap, no launch gaps)")
    print(f"{'ms':>8} {'share':>6} {'calls':>5} {'mean us':>8}  kernel [grid] [block]")
    for (name, grid, block), (n, ms) in sorted(groups.items(), key=lambda kv: -kv[1][1])[:rows]:
        print(f"{ms:8.3f} {100 * ms / total:5.1f}% {n:5d} {1000 * ms / n:8.1f}  "
              f"{name} {grid} {block}")


if __name__ == "__main__":
    main()
