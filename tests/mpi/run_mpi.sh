#!/bin/bash
# run_mpi.sh CASE [ARGS]: runs an unmodified MPI/libfabric client on psmd's
# libpsm2.so.2, inside the fake-adapter namespace (scripts/fake_hfi.sh), with
# a private psmd, and proves the traffic went through psmd: the daemon's
# message counters must grow by at least what the case implies.
#   semantics N    tests/mpi/mpi_semantics with N ranks (pml cm, mtl psm2)
#   mpi4py         tests/mpi/mpi4py_check.py with 2 ranks
#   netpipe        NPopenmpi over its full default size range
#   fi_pingpong S  libfabric's fi_pingpong -p psm2 with S-byte messages
# Every process it starts is ended by PID; its directory is removed.
set -uo pipefail
case_name=$1; shift
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
source "$root/scripts/workdir.sh" psmd-mpi

psmd=${PSMD_BIN:-$root/daemon/psmd}
psmctl=${PSMCTL_BIN:-$root/tools/psmctl}
libdir=${PSMD_LIBDIR:-$root/client}
[[ -e "$libdir/libpsm2.so.2" ]] || { echo "run_mpi: no libpsm2.so.2 in $libdir" >&2; exit 1; }
export PSMD_SOCKET="$work/psmd.sock"
"$psmd" --socket "$PSMD_SOCKET" --log-level warn &
pids+=($!)
for _ in $(seq 100); do [[ -S "$PSMD_SOCKET" ]] && break; sleep 0.05; done

sent() {
  "$psmctl" --socket "$PSMD_SOCKET" --json stats |
    python3 -c 'import json,sys; print(json.load(sys.stdin)["total"]["msgs_sent"])'
}

# mpirun as Open MPI users run it, forced onto the PSM2 MTL (no fallback),
# with our library first on the search path.
mpi() {
  local np=$1; shift
  (cd "$work" && timeout -k 10 300 "$root/scripts/fake_hfi.sh" \
    env LD_LIBRARY_PATH="$libdir" OMPI_MCA_plm_rsh_agent= \
    mpirun --allow-run-as-root --oversubscribe -np "$np" \
      --mca pml cm --mca mtl psm2 --mca btl self \
      -x LD_LIBRARY_PATH -x PSMD_SOCKET -x PSM2_DEVICES -x HFI_SYSFS_PATH "$@")
}

before=$(sent)
case "$case_name" in
  semantics)
    np=$1
    mpi "$np" "$root/tests/mpi/mpi_semantics"
    status=$? min=$((2000 * (np - 1)))
    ;;
  mpi4py)
    mpi 2 /usr/bin/python3 "$root/tests/mpi/mpi4py_check.py"
    status=$? min=10
    ;;
  netpipe)
    mpi 2 NPopenmpi -o "$work/np.out"
    status=$? min=1000
    [[ $status == 0 ]] && tail -3 "$work/np.out"
    ;;
  fi_pingpong)
    # A control port of our own: the three pingpong tests may run at once.
    size=$1 iters=200 port=$((20000 + RANDOM % 20000))
    wrap=("$root/scripts/fake_hfi.sh" env LD_LIBRARY_PATH="$libdir")
    # Started directly (no subshell) so that cleanup's TERM reaches timeout,
    # which passes it on to fake_hfi.sh and the server.
    cd "$work"
    timeout -k 10 120 "${wrap[@]}" \
      fi_pingpong -p psm2 -S "$size" -I "$iters" -B "$port" >"$work/server.out" 2>&1 &
    server=$!
    cd - >/dev/null
    pids+=($server)
    sleep 1
    (cd "$work" && timeout -k 10 120 "${wrap[@]}" \
      fi_pingpong -p psm2 -S "$size" -I "$iters" -P "$port" 127.0.0.1)
    status=$?
    wait "$server" || status=1
    cat "$work/server.out"
    min=$((2 * iters))
    ;;
  *) echo "usage: run_mpi.sh semantics N | mpi4py | netpipe | fi_pingpong SIZE" >&2; exit 2 ;;
esac
after=$(sent)
echo "run_mpi: $case_name exit $status; psmd carried $((after - before)) messages (at least $min expected)"
[[ $status == 0 ]] || exit 1
((after - before >= min)) || { echo "run_mpi: traffic did not go through psmd" >&2; exit 1; }
