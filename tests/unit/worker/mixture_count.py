#!/usr/bin/env python3
"""Reads the loader's debug lines (worker/data/loader.h) from rank logs.
  mixture_count.py ids FIRST LAST LOG...     per step FIRST..LAST: the sum of the ranks' sample-id
                                             hashes (mod 2^64) and the number of samples, one line
  mixture_count.py sources FIRST LAST LOG... per source index: the sequences k drawn in steps
                                             FIRST..LAST, as JSON {"d": [k, ...]}
A line of a step outside [FIRST, LAST] (a prefetch past the end) is ignored, and so is, in an
elastic job, a line written before its generation ended ("generation G ends at step S", or the
test hook's "hangs as step S+1 begins") for a step after S: that step was redone."""
import collections, json, re, sys

LINE = re.compile(r"loader: step (\d+) samples \[(\d+), (\d+)\) ids ([0-9a-f]{16})"
                  r"(?: source:sequence((?: \d+:\d+)+))?")

END = re.compile(r"generation \d+ ends at step (\d+)|hangs as step (\d+) begins")


def lines(first, last, paths):
    for p in paths:
        with open(p, errors="replace") as f:
            text = f.read()
        ends = [(e.start(), int(e[1]) if e[1] else int(e[2]) - 1) for e in END.finditer(text)]
        for m in LINE.finditer(text):
            step = int(m[1])
            if not first <= step <= last:
                continue
            if any(m.start() < at and step > done for at, done in ends):
                continue  # loaded before its generation ended; the step was redone
            yield m

def main():
    what, first, last, paths = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4:]
    if what == "ids":
        h, n = collections.defaultdict(int), collections.Counter()
        for m in lines(first, last, paths):
            s = int(m[1])
            h[s] = (h[s] + int(m[4], 16)) % 2**64
            n[s] += int(m[3]) - int(m[2])
        print(" ".join("%d:%016x/%d" % (s, h[s], n[s]) for s in sorted(h)))
    else:
        ks = collections.defaultdict(list)
        for m in lines(first, last, paths):
            for pair in (m[5] or "").split():
                d, k = pair.split(":")
                ks[d].append(int(k))
        print(json.dumps(ks))

main()
