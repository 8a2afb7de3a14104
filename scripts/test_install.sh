#!/usr/bin/env bash
# Tests the install (scripts/test.sh counts it as one result):
#  1. scripts/install.sh into a prefix under a temporary destdir: every file
#     in place, the installed psmctl, pkg-config, default config and man
#     pages work; a re-install keeps an edited config; --uninstall leaves
#     the destdir empty but for that edited config, and so it does for a
#     config edited since the last install (and says so), while an unedited
#     install leaves nothing.
#  2. The .deb (scripts/build_deb.sh) in a clean Debian 12 root: dpkg -i,
#     apt-get -f install for its dependencies, an edited conffile kept by a
#     second dpkg -i, psmd started as its unit
#     starts it (PID 1 is not systemd here: the unit's ExecStart, in its
#     RuntimeDirectory), psmctl stats and health answer, SIGTERM stops it,
#     dpkg --purge leaves nothing named *psm* anywhere in the root.
# The clean root is debootstrap --variant=minbase bookworm (about 3.5 min);
# the first run keeps a tarball of it, untouched, in $PSMD_CLEAN_ROOT_CACHE
# (default /var/cache/psmd-test) and later runs unpack a fresh copy (seconds).
# Needs root, debootstrap and the Debian mirror apt uses. Removes its chroot
# and everything else it made.
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$(pwd)
cache_dir=${PSMD_CLEAN_ROOT_CACHE:-/var/cache/psmd-test}
work=$(mktemp -d /tmp/psmd-install-test.XXXXXX)
psmd_pid=
cleanup() {
  if [[ -n "$psmd_pid" ]] && kill -0 "$psmd_pid" 2>/dev/null; then
    kill -KILL "$psmd_pid" 2>/dev/null || true
    wait "$psmd_pid" 2>/dev/null || true
  fi
  if mountpoint -q "$work/root/proc" 2>/dev/null; then umount "$work/root/proc"; fi
  rm -rf --one-file-system "$work"
}
trap cleanup EXIT
t0=$SECONDS
step() { echo "test_install: [$((SECONDS - t0)) s] $*"; }
fail() { echo "test_install: FAILED: $*" >&2; exit 1; }

# ---- 1. prefix install and uninstall ----
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

# ---- 2. the .deb in a clean root ----
deb=$(scripts/build_deb.sh "$work/deb") || fail "build_deb.sh"
step "built $(basename "$deb"): $(dpkg-deb -f "$deb" Depends)"
root=$work/root
tarball=$cache_dir/bookworm-minbase.tar.gz
mkdir -p "$root"
if [[ -f "$tarball" ]]; then
  tar -C "$root" -xzf "$tarball" || fail "unpacking $tarball"
  step "clean root unpacked from $tarball"
else
  mirror=$(scripts/debian_archive.sh) || fail "no Debian archive in apt's sources"
  debootstrap --variant=minbase bookworm "$root" "$mirror" \
    >"$work/debootstrap.log" 2>&1 || { tail -5 "$work/debootstrap.log"; fail "debootstrap"; }
  mkdir -p "$cache_dir"
  tar -C "$root" -czf "$tarball.tmp" . && mv "$tarball.tmp" "$tarball"
  step "clean root made by debootstrap (kept in $tarball)"
fi
cp /etc/resolv.conf "$root/etc/resolv.conf"
mount -t proc proc "$root/proc"
in_root_argv=(chroot "$root" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin)
in_root() { "${in_root_argv[@]}" "$@"; }
cp "$deb" "$root/tmp/psmd.deb"
in_root dpkg -i /tmp/psmd.deb >"$work/dpkg.log" 2>&1 || true  # dependencies missing
in_root apt-get update -qq >/dev/null 2>&1 || fail "apt-get update in the clean root"
in_root env DEBIAN_FRONTEND=noninteractive apt-get -f install -y -qq >"$work/apt.log" 2>&1 ||
  { tail -5 "$work/apt.log"; fail "apt-get -f install"; }
in_root dpkg-query -W -f='${Status}' psmd | grep -q "install ok installed" ||
  fail "psmd not installed after apt-get -f install"
[[ -e "$root/usr/lib/systemd/system/psmd.socket" && -e "$root/etc/psmd/psmd.toml" ]] ||
  fail "the .deb lacks psmd.socket or /etc/psmd/psmd.toml"
in_root dpkg-query -W -f='${Conffiles}' psmd | grep -q '^ /etc/psmd/psmd.toml ' ||
  fail "/etc/psmd/psmd.toml is not a conffile"
# dpkg keeps an edited conffile when the package is installed again.
sed -i 's/^spin_us = 200$/spin_us = 300/' "$root/etc/psmd/psmd.toml"
in_root dpkg -i /tmp/psmd.deb >"$work/dpkg.log" 2>&1 || { tail -5 "$work/dpkg.log"; fail "dpkg -i again"; }
grep -qx 'spin_us = 300' "$root/etc/psmd/psmd.toml" || fail "dpkg -i overwrote the edited config"
rm -f "$root/tmp/psmd.deb"
step "dpkg -i + apt-get -f install: ok; the edited conffile survived a re-install"

# Start it as systemd would: RuntimeDirectory=psmd, then ExecStart.
unit=$root/usr/lib/systemd/system/psmd.service
exec_start=$(sed -n 's/^ExecStart=//p' "$unit")
[[ "$exec_start" == /usr/sbin/psmd* ]] || fail "unit's ExecStart: $exec_start"
# No /etc/default/psmd here: systemd expands $PSMD_OPTIONS to nothing.
exec_start=${exec_start% \$PSMD_OPTIONS}
mkdir -m 0755 "$root/run/psmd"
# Not through the in_root function: $! must be psmd itself (chroot and env
# exec it), so that SIGTERM reaches it.
# shellcheck disable=SC2086  # ExecStart is a command line
"${in_root_argv[@]}" $exec_start >"$work/psmd.log" 2>&1 &
psmd_pid=$!
for _ in $(seq 100); do
  [[ -S "$root/run/psmd/psmd.sock" ]] && break
  sleep 0.1
done
[[ -S "$root/run/psmd/psmd.sock" ]] || { cat "$work/psmd.log"; fail "psmd did not open its socket"; }
stats=$(in_root psmctl stats) || fail "psmctl stats"
[[ "$stats" == "psmd up "* && "$stats" == *msgs_sent* ]] || fail "psmctl stats said: $stats"
in_root psmctl health >/dev/null || fail "psmctl health"
in_root psmctl config | grep -qx 'spin_us = 300' || fail "psmd did not read /etc/psmd/psmd.toml"
kill -TERM "$psmd_pid"
wait "$psmd_pid" || fail "psmd did not exit 0 on SIGTERM"
psmd_pid=
[[ ! -e "$root/run/psmd/psmd.sock" ]] || fail "psmd left its socket"
rmdir "$root/run/psmd"  # systemd removes the RuntimeDirectory on stop
step "psmd started from the unit's ExecStart with the edited config; psmctl stats, health and config answered"

in_root dpkg --purge psmd >/dev/null || fail "dpkg --purge psmd"
# Whatever is still named *psm* must belong to another package: the
# dependencies (Open MPI pulls in Intel's libpsm2-2 and libpsm-infinipath1)
# stay, with apt's cache of them and their alternatives links.
left=()
while IFS= read -r f; do
  case "$f" in
    /var/cache/apt/archives/*|/etc/alternatives/*|/var/lib/dpkg/alternatives/*)
      continue ;;
  esac
  # a link that update-alternatives manages for another package
  [[ "$(readlink "$root$f")" == /etc/alternatives/* ]] && continue
  in_root dpkg -S "$f" >/dev/null 2>&1 && continue
  [[ "$f" == /var/lib/dpkg/info/* ]] && in_root dpkg -s \
    "$(basename "${f%.*}" | cut -d: -f1)" >/dev/null 2>&1 && continue
  left+=("$f")
done < <(find "$root" -xdev -iname '*psm*' | sed "s|^$root||")
umount "$root/proc"
((${#left[@]} == 0)) || fail "left behind after purge: ${left[*]}"
step "dpkg --purge: nothing left"
