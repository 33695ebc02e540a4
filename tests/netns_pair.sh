# Two "hosts" for a test (sourced): network namespaces NS_A and NS_B joined by a veth pair,
# addresses ADDR_A and ADDR_B (/24), loopback up in both. Used by the daemon's and the
# trainer's multi-host tests; the caller deletes the namespaces (ip netns del) when done.
#   netns_pair NS_A NS_B IF_SUFFIX ADDR_A ADDR_B || skip
# Returns non-zero, with nothing left half-made that the caller's cleanup would miss, where
# namespaces or veth links cannot be created (not root, no CAP_NET_ADMIN).
netns_pair() {
    local na=$1 nb=$2 sfx=$3 a=$4 b=$5
    ip netns add "$na" 2>/dev/null && ip netns add "$nb" 2>/dev/null &&
        ip link add "va$sfx" type veth peer name "vb$sfx" 2>/dev/null || return 1
    ip link set "va$sfx" netns "$na" && ip link set "vb$sfx" netns "$nb" &&
        ip -n "$na" addr add "$a/24" dev "va$sfx" && ip -n "$nb" addr add "$b/24" dev "vb$sfx" &&
        ip -n "$na" link set lo up && ip -n "$nb" link set lo up &&
        ip -n "$na" link set "va$sfx" up && ip -n "$nb" link set "vb$sfx" up
}
