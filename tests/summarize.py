#!/usr/bin/env python3
"""Reads meson's testlog.json files and prints one closing line:
   tests: N passed, N failed, N skipped
Arguments are testlog.json paths; "--broken NAME" counts a build that failed (so its tests
never ran) as one failure.
Subtests of TAP tests count one each; a test binary that crashed or timed out counts as one
failure. Each failed test is named first with its "not ok" lines and the last lines of its
output, so a CI log shows the cause. Exit status 1 when anything failed or no test ran."""
import json
import sys

TAIL_LINES = 40


def report_failure(path, rec):
    out = rec.get("stdout", "").splitlines()
    print(f"--- {rec.get('name')} ({path}): {rec.get('result')}")
    for l in out:
        if l.startswith("not ok "):
            print(f"    {l}")
    for l in (out + rec.get("stderr", "").splitlines())[-TAIL_LINES:]:
        print(f"  | {l}")


passed = failed = skipped = 0
args = sys.argv[1:]
while "--broken" in args:
    i = args.index("--broken")
    print(f"{args[i + 1]}: the build failed, its tests did not run")
    failed += 1
    del args[i:i + 2]
for path in args:
    try:
        lines = open(path).read().splitlines()
    except OSError:
        failed += 1
        continue
    for line in lines:
        rec = json.loads(line)
        result = rec.get("result")
        if result == "SKIP":
            skipped += 1
            continue
        # Count TAP subtests from the captured output when the binary ran to completion.
        ok = sum(1 for l in rec.get("stdout", "").splitlines() if l.startswith("ok "))
        not_ok = sum(1 for l in rec.get("stdout", "").splitlines() if l.startswith("not ok "))
        if result in ("OK", "EXPECTEDFAIL"):
            passed += max(ok, 1)
        else:
            passed += ok
            failed += max(not_ok, 1)
            report_failure(path, rec)
print(f"tests: {passed} passed, {failed} failed, {skipped} skipped")
sys.exit(1 if failed or passed == 0 else 0)
