#!/usr/bin/env bash
# Builds psmd's Debian packages from debian/ (debhelper; Bazel builds the
# binaries offline, -c opt) and writes them, with the .buildinfo and
# .changes of the build, to OUTDIR; prints the path of each .deb.
#
#   scripts/build_deb.sh OUTDIR
#     -> OUTDIR/psmd_<version>_<arch>.deb, libpsmclient0_..., libpsmclient-dev_...,
#        psmd-openmpi_..., psmd-libpsm2_... and their -dbgsym .debs
#
# Needs the build dependencies of debian/control (scripts/deps.sh installs
# them). The tree is left as it was (dpkg-buildpackage --post-clean);
# Bazel's outputs stay in its cache, so a second build is quick.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:?usage: build_deb.sh OUTDIR}
mkdir -p "$out"
out=$(cd "$out" && pwd)
version=$(dpkg-parsechangelog -S Version)
arch=$(dpkg --print-architecture)
log=$out/build.log
# dpkg writes the packages, .buildinfo and .changes to the parent directory
# unless told otherwise: all of them go to OUTDIR.
if ! PSMD_DEB_OUTDIR=$out dpkg-buildpackage -b --no-sign --post-clean \
  --buildinfo-option="-u$out" --buildinfo-file="$out/psmd_${version}_${arch}.buildinfo" \
  --changes-option="-u$out" --changes-file="$out/psmd_${version}_${arch}.changes" \
  >"$log" 2>&1; then
  tail -30 "$log" >&2
  echo "build_deb.sh: dpkg-buildpackage failed (whole log: $log)" >&2
  exit 1
fi
ls "$out"/*_"${version}"_*.deb
