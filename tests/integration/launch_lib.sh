# Shared setup of the integration tests that run deploy/launch-local.sh themselves, without a
# daemon (test_elastic.sh, test_flight.sh; the daemon's tests use lib.sh). Sourced by a script
# that has set worker (ddp-worker) and prep (ddp-prep); it sources tests/tap.sh, tests/corpus.sh
# and tests/wait.sh, and defines
#   launch_setup NAME   root (the source tree), launch (deploy/launch-local.sh) and tmp (a new
#                       /tmp/ddp-test-NAME.XXXXXX); exports DDP_WORKER=$worker and
#                       DDP_LOG_LEVEL=info; and sets the exit trap, which TERMs $launcher (the
#                       script's launch-local.sh in the background, "" when none), KILLs every
#                       rank whose pid file is in a run directory under $tmp, and removes $tmp
#                       (kept when KEEP_TMP is set), so that no process or file is left behind.
. "$(dirname "${BASH_SOURCE[0]}")/../tap.sh"
. "$(dirname "${BASH_SOURCE[0]}")/../corpus.sh"
. "$(dirname "${BASH_SOURCE[0]}")/../wait.sh"

launch_cleanup() {
    [ -n "$launcher" ] && kill -TERM "$launcher" 2>/dev/null
    for f in "$tmp"/*/rank-*.pid; do [ -f "$f" ] && kill -KILL "$(cat "$f")" 2>/dev/null; done
    wait 2>/dev/null
    [ -n "${KEEP_TMP:-}" ] || rm -rf "$tmp"
}

launch_setup() {
    local here
    here=$(cd "$(dirname "$0")" && pwd)
    root=${DDP_SOURCE_ROOT:-$here/../..}
    launch="$root/deploy/launch-local.sh"
    tmp=$(mktemp -d "/tmp/ddp-test-$1.XXXXXX")
    launcher=""
    trap launch_cleanup EXIT
    export DDP_WORKER=$worker DDP_LOG_LEVEL=info
}
