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

# check_unit DIR LIMIT WHAT: systemd-analyze verify on DIR's psmd.service and
# psmd.socket must say nothing (it exits 0 on settings it merely ignores,
# "Failed to parse ..., ignoring": any word from it is a failure), and
# security must rate the service at most LIMIT.
check_unit() {
  local dir=$1 limit=$2 what=$3 score
  if ! (cd "$dir" && systemd-analyze verify --man=no psmd.service psmd.socket \
    >"$dir/verify.out" 2>&1) || [[ -s "$dir/verify.out" ]]; then
    cat "$dir/verify.out"
    echo "FAIL: systemd-analyze verify ($what)"
    exit 1
  fi
  score=$(systemd-analyze security --offline=true "$dir/psmd.service" 2>&1 |
    sed -n 's/.*Overall exposure level for psmd.service: \([0-9.]*\).*/\1/p')
  echo "systemd-analyze security ($what): $score"
  [[ -n "$score" ]] || { echo "FAIL: no exposure score ($what)"; exit 1; }
  awk -v s="$score" -v l="$limit" 'BEGIN { exit !(s <= l) }' ||
    { echo "FAIL: exposure $score > $limit ($what)"; exit 1; }
}
check_unit "$work" 2.0 "as shipped"
# With the fabric drop-in: the same unit plus its [Service] lines (which is
# how systemd merges a drop-in: lists add up, later single values win).
mkdir "$work/fabric"
cat "$work/psmd.service" deploy/psmd-fabric.conf >"$work/fabric/psmd.service"
cp deploy/psmd.socket "$work/fabric/"
check_unit "$work/fabric" 2.5 "with psmd-fabric.conf"

# The shipped configuration and command line are accepted as they are, and
# PSMD_OPTIONS (EnvironmentFile=-/etc/default/psmd) reaches psmd as flags,
# split on whitespace as systemd splits an unquoted $VAR.
grep -qx 'EnvironmentFile=-/etc/default/psmd' deploy/psmd.service ||
  { echo "FAIL: no optional EnvironmentFile=-/etc/default/psmd"; exit 1; }
exec_args=$(sed -n 's|^ExecStart=/usr/sbin/psmd ||p' deploy/psmd.service |
  sed "s|/etc/psmd/psmd.toml|deploy/psmd.toml|")
[[ "$exec_args" == *' $PSMD_OPTIONS' ]] ||
  { echo "FAIL: ExecStart= does not end with \$PSMD_OPTIONS"; exit 1; }
PSMD_OPTIONS="--spin-us 300 --log-level debug"
# shellcheck disable=SC2086
"$psmd" ${exec_args% \$PSMD_OPTIONS} $PSMD_OPTIONS --check-config >"$work/effective.toml" ||
  { echo "FAIL: psmd --check-config rejects deploy/psmd.toml"; exit 1; }
grep -q '^spin_us = 300$' "$work/effective.toml" &&
  grep -q '^log_level = .debug.$' "$work/effective.toml" ||
  { echo "FAIL: PSMD_OPTIONS did not reach psmd"; cat "$work/effective.toml"; exit 1; }
grep -q '^socket = ./run/psmd/psmd.sock.$' "$work/effective.toml" ||
  { echo "FAIL: shipped socket path is not /run/psmd/psmd.sock"; exit 1; }
grep -q '^ListenStream=/run/psmd/psmd.sock$' deploy/psmd.socket ||
  { echo "FAIL: psmd.socket listens elsewhere than psmd.toml's socket"; exit 1; }
echo PASS
