#!/usr/bin/env python3
"""Finds two files of one folder that include each other's headers: two modules that need each
other are one module, or one of them should learn through a notification or a returned result. A module is a.c + a.h (+ a_impl.h / a_int.h / a_internal.h,
its internal header); an include counts when it names a header of the same folder.
Usage: include_cycles.py ROOT FOLDER...  Prints each pair; exits 1 when there is one.
The meson test `include_cycles` runs it over common, proto, kernels, collectives, worker and
daemon."""
import os, re, sys, itertools
root = sys.argv[1]
bad = 0
for folder in sys.argv[2:]:
    for d, _, files in os.walk(os.path.join(root, folder)):
        rel = os.path.relpath(d, root)
        mods = {}
        for f in files:
            if not f.endswith(('.c', '.h', '.cu')): continue
            mod = re.sub(r"_(impl|int|internal)$", "", os.path.splitext(f)[0])  # a module's internal header is the module
            text = open(os.path.join(d, f), errors='replace').read()
            for inc in re.findall(r'#\s*include\s*"([^"]+)"', text):
                # resolve "folder/x.h" or "x.h" (same directory)
                if '/' in inc:
                    if os.path.dirname(inc) != rel: continue
                    inc = os.path.basename(inc)
                target = re.sub(r"_(impl|int|internal)$", "", os.path.splitext(inc)[0])
                if target != mod and os.path.exists(os.path.join(d, inc)):
                    mods.setdefault(mod, set()).add(target)
        for a, b in itertools.combinations(sorted(mods), 2):
            if b in mods.get(a, ()) and a in mods.get(b, ()):
                print(f"{rel}: {a} <-> {b}"); bad += 1
print(f"{bad} two-way pair(s)")
sys.exit(1 if bad else 0)
