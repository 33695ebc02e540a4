#!/usr/bin/env bash
# Installs ddpd, ddpctl and ddp-worker from a build directory, the systemd unit, an example
# config (kept if one exists), a cluster secret (created if missing), and the ddpd group.
#
#   deploy/install.sh [BUILD_DIR] [PREFIX]     (defaults: build, /usr/local)
#   DESTDIR=/tmp/stage deploy/install.sh       stage without touching the system (no systemctl)
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build}
PREFIX=${2:-/usr/local}
D=${DESTDIR:-}
for b in daemon/ddpd daemon/ddpctl; do
  [ -x "$BUILD/$b" ] || { echo "install.sh: $BUILD/$b is missing; build first (ninja -C $BUILD)" >&2; exit 1; }
done
install -d "$D$PREFIX/bin" "$D/etc/ddpd" "$D/etc/systemd/system"
install -m 0755 "$BUILD/daemon/ddpd" "$BUILD/daemon/ddpctl" "$D$PREFIX/bin/"
for b in worker/ddp-worker worker/ddp-prep; do
  [ -x "$BUILD/$b" ] && install -m 0755 "$BUILD/$b" "$D$PREFIX/bin/"
done
sed "s|/usr/local/bin|$PREFIX/bin|g" deploy/ddpd.service > "$D/etc/systemd/system/ddpd.service"
chmod 0644 "$D/etc/systemd/system/ddpd.service"
if [ ! -f "$D/etc/ddpd/ddpd.yaml" ]; then
  # a single-node config: the example's multi-node keys are left commented out
  sed -e "s|/usr/local/bin|$PREFIX/bin|g" -e 's/^node_name:/# node_name:/' \
      -e 's/^\(listen\|advertise\|secret_file\|peers\):/# \1:/' -e 's/^  - {name/#   - {name/' \
      deploy/ddpd.yaml > "$D/etc/ddpd/ddpd.yaml"
fi
if [ ! -f "$D/etc/ddpd/secret" ]; then
  (umask 077; head -c 32 /dev/urandom | base64 > "$D/etc/ddpd/secret")
fi
if [ -z "$D" ]; then
  getent group ddpd >/dev/null || groupadd --system ddpd
  if command -v systemctl >/dev/null && [ -d /run/systemd/system ]; then
    systemctl daemon-reload
    echo "installed; start with: systemctl enable --now ddpd"
  else
    echo "installed (no running systemd here: start ddpd by hand)"
  fi
fi
