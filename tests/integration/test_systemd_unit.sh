#!/bin/bash
# `systemd-analyze verify` on deploy/ddpd.service (with ExecStart pointed at this build's ddpd,
# since verify checks that the binary exists). Installs systemd when it is missing and apt can;
# skips (77) only when systemd-analyze cannot be had.
. "$(dirname "$0")/lib.sh"
if ! command -v systemd-analyze >/dev/null; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq systemd >/dev/null 2>&1
    fi
fi
command -v systemd-analyze >/dev/null || { echo "1..0 # SKIP systemd-analyze unavailable"; exit 77; }
unit="$SRC/deploy/ddpd.service"
check "deploy/ddpd.service exists" test -f "$unit"
sed -e "s|/usr/local/bin/ddpd|$DDPD|g" -e "s|/usr/local/bin/ddpctl|$DDPCTL|g" "$unit" > "$T/ddpd.service"
systemd-analyze verify "$T/ddpd.service" >"$T/verify.log" 2>&1; rc=$?
diag "$T/verify.log"
check "systemd-analyze verify passes" test $rc -eq 0
check "no warnings about the unit" bash -c "! grep -q 'ddpd.service:' '$T/verify.log'"
check "Type=notify" grep -q '^Type=notify' "$unit"
check "restarts on failure" grep -q '^Restart=on-failure' "$unit"
check "a stop or restart signals ddpd alone (its jobs are adopted)" grep -q '^KillMode=process' "$unit"
check "runtime and state directories" grep -q '^RuntimeDirectory=ddpd' "$unit"
check "the state directory is traversable by users' jobs, not listable" \
    grep -qx 'StateDirectoryMode=0711' "$unit"
# hardening: what the unit takes, and what it must not take (workers inherit the unit's sandbox)
for d in ProtectSystem=full ProtectKernelTunables=yes ProtectKernelModules=yes \
         ProtectKernelLogs=yes ProtectClock=yes ProtectHostname=yes RestrictRealtime=yes \
         LockPersonality=yes SystemCallArchitectures=native; do
    check "hardening: $d" grep -qx "$d" "$unit"
done
for d in NoNewPrivileges ProtectHome PrivateTmp PrivateDevices MemoryDenyWriteExecute \
         RestrictNamespaces SystemCallFilter ProtectControlGroups; do
    check "no $d (it would break users' jobs)" bash -c "! grep -q '^$d=' '$unit'"
done
check "ProtectSystem is not strict (users' files stay writable)" bash -c "! grep -qx 'ProtectSystem=strict' '$unit'"
caps=$(grep '^CapabilityBoundingSet=' "$unit")
for c in CAP_SETUID CAP_SETGID CAP_KILL CAP_CHOWN CAP_SYS_PTRACE; do
    check "the capability bound keeps $c" bash -c "grep -qw $c <<<'$caps'"
done
check "sockets the workers need (unix, IPv4, IPv6, netlink)" \
    grep -qx 'RestrictAddressFamilies=AF_UNIX AF_INET AF_INET6 AF_NETLINK' "$unit"
# the exposure score, for the record
systemd-analyze security --offline=yes "$T/ddpd.service" 2>/dev/null | tail -1 | sed 's/^/# /' || true
check "example config parses (ddpd reads it)" bash -c "'$DDPD' --config '$SRC/deploy/ddpd.yaml' --check-config >/dev/null"
DESTDIR="$T/stage" bash "$SRC/deploy/install.sh" "$BUILD" /usr/local >"$T/install.log" 2>&1
check "install.sh stages the binaries, unit, config and secret" test -x "$T/stage/usr/local/bin/ddpd" \
    -a -x "$T/stage/usr/local/bin/ddpctl" -a -f "$T/stage/etc/systemd/system/ddpd.service" \
    -a -f "$T/stage/etc/ddpd/ddpd.yaml" -a -f "$T/stage/etc/ddpd/secret"
check "the installed single-node config is valid" "$DDPD" --config "$T/stage/etc/ddpd/ddpd.yaml" --check-config
finish
