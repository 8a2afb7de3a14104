# Sourced by scripts/test_deb.sh and scripts/test_systemd.sh: a clean Debian
# 12 root, debootstrap --variant=minbase bookworm from the archive apt uses
# (about 3.5 min). The first run keeps a tarball of it, untouched, in
# $PSMD_CLEAN_ROOT_CACHE (default /var/cache/psmd-test); later runs unpack a
# fresh copy (seconds).
#
#   make_clean_root DIR LOG   -> DIR holds the root; prints what it did
make_clean_root() {
  local root=$1 log=$2 cache_dir=${PSMD_CLEAN_ROOT_CACHE:-/var/cache/psmd-test}
  local tarball=$cache_dir/bookworm-minbase.tar.gz mirror
  mkdir -p "$root"
  if [[ -f "$tarball" ]]; then
    tar -C "$root" -xzf "$tarball" || { echo "unpacking $tarball failed"; return 1; }
    echo "clean root unpacked from $tarball"
    return 0
  fi
  mirror=$(scripts/debian_archive.sh) || return 1
  debootstrap --variant=minbase bookworm "$root" "$mirror" >"$log" 2>&1 ||
    { tail -5 "$log"; echo "debootstrap failed"; return 1; }
  mkdir -p "$cache_dir"
  tar -C "$root" -czf "$tarball.tmp" . && mv "$tarball.tmp" "$tarball"
  echo "clean root made by debootstrap (kept in $tarball)"
}
