#!/usr/bin/env python3
"""Checks a picture from `ddpctl plot`: plot_check.py FILE STEPS [TEXT...]

PNG: the signature, 1000x720, and the curves really drawn (pixels of the training-loss blue,
the validation red and the tokens/s green, the colours plot.gp uses). SVG: well-formed XML with
an <svg> root, one path per curve with about STEPS points for the training loss, and every TEXT
present as text. Exits 1 with the reason on stderr."""
import sys
import xml.etree.ElementTree as ET

path, steps, texts = sys.argv[1], int(sys.argv[2]), sys.argv[3:]


def fail(msg):
    sys.exit("%s: %s" % (path, msg))


data = open(path, "rb").read()
if path.endswith(".png"):
    from PIL import Image
    if data[:8] != b"\x89PNG\r\n\x1a\n":
        fail("no PNG signature")
    im = Image.open(path).convert("RGB")
    if im.size != (1000, 720):
        fail("size %s, want 1000x720" % (im.size,))
    counts = {}
    for px in im.getdata():
        counts[px] = counts.get(px, 0) + 1

    def near(rgb):  # anti-aliased lines: pixels close to the colour count
        return sum(c for px, c in counts.items()
                   if sum(abs(a - b) for a, b in zip(px, rgb)) <= 60)
    for name, rgb, least in (("training loss", (0x1f, 0x77, 0xb4), 300),
                             ("validation loss", (0xd6, 0x27, 0x28), 100),
                             ("tokens/s", (0x2c, 0xa0, 0x2c), 300)):
        got = near(rgb)
        if got < least:
            fail("%s: %d pixels near #%02x%02x%02x, want >= %d" % (name, got, *rgb, least))
    if len(counts) < 20:
        fail("only %d colours: an empty picture" % len(counts))
else:
    root = ET.fromstring(data)
    if not root.tag.endswith("svg"):
        fail("root element %s, not svg" % root.tag)
    ns = "{http://www.w3.org/2000/svg}"
    alltext = " ".join("".join(t.itertext()) for t in root.iter(ns + "text"))
    for t in ["training loss", "validation loss", "tokens/s", "step"] + texts:
        if t not in alltext:
            fail("no text %r in %r" % (t, alltext[:300]))
    # the longest path is a curve of one point per step (gnuplot writes "M x,y L x,y ...")
    longest = max(len(p.get("d", "").split("L")) for p in root.iter(ns + "path"))
    if not steps <= longest <= steps + 2:
        fail("longest path has %d points, want about %d" % (longest, steps))
print("%s: ok" % path)
