#!/bin/bash
# run_mpi.sh CASE [ARGS]: runs an unmodified MPI/libfabric client on psmd's
# libpsm2.so.2, inside the fake-adapter namespace (scripts/fake_hfi.sh), with
# a private psmd, and proves the traffic went through psmd: the daemon's
# message counters must grow by at least what the case implies.
#   semantics N    tests/mpi/mpi_semantics with N ranks (pml cm, mtl psm2)
#   mpi4py         tests/mpi/mpi4py_check.py with 2 ranks
#   mpi4py_suite [RUNTESTS ARGS]  mpi4py's own test suite (its test/ folder in
#                  $PSMD_MPI4PY_TESTS) with 2 ranks, judged against
#                  tests/mpi/mpi4py_expected_failures.txt
#   mpi4py_asan [RUNTESTS ARGS]   the same on the AddressSanitizer build of the
#                  library (client/asan/libpsm2.so.2)
#   mpi4py_intel [RUNTESTS ARGS]  the same on Intel's libpsm2 (the reference,
#                  judged by the same list), plus each test the list says
#                  crashes it, alone
#   netpipe        NPopenmpi over its full default size range, in its
#                  integrity mode (-i: every payload checked; netpipe_check.py)
#   fi_pingpong S [--corrupt]  libfabric's fi_pingpong -p psm2 with S-byte
#                  messages, its data checks on (-c: a payload that differs
#                  fails the run). --corrupt, the check's negative control:
#                  one byte of a payload the client receives inverted after
#                  delivery (LD_PRELOAD of corrupt_rx.c); passes only when
#                  the client fails with fi_pingpong's mismatch report
#   semantics_nodes, netpipe_nodes, mpi4py_nodes [RUNTESTS ARGS]
#                  the same programs (mpi4py's suite judged against the same
#                  list) with 2 ranks on two psmd linked by the fabric
#                  (scripts/nodes.sh: 127.0.0.2 and .3, one private munged):
#                  an MPMD mpirun, each rank with its own PSMD_SOCKET; both
#                  daemons' per-peer-node counters must show the traffic
#   node_lost      2 ranks on two psmd, the same way: node 2's psmd is
#                  killed while rank 0 waits on a receive from any source,
#                  and the job must end with an error (tests/mpi/node_lost.sh)
#   threads        tests/mpi/mpi_threads (threads per rank after MPI_Init) with
#                  2 ranks over mtl psmd (//ompi), mtl psm2 on the drop-in,
#                  mtl psm2 on Intel's libpsm2 and btl vader: a rank on psmd,
#                  either way, carries at most one thread more than on
#                  Intel's library
# Every process it starts is ended by PID; its directory is removed.
set -uo pipefail
case_name=$1; shift
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
source "$root/scripts/workdir.sh" psmd-mpi

source "$here/private_psmd.sh"
source "$here/node_lost.sh"
source "$root/scripts/nodes.sh"
libdir=${PSMD_LIBDIR:-$root/client}
[[ -e "$libdir/libpsm2.so.2" ]] || { echo "run_mpi: no libpsm2.so.2 in $libdir" >&2; exit 1; }
case $case_name in
  *_nodes|node_lost)
    start_nodes "$psmd" 2 --log-level warn || exit 1
    node2_pid=${pids[-1]}
    export PSMD_SOCKET=${node_socket[0]}  # what sent() counts
    ;;
  *) start_psmd ;;
esac

# mpirun as Open MPI users run it, forced onto the PSM2 MTL (no fallback),
# with our library first on the search path. Its session directory goes in
# $work (TMPDIR), so that a killed run leaves nothing in /tmp.
# $mpi_btl: the BTLs Open MPI may use besides (one-sided operations need one
# that reaches the other ranks; point-to-point stays on pml cm + mtl psm2).
mpirun_psm2() {
  (cd "$work" && timeout -k 10 "${mpi_timeout:-300}" "$root/scripts/fake_hfi.sh" \
    env LD_LIBRARY_PATH="$libdir" OMPI_MCA_plm_rsh_agent= TMPDIR="$work" \
    mpirun --allow-run-as-root --oversubscribe \
      --mca pml cm --mca mtl psm2 --mca btl "${mpi_btl:-self}" \
      -x LD_LIBRARY_PATH -x PSM2_DEVICES -x HFI_SYSFS_PATH "$@")
}
mpi() {
  local np=$1; shift
  mpirun_psm2 -np "$np" -x PSMD_SOCKET "$@"
}
# mpi_nodes PROGRAM [ARGS...]: one rank on each daemon of start_nodes (an
# MPMD command line, each rank with its own PSMD_SOCKET), with the mpirun
# options in $mpi_opts.
mpi_opts=()
mpi_nodes() {
  mpirun_psm2 "${mpi_opts[@]}" \
    -np 1 env PSMD_SOCKET="${node_socket[0]}" "$@" : \
    -np 1 env PSMD_SOCKET="${node_socket[1]}" "$@"
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
  mpi4py_suite|mpi4py_asan|mpi4py_nodes|mpi4py_intel)
    src=${PSMD_MPI4PY_TESTS:-}
    if [[ ! -f "$src/runtests.py" ]]; then
      echo "run_mpi: PSMD_MPI4PY_TESTS='$src' must name mpi4py 3.1.4's test/ folder" \
           "(scripts/test.sh passes ../shared/external/mpi4py-3.1.4-test/test)" >&2
      exit 1
    fi
    cp -r "$src" "$work/mpi4py-test"  # the suite writes next to itself
    mpi_btl=self,vader mpi_timeout=600
    library=dropin sanitizer=()
    if [[ $case_name == mpi4py_asan ]]; then
      libdir=${PSMD_ASAN_LIBDIR:-$root/client/asan}
      sanitizer=(-x "LD_PRELOAD=$(gcc -print-file-name=libasan.so)"
                 -x ASAN_OPTIONS=detect_leaks=0:abort_on_error=1
                 -x UBSAN_OPTIONS=print_stacktrace=1)
    elif [[ $case_name == mpi4py_intel ]]; then
      # The reference: Intel's libpsm2, which names itself in each rank's log.
      libdir=/usr/lib/x86_64-linux-gnu library=intel sanitizer=(-x PSM2_IDENTIFY=1)
    fi
    check=$here/mpi4py_suite_check.py list=$here/mpi4py_expected_failures.txt
    # suite NAME [--crash ID] RUNTESTS ARGS: one run, each rank's output in
    # $work/NAME/1/rank.N (Open MPI's --output-filename), judged.
    suite() {
      local name=$1 crash=(); shift
      [[ $1 == --crash ]] && { crash=(--crash "$2"); shift 2; }
      mpi_opts=(--output-filename "$work/$name")
      local rank=(/usr/bin/python3 "$check" rank /usr/bin/python3
                  "$work/mpi4py-test/runtests.py" -v "$@")
      if [[ $case_name == mpi4py_nodes ]]; then
        mpi_nodes "${rank[@]}" >"$work/$name.log" 2>&1
      else
        mpi 2 "${mpi_opts[@]}" "${sanitizer[@]}" "${rank[@]}" >"$work/$name.log" 2>&1
      fi
      local run_status=$?
      python3 "$check" judge "${crash[@]}" "$library" "$list" "$run_status" 2 \
        "$work/$name" "$work/$name.log" || { tail -40 "$work/$name.log"; return 1; }
      if [[ $library == intel ]] &&
         ! grep -q "PSM2_IDENTIFY location .*/x86_64-linux-gnu/libpsm2.so.2" \
           "$work/$name/1/rank.0/stderr" "$work/$name/1/rank.0/stdout"; then
        echo "run_mpi: $name did not run on Intel's libpsm2" >&2; return 1
      fi
    }
    suite suite "$@"
    status=$? min=1000
    if [[ $library == intel ]]; then
      min=0  # psmd carries nothing here
      # Each test listed as crashing Intel's library, alone: it must.
      for id in $(python3 "$check" crashes intel "$list"); do
        suite "crash-${id##*.}-${id%.*}" --crash "$id" -i "${id%%.*}" \
          -k "${id#*.}" || status=1
      done
    fi
    ;;
  netpipe|netpipe_nodes)
    # Integrity mode (-i): each size's payload checked, not timed; NetPIPE
    # reports a bad one without failing, so rank 0's own log (not spliced
    # with rank 1's lines) is judged.
    mpi_opts+=(--output-filename "$work/np-ranks")
    run=(mpi 2 "${mpi_opts[@]}")
    [[ $case_name == netpipe_nodes ]] && run=(mpi_nodes)
    "${run[@]}" NPopenmpi -i -o "$work/np.out" >"$work/np.log" 2>&1
    status=$? min=1000
    python3 "$here/netpipe_check.py" "$work/np-ranks"/1/rank.0/std{out,err} ||
      { tail -20 "$work/np.log"; status=1; }
    ;;
  semantics_nodes)
    mpi_nodes "$root/tests/mpi/mpi_semantics"
    status=$? min=10  # rank 0 mostly receives (the byte counts below prove the rest)
    ;;
  fi_pingpong)
    # A control port of our own: the three pingpong tests may run at once.
    size=$1 iters=200 port=$((20000 + RANDOM % 20000))
    wrap=("$root/scripts/fake_hfi.sh" env LD_LIBRARY_PATH="$libdir")
    # --corrupt: the negative control of the data check (-c). The client
    # runs with corrupt_rx.c's interposer over the library, which inverts a
    # byte of the third payload it receives after delivery.
    corrupt=()
    [[ ${2:-} == --corrupt ]] && corrupt=(LD_PRELOAD="$root/tests/mpi/libcorrupt_rx.so")
    # Started directly (no subshell) so that cleanup's TERM reaches timeout,
    # which passes it on to fake_hfi.sh and the server.
    cd "$work"
    timeout -k 10 120 "${wrap[@]}" \
      fi_pingpong -p psm2 -c -S "$size" -I "$iters" -B "$port" >"$work/server.out" 2>&1 &
    server=$!
    cd - >/dev/null
    pids+=($server)
    sleep 1
    (cd "$work" && timeout -k 10 120 "${wrap[@]}" "${corrupt[@]}" \
      fi_pingpong -p psm2 -c -S "$size" -I "$iters" -P "$port" 127.0.0.1) >"$work/client.out" 2>&1
    status=$?
    cat "$work/client.out"
    min=$((2 * iters))
    if ((${#corrupt[@]})); then
      # The server waits for a pong the failed client never sends: ended
      # here (TERM to timeout, passed on to the server).
      kill -TERM "$server" 2>/dev/null
      wait "$server"
      cat "$work/server.out"
      # The client must have corrupted a payload, reported the mismatch at
      # the byte inverted and failed; then this run passes.
      byte=$(sed -n 's/^corrupt_rx: inverted byte \([0-9]*\) .*/\1/p' "$work/client.out")
      if [[ -z $byte ]]; then
        echo "run_mpi: the interposer corrupted no payload (nothing was checked)" >&2
        status=1
      elif ((status == 0)) || ! grep -q "^Error at iteration=[0-9]* size=$size byte=$byte\$" "$work/client.out"; then
        echo "run_mpi: fi_pingpong -c did not detect a corrupted payload" >&2
        status=1
      else
        echo "run_mpi: fi_pingpong -c detected the corrupted payload (exit $status)"
        status=0 min=4  # a few messages went through before the corruption
      fi
    else
      wait "$server" || status=1
      cat "$work/server.out"
      # A reported mismatch fails the run whatever the exit status says.
      ! grep -h "^Error at iteration=" "$work/client.out" "$work/server.out" || status=1
    fi
    ;;
  threads)
    mkdir "$work/components" && cp "$root/ompi/mca_mtl_psmd.so" "$work/components/"
    ompi=$(dirname "$(find /usr/lib/x86_64-linux-gnu/openmpi/lib -name mca_pml_cm.so | head -1)")
    prog=$root/tests/mpi/mpi_threads
    status=0
    mpi 2 "$prog" >"$work/dropin.log" || status=1
    libdir=/usr/lib/x86_64-linux-gnu mpi 2 "$prog" >"$work/intel.log" || status=1
    (cd "$work" && timeout -k 10 300 env \
      OMPI_MCA_mca_base_component_path="$ompi:$work/components" TMPDIR="$work" \
      mpirun --allow-run-as-root --oversubscribe -np 2 --mca pml cm --mca mtl psmd \
        -x PSMD_SOCKET "$prog") >"$work/psmd.log" || status=1
    (cd "$work" && timeout -k 10 300 env TMPDIR="$work" \
      mpirun --allow-run-as-root --oversubscribe -np 2 --mca pml ob1 --mca btl self,vader \
        "$prog") >"$work/vader.log" || status=1
    declare -A n
    for t in dropin intel psmd vader; do
      sed "s/^/$t: /" "$work/$t.log"
      # The most threads any rank of the run had.
      n[$t]=$(grep -o 'threads [0-9]*' "$work/$t.log" | awk '{ if ($2 > m) m = $2 } END { print m + 0 }')
    done
    # Each ran on the library it names: the drop-in, Intel's, or none (mtl
    # psmd carries its own copy; vader needs none).
    grep -q "psm2: $(realpath "$libdir/libpsm2.so.2")" "$work/dropin.log" &&
      grep -q "psm2: /usr/lib/x86_64-linux-gnu/libpsm2.so.2" "$work/intel.log" &&
      ! grep -q "psm2: /" "$work/psmd.log" ||
      { echo "run_mpi: a run did not load the PSM2 library it should have" >&2; status=1; }
    echo "run_mpi: threads per rank: mtl psmd ${n[psmd]}, drop-in ${n[dropin]}," \
         "Intel's libpsm2 ${n[intel]}, btl vader ${n[vader]}"
    for t in psmd dropin; do
      ((n[intel] > 0 && n[$t] > 0 && n[$t] <= n[intel] + 1)) ||
        { echo "run_mpi: $t carries more than one thread over Intel's libpsm2" >&2; status=1; }
    done
    min=2  # the allreduce of each psmd run
    ;;
  node_lost)
    mkdir "$work/run"
    mpi_timeout=120 expect_node_lost "$node2_pid" \
      mpi_nodes /usr/bin/python3 "$here/node_lost.py" "$work/run"
    status=$? min=0
    ;;
  *) echo "usage: run_mpi.sh semantics N | mpi4py | mpi4py_suite [ARGS] | mpi4py_asan [ARGS]" \
          "| netpipe | fi_pingpong SIZE [--corrupt] | threads | semantics_nodes | netpipe_nodes" \
          "| mpi4py_nodes [ARGS] | mpi4py_intel [ARGS] | node_lost" >&2; exit 2 ;;
esac
if [[ $case_name == *_nodes ]]; then  # not node_lost: node 2 is gone
  check_node_traffic "$psmctl" || status=1
fi
if [[ ($case_name == *_nodes || $case_name == node_lost) && $status != 0 ]]; then
  print_node_logs
fi
after=$(sent)
echo "run_mpi: $case_name exit $status; psmd carried $((after - before)) messages (at least $min expected)"
[[ $status == 0 ]] || exit 1
((after - before >= min)) || { echo "run_mpi: traffic did not go through psmd" >&2; exit 1; }
