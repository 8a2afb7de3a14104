#!/usr/bin/env bash
# Tests the install into a prefix (scripts/test.sh counts it as one result):
# scripts/install.sh into a prefix under a temporary destdir: every file in
# place, the installed psmctl, pkg-config, default config and man pages
# work; a re-install keeps an edited config; --uninstall leaves the destdir
# empty but for that edited config, and so it does for a config edited
# since the last install (and says so), while an unedited install leaves
# nothing. The Debian packages have their own test: scripts/test_deb.sh.
# Needs root. Removes everything it made.
set -euo pipefail
cd "$(dirname "$0")/.."
work=$(mktemp -d /tmp/psmd-install-test.XXXXXX)
trap 'rm -rf --one-file-system "$work"' EXIT
t0=$SECONDS
step() { echo "test_install: [$((SECONDS - t0)) s] $*"; }
fail() { echo "test_install: FAILED: $*" >&2; exit 1; }

dest=$work/dest
scripts/install.sh --prefix /opt/psmd --destdir "$dest" >/dev/null 2>&1 ||
  fail "install.sh"
p=$dest/opt/psmd
for f in sbin/psmd bin/psmctl lib/libpsmclient.so.0 lib/libpsmclient.so lib/psmd/libpsm2.so.2.2 \
  lib/psmd/libpsm2.so.2 lib/psmd/libpsm2.so include/psmd/psm2.h \
  include/psmd/psm2_mq.h include/psmd/psm2_am.h lib/pkgconfig/psm2.pc \
  lib/pkgconfig/psmclient.pc lib/systemd/system/psmd.service \
  lib/systemd/system/psmd.socket share/psmd/psmd-fabric.conf etc/psmd/psmd.toml \
  share/man/man8/psmd.8 share/man/man8/psmctl.8 share/man/man5/psmd.toml.5 \
  lib/openmpi/mca_mtl_psmd.so; do
  [[ -e "$p/$f" ]] || fail "install.sh did not install $f"
done
[[ "$(readlink "$p/lib/psmd/libpsm2.so.2")" == libpsm2.so.2.2 ]] || fail "SONAME link"
[[ "$(readlink "$p/lib/libpsmclient.so")" == libpsmclient.so.0 ]] || fail "libpsmclient.so link"
objdump -p "$p/lib/psmd/libpsm2.so.2.2" | grep -q 'SONAME *libpsm2.so.2' || fail "SONAME"
grep -qx 'ExecStart=/opt/psmd/sbin/psmd --config /opt/psmd/etc/psmd/psmd.toml $PSMD_OPTIONS' \
  "$p/lib/systemd/system/psmd.service" || fail "unit's ExecStart not pointed at the prefix"
"$p/sbin/psmd" --check-config --config "$p/etc/psmd/psmd.toml" >/dev/null ||
  fail "the installed default config does not pass --check-config"
for page in psmd.8 psmctl.8 psmd.toml.5; do
  man -l "$p/share/man/man${page##*.}/$page" 2>/dev/null | grep -q 'SEE ALSO' ||
    fail "$page does not render"
done
# An edited config survives a re-install; uninstall leaves it (and only it).
sed -i 's/^spin_us = 200$/spin_us = 300/' "$p/etc/psmd/psmd.toml"
scripts/install.sh --no-build --prefix /opt/psmd --destdir "$dest" >/dev/null 2>&1 ||
  fail "install.sh again"
grep -qx 'spin_us = 300' "$p/etc/psmd/psmd.toml" || fail "re-install overwrote the edited config"
"$p/bin/psmctl" --version | grep -q "^psmctl $(cat VERSION) " || fail "installed psmctl --version"
[[ "$(PKG_CONFIG_PATH=$p/lib/pkgconfig pkg-config --define-prefix --libs psm2)" == *"-L$p/lib/psmd"*"-lpsm2"* ]] ||
  fail "pkg-config psm2"
man -l "$p/share/man/man8/psmctl.8" 2>/dev/null | grep -q 'health' || fail "psmctl(8) does not render"
scripts/install.sh --uninstall --prefix /opt/psmd --destdir "$dest" >/dev/null || fail "--uninstall"
left=$(find "$dest" -mindepth 1 -type f)
[[ "$left" == "$p/etc/psmd/psmd.toml" ]] || fail "--uninstall left: $left (wanted only the edited config)"
rm -- "$p/etc/psmd/psmd.toml"
find "$dest" -mindepth 1 -type d -empty -delete
left=$(find "$dest" -mindepth 1)
[[ -z "$left" ]] || fail "--uninstall left: $left"
# Edited after the last install, with no re-install in between: uninstall
# keeps it too, and says so; an unedited one goes with the rest.
scripts/install.sh --no-build --prefix /opt/psmd --destdir "$dest" >/dev/null 2>&1 ||
  fail "install.sh after uninstall"
scripts/install.sh --uninstall --prefix /opt/psmd --destdir "$dest" >/dev/null || fail "--uninstall"
left=$(find "$dest" -mindepth 1 -type f)
[[ -z "$left" ]] || fail "--uninstall of an unedited install left: $left"
scripts/install.sh --no-build --prefix /opt/psmd --destdir "$dest" >/dev/null 2>&1 ||
  fail "install.sh after uninstall"
sed -i 's/^spin_us = 200$/spin_us = 400/' "$p/etc/psmd/psmd.toml"
said=$(scripts/install.sh --uninstall --prefix /opt/psmd --destdir "$dest" 2>&1 >/dev/null) ||
  fail "--uninstall"
grep -qx 'spin_us = 400' "$p/etc/psmd/psmd.toml" 2>/dev/null ||
  fail "--uninstall removed the config edited since the install"
[[ "$said" == *"keeping the edited $p/etc/psmd/psmd.toml"* ]] ||
  fail "--uninstall did not say it kept the edited config (said: $said)"
left=$(find "$dest" -mindepth 1 -type f)
[[ "$left" == "$p/etc/psmd/psmd.toml" ]] || fail "--uninstall left: $left (wanted only the edited config)"
rm -- "$p/etc/psmd/psmd.toml"
find "$dest" -mindepth 1 -type d -empty -delete
step "prefix install and uninstall: ok"
