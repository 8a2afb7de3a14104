#!/usr/bin/env bash
# Builds the Debian package of psmd from what scripts/install.sh installs
# under /usr, with its runtime dependencies found by dpkg-shlibdeps.
#
#   scripts/build_deb.sh OUTDIR      -> OUTDIR/psmd_<version>_<arch>.deb
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:?usage: build_deb.sh OUTDIR}
mkdir -p "$out"
out=$(cd "$out" && pwd)

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
stage=$work/stage
scripts/install.sh --prefix /usr --destdir "$stage" >/dev/null
# dpkg keeps its own list of the package's files.
rm -rf "$stage/usr/share/psmd"

# dpkg-shlibdeps wants a debian/control to read; it only needs the names.
mkdir -p "$work/src/debian"
printf 'Source: psmd\n\nPackage: psmd\nArchitecture: any\n' > "$work/src/debian/control"
elves=()
while IFS= read -r f; do
  file -b "$f" | grep -q '^ELF' && elves+=("$f")
done < <(find "$stage" -type f)
depends=$(cd "$work/src" && dpkg-shlibdeps -O "${elves[@]}" 2>/dev/null |
  sed -n 's/^shlibs:Depends=//p')
[[ -n "$depends" ]] || { echo "build_deb.sh: dpkg-shlibdeps found no dependencies" >&2; exit 1; }

version=$(cat VERSION)
arch=$(dpkg --print-architecture)
mkdir -p "$stage/DEBIAN"
cat > "$stage/DEBIAN/control" <<EOF
Package: psmd
Version: $version
Architecture: $arch
Maintainer: psmd maintainers <root@localhost>
Section: net
Priority: optional
Installed-Size: $(du -sk --exclude=DEBIAN "$stage" | cut -f1)
Depends: $depends
Description: node-level PSM2 messaging daemon
 psmd serves the PSM2 API (matched queues, active messages) to the
 processes of a node through shared memory; applications link
 libpsmclient or the drop-in libpsm2.so.2 (in /usr/lib/psmd). Includes
 psmctl, headers, pkg-config files, the systemd unit and man pages.
EOF
# dpkg keeps an administrator's edits to it on upgrade.
echo /etc/psmd/psmd.toml > "$stage/DEBIAN/conffiles"
# libpsmclient.so lands in /usr/lib: refresh the loader's cache.
echo "activate-noawait ldconfig" > "$stage/DEBIAN/triggers"
deb=$out/psmd_${version}_${arch}.deb
dpkg-deb --root-owner-group --build "$stage" "$deb" >/dev/null
echo "$deb"
