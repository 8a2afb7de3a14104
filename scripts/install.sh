#!/usr/bin/env bash
# Installs psmd (builds it first) or removes what an earlier run installed.
#
#   scripts/install.sh [--prefix P] [--destdir D] [--sysconfdir S] [--no-build]
#   scripts/install.sh --uninstall [--prefix P] [--destdir D]
#
# Installs, under D (default: none) + P (default /usr/local):
#   sbin/psmd, bin/psmctl
#   lib/libpsmclient.so.0, lib/libpsmclient.so -> .so.0
#                                          (its SONAME is libpsmclient.so.0)
#   lib/psmd/libpsm2.so.2 -> libpsm2.so.2.2, lib/psmd/libpsm2.so -> .so.2
#                                          the drop-in, in a directory of its
#                                          own so that it never shadows
#                                          Intel's libpsm2 unless asked to
#                                          (LD_LIBRARY_PATH=P/lib/psmd)
#   include/psmd/psm2*.h                   (beside, not over, libpsm2-dev's)
#   Open MPI's mtl psmd component, mca_mtl_psmd.so: for P=/usr in Open
#                                          MPI's own component directory
#                                          (ompi_info --path pkglibdir), so
#                                          that mpirun finds it unasked;
#                                          else P/lib/openmpi (name it with
#                                          OMPI_MCA_mca_base_component_path)
#   lib/pkgconfig/psmclient.pc, psm2.pc    (psm2.pc points at the drop-in)
#   lib/systemd/system/psmd.service        (ExecStart pointed at P/sbin/psmd
#                                          and S/psmd/psmd.toml)
#   lib/systemd/system/psmd.socket
#   share/psmd/psmd-fabric.conf            drop-in for psmd.service on a node
#                                          on the fabric (inet, io_uring)
#   S/psmd/psmd.toml                       the defaults (S: /etc for P=/usr,
#                                          else P/etc); an existing file that
#                                          differs is kept, never overwritten
#   share/man/man5/psmd.toml.5, man8/psmd.8, man8/psmctl.8   (from scdoc)
#   share/doc/psmd/                        README.md, docs/*.md
#   share/psmd/install-manifest            what --uninstall removes
# --uninstall removes exactly the files in the manifest and the directories
# this install created (when they are empty again), and nothing else; the
# config only while it is still what was installed (the manifest keeps its
# SHA-256, as dpkg does for a conffile): an edited one is kept, and said so.
set -euo pipefail
cd "$(dirname "$0")/.."

prefix=/usr/local
destdir=
sysconfdir=
build=1
uninstall=0
while (($# > 0)); do
  case "$1" in
    --prefix) prefix=$2; shift 2 ;;
    --prefix=*) prefix=${1#*=}; shift ;;
    --destdir) destdir=$2; shift 2 ;;
    --destdir=*) destdir=${1#*=}; shift ;;
    --sysconfdir) sysconfdir=$2; shift 2 ;;
    --sysconfdir=*) sysconfdir=${1#*=}; shift ;;
    --no-build) build=0; shift ;;
    --uninstall) uninstall=1; shift ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "install.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
[[ "$prefix" == /* ]] || { echo "install.sh: --prefix must be absolute" >&2; exit 2; }
if [[ -z "$sysconfdir" ]]; then
  if [[ "$prefix" == /usr ]]; then sysconfdir=/etc; else sysconfdir=$prefix/etc; fi
fi
root=$destdir$prefix
manifest_rel=share/psmd/install-manifest
manifest=$root/$manifest_rel

if ((uninstall)); then
  [[ -f "$manifest" ]] || { echo "install.sh: nothing installed at $root (no $manifest)" >&2; exit 1; }
  # "f PATH" lines first, then "d PATH" lines deepest first (install.sh
  # writes them so); rmdir keeps a directory someone else filled since.
  while read -r kind path; do
    case "$kind" in
      f) rm -f -- "$destdir$path" ;;
      c)  # "c SHA256 PATH": the config as installed
        sum=${path%% *} path=${path#* }
        if [[ -e "$destdir$path" ]] &&
          [[ "$(sha256sum <"$destdir$path" | cut -d' ' -f1)" != "$sum" ]]; then
          echo "install.sh: keeping the edited $destdir$path" >&2
        else
          rm -f -- "$destdir$path"
        fi
        ;;
      d) rmdir -- "$destdir$path" 2>/dev/null || true ;;
    esac
  done < "$manifest"
  echo "psmd uninstalled from $root"
  exit 0
fi

if ((build)); then
  bazel build //:psmd //:psmctl //:psmclient //:libpsm2 //ompi:mca_mtl_psmd >&2
fi
bin=bazel-bin
version=$(cat VERSION)
[[ -z "$destdir" ]] || mkdir -p -- "$destdir"
installed=()  # files and links, as installed (without destdir)
configs=()    # "SHA256 PATH" of the config files installed
created=()    # directories this run created

# mkdirs DIR: creates DIR (without destdir) and records what did not exist.
mkdirs() {
  local dir=$1
  while [[ "$dir" != / && ! -d "$destdir$dir" ]]; do
    created+=("$dir")
    dir=$(dirname "$dir")
  done
  mkdir -p -- "$destdir$1"
}
# put SRC DEST MODE: copies one file and records it.
put() {
  mkdirs "$(dirname "$2")"
  install -m "$3" -- "$1" "$destdir$2"
  installed+=("$2")
}
link() {  # link TARGET NAME
  mkdirs "$(dirname "$2")"
  ln -sfn -- "$1" "$destdir$2"
  installed+=("$2")
}

put "$bin/daemon/psmd" "$prefix/sbin/psmd" 0755
put "$bin/tools/psmctl" "$prefix/bin/psmctl" 0755
put "$bin/client/libpsmclient.so.0" "$prefix/lib/libpsmclient.so.0" 0755
link libpsmclient.so.0 "$prefix/lib/libpsmclient.so"
put "$bin/client/libpsm2.so.2" "$prefix/lib/psmd/libpsm2.so.2.2" 0755
link libpsm2.so.2.2 "$prefix/lib/psmd/libpsm2.so.2"
link libpsm2.so.2 "$prefix/lib/psmd/libpsm2.so"
if [[ "$prefix" == /usr ]]; then
  mtl_dir=$(ompi_info --parsable --path pkglibdir | sed -n 's/^path:pkglibdir://p')
else
  mtl_dir=$prefix/lib/openmpi
fi
put "$bin/ompi/mca_mtl_psmd.so" "$mtl_dir/mca_mtl_psmd.so" 0644
for h in include/psm2*.h; do
  put "$h" "$prefix/include/psmd/$(basename "$h")" 0644
done

pc() {  # pc NAME DESCRIPTION LIBDIR LIB
  local tmp
  tmp=$(mktemp)
  cat > "$tmp" <<EOF
prefix=$prefix
libdir=$3
includedir=\${prefix}/include/psmd

Name: $1
Description: $2
Version: $version
Libs: -L\${libdir} -Wl,-rpath,\${libdir} -l$4
Cflags: -I\${includedir}
EOF
  put "$tmp" "$prefix/lib/pkgconfig/$1.pc" 0644
  rm -f "$tmp"
}
pc psmclient "The PSM2 API served by psmd (libpsmclient)" "\${prefix}/lib" psmclient
pc psm2 "The PSM2 API served by psmd (drop-in libpsm2.so.2)" "\${prefix}/lib/psmd" psm2

unit=$(mktemp)
sed "s|/usr/sbin/psmd|$prefix/sbin/psmd|g; s|/usr/share/doc/psmd|$prefix/share/doc/psmd|g;
     s|/etc/psmd/psmd.toml|$sysconfdir/psmd/psmd.toml|g" deploy/psmd.service > "$unit"
put "$unit" "$prefix/lib/systemd/system/psmd.service" 0644
rm -f "$unit"
put deploy/psmd.socket "$prefix/lib/systemd/system/psmd.socket" 0644
# For nodes on the fabric only: the administrator copies it into
# /etc/systemd/system/psmd.service.d/ (see the unit's comment).
put deploy/psmd-fabric.conf "$prefix/share/psmd/psmd-fabric.conf" 0644
# The administrator's edits survive a re-install (the .deb marks the file a
# conffile for the same reason); a file that is still the default is ours.
config=$sysconfdir/psmd/psmd.toml
if [[ -e "$destdir$config" ]] && ! cmp -s deploy/psmd.toml "$destdir$config"; then
  echo "install.sh: keeping the edited $destdir$config (defaults: deploy/psmd.toml)" >&2
else
  mkdirs "$(dirname "$config")"
  install -m 0644 -- deploy/psmd.toml "$destdir$config"
  configs+=("$(sha256sum <deploy/psmd.toml | cut -d' ' -f1) $config")
fi

man=$(mktemp -d)
for src in docs/man/*.scd; do
  page=$(basename "$src" .scd)  # psmd.8, psmctl.8, psmd.toml.5
  scdoc < "$src" > "$man/$page"
  put "$man/$page" "$prefix/share/man/man${page##*.}/$page" 0644
done
rm -rf "$man"
for doc in README.md docs/*.md; do
  put "$doc" "$prefix/share/doc/psmd/$(basename "$doc")" 0644
done

# A re-install found the directories an earlier one created already there:
# they are still this install's to remove.
if [[ -f "$manifest" ]]; then
  while read -r kind path; do
    [[ "$kind" == d ]] && created+=("$path")
  done < "$manifest"
fi
mkdirs "$prefix/$(dirname "$manifest_rel")"
installed+=("$prefix/$manifest_rel")
{
  printf 'f %s\n' "${installed[@]}"
  if ((${#configs[@]} > 0)); then printf 'c %s\n' "${configs[@]}"; fi
  if ((${#created[@]} > 0)); then
    printf '%s\n' "${created[@]}" | sort -u | awk '{ print length, $0 }' | sort -rn |
      cut -d' ' -f2- | sed 's/^/d /'
  fi
} > "$manifest"
echo "psmd $version installed under $root ($((${#installed[@]} + ${#configs[@]})) files; remove with" \
  "scripts/install.sh --uninstall --prefix $prefix${destdir:+ --destdir $destdir})"
