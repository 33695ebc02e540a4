#!/bin/bash
# Links between daemons (TAP): a cluster secret others may read is refused; a relay that passes
# a real login through cannot inject a root start request or replay a message (both daemons
# this ddpd: every message after the login is encrypted and authenticated); a peer's node name
# cannot climb out of the run directory or forge a log line; a peer may not start ranks as root;
# a guest record is not written through a link the job's user planted, nor read from a file
# the user made.
. "$(dirname "$0")/../integration/lib.sh"
. "$(dirname "$0")/lib.sh"
install -m 0755 "$SEC/peer.py" "$T/bin/peer.py"
PEER=$T/bin/peer.py
job_spec "$T/job2.yaml" 2 100000
printf 'root secret\n' > "$T/rootfile"; chmod 0600 "$T/rootfile"
head -c 32 /dev/urandom | base64 > "$T/secret"
base=$((20000 + $$ % 15000)) PA=$base PB=$((base + 1)) PR=$((base + 2))

chmod 0644 "$T/secret"
"$DDPD" -c /dev/null --socket "$T/x.sock" --state-dir "$T/x" --metrics off \
    --listen "127.0.0.1:$PA" \
    --secret-file "$T/secret" > "$T/x.log" 2>&1 & xpid=$!
wait_until 10 bash -c "! kill -0 $xpid"; rc=$?
check "a cluster secret that others may read is refused (the daemon does not start)" \
    bash -c "[ $rc = 0 ] && grep -q 'cannot use the cluster secret' '$T/x.log'"
kill -KILL $xpid 2>/dev/null; wait $xpid 2>/dev/null
chmod 0600 "$T/secret"

# a relay between a (dialer, the coordinator) and b (listener)
b_up_via() { [ "$(ctl a --json nodes | jq '[.[]|select(.up and (.self|not))]|length')" = 1 ]; }
sec_daemon b "" --slots 2 --node-name b --listen "127.0.0.1:$PB" --secret-file "$T/secret" || exit 1
"$PY" "$PEER" relay "$PR" 127.0.0.1 "$PB" inject > "$T/relay1.log" 2>&1 & relay=$!; PIDS="$PIDS $relay"
wait_until 10 grep -q listening "$T/relay1.log"
sec_daemon a "" --slots 1 --node-name a --secret-file "$T/secret" --peer "b=127.0.0.1:$PR" || exit 1
check "the relay injected a start request for uid 0 after a real login" \
    wait_until 30 grep -q injected "$T/relay1.log"
check "b closed the link the message was injected on" \
    wait_until 10 grep -Eq "failed authentication|frame of [0-9]* bytes|: closed" "$T/b.log"
check "and started nothing for it" bash -c "[ ! -e '$T/b/runs/a-job-999' ] && ! pgrep -f 'a-job-99[9]/job.json'"
check "a links to b again (through the relay)" wait_until 30 b_up_via

# the same relay replays the coordinator's start request
kill $relay; wait $relay 2>/dev/null
"$PY" "$PEER" relay "$PR" 127.0.0.1 "$PB" replay > "$T/relay2.log" 2>&1 & relay=$!; PIDS="$PIDS $relay"
wait_until 30 b_up_via
id=$(submit_as A a "$T/job2.yaml")
check "the relay replayed the coordinator's messages to b" wait_until 30 grep -q replayed "$T/relay2.log"
check "b refused the replay and closed the link" \
    wait_until 10 grep -q "failed authentication (forged, replayed" "$T/b.log"
# (at most once: the replay closes the link, and a start request still being parsed then may
# be dropped with it, which fails the job on a; what must never happen is a second start)
check "b started the job's rank once at most, not twice" \
    test "$(grep -c "started 1 ranks of job $id for coordinator a" "$T/b.log")" -le 1
ctl a cancel "$id" >/dev/null; kill $relay; wait $relay 2>/dev/null
stop_daemon a

# names and uid 0 from a peer (an older peer's protocol, which b allows for this)
stop_daemon b
sec_daemon b "" --slots 2 --node-name b --listen "127.0.0.1:$PB" --secret-file "$T/secret" \
    --peer-auth allow-legacy || exit 1
far=/tmp/ddpd-sec-$$
"$PY" "$PEER" v1-start 127.0.0.1 "$PB" "$T/secret" "../../../..$far" 1001 7 "$(printf 'e%.0s' $(seq 64))" > "$T/p1.log" 2>&1
check "a peer named ../../../..$far is refused" grep -q refused "$T/p1.log"
check "and no directory is made outside the run directory" test ! -e "$far-job-7"
"$PY" "$PEER" v1-start 127.0.0.1 "$PB" "$T/secret" $'x\nforged log line' 1001 7 tok > "$T/p2.log" 2>&1
check "a peer name with a newline is refused and forges no log line" \
    bash -c "grep -q refused '$T/p2.log' && ! grep -q '^forged log line' '$T/b.log'"
"$PY" "$PEER" v1-start 127.0.0.1 "$PB" "$T/secret" evil 0 8 "$(printf 'f%.0s' $(seq 64))" > "$T/p3.log" 2>&1
check "an authenticated peer asked b to start a rank as root" grep -q 'sent start' "$T/p3.log"
check "b refused it" wait_until 10 grep -q 'does not start ranks as root' "$T/b.log"
check "and nothing runs for it" bash -c "[ ! -e '$T/b/runs/evil-job-8' ] && ! pgrep -f 'evil-job-[8]/job.json'"

# guest records: a 2-rank job with rank 1 on b; its user plants links in b's run directory
sec_daemon a "" --slots 1 --node-name a --secret-file "$T/secret" --peer "b=127.0.0.1:$PB" || exit 1
wait_until 30 b_up_via
id=$(submit_as A a "$T/job2.yaml")
wait_state a "$id" running 30
g="$T/b/runs/a-job-$id"
wait_until 30 test -s "$g/rank-1.log"
as A ln -sf "$T/rootfile" "$g/guest.json.tmp"
as A ln -sf "$T/rootfile" "$g/guest.json"
stop_daemon b # leaves its guest rank running and records it for the next b
check "b's record of its guest rank is not written through the user's link" \
    test "$(cat "$T/rootfile")-$(stat -c %u "$T/rootfile")" = "root secret-0"
sec_daemon b "" --slots 2 --node-name b --listen "127.0.0.1:$PB" --secret-file "$T/secret" \
    --peer-auth allow-legacy || exit 1
check "the next b takes the guest rank back from its own record" \
    wait_until 20 grep -q "took back 1 of 1 guest rank(s) of a's job $id" "$T/b.log"
wait_until 30 grep -q "coordinator a is back: its 1 rank(s) of job $id" "$T/b.log"
ctl a cancel "$id" >/dev/null; wait_state a "$id" cancelled 30
wait_until 30 bash -c "! pgrep -f 'a-job-$id/job.jso[n]'"

# a guest record the user forged (uid 0, a process of the user's own with the job's token)
stop_daemon b
env -i DDP_JOB_TOKEN=$(printf 'd%.0s' $(seq 64)) DDP_RANK=1 setpriv --reuid=$UA --regid=$GA \
    --clear-groups sleep 300 & decoy=$!; PIDS="$PIDS $decoy"
fake=$(jq -nc --arg tok "$(printf 'd%.0s' $(seq 64))" --argjson pid $decoy --argjson job $id \
    '{coord: "a", job: $job, procs: [{rank: 1, local_rank: 0, pid: $pid, restarts: 0}],
      start: {t: "start", job: $job, name: "x", ranks: [1], world: 2, rdzv: "127.0.0.1:1",
              token: $tok, spec: "{}", cwd: "/", uid: 0, gid: 0, threads: 1, elastic: true,
              max_restarts: 5}}')
as A rm -f "$g/guest.json" "$g/guest.json.tmp"
printf '%s\n' "$fake" > "$T/fake.json"; as A cp "$T/fake.json" "$g/guest.json"
took=$(grep -c "took back .* of a's job $id" "$T/b.log")
sec_daemon b "" --slots 2 --node-name b --listen "127.0.0.1:$PB" --secret-file "$T/secret" || exit 1
check "a guest record the user wrote is not believed" grep -q 'guest.json ignored' "$T/b.log"
check "and nothing of it is taken back" test "$(grep -c "took back .* of a's job $id" "$T/b.log")" = "$took"
finish
