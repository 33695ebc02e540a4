#!/bin/bash
# Two daemons on two "hosts" made with network namespaces (a veth pair, 10.77.X.1/.2) run one
# 4-rank job together (2 slots each: ranks 0-1 on a, 2-3 on b); a third daemon with the wrong
# secret is refused and the refusal is logged. Skips (77) only if namespaces cannot be made.
. "$(dirname "$0")/lib.sh"
[ "$(id -u)" = 0 ] || { echo "1..0 # SKIP needs root for network namespaces"; exit 77; }
sfx=$$
NA=ddpd-a-$sfx NB=ddpd-b-$sfx
net=$((sfx % 200 + 20))
A=10.77.$net.1 Bip=10.77.$net.2
ns_cleanup() {
    cleanup
    ip netns del "$NA" 2>/dev/null
    ip netns del "$NB" 2>/dev/null
}
trap ns_cleanup EXIT
if ! ip netns add "$NA" 2>/dev/null || ! ip netns add "$NB" 2>/dev/null; then
    echo "1..0 # SKIP cannot create network namespaces"; exit 77
fi
ip link add "va$sfx" type veth peer name "vb$sfx" || { echo "1..0 # SKIP no veth"; exit 77; }
ip link set "va$sfx" netns "$NA"
ip link set "vb$sfx" netns "$NB"
ip -n "$NA" addr add "$A/24" dev "va$sfx"
ip -n "$NB" addr add "$Bip/24" dev "vb$sfx"
for n in "$NA" "$NB"; do ip -n "$n" link set lo up; done
ip -n "$NA" link set "va$sfx" up
ip -n "$NB" link set "vb$sfx" up

W=$(worker_bin)
echo "# worker: $W"
export DDP_WORKER_BIN=$W FAKE_STEP_S=0.05
make_job "$T/job4.yaml" 4 6
echo "cluster-secret-$RANDOM$RANDOM" > "$T/secret"; chmod 600 "$T/secret"
echo "not-the-secret" > "$T/wrong"; chmod 600 "$T/wrong"

# start_ns NS NAME [ddpd options]: like start_daemon, inside a namespace
start_ns() {
    local ns=$1 name=$2; shift 2
    ip netns exec "$ns" "$DDPD" --socket "$T/$name.sock" --state-dir "$T/$name" --metrics off \
        --grace 3 --node-name "$name" "$@" >>"$T/$name.log" 2>&1 &
    local pid=$!
    PIDS="$PIDS $pid"
    eval "${name}_PID=$pid"
    wait_until 30 "$DDPCTL" --socket "$T/$name.sock" info && return 0
    diag "$T/$name.log"; return 1
}
start_ns "$NA" a --slots 2 --listen "$A:7450" --secret-file "$T/secret" --peer "b=$Bip:7450"
start_ns "$NB" b --slots 2 --listen "$Bip:7450" --secret-file "$T/secret" --peer "a=$A:7450"
start_ns "$NB" c --slots 2 --listen "$Bip:7451" --secret-file "$T/wrong" --peer "a=$A:7450"

peers_up() { [ "$(ctl a --json nodes | jq '[.[]|select(.up and (.self|not))]|length')" = "$1" ]; }
check "a sees peer b up" wait_until 30 peers_up 1
check "ddpctl nodes lists both with 2 slots" test "$(ctl a --json nodes | jq '[.[].slots]|add')" = 4

out=$(ctl a run "$T/job4.yaml" 2>&1); rc=$?
echo "$out" | tail -3 | sed 's/^/# /'
[ $rc -eq 0 ] && ok "4-rank job across two namespaces succeeded" || {
    not_ok "4-rank job across two namespaces succeeded (rc $rc)"
    for f in "$T"/a/runs/job-1/rank-*.log "$T"/b/runs/a-job-1/rank-*.log; do echo "# == $f"; tail -5 "$f" | sed 's/^/# /'; done; }
check "placement a:0-1,b:2-3" test "$(ctl a --json status 1 | jq -r .nodes)" = "a:0-1,b:2-3"
check "ranks 2 and 3 ran on b" test -s "$T/b/runs/a-job-1/rank-2.log" -a -s "$T/b/runs/a-job-1/rank-3.log"
check "the rendezvous is on a's address" bash -c "$DDPCTL --socket $T/a.sock --json status 1 | jq -r '.transitions[1].reason' | grep -q 'rendezvous $A:'"
check "a refused the daemon with the wrong secret and logged it" grep -q "refused" "$T/a.log"
check "c never came up as a's peer" bash -c "! grep -q 'peer c .* authenticated' '$T/a.log'"
check "c logs that a failed authentication" grep -q "authentication" "$T/c.log"
finish
