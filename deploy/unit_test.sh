#!/usr/bin/env bash
# Checks the shipped units with systemd's own tools:
#  - systemd-analyze verify passes. The units name the installed binary,
#    /usr/sbin/psmd, which a build tree does not have: the test verifies a
#    copy whose ExecStart= names the psmd just built, and checks that this is
#    the only difference. --man=no: the man pages are installed by the install
#    step, not present in a build tree.
#  - systemd-analyze security rates psmd.service at most 2.0, and with the
#    fabric drop-in (psmd-fabric.conf) at most 2.5.
#  - the psmd built here accepts the shipped psmd.toml and the ExecStart=
#    command line (--check-config).
set -euo pipefail
psmd="$PWD/daemon/psmd"
work=$(mktemp -d /tmp/psmd-unit.XXXXXX)
trap 'rm -rf "$work"' EXIT

sed "s|/usr/sbin/psmd|$psmd|" deploy/psmd.service >"$work/psmd.service"
cp deploy/psmd.socket "$work/psmd.socket"
changed=$(diff deploy/psmd.service "$work/psmd.service" | grep -c '^>' || true)
[[ "$changed" == 1 ]] || { echo "FAIL: expected one changed line, got $changed"; exit 1; }
grep -q '^ExecStart=/usr/sbin/psmd ' deploy/psmd.service ||
  { echo "FAIL: ExecStart= must name /usr/sbin/psmd"; exit 1; }

# verify exits 0 on settings it merely ignores ("Failed to parse ...,
# ignoring"): any word from it is a failure.
if ! (cd "$work" && systemd-analyze verify --man=no psmd.service psmd.socket \
  >"$work/verify.out" 2>&1) || [[ -s "$work/verify.out" ]]; then
  cat "$work/verify.out"
  echo "FAIL: systemd-analyze verify"
  exit 1
fi

score=$(systemd-analyze security --offline=true "$work/psmd.service" 2>&1 |
  sed -n 's/.*Overall exposure level for psmd.service: \([0-9.]*\).*/\1/p')
echo "systemd-analyze security: $score"
[[ -n "$score" ]] || { echo "FAIL: no exposure score"; exit 1; }
awk -v s="$score" 'BEGIN { exit !(s <= 2.0) }' ||
  { echo "FAIL: exposure $score > 2.0"; exit 1; }

# With the fabric drop-in: the same unit plus its [Service] lines (which is
# how systemd merges a drop-in: lists add up, later single values win).
mkdir "$work/fabric"
cat "$work/psmd.service" deploy/psmd-fabric.conf >"$work/fabric/psmd.service"
cp deploy/psmd.socket "$work/fabric/"
if ! (cd "$work/fabric" && systemd-analyze verify --man=no psmd.service psmd.socket \
  >"$work/verify-fabric.out" 2>&1) || [[ -s "$work/verify-fabric.out" ]]; then
  cat "$work/verify-fabric.out"
  echo "FAIL: systemd-analyze verify with psmd-fabric.conf"
  exit 1
fi
fabric_score=$(systemd-analyze security --offline=true "$work/fabric/psmd.service" 2>&1 |
  sed -n 's/.*Overall exposure level for psmd.service: \([0-9.]*\).*/\1/p')
echo "systemd-analyze security with the fabric drop-in: $fabric_score"
awk -v s="$fabric_score" 'BEGIN { exit !(s != "" && s <= 2.5) }' ||
  { echo "FAIL: exposure with the fabric drop-in $fabric_score > 2.5"; exit 1; }

# The shipped configuration and command line are accepted as they are.
exec_args=$(sed -n 's|^ExecStart=/usr/sbin/psmd ||p' deploy/psmd.service |
  sed "s|/etc/psmd/psmd.toml|deploy/psmd.toml|")
# shellcheck disable=SC2086
"$psmd" $exec_args --check-config >"$work/effective.toml" ||
  { echo "FAIL: psmd --check-config rejects deploy/psmd.toml"; exit 1; }
grep -q '^socket = ./run/psmd/psmd.sock.$' "$work/effective.toml" ||
  { echo "FAIL: shipped socket path is not /run/psmd/psmd.sock"; exit 1; }
grep -q '^ListenStream=/run/psmd/psmd.sock$' deploy/psmd.socket ||
  { echo "FAIL: psmd.socket listens elsewhere than psmd.toml's socket"; exit 1; }
echo PASS
