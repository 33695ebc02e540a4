#!/usr/bin/env python3
"""The trainer's doors (docs/architecture.md, "The trainer's rooms"): which of worker/'s files may
see which. Fails (exit 1, one line per breach) when

  1. a file of a sub-folder of worker/ includes the trainer's header (worker/trainer.h or
     worker/trainer_int.h): only the trainer's own files, at worker/'s root, see ddp_trainer_t;
  2. a folder includes a header of a folder above it in the order
       worker/ (the trainer) -> {saving, optim, evaluate} -> {sync, budget} -> {model, data, observe}
       -> checkpoint
     (prep/ is a program beside the trainer), or two folders of one level include each other;
  3. one of the trainer's root files calls a function defined in another that comes before it
     in the order run -> setup -> generation -> step -> validate -> evaluate -> sample ->
     step_log ->
     memory_check (the symbols of libddp_worker.a's objects, defined against undefined: calls,
     which an include check cannot see);
  4. worker/'s root holds a source file that is not one of the trainer's (or the program's).

Usage: doors.py SOURCE_ROOT [LIBDDP_WORKER_A]   (without the archive, check 3 is not run)
The meson test `doors` runs it over this tree and the built library.
"""
import os
import re
import subprocess
import sys

LEVEL = {"": 0, "prep": 0, "saving": 1, "optim": 1, "evaluate": 1, "sync": 2, "budget": 2, "model": 3,
         "data": 3, "observe": 3, "checkpoint": 4}
ROOT_ORDER = ["run", "setup", "generation", "step", "validate", "evaluate", "sample", "step_log",
              "memory_check"]
ROOT_FILES = {f + ".c" for f in ROOT_ORDER} | {"main.c", "trainer.h", "trainer_int.h",
                                              "meson.build"}
TRAINER_HEADERS = {"worker/trainer.h", "worker/trainer_int.h"}


def folder_of(rel):
    """The sub-folder of worker/ a path is in ("" for the root), or None outside worker/."""
    parts = rel.split("/")
    if parts[0] != "worker":
        return None
    return parts[1] if len(parts) > 2 else ""


def main():
    root = sys.argv[1]
    archive = sys.argv[2] if len(sys.argv) > 2 else None
    breaches = []
    includes = {}  # folder -> set of folders it includes
    wroot = os.path.join(root, "worker")
    for d, _, files in os.walk(wroot):
        for f in sorted(files):
            path = os.path.join(d, f)
            rel = os.path.relpath(path, root)
            folder = folder_of(rel)
            if folder == "" and not f.startswith(".") and f not in ROOT_FILES:
                breaches.append(f"{rel}: not one of the trainer's files, at worker/'s root (4)")
            if not f.endswith((".c", ".h", ".cu", ".cuh")):
                continue
            text = open(path, errors="replace").read()
            for inc in re.findall(r'#\s*include\s*"([^"]+)"', text):
                if "/" not in inc:
                    inc = os.path.join(os.path.dirname(rel), inc)
                target = folder_of(inc)
                if target is None:
                    continue
                if folder != "" and inc in TRAINER_HEADERS:
                    breaches.append(f"{rel}: includes {inc}, the trainer's header (1)")
                    continue
                if target == folder or folder not in LEVEL or target not in LEVEL:
                    continue
                if LEVEL[target] < LEVEL[folder]:
                    breaches.append(f"{rel}: includes {inc}, a folder above worker/{folder}/ "
                                    f"(2)")
                includes.setdefault(folder, set()).add(target)
    for a in sorted(includes):
        for b in sorted(includes[a]):
            if a < b and LEVEL[a] == LEVEL[b] and a in includes.get(b, ()):
                breaches.append(f"worker/{a}/ and worker/{b}/ include each other (2)")
    if archive:
        breaches += calls(archive)
    for b in breaches:
        print(b)
    print(f"{len(breaches)} breach(es) of the trainer's doors")
    return 1 if breaches else 0


def calls(archive):
    """Check 3 over the archive's objects of the trainer's root files."""
    out = subprocess.run(["nm", "-A", archive], capture_output=True, text=True,
                         check=True).stdout
    defined, undefined = {}, {}
    for line in out.splitlines():
        m = re.match(r".*?([^/:]+)\.c\.o:\s*(?:[0-9a-f]+)?\s+([A-Za-z])\s+(\S+)$", line)
        if not m:
            continue
        obj, kind, sym = m.groups()
        if obj not in ROOT_ORDER:
            continue
        if kind == "U":
            undefined.setdefault(obj, set()).add(sym)
        elif kind in "TDBR":
            defined[sym] = obj
    breaches = []
    for obj, syms in sorted(undefined.items()):
        for sym in sorted(syms):
            callee = defined.get(sym)
            if callee and ROOT_ORDER.index(callee) < ROOT_ORDER.index(obj):
                breaches.append(f"worker/{obj}.c calls {sym} of worker/{callee}.c, which comes "
                                f"before it (3)")
    return breaches


if __name__ == "__main__":
    sys.exit(main())
