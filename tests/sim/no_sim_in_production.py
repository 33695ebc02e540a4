#!/usr/bin/env python3
"""No simulated-GPU symbol in what ddpd installs or in its production libraries.

The simulated GPU (tests/sim/) is built for the tests only and loaded by name as a module; this
checks with nm that none of it leaked back into a production object: every file that
`meson install` would install (meson-info/intro-installed.json) and every library target defined
outside tests/ (intro-targets.json). A control first runs the same match over tests/sim's own
library, so a pattern that stopped matching the simulator fails here instead of passing quietly.

    no_sim_in_production.py BUILD_ROOT SOURCE_ROOT     (TAP on stdout; exit 1 on a failure)
"""
import json
import os
import re
import subprocess
import sys

# simdev's API (ddp_simdev_*), the runtime's (ddp_sim_*), the backends' tables and entry
# points, and the sim kernel backend's static functions (sim_<op>); not "simple" or "similar".
SIM = re.compile(r"(?:^|[^A-Za-z0-9])(simdev|ddp_sim_\w*|sim_\w+|ddp_(?:kernels|coll)_sim\w*)")


def sim_symbols(path):
    """The names nm lists in path (static and dynamic tables) that belong to the simulator,
    plus archive members named after its files."""
    out = set()
    for args in (["nm", "-a", path], ["nm", "-D", path]):
        r = subprocess.run(args, capture_output=True, text=True)
        if r.returncode != 0 and "no symbols" not in r.stderr:
            if args[1] == "-D":
                continue  # not a dynamic object (an archive)
            raise RuntimeError("%s: %s" % (" ".join(args), r.stderr.strip()))
        for line in r.stdout.splitlines():
            name = line.split()[-1] if line.split() else ""
            if line.endswith(":"):  # an archive member's header: "simdev.c.o:"
                name = line[:-1]
            m = SIM.search(name)
            if m:
                out.add(name)
    return out


def main():
    build, source = sys.argv[1], os.path.realpath(sys.argv[2])
    with open(os.path.join(build, "meson-info", "intro-installed.json")) as f:
        installed = list(json.load(f))
    with open(os.path.join(build, "meson-info", "intro-targets.json")) as f:
        targets = json.load(f)
    libs = []
    for t in targets:
        where = os.path.relpath(os.path.realpath(t["defined_in"]), source)
        if t["type"] in ("static library", "shared library") and not where.startswith("tests"):
            libs.extend(t["filename"])
    control = [f for t in targets if t["name"] == "ddp_sim" for f in t["filename"]]

    n, failed = 0, 0

    def check(ok, what, detail=""):
        nonlocal n, failed
        n += 1
        print("%s %d - %s" % ("ok" if ok else "not ok", n, what))
        if not ok:
            failed += 1
            for line in detail.splitlines():
                print("# " + line)

    check(any(os.path.basename(p) == "ddp-worker" for p in installed),
          "ddp-worker is among the installed files", "\n".join(installed))
    check(len(control) == 1 and len(sim_symbols(control[0])) > 10,
          "the pattern finds the simulator in tests/sim's libddp_sim.so (control)")
    for path in sorted(set(installed + libs)):
        found = sim_symbols(path)
        check(not found, "no simulated-GPU symbol in " + os.path.relpath(path, build),
              "\n".join(sorted(found)[:20]))
    print("1..%d" % n)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
