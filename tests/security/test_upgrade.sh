#!/bin/bash
# Upgrading from ba7c947 (TAP): its job store and run directories (tests/fixtures/ba7c947) are
# taken over: the store made private without a new schema version (ba7c947 still opens it),
# its history shown, its queued job run as its user with the user's groups from the user
# database (uid 6: Debian's man, gid 12), its running job (its rank gone) failed with a reason. With ba7c947 built from this
# repository's history: a ba7c947 peer and this one cluster under peer_auth: allow-legacy and
# run a job across them; under peer_auth: required the old peer is refused; and a relay that
# strips the version from a hello is caught as a downgrade.
. "$(dirname "$0")/../integration/lib.sh"
. "$(dirname "$0")/lib.sh"
install -m 0755 "$SEC/peer.py" "$T/bin/peer.py"
FIX=$SRC/tests/fixtures/ba7c947/state
OLDPFX=/tmp/ddpd-fixture-ba7c947/state

# the fixture as ba7c947 left it, at this test's path
cp -r "$FIX" "$T/a"
mkdir -p "$T/a/runs/job-3" && chown 6:6 "$T/a/runs/job-3" # ba7c947 gave it gid = uid
chmod 0755 "$T/a"; chmod 0750 "$T/a/runs"/job-*; chmod 0644 "$T/a/ddpd.db"
"$PY" - "$T/a/ddpd.db" "$OLDPFX" "$T/a" <<'PY'
import sqlite3, sys
c = sqlite3.connect(sys.argv[1])
c.execute("UPDATE jobs SET run_dir = replace(run_dir, ?, ?)", (sys.argv[2], sys.argv[3]))
c.commit()
PY
chmod 0644 "$T/a/ddpd.db"
sec_daemon a "" --slots 1 || exit 1
check "the store is made private (0600)" test "$(stat -c %a "$T/a/ddpd.db")" = 600
check "without a new schema version (2), its rows kept, gid and groups added as NULL" \
    test "$("$PY" -c "import sqlite3; c=sqlite3.connect('$T/a/ddpd.db'); print(c.execute('pragma user_version').fetchone()[0], c.execute('select count(*), count(gid) from jobs where id<=3').fetchone())")" = "2 (3, 0)"
check "ddpctl ls shows ba7c947's history" test "$(ctl a --json ls | jq -c '[.[]|select(.id<=3)|[.id,.name]]')" = '[[3,"queued-job"],[2,"long-job"],[1,"done-job"]]'
check "job 1's log is read through the new daemon" bash -c "ctl() { '$DDPCTL' --socket '$T/a.sock' \"\$@\"; }; ctl logs 1 | grep -q uid=0"
check "job 2, whose rank died with that daemon, is failed with the reason" \
    wait_until 10 bash -c "$DDPCTL --socket $T/a.sock --json status 2 | jq -e '.state==\"failed\" and (.reason|test(\"could not adopt|ended\"))'"
check "job 3, queued by uid 6, is re-queued and runs" wait_state a 3 succeeded 30
g6=$(getent passwd 6 | cut -d: -f4)
check "as uid 6 with the gid of its passwd entry (${g6:-none}), not gid = uid" \
    bash -c "[ -n '$g6' ] && [ '$g6' != 6 ] && grep -q '^uid=6 gid=$g6 ' '$T/a/runs/job-3/rank-0.log'"
job_spec "$T/job.yaml" 1 10
id=$(submit_as A a "$T/job.yaml")
check "a new job runs on the taken-over store" wait_state a "$id" succeeded 30
stop_daemon a

# ba7c947 itself, from this repository's history (11 s to build on 2 cores)
OLD=$BUILD/security-ba7c947
old_build() {
    [ -x "$OLD/build/daemon/ddpd" ] && return 0
    git -C "$SRC" cat-file -e 'ba7c947^{commit}' 2>/dev/null || return 1
    rm -rf "$OLD" && mkdir -p "$OLD/src" &&
        git -C "$SRC" archive ba7c947 | tar -x -C "$OLD/src" &&
        meson setup "$OLD/build" "$OLD/src" -Dcuda=disabled -Ddnnl=disabled -Dmpi=disabled \
            > "$OLD/setup.log" 2>&1 &&
        ninja -C "$OLD/build" daemon/ddpd daemon/ddpctl > "$OLD/build.log" 2>&1
}
if ! old_build; then
    skip_rest="ba7c947 cannot be built here (no git history of it, or its build failed)"
    for i in 1 2 3 4 5 6; do skip "a ba7c947 daemon beside this one" "$skip_rest"; done
    finish
    exit
fi
ODDPD=$OLD/build/daemon/ddpd ODDPCTL=$OLD/build/daemon/ddpctl
"$ODDPD" -c /dev/null --socket "$T/o.sock" --state-dir "$T/a" --metrics off > "$T/o.log" 2>&1 & opid=$!
PIDS="$PIDS $opid"
check "ba7c947 still opens the store this daemon upgraded" \
    wait_until 20 bash -c "'$ODDPCTL' --socket '$T/o.sock' --json ls | jq -e 'length >= 4'"
kill -TERM $opid; wait $opid 2>/dev/null

head -c 32 /dev/urandom | base64 > "$T/secret"; chmod 0600 "$T/secret"
base=$((20000 + $$ % 15000)) PA=$base PB=$((base + 1)) PR=$((base + 2))
# ob: a ba7c947 daemon with the same secret; its state directory opened for users' jobs
mkdir -p "$T/ob" && chmod 0755 "$T/ob"
"$ODDPD" -c /dev/null --socket "$T/ob.sock" --state-dir "$T/ob" --metrics off --slots 1 --node-name ob \
    --listen "127.0.0.1:$PB" --secret-file "$T/secret" > "$T/ob.log" 2>&1 & PIDS="$PIDS $!"
wait_until 20 "$ODDPCTL" --socket "$T/ob.sock" info && chmod o+x "$T/ob/runs"
sec_daemon n "" --slots 1 --node-name n --secret-file "$T/secret" --peer "ob=127.0.0.1:$PB" \
    --listen "127.0.0.1:$PA" --peer-auth allow-legacy || exit 1
peer_up() { [ "$(ctl n --json nodes | jq '[.[]|select(.up and (.self|not))]|length')" = 1 ]; }
check "under allow-legacy this daemon links with a ba7c947 peer" wait_until 30 peer_up
check "and logs that the link is the older protocol" grep -q "older protocol" "$T/n.log"
job_spec "$T/job2.yaml" 2 20
id=$(submit_as A n "$T/job2.yaml")
check "a 2-rank job across this daemon and ba7c947 succeeds" wait_state n "$id" succeeded 60
check "its rank on ba7c947 ran as its user" grep -q "^uid=$UA " "$T/ob/runs/n-job-$id/rank-1.log"
stop_daemon n

# peer_auth: required refuses the old peer (it dials n, n would not dial it)
sec_daemon r "" --slots 1 --node-name r --secret-file "$T/secret" --listen "127.0.0.1:$PA" || exit 1
"$ODDPD" -c /dev/null --socket "$T/oc.sock" --state-dir "$T/oc" --metrics off --slots 1 --node-name oc \
    --secret-file "$T/secret" --peer "r=127.0.0.1:$PA" > "$T/oc.log" 2>&1 & PIDS="$PIDS $!"
check "under peer_auth: required a ba7c947 peer is refused, and the log says how to allow it" \
    wait_until 30 grep -q "older peer protocol.*peer_auth: required" "$T/r.log"
stop_daemon r

# a relay that strips the version from this daemon's hello: a downgrade, caught by the sentinel
sec_daemon l "" --slots 1 --node-name l --secret-file "$T/secret" --listen "127.0.0.1:$PA" \
    --peer-auth allow-legacy || exit 1
"$PY" "$T/bin/peer.py" relay "$PR" 127.0.0.1 "$PA" strip > "$T/strip.log" 2>&1 & PIDS="$PIDS $!"
wait_until 10 grep -q listening "$T/strip.log"
sec_daemon d "" --slots 1 --node-name d --secret-file "$T/secret" --peer "l=127.0.0.1:$PR" \
    --peer-auth allow-legacy || exit 1
check "a hello stripped of its version is refused as a downgrade" \
    wait_until 30 grep -q "downgrade attempt" "$T/l.log"
finish
