#!/bin/bash
# mpich_suite.sh [--ci]: MPICH's own conformance tests (test/mpi of
# Debian's mpich 4.0.2 source package) over Open MPI's pml cm + mtl psmd,
# over the reference (Intel's libpsm2) and, in a full run, over btl vader,
# so that a failure that is Open MPI's own is told apart from ours. Ranks
# run as uid nobody when started as root, with no fake adapter. Judged by
# mpich_run.py against mpich_expected_failures.txt.
#   --ci   leaves out the tests that can only end at their time limit here
#          (too-long-for-ci in the list; see docs/design.md), and vader
# Fetching needs a deb-src entry for Debian's archive: added (as root) next
# to the existing Debian entry when missing. Times each phase.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
source "$root/scripts/workdir.sh" psmd-mpich
ci=()
[[ ${1:-} == --ci ]] && ci=(--ci)

psmd=${PSMD_BIN:-$root/daemon/psmd}
component=${PSMD_MTL_COMPONENT:-$root/ompi/mca_mtl_psmd.so}
phase_start=$SECONDS
phase() { echo "mpich_suite: $1 took $((SECONDS - phase_start)) s"; phase_start=$SECONDS; }

# 1. The source: only test/mpi of the upstream tarball is needed (Debian's
# patches do not touch it).
if ! apt-cache showsrc mpich 2>/dev/null | grep -q '^Version: 4.0.2'; then
  if [[ $(id -u) != 0 ]]; then
    echo "mpich_suite: no deb-src entry for mpich 4.0.2; add one for Debian bookworm (needs root)" >&2
    exit 1
  fi
  # The archive the system already uses (its first Debian entry).
  uri=$(awk '/^URIs:/ { print $2; exit }' /etc/apt/sources.list.d/debian.sources 2>/dev/null)
  [[ -n $uri ]] || { echo "mpich_suite: no Debian entry in /etc/apt/sources.list.d/debian.sources" >&2; exit 1; }
  cat >/etc/apt/sources.list.d/psmd-deb-src.sources <<EOF
Types: deb-src
URIs: $uri
Suites: bookworm
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
EOF
  apt-get update -qq || exit 1
fi
(cd "$work" && apt-get source --download-only -qq mpich=4.0.2-3 >/dev/null 2>&1) ||
  { echo "mpich_suite: apt-get source mpich=4.0.2-3 failed" >&2; exit 1; }
tar -C "$work" -xJf "$work/mpich_4.0.2.orig.tar.xz" mpich-4.0.2/test/mpi || exit 1
tests="$work/mpich-4.0.2/test/mpi"
phase "fetching"

# 2. Configure standalone with Open MPI's mpicc. dtpools calls four MPI-1
# functions that Open MPI 4.1 no longer has: their MPI-2 names.
sed -i -E 's/\bMPI_Type_hindexed\b/MPI_Type_create_hindexed/g;
           s/\bMPI_Type_hvector\b/MPI_Type_create_hvector/g;
           s/\bMPI_Type_struct\b/MPI_Type_create_struct/g;
           s/\bMPI_Address\b/MPI_Get_address/g' "$tests/dtpools/src/dtpools_custom.c"
(cd "$tests" && ./configure CC=mpicc --disable-fortran --disable-cxx --disable-romio \
   --disable-spawn --disable-ft-tests --disable-perftest >"$work/configure.log" 2>&1) ||
  { tail -20 "$work/configure.log"; exit 1; }
phase "configuring"

# 3. Build the helpers and the three directories' programs (-k: a program
# that does not build fails the run unless the list names it as not-built
# with the symbol its build log must show).
for dir in util dtpools; do
  make -C "$tests/$dir" -j2 >"$work/make-$dir.log" 2>&1 || { tail -20 "$work/make-$dir.log"; exit 1; }
done
for dir in pt2pt coll comm; do
  make -C "$tests/$dir" -j2 -k >"$work/make-$dir.log" 2>&1 ||
    echo "mpich_suite: some $dir programs did not build (see the run)"
done
phase "building"

# 4. Run as nobody, psmd as the caller.
# nobody cannot read Bazel's runfiles under root's home: copies.
mkdir "$work/components" && cp "$component" "$work/components/"
cp "$here/mpich_run.py" "$here/mpich_expected_failures.txt" "$work/"
chmod -R a+rwX "$work"
as_user=()
[[ $(id -u) == 0 ]] && as_user=(setpriv --reuid=nobody --regid=nogroup --clear-groups)
export PSMD_SOCKET="$work/psmd.sock"
"$psmd" --socket "$PSMD_SOCKET" --log-level warn &
pids+=($!)
for _ in $(seq 100); do [[ -S "$PSMD_SOCKET" ]] && break; sleep 0.05; done
ompi_components=$(dirname "$(find /usr/lib/x86_64-linux-gnu/openmpi/lib -name mca_pml_cm.so | head -1)")
# A test that hangs unlisted gets psmd's view of its endpoints printed
# before it is killed (mpich_run.py, diagnose).
cp "$root/tools/psmctl" "$work/psmctl"
# btl vader (Open MPI's own shared memory) tells a failure that is Open
# MPI's own apart from ours when one is new; it judges Open MPI, not psmd,
# so CI leaves it to the full run (about 45 s of CI's time).
transports=("psmd=--mca pml cm --mca mtl psmd -x PSMD_SOCKET")
[[ ${#ci[@]} == 0 ]] && transports+=("vader=--mca pml ob1 --mca btl self,vader")
"${as_user[@]}" env -u PSM2_DEVICES -u HFI_SYSFS_PATH HOME="$work" TMPDIR="$work" \
  MPICH_RUN_DIAG="$work/psmctl --socket $PSMD_SOCKET endpoints; $work/psmctl --socket $PSMD_SOCKET stats" \
  OMPI_MCA_mca_base_component_path="$ompi_components:$work/components" OMPI_MCA_plm_rsh_agent= \
  python3 "$work/mpich_run.py" "${ci[@]}" --build-logs "$work" "$tests" "$work/mpich_expected_failures.txt" \
    "${transports[@]}"
status=$?
phase "running over ${transports[*]%%=*}"
# The reference: the whole suite over mtl psm2 on Intel's libpsm2 (in the
# fake-adapter namespace, which needs root), judged by the same list (its
# "intel" entries and totals). First one program names the library it
# mapped (PSM2_IDENTIFY): Intel's, not a copy of psmd's drop-in.
if [[ $(id -u) == 0 ]]; then
  intel=(env TMPDIR="$work" OMPI_MCA_plm_rsh_agent= "$root/scripts/fake_hfi.sh")
  intel_args="--allow-run-as-root --mca pml cm --mca mtl psm2 -x PSM2_DEVICES -x HFI_SYSFS_PATH"
  # shellcheck disable=SC2086
  (cd "$work" && timeout -k 10 120 "${intel[@]}" mpirun -np 1 $intel_args -x PSM2_IDENTIFY=1 \
     "$tests/pt2pt/isendselfprobe") >"$work/identify.log" 2>&1
  if ! grep -Eq "PSM2_IDENTIFY location (/usr)?/lib/x86_64-linux-gnu/libpsm2\.so\.2$" "$work/identify.log"; then
    cat "$work/identify.log"
    echo "mpich_suite: the reference did not run on Intel's libpsm2" >&2
    status=1
  fi
  (cd "$work" && "${intel[@]}" python3 "$work/mpich_run.py" "${ci[@]}" \
      --build-logs "$work" "$tests" "$work/mpich_expected_failures.txt" \
      "intel=$intel_args") || status=1
  phase "running over Intel's libpsm2"
else
  echo "mpich_suite: not root: the intel entries are not checked" >&2
  [[ ${#ci[@]} == 0 ]] || status=1
fi
exit $status
