#!/usr/bin/env bash
# Tests psmd's Debian packages (scripts/test.sh counts it as one result):
#  1. scripts/build_deb.sh builds them (dpkg-buildpackage: debhelper packs
#     what Bazel built with -c opt).
#  2. lintian on the build's .changes (every .deb and the .buildinfo):
#     no error, no warning.
#  3. The split: each package holds exactly the files listed below
#     (dpkg-deb -c; /usr/share/doc aside, where each has its copyright);
#     ELF files are stripped and each -dbgsym package holds their debug
#     info (one .debug file per ELF file, matched by build id).
#  4. libpsmclient0: SONAME libpsmclient.so.0 (readelf -d), its symbols
#     file; no ELF file of any package has an RPATH or RUNPATH; the drop-in
#     keeps SONAME libpsm2.so.2; psmd-openmpi depends on the Open MPI
#     release it was built against and its component sits where
#     `ompi_info --path pkglibdir` says; psmd-slurm (the SPANK plugin in
#     Slurm's plugin directory, psmd-slurm-nodes and psmd-epilog in
#     /usr/lib/psmd) depends on the Slurm release series it was built for.
#  5. libpsmclient-dev: psmclient.pc names no rpath; a program built with
#     `pkg-config --cflags --libs psmclient` against the unpacked packages
#     (dpkg -x) needs libpsmclient.so.0 and opens an endpoint on the
#     unpacked psmd (which starts with its packaged config).
#  6. A clean Debian 12 root (chroot): dpkg -i psmd + apt-get -f install
#     pulls no Open MPI; then the other packages; dh_installsystemd's
#     maintainer scripts enabled both units; ldconfig knows
#     libpsmclient.so.0 and not the drop-in; an edited conffile survives a
#     re-install; psmd started as its unit starts it serves psmctl stats,
#     health and config (the edited one), and is handed over in place by
#     the package's upgrade (postinst: psmctl upgrade); dpkg --purge of every package
#     leaves nothing named *psm* and no unit links.
# The clean root is scripts/clean_root.sh's (cached after the first run).
# With PSMD_DEBS_OUT=DIR the packages built are copied to DIR (for
# scripts/test_systemd.sh).
# Needs root, the build dependencies, lintian, debootstrap and the Debian
# mirror apt uses. Removes everything it made.
set -euo pipefail
# In "CMD | grep -c PATTERN >/dev/null" grep reads all of CMD's output (with
# -q it would stop at the first match and CMD could die of SIGPIPE, which
# pipefail reports as no match).
cd "$(dirname "$0")/.."
source scripts/clean_root.sh
work=$(mktemp -d /tmp/psmd-deb-test.XXXXXX)
pids=()
cleanup() {
  local p
  for p in "${pids[@]}"; do
    if kill -0 "$p" 2>/dev/null; then
      kill -KILL "$p" 2>/dev/null || true
      wait "$p" 2>/dev/null || true
    fi
  done
  if mountpoint -q "$work/root/proc" 2>/dev/null; then umount "$work/root/proc"; fi
  rm -rf --one-file-system "$work"
}
trap cleanup EXIT
t0=$SECONDS
step() { echo "test_deb: [$((SECONDS - t0)) s] $*"; }
fail() { echo "test_deb: FAILED: $*" >&2; exit 1; }

version=$(dpkg-parsechangelog -S Version)
arch=$(dpkg --print-architecture)
ma=$(dpkg-architecture -qDEB_HOST_MULTIARCH)
lib=/usr/lib/$ma
packages=(psmd libpsmclient0 libpsmclient-dev psmd-openmpi psmd-libpsm2 psmd-slurm)
elf_packages=(psmd libpsmclient0 psmd-openmpi psmd-libpsm2 psmd-slurm)  # each with a -dbgsym
[[ "$version" == "$(cat VERSION)" ]] || fail "debian/changelog says $version, VERSION $(cat VERSION)"

# ---- 1. build ----
out=$work/out
before=$(find debian | sort)
scripts/build_deb.sh "$out" >/dev/null || fail "build_deb.sh"
deb() { echo "$out/${1}_${version}_${arch}.deb"; }
for p in "${packages[@]}" "${elf_packages[@]/%/-dbgsym}"; do
  [[ -f "$(deb "$p")" ]] || fail "no package $p"
done
[[ "$(ls "$out"/*.deb | wc -l)" == $((${#packages[@]} + ${#elf_packages[@]})) ]] ||
  fail "more packages than expected: $(ls "$out"/*.deb)"
[[ "$(find debian | sort)" == "$before" ]] ||
  fail "the build left files in debian/: $(comm -13 <(echo "$before") <(find debian | sort) | head -5)"
step "built $(ls "$out"/*.deb | wc -l) packages"
if [[ -n "${PSMD_DEBS_OUT:-}" ]]; then cp "$out"/*.deb "$PSMD_DEBS_OUT"/; fi

# ---- 2. lintian ----
# lintian leaves its mldbm-elf-* databases in TMPDIR: give it the work
# directory, which the EXIT trap removes.
if ! TMPDIR="$work" lintian --fail-on error,warning --display-info --tag-display-limit 0 \
  "$out/psmd_${version}_${arch}.changes" >"$work/lintian.log" 2>&1; then
  cat "$work/lintian.log" >&2
  fail "lintian"
fi
grep -q '^[EW]: ' "$work/lintian.log" && { cat "$work/lintian.log" >&2; fail "lintian"; }
step "lintian: no error, no warning ($(grep -c '^[IPX]: ' "$work/lintian.log" || true) info tags)"

# ---- 3. the split ----
# files FILE.deb: its files and links ("PATH" or "PATH -> TARGET"), no
# directories, nothing under /usr/share/doc.
files() {
  dpkg-deb -c "$1" | awk '$1 !~ /^d/ { $1 = $2 = $3 = $4 = $5 = ""; sub(/^ +/, ""); print }' |
    sed 's|^\./|/|' | grep -v '^/usr/share/doc/' | sort
}
want() {  # want PACKAGE: the files it must hold, one a line
  case $1 in
    psmd) printf '%s\n' /etc/psmd/psmd.toml /lib/systemd/system/psmd.service \
      /lib/systemd/system/psmd.socket /usr/bin/psmctl /usr/sbin/psmd \
      /usr/share/man/man5/psmd.toml.5.gz /usr/share/man/man8/psmctl.8.gz \
      /usr/share/man/man8/psmd.8.gz /usr/share/psmd/psmd-fabric.conf ;;
    libpsmclient0) printf '%s\n' "$lib/libpsmclient.so.0 -> libpsmclient.so.$version" \
      "$lib/libpsmclient.so.$version" ;;
    libpsmclient-dev) printf '%s\n' /usr/include/psmd/psm2.h /usr/include/psmd/psm2_am.h \
      /usr/include/psmd/psm2_mq.h "$lib/libpsmclient.so -> libpsmclient.so.0" \
      "$lib/pkgconfig/psmclient.pc" ;;
    psmd-openmpi) echo "$lib/openmpi/lib/openmpi3/mca_mtl_psmd.so" ;;
    psmd-libpsm2) echo "$lib/psmd/libpsm2.so.2" ;;
    psmd-slurm) printf '%s\n' "$lib/slurm-wlm/psmd_spank.so" /usr/lib/psmd/psmd-epilog \
      /usr/lib/psmd/psmd-slurm-nodes ;;
  esac
}
for p in "${packages[@]}"; do
  got=$(files "$(deb "$p")")
  [[ "$got" == "$(want "$p" | sort)" ]] ||
    fail "$p holds: $(diff <(want "$p" | sort) <(echo "$got") | grep '^[<>]' | tr '\n' ' ')"
  [[ "$(dpkg-deb -c "$(deb "$p")")"$'\n' == *" ./usr/share/doc/$p/copyright"$'\n'* ]] ||
    fail "$p has no copyright"
done
# Unpacked, each in a directory of its own and all together in $x.
x=$work/x
for p in "${packages[@]}" "${elf_packages[@]/%/-dbgsym}"; do
  mkdir -p "$work/pkg/$p"
  dpkg -x "$(deb "$p")" "$work/pkg/$p"
  dpkg -x "$(deb "$p")" "$x"
done
for p in "${elf_packages[@]}"; do
  elves=0
  while IFS= read -r f; do
    file -b "$f" | grep -c '^ELF' >/dev/null || continue
    elves=$((elves + 1))
    readelf -S "$f" | grep -c '\.debug_info' >/dev/null && fail "$p: ${f#"$work/pkg/$p"} is not stripped"
    readelf -d "$f" | grep -cE '\((RPATH|RUNPATH)\)' >/dev/null && fail "$p: ${f#"$work/pkg/$p"} has an rpath"
    id=$(readelf -n "$f" | sed -n 's/^ *Build ID: //p')
    dbg=$work/pkg/$p-dbgsym/usr/lib/debug/.build-id/${id:0:2}/${id:2}.debug
    readelf -S "$dbg" 2>/dev/null | grep -c '\.debug_info' >/dev/null ||
      fail "$p-dbgsym has no debug info for ${f#"$work/pkg/$p"}"
  done < <(find "$work/pkg/$p" -type f)
  ((elves > 0)) || fail "$p: no ELF file"
  # (dh_dwz may add one file of what they share, under .dwz/)
  [[ "$(find "$work/pkg/$p-dbgsym/usr/lib/debug/.build-id" -name '*.debug' | wc -l)" == "$elves" ]] ||
    fail "$p-dbgsym: not one .debug file per ELF file of $p"
done
step "split: every file in its package; stripped, debug info in the -dbgsym packages"

# ---- 4. libraries and dependencies ----
soname() { readelf -d "$1" | sed -n 's/.*(SONAME).*\[\(.*\)\]/\1/p'; }
[[ "$(soname "$x$lib/libpsmclient.so.$version")" == libpsmclient.so.0 ]] ||
  fail "libpsmclient's SONAME is $(soname "$x$lib/libpsmclient.so.$version")"
[[ "$(soname "$x$lib/psmd/libpsm2.so.2")" == libpsm2.so.2 ]] || fail "the drop-in's SONAME"
dpkg-deb -I "$(deb libpsmclient0)" symbols | grep -c '^ psm2_mq_irecv2@PSM2_1.0 ' >/dev/null ||
  fail "libpsmclient0 has no symbols file"
dpkg-deb -I "$(deb libpsmclient0)" triggers | grep -c 'ldconfig' >/dev/null || fail "libpsmclient0: no ldconfig trigger"
dpkg-deb -I "$(deb psmd-libpsm2)" 2>/dev/null | grep -cE ' (shlibs|symbols|triggers)$' >/dev/null &&
  fail "psmd-libpsm2 declares its private library to the loader or to dpkg-shlibdeps"
ompi=$(dpkg-query -W -f='${Version}' libopenmpi-dev | sed 's/-[^-]*$//')
dpkg-deb -f "$(deb psmd-openmpi)" Depends | grep -c "libopenmpi3 (>= $ompi), libopenmpi3 (<< " >/dev/null ||
  fail "psmd-openmpi does not depend on Open MPI $ompi: $(dpkg-deb -f "$(deb psmd-openmpi)" Depends)"
[[ "$(ompi_info --parsable --path pkglibdir | sed -n 's/^path:pkglibdir://p')" == "$lib/openmpi/lib/openmpi3" ]] ||
  fail "Open MPI's component directory is not $lib/openmpi/lib/openmpi3"
# The SPANK plugin: Slurm loads only plugins of its own X.YY release.
slurm=$(dpkg-query -W -f='${Version}' libslurm-dev | sed 's/^[0-9]*://' | cut -d. -f1,2)
dpkg-deb -f "$(deb psmd-slurm)" Depends | grep -c "slurmd (>= $slurm), slurmd (<< " >/dev/null ||
  fail "psmd-slurm does not depend on Slurm $slurm: $(dpkg-deb -f "$(deb psmd-slurm)" Depends)"
[[ $(dpkg-deb --fsys-tarfile "$(deb psmd-slurm)" | tar -tvf - ./usr/lib/psmd/psmd-epilog) == -rwxr-xr-x* ]] ||
  fail "psmd-slurm: psmd-epilog is not executable"
dpkg-deb -f "$(deb psmd)" Depends | grep -cE 'openmpi|libpsm|slurm' >/dev/null &&
  fail "psmd depends on Open MPI or libpsm: $(dpkg-deb -f "$(deb psmd)" Depends)"
step "SONAME libpsmclient.so.0 with symbols file, no rpath, dependencies per package"

# ---- 5. the -dev package builds a program; the unpacked psmd serves it ----
pc=$x$lib/pkgconfig/psmclient.pc
grep -qi 'rpath' "$pc" && fail "psmclient.pc names an rpath: $(grep -i rpath "$pc")"
pkgconf() { PKG_CONFIG_LIBDIR=$x$lib/pkgconfig PKG_CONFIG_SYSROOT_DIR=$x pkg-config "$@"; }
[[ "$(pkgconf --modversion psmclient)" == "$version" ]] || fail "pkg-config --modversion psmclient"
cat >"$work/hello.c" <<'EOF'
#include <psm2.h>
#include <stdio.h>
#include <string.h>
int main(void) {
  int major = PSM2_VERNO_MAJOR, minor = PSM2_VERNO_MINOR;
  psm2_uuid_t key;
  psm2_ep_t ep;
  psm2_epid_t epid;
  memset(key, 7, sizeof key);
  if (psm2_init(&major, &minor) != PSM2_OK) return 1;
  if (psm2_ep_open(key, NULL, &ep, &epid) != PSM2_OK) return 2;
  printf("epid %llx\n", (unsigned long long)epid);
  if (psm2_ep_close(ep, PSM2_EP_CLOSE_GRACEFUL, 0) != PSM2_OK) return 3;
  return psm2_finalize() == PSM2_OK ? 0 : 4;
}
EOF
# shellcheck disable=SC2046  # pkg-config prints several flags
gcc -o "$work/hello" "$work/hello.c" $(pkgconf --cflags --libs psmclient) ||
  fail "a program does not build with pkg-config psmclient"
readelf -d "$work/hello" | grep -c 'NEEDED.*\[libpsmclient.so.0\]' >/dev/null || fail "the program does not need libpsmclient.so.0"
"$x/usr/sbin/psmd" --version | grep -c "^psmd $version " >/dev/null || fail "the unpacked psmd --version"
sock=$work/psmd.sock
"$x/usr/sbin/psmd" --config "$x/etc/psmd/psmd.toml" --socket "$sock" --log-level warn \
  >"$work/psmd-x.log" 2>&1 &
pids+=($!)
for _ in $(seq 100); do [[ -S "$sock" ]] && break; sleep 0.1; done
[[ -S "$sock" ]] || { cat "$work/psmd-x.log"; fail "the unpacked psmd did not open its socket"; }
PSMD_SOCKET=$sock LD_LIBRARY_PATH=$x$lib "$work/hello" >"$work/hello.out" 2>&1 ||
  { cat "$work/hello.out"; fail "the program built against libpsmclient-dev did not open an endpoint"; }
kill -TERM "${pids[-1]}"
wait "${pids[-1]}" || fail "the unpacked psmd did not exit 0 on SIGTERM"
step "the unpacked psmd started; a program built with pkg-config psmclient opened an endpoint on it"

# ---- 6. a clean Debian 12 root ----
root=$work/root
made=$(make_clean_root "$root" "$work/debootstrap.log") || fail "$made"
step "$made"
cp /etc/resolv.conf "$root/etc/resolv.conf"
mount -t proc proc "$root/proc"
in_root_argv=(chroot "$root" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin)
in_root() { "${in_root_argv[@]}" "$@"; }
mkdir "$root/tmp/debs"
for p in "${packages[@]}"; do cp "$(deb "$p")" "$root/tmp/debs/$p.deb"; done
# dpkg -i PACKAGE..., then apt-get -f install for their dependencies.
install_debs() {
  in_root dpkg -i "${@/#//tmp/debs/}" >"$work/dpkg.log" 2>&1 || true  # dependencies missing
  in_root env DEBIAN_FRONTEND=noninteractive apt-get -f install -y -qq >"$work/apt.log" 2>&1 ||
    { tail -5 "$work/apt.log"; fail "apt-get -f install after dpkg -i $*"; }
  local p
  for p in "${@%.deb}"; do
    in_root dpkg-query -W -f='${Status}' "$p" | grep -c "install ok installed" >/dev/null ||
      fail "$p not installed after apt-get -f install"
  done
}
in_root apt-get update -qq >/dev/null 2>&1 || fail "apt-get update in the clean root"
install_debs psmd.deb
in_root dpkg-query -W -f='${Status}' libopenmpi3 2>/dev/null | grep -c "install ok installed" >/dev/null &&
  fail "installing psmd alone pulled in Open MPI"
# (psmd-slurm is not installed here: it pulls in slurmd, munge and their
# services; the Slurm test cluster runs what it ships.)
install_debs libpsmclient0.deb libpsmclient-dev.deb psmd-openmpi.deb psmd-libpsm2.deb
step "dpkg -i + apt-get -f install: psmd alone without Open MPI, then the other packages"
for link in multi-user.target.wants/psmd.service sockets.target.wants/psmd.socket; do
  [[ -L "$root/etc/systemd/system/$link" ]] || fail "the maintainer scripts did not enable $link"
done
# (on a merged-/usr root ldconfig may name /lib/$ma for /usr/lib/$ma)
in_root ldconfig -p | grep -cE "libpsmclient.so.0 \(.*\) => (/usr)?/lib/$ma/libpsmclient.so.0$" >/dev/null ||
  fail "ldconfig does not know libpsmclient.so.0"
in_root ldconfig -p | grep -c "/lib/$ma/psmd/" >/dev/null && fail "the drop-in libpsm2.so.2 is on the loader's path"
in_root dpkg-query -W -f='${Conffiles}' psmd | grep -c '^ /etc/psmd/psmd.toml ' >/dev/null ||
  fail "/etc/psmd/psmd.toml is not a conffile"
# dpkg keeps an edited conffile when the package is installed again.
sed -i 's/^spin_us = 200$/spin_us = 300/' "$root/etc/psmd/psmd.toml"
in_root dpkg -i /tmp/debs/psmd.deb >"$work/dpkg.log" 2>&1 || { tail -5 "$work/dpkg.log"; fail "dpkg -i again"; }
grep -qx 'spin_us = 300' "$root/etc/psmd/psmd.toml" || fail "dpkg -i overwrote the edited config"
rm -rf "$root/tmp/debs"
step "units enabled, libpsmclient.so.0 known to ldconfig (the drop-in not), edited conffile kept"

# Start it as systemd would: RuntimeDirectory=psmd, then ExecStart.
unit=$root/lib/systemd/system/psmd.service
exec_start=$(sed -n 's/^ExecStart=//p' "$unit")
[[ "$exec_start" == /usr/sbin/psmd* ]] || fail "unit's ExecStart: $exec_start"
# No /etc/default/psmd here: systemd expands $PSMD_OPTIONS to nothing.
exec_start=${exec_start% \$PSMD_OPTIONS}
mkdir -m 0755 "$root/run/psmd"
# Not through the in_root function: $! must be psmd itself (chroot and env
# exec it), so that SIGTERM reaches it.
# shellcheck disable=SC2086  # ExecStart is a command line
"${in_root_argv[@]}" $exec_start >"$work/psmd.log" 2>&1 &
pids+=($!)
for _ in $(seq 100); do
  [[ -S "$root/run/psmd/psmd.sock" ]] && break
  sleep 0.1
done
[[ -S "$root/run/psmd/psmd.sock" ]] || { cat "$work/psmd.log"; fail "psmd did not open its socket"; }
stats=$(in_root psmctl stats) || fail "psmctl stats"
[[ "$stats" == "psmd up "* && "$stats" == *msgs_sent* ]] || fail "psmctl stats said: $stats"
in_root psmctl health >/dev/null || fail "psmctl health"
in_root psmctl config | grep -cx 'spin_us = 300' >/dev/null || fail "psmd did not read /etc/psmd/psmd.toml"
# An upgrade (the same package again, as dpkg calls postinst configure with
# the installed version) hands the running psmd over in place.
mkdir "$root/tmp/debs"
cp "$(deb psmd)" "$root/tmp/debs/psmd.deb"
in_root dpkg -i /tmp/debs/psmd.deb >"$work/dpkg.log" 2>&1 || { tail -5 "$work/dpkg.log"; fail "dpkg -i under a running psmd"; }
rm -rf "$root/tmp/debs"
grep -q "endpoints carried over" "$work/dpkg.log" || { cat "$work/dpkg.log"; fail "the upgrade did not hand psmd over"; }
in_root psmctl health --json | grep -c '"generation": 1' >/dev/null || fail "psmd's generation is not 1 after the upgrade"
kill -TERM "${pids[-1]}"
wait "${pids[-1]}" || fail "psmd did not exit 0 on SIGTERM"
[[ ! -e "$root/run/psmd/psmd.sock" ]] || fail "psmd left its socket"
rmdir "$root/run/psmd"  # systemd removes the RuntimeDirectory on stop
step "psmd started from the unit's ExecStart with the edited config; psmctl stats, health and config answered; an upgrade handed it over"

in_root dpkg --purge "${packages[@]}" >/dev/null || fail "dpkg --purge"
[[ -z "$(find "$root/etc/systemd/system" -name 'psmd.*')" ]] ||
  fail "unit links left after purge: $(find "$root/etc/systemd/system" -name 'psmd.*')"
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
