#!/bin/bash
# The status page in a real headless browser (TAP): a daemon runs a real 2-rank job, Debian's
# chromium loads http://127.0.0.1:PORT/, and its DOM shows the job (name, running, progress)
# with a loss curve; a screenshot is taken and checked for the curve; /metrics still answers
# Prometheus text; `ddpctl plot ID` finds the run through the daemon; the page follows the
# job to cancelled. Installs chromium when missing (root with apt); skips (77) only when that
# fails.
. "$(dirname "$0")/../integration/lib.sh"
here=$(cd "$(dirname "$0")" && pwd)
if ! command -v chromium >/dev/null; then
    [ "$(id -u)" = 0 ] && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
        --no-install-recommends chromium >"$T/apt.log" 2>&1
    command -v chromium >/dev/null || { echo "1..0 # SKIP chromium cannot be installed"; exit 77; }
fi
W=$(worker_bin)
[ "$W" = "$FAKE_WORKER" ] && { echo "1..0 # SKIP ddp-worker is not built"; exit 77; }
export DDP_WORKER_BIN=$W
# a browser run; chromium needs no sandbox as root here and a profile of its own
browse() { timeout -k 5 90 chromium --headless --no-sandbox --disable-gpu --hide-scrollbars \
    --user-data-dir="$T/chrome" --window-size=1000,720 "$@" 2>>"$T/chrome.log"; }

make_job "$T/long.yaml" 2 100000
sed -i 's/^name: it-tiny/name: status-page-test/; s|^data: .*|data: {train: "'"$T"'/data/train_*.bin", val: "'"$T"'/data/val_*.bin"}|' "$T/long.yaml"
sed -i 's/log_every: 1, seed: 7}/log_every: 1, seed: 7, val_every: 10, val_batches: 2, threads: 1}/' "$T/long.yaml"
# a multiple-choice task scored every 10 steps (worker/evaluate.c): its last scores under the curve
printf '%s\n' '{"context": "int main(", "choices": ["void)", "x y z"], "label": 0}' \
    '{"context": "return", "choices": [" 0;", "q"], "label": 0}' >"$T/task.jsonl"
printf 'eval:\n  - {name: tiny, path: "%s", every: 10}\n' "$T/task.jsonl" >>"$T/long.yaml"

check "the metrics port (and so the page) is bound to 127.0.0.1 by default" \
    bash -c "'$DDPD' --check-config --state-dir '$T/cfg' | grep -q '^ *metrics: 127.0.0.1:9464'"
start_daemon a --slots 2 --metrics 127.0.0.1:0 --status-page public ||
    { echo "1..0 # SKIP daemon did not start"; exit 1; }
url=$(grep -o 'status page on http://127.0.0.1:[0-9]*/' "$T/a.log" | head -1 | sed 's/status page on //')
check "the daemon logs the page's address" test -n "$url"

id=$(ctl a submit "$T/long.yaml")
check "the job reaches running" wait_state a "$id" running 60
# wait (with a deadline) for 25 steps and a validation in metrics.jsonl
m="$T/a/runs/job-$id/metrics.jsonl"
for _ in $(seq 1 600); do
    [ "$(jq -s '[.[]|select(.loss)]|length' "$m" 2>/dev/null || echo 0)" -ge 25 ] &&
        grep -q val_loss "$m" && grep -q '"event":"eval"' "$m" && break
    sleep 0.1
done
check "25 steps and a validation logged" grep -q '"step":25,' "$m"

browse --dump-dom "$url" >"$T/dom.html"
check "chromium loaded the page" grep -q '<table id="jobs">' "$T/dom.html"
python3 - "$T/dom.html" "$id" >"$T/dom.check" 2>&1 <<'PY'
import sys
from html.parser import HTMLParser
dom, job = open(sys.argv[1]).read(), sys.argv[2]

class P(HTMLParser):
    def __init__(self):
        super().__init__(); self.row = None; self.cells = {}; self.cls = None; self.svg = {}
        self.where = None; self.refresh = False
    def handle_starttag(self, tag, a):
        a = dict(a)
        if tag == "meta" and a.get("http-equiv") == "refresh": self.refresh = True
        if tag == "tr" and a.get("id") == "job-" + job: self.row = a.get("class")
        if tag == "td" and self.row is not None: self.cls = a.get("class") or "td"
        if tag == "section" and a.get("id") == "curve-" + job: self.where = "curve"
        if self.where == "curve" and tag == "polyline":
            self.svg[a.get("class")] = len(a.get("points", "").split())
    def handle_endtag(self, tag):
        if tag == "tr": self.row = None
        if tag == "section": self.where = None
    def handle_data(self, d):
        if self.row is not None and self.cls: self.cells.setdefault(self.cls, []).append(d.strip())
p = P(); p.feed(dom)
errs = []
if not p.refresh: errs.append("no refresh")
if p.row is None and not p.cells: errs.append("no row job-%s" % job)
if "status-page-test" not in " ".join(p.cells.get("name", [])): errs.append("name: %s" % p.cells)
if "running" not in " ".join(p.cells.get("state", [])): errs.append("state: %s" % p.cells)
if p.svg.get("loss", 0) < 25: errs.append("loss curve points: %s" % p.svg)
if p.svg.get("val_loss", 0) < 1: errs.append("validation curve points: %s" % p.svg)
print("\n".join(errs) or "ok")
sys.exit(1 if errs else 0)
PY
rc=$?
[ $rc -eq 0 ] && ok "the DOM shows job $id: its name, running, and its loss and validation curves" ||
    { not_ok "the DOM shows the job and its curve"; diag "$T/dom.check"; }

check "the page shows the eval task's last scores" grep -q 'eval: tiny acc_norm [0-9.]*, acc' "$T/dom.html"

browse --screenshot="$T/page.png" "$url" >/dev/null
python3 - "$T/page.png" >"$T/shot.check" 2>&1 <<'PY'
import sys
from PIL import Image
im = Image.open(sys.argv[1]).convert("RGB")
assert im.size == (1000, 720), im.size
px = list(im.getdata())
near = lambda rgb: sum(1 for p in px if sum(abs(a - b) for a, b in zip(p, rgb)) <= 60)
blue, green = near((0x1f, 0x77, 0xb4)), near((0x2c, 0xa0, 0x2c))
assert blue >= 300, "training-loss blue pixels: %d" % blue
assert green >= 20, "green 'running' pixels: %d" % green
print("ok")
PY
[ $? -eq 0 ] && ok "the screenshot shows the curve and the running state" ||
    { not_ok "the screenshot shows the curve"; diag "$T/shot.check"; }
[ -n "${SCREENSHOT_OUT:-}" ] && cp "$T/page.png" "$SCREENSHOT_OUT"

check "/metrics still answers Prometheus text" \
    bash -c "curl -sf '${url}metrics' | grep -q '^ddpd_job_step{job=\"$id\"}'"
# (the job runs on: the picture has as many steps as ddpctl says it drew)
out=$("$DDPCTL" --socket "$T/a.sock" plot "$id" -o "$T/job.svg" 2>&1)
drawn=$(echo "$out" | sed -n 's/^wrote .*: \([0-9]*\) steps.*/\1/p')
if [ -n "$drawn" ] && [ "$drawn" -ge 25 ] && python3 "$here/plot_check.py" "$T/job.svg" "$drawn" >"$T/plot.check" 2>&1; then
    ok "ddpctl plot ID finds the run through the daemon and draws its $drawn steps"
else
    not_ok "ddpctl plot ID finds the run through the daemon"; echo "$out" | diag /dev/stdin; diag "$T/plot.check"
fi

ctl a cancel "$id" >/dev/null
check "the job is cancelled" wait_state a "$id" cancelled 60
check "the page follows it: cancelled, and no curve for an ended job" \
    bash -c "page=\$(curl -sf '$url'); echo \"\$page\" | grep -q '<tr id=\"job-$id\" class=\"cancelled\">' && ! echo \"\$page\" | grep -q 'id=\"curve-$id\"'"
finish
