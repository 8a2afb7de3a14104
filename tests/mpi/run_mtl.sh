#!/bin/bash
# run_mtl.sh CASE [ARGS]: MPI programs over Open MPI's pml cm + mtl psmd (the
# //ompi component, found through OMPI_MCA_mca_base_component_path), run as
# uid nobody when started as root (mpirun refuses root without
# --allow-run-as-root, which is not passed), with no fake adapter: the way a user runs
# on a node where psmd is running. psmd itself runs as the caller. Proves the
# traffic went through psmd (its message counters) where the case sends any.
#   semantics N    tests/mpi/mpi_semantics with N ranks, no --mca flags: Open
#                  MPI must pick pml cm + mtl psmd by itself
#   datatypes      tests/mpi/mpi_datatypes (non-contiguous types, byte checks)
#   mpi4py_suite [RUNTESTS ARGS]  mpi4py's own suite ($PSMD_MPI4PY_TESTS) with
#                  2 ranks, judged against mpi4py_expected_failures.txt (mtl-psmd)
#   netpipe        NPopenmpi over its full default size range, in its
#                  integrity mode (-i: every payload checked; netpipe_check.py)
#   selection      verbose selection says psmd was picked and why, ompi_info
#                  lists it, and a rank carries at most one thread more than
#                  on btl vader (tests/mpi/mpi_threads)
#   decline        no psmd: the component declines quietly (saying why at
#                  mtl_base_verbose 10) and Open MPI runs over its own BTLs;
#                  asked for by name (--mca mtl psmd), the ranks say why
#   semantics_nodes, netpipe_nodes, mpi4py_nodes [RUNTESTS ARGS]
#                  the same programs (mpi4py's suite judged against the same
#                  list) with 2 ranks on two psmd linked by the fabric
#                  (127.0.0.2 and .3, node ids 1 and 2, one private munged):
#                  an MPMD mpirun, each rank with its own PSMD_SOCKET; both
#                  daemons' per-peer-node counters must show the traffic;
#                  with PSMD_WORKERS=N (semantics_nodes_workers2) each psmd
#                  runs N engine shards with N ranks on it, and every
#                  daemon's shards are checked (check_shards)
#   node_lost      2 ranks on two psmd (as above); once rank 0 waits in a
#                  receive from MPI_ANY_SOURCE, node 2's psmd is SIGKILLed:
#                  rank 0 must learn it (psmd's kNodeLost, the component's
#                  error handler) and the job end with an error naming the
#                  lost node within 30 s, not hang
#   restart        tests/mpi/mpi_restart with 2 ranks (a verified exchange);
#                  mid-exchange psmd is SIGKILLed and a new psmd started at
#                  once on the same socket, as systemd's Restart= does (issue
#                  33: the ranks spun at ~90% CPU until the run's time
#                  limit). The job must end with an error, each rank that
#                  reports its failed call within 1 s of the kill having used
#                  at most 0.5 s of CPU since, "lost psmd" said; then a new
#                  job runs on the new psmd
#   upgrade        tests/mpi/mpi_restart with 2 ranks and a fixed number of
#                  rounds; mid-exchange psmd is handed over to a new
#                  process twice (psmctl upgrade, issue 33). The job must
#                  finish with every round intact and no rank losing psmd,
#                  the handovers made while it ran
#   with_dropin    psmd's drop-in libpsm2.so.2 on LD_LIBRARY_PATH as well (a
#                  site that switched Open MPI's mtl psm2 to psmd): Open MPI
#                  loads mca_mtl_psm2 (and so the drop-in) beside this
#                  component; ompi_info and tests/mpi/mpi_semantics with 2
#                  ranks, no --mca flags, must still run on mtl psmd
# Every process it starts is ended by PID; its directory is removed.
set -uo pipefail
case_name=$1; shift
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
source "$root/scripts/workdir.sh" psmd-mtl

source "$here/private_psmd.sh"
source "$here/node_lost.sh"
component=${PSMD_MTL_COMPONENT:-$root/ompi/mca_mtl_psmd.so}

# The ranks run as nobody, who cannot read Bazel's runfiles under root's home:
# what they load is copied into the work directory.
chmod 755 "$work"
mkdir "$work/components" "$work/run"
cp "$component" "$work/components/"
dropin=${PSMD_DROPIN:-$root/client/libpsm2.so.2}
if [[ $case_name == with_dropin ]]; then
  mkdir "$work/lib" && cp "$dropin" "$work/lib/libpsm2.so.2"
fi
cp "$root/tests/mpi/mpi_semantics" "$root/tests/mpi/mpi_datatypes" \
   "$root/tests/mpi/mpi_threads" "$root/tests/mpi/mpi_restart" "$work/"
chmod -R a+rX "$work"
as_user=()
if [[ $(id -u) == 0 ]]; then
  as_user=(setpriv --reuid=nobody --regid=nogroup --clear-groups)
  chown nobody:nogroup "$work/run"
fi

# Two daemons linked by the fabric, authenticated by a munged of our own.
source "$root/scripts/nodes.sh"

# One rank on each daemon (an MPMD command line); with PSMD_WORKERS=N
# (semantics_nodes_workers2), N on each, one per engine shard of a daemon
# whose shard 0 owns the fabric.
mpi_nodes() {
  local per_node=${PSMD_WORKERS:-1}
  (cd "$work/run" && timeout -k 10 "${mpi_timeout:-300}" "${as_user[@]}" \
    env -u PSM2_DEVICES -u HFI_SYSFS_PATH HOME="$work/run" TMPDIR="$work/run" \
      OMPI_MCA_mca_base_component_path="$ompi_components:$work/components" \
      OMPI_MCA_plm_rsh_agent= \
      mpirun --oversubscribe --mca pml cm --mca mtl psmd "${mpi_extra[@]}" \
        -np "$per_node" env PSMD_SOCKET="${node_socket[0]}" "$@" : \
        -np "$per_node" env PSMD_SOCKET="${node_socket[1]}" "$@")
}

case $case_name in
  decline) ;;
  *_nodes|node_lost)
    start_nodes "$psmd" 2 --log-level warn --workers "${PSMD_WORKERS:-1}" ||
      exit 1
    node2_pid=${pids[-1]}
    export PSMD_SOCKET=${node_socket[0]}  # what sent() counts
    ;;
  *) start_psmd ;;
esac

ompi_components=$(dirname "$(find /usr/lib/x86_64-linux-gnu/openmpi/lib -name mca_pml_cm.so | head -1)")
# mpirun as a user runs it: Open MPI's own components plus ours, nothing
# else on the command line but what the case adds.
mpi() {
  local np=$1; shift
  (cd "$work/run" && timeout -k 10 "${mpi_timeout:-300}" "${as_user[@]}" \
    env -u PSM2_DEVICES -u HFI_SYSFS_PATH HOME="$work/run" TMPDIR="$work/run" \
      OMPI_MCA_mca_base_component_path="$ompi_components:$work/components" \
      OMPI_MCA_plm_rsh_agent= "${env_extra[@]}" \
      mpirun --oversubscribe -np "$np" -x PSMD_SOCKET "${mpi_extra[@]}" "$@")
}

env_extra=() mpi_extra=()
if [[ $case_name == with_dropin ]]; then
  env_extra=(LD_LIBRARY_PATH="$work/lib") mpi_extra=(-x LD_LIBRARY_PATH)
fi

# CLOCK_MONOTONIC in ms, the clock of mpi_restart's lines.
monotonic_ms() { python3 -c 'import time; print(time.monotonic_ns() // 1000000)'; }
# CPU ms (user + system) process $1 has used; 0 if it is gone.
cpu_ms() {
  local ticks
  ticks=$(awk '{ sub(/.*\) /, ""); print $12 + $13 }' "/proc/$1/stat" 2>/dev/null)
  echo $((${ticks:-0} * 1000 / $(getconf CLK_TCK)))
}

# The threads of each rank in "rank R threads N: ..." lines; prints the most.
most_threads() {
  grep -o 'threads [0-9]*' "$1" | awk '{ if ($2 > m) m = $2 } END { print m + 0 }'
}

# Waits (at most 60 s) until both ranks of mpi_restart wrote their ready
# files.
await_ready() {
  for _ in $(seq 600); do
    [[ -s $work/run/ready0 && -s $work/run/ready1 ]] && return; sleep 0.1
  done
}

before=0
[[ $case_name != decline ]] && before=$(sent)
# PSMD_UPGRADES=1 (the *_upgrades targets): psmctl upgrade twice a second
# while the case runs (docs/design.md, "Handover"); the run fails unless
# one went through and none failed.
if [[ -n ${PSMD_UPGRADES:-} ]]; then
  (while sleep 0.5 && [[ ! -e $work/case_done ]]; do
     if "$psmctl" --socket "$PSMD_SOCKET" upgrade >>"$work/upgrades.out" 2>&1; then
       echo ok; else echo failed; fi
   done >"$work/upgrades") &
  pids+=($!)
  upgrader=$!
fi
min=0
case "$case_name" in
  semantics)
    np=$1
    mpi "$np" "$work/mpi_semantics"
    status=$? min=$((2000 * (np - 1)))
    ;;
  datatypes)
    mpi 2 --mca pml cm --mca mtl psmd "$work/mpi_datatypes"
    status=$? min=90  # 3 messages per case, 30 cases
    ;;
  mpi4py_suite|mpi4py_nodes)
    src=${PSMD_MPI4PY_TESTS:-}
    if [[ ! -f "$src/runtests.py" ]]; then
      echo "run_mtl: PSMD_MPI4PY_TESTS='$src' must name mpi4py 3.1.4's test/ folder" \
           "(scripts/test.sh passes ../shared/external/mpi4py-3.1.4-test/test)" >&2
      exit 1
    fi
    cp -r "$src" "$work/run/mpi4py-test"  # the suite writes next to itself
    chmod -R a+rwX "$work/run/mpi4py-test"
    # Each rank's output in a directory of its own (--output-filename),
    # judged with its exit status (the wrapper, copied for nobody to read).
    cp "$here/mpi4py_suite_check.py" "$work/"
    mkdir "$work/run/ranks" && chmod a+rwx "$work/run/ranks"
    mpi_extra+=(--output-filename "$work/run/ranks")
    suite=(/usr/bin/python3 "$work/mpi4py_suite_check.py" rank
           /usr/bin/python3 "$work/run/mpi4py-test/runtests.py" -v "$@")
    if [[ $case_name == mpi4py_nodes ]]; then
      mpi_timeout=600 mpi_nodes "${suite[@]}"
    else
      mpi_timeout=600 mpi 2 --mca pml cm --mca mtl psmd "${suite[@]}"
    fi >"$work/suite.log" 2>&1
    python3 "$here/mpi4py_suite_check.py" judge mtl-psmd \
      "$here/mpi4py_expected_failures.txt" $? 2 "$work/run/ranks" "$work/suite.log"
    status=$? min=1000
    [[ $status == 0 ]] || tail -40 "$work/suite.log"
    ;;
  netpipe|netpipe_nodes)
    # Integrity mode (-i): each size's payload checked, not timed; NetPIPE
    # reports a bad one without failing, so rank 0's own log (not spliced
    # with rank 1's lines) is judged.
    mpi_extra+=(--output-filename "$work/run/np-ranks")
    run=(mpi 2 --mca pml cm --mca mtl psmd)
    [[ $case_name == netpipe_nodes ]] && run=(mpi_nodes)
    "${run[@]}" NPopenmpi -i -o "$work/run/np.out" >"$work/np.log" 2>&1
    status=$? min=1000
    python3 "$here/netpipe_check.py" "$work/run/np-ranks"/1/rank.0/std{out,err} ||
      { tail -20 "$work/np.log"; status=1; }
    ;;
  selection)
    mpi 2 --mca mtl_base_verbose 10 --mca pml_base_verbose 10 \
      "$work/mpi_threads" >"$work/psmd.log" 2>&1
    status=$?
    mpi 2 --mca pml ob1 --mca btl self,vader "$work/mpi_threads" \
      >"$work/vader.log" 2>&1 || status=1
    grep -E "mtl:psmd|component cm selected|^rank" "$work/psmd.log"
    grep "^rank" "$work/vader.log" | sed 's/^/vader: /'
    grep -q "mtl:psmd: available: psmd answers" "$work/psmd.log" &&
      grep -q "mtl:psmd: selected: endpoint" "$work/psmd.log" &&
      grep -q "select: component cm selected" "$work/psmd.log" ||
      { echo "run_mtl: Open MPI did not pick pml cm + mtl psmd" >&2; status=1; }
    on_psmd=$(most_threads "$work/psmd.log") on_vader=$(most_threads "$work/vader.log")
    echo "run_mtl: threads per rank: $on_psmd over mtl psmd, $on_vader over btl vader"
    ((on_vader > 0 && on_psmd <= on_vader + 1)) ||
      { echo "run_mtl: a rank on psmd carries more than one thread over vader's" >&2; status=1; }
    info=$("${as_user[@]}" env HOME="$work/run" \
      OMPI_MCA_mca_base_component_path="$ompi_components:$work/components" ompi_info | grep psmd)
    echo "ompi_info: $info"
    [[ $info == *"MCA mtl: psmd"* ]] || { echo "run_mtl: ompi_info does not list mtl psmd" >&2; status=1; }
    min=2
    ;;
  decline)
    mpi 2 --mca mtl_base_verbose 10 --mca pml_base_verbose 10 \
      "$work/mpi_semantics" >"$work/out.log" 2>&1
    status=$?
    grep -E "mtl:psmd|component .* selected|^(PASS|FAIL)" "$work/out.log"
    grep -q "mtl:psmd: not available: psmd has no control socket at $PSMD_SOCKET" "$work/out.log" &&
      grep -q "select: component ob1 selected" "$work/out.log" ||
      { echo "run_mtl: the component did not decline quietly to ob1" >&2; status=1; }
    # Quietly: nothing from psmd's side reaches the user without verbosity.
    mpi 2 "$work/mpi_semantics" >"$work/quiet.log" 2>&1 || status=1
    if grep -qiE "psm|error" "$work/quiet.log"; then
      echo "run_mtl: without psmd the run printed:" >&2; cat "$work/quiet.log" >&2; status=1
    fi
    # Asked for by name, it cannot fall back: the run fails, and a rank's
    # line names psmd's socket and the fix (every rank that gets to opening
    # the component prints it; mpirun may end the others first).
    if mpi 2 --mca pml cm --mca mtl psmd "$work/mpi_semantics" >"$work/asked.log" 2>&1; then
      echo "run_mtl: --mca mtl psmd without psmd succeeded" >&2; status=1
    fi
    asked=$(grep -c "mtl psmd: asked for (--mca mtl psmd), but psmd has no control socket at $PSMD_SOCKET: start it" "$work/asked.log")
    echo "run_mtl: --mca mtl psmd without psmd: $asked ranks said why"
    ((asked >= 1)) || { echo "run_mtl: no rank said why:" >&2; head -20 "$work/asked.log" >&2; status=1; }
    ;;
  semantics_nodes)
    mpi_nodes "$work/mpi_semantics"
    status=$? min=10  # rank 0 mostly receives (the byte counts below prove the rest)
    ;;
  node_lost)
    cp "$root/tests/mpi/node_lost.py" "$work/"
    mpi_timeout=120 expect_node_lost "$node2_pid" \
      mpi_nodes /usr/bin/python3 "$work/node_lost.py" "$work/run"
    status=$?
    ;;
  restart)
    scale=${PSMD_TEST_TIME_SCALE:-1}
    mpi_timeout=60 mpi 2 --mca pml cm --mca mtl psmd \
      "$work/mpi_restart" "$work/run" 0 >"$work/restart.log" 2>&1 &
    job=$!
    await_ready
    status=0
    rank_pid=("$(cat "$work/run/ready0" 2>/dev/null)" "$(cat "$work/run/ready1" 2>/dev/null)")
    cpu_before=("$(cpu_ms "${rank_pid[0]}")" "$(cpu_ms "${rank_pid[1]}")")
    [[ -n ${rank_pid[0]} && -n ${rank_pid[1]} ]] ||
      { echo "run_mtl: the job never got going" >&2; status=1; }
    old_psmd=${pids[-1]}
    killed_ms=$(monotonic_ms)
    # (bash's "Killed" notice for its own background job is not news)
    { kill -KILL "$old_psmd"; wait "$old_psmd"; } 2>/dev/null
    kept=()
    for p in "${pids[@]}"; do [[ $p == "$old_psmd" ]] || kept+=("$p"); done
    pids=("${kept[@]}")
    start_psmd
    wait "$job"; job_status=$?
    ms=$(($(monotonic_ms) - killed_ms))
    cat "$work/restart.log"
    echo "run_mtl: restart: mpirun exit $job_status ${ms} ms after psmd was killed and replaced"
    ((job_status != 0 && job_status != 124 && ms < 10000 * scale)) ||
      { echo "run_mtl: the job did not end with an error in time" >&2; status=1; }
    grep -q "lost psmd" "$work/restart.log" ||
      { echo "run_mtl: no rank said it lost psmd" >&2; status=1; }
    # "rank R: CALL failed at MS cpu_ms CPU: ..." (mpi_restart.cc)
    reported=0
    while read -r r at cpu; do
      reported=$((reported + 1))
      echo "run_mtl: rank $r failed $((at - killed_ms)) ms after the kill," \
           "using $((cpu - cpu_before[r])) ms of CPU since"
      ((at - killed_ms <= 1000 * scale && cpu - cpu_before[r] <= 500 * scale)) ||
        { echo "run_mtl: rank $r failed too late or spun meanwhile" >&2; status=1; }
    done < <(sed -nE 's/^rank ([01]): .* failed at ([0-9]+) cpu_ms ([0-9]+):.*/\1 \2 \3/p' \
               "$work/restart.log")
    ((reported >= 1)) || { echo "run_mtl: no rank reported its failed call" >&2; status=1; }
    # A job started on the new psmd runs normally, through it.
    before=$(sent)
    mpi 2 --mca pml cm --mca mtl psmd "$work/mpi_restart" "$work/run" 300 \
      >"$work/fresh.log" 2>&1 || status=1
    [[ $(grep -c "rounds intact" "$work/fresh.log") == 2 ]] ||
      { echo "run_mtl: the job on the new psmd failed:" >&2; tail -20 "$work/fresh.log" >&2; status=1; }
    min=600
    ;;
  upgrade)
    mpi_timeout=120 mpi 2 --mca pml cm --mca mtl psmd \
      "$work/mpi_restart" "$work/run" 60000 >"$work/upgrade.log" 2>&1 &
    job=$!
    await_ready
    status=0
    [[ -s $work/run/ready0 && -s $work/run/ready1 ]] ||
      { echo "run_mtl: the job never got going" >&2; status=1; }
    for round in 1 2; do
      "$psmctl" --socket "$PSMD_SOCKET" upgrade ||
        { echo "run_mtl: upgrade $round failed" >&2; status=1; }
    done
    kill -0 "$job" 2>/dev/null ||
      { echo "run_mtl: the job ended before the upgrades; raise its rounds" >&2; status=1; }
    wait "$job" || { echo "run_mtl: the job failed across the upgrades" >&2; status=1; }
    cat "$work/upgrade.log"
    [[ $(grep -c "rounds intact" "$work/upgrade.log") == 2 ]] ||
      { echo "run_mtl: not every rank ended intact" >&2; status=1; }
    ! grep -q "lost psmd" "$work/upgrade.log" ||
      { echo "run_mtl: a rank lost psmd" >&2; status=1; }
    min=60000
    ;;
  with_dropin)
    # ompi_info opens every component: both libraries in one process.
    info=$("${as_user[@]}" env HOME="$work/run" LD_LIBRARY_PATH="$work/lib" \
      OMPI_MCA_mca_base_component_path="$ompi_components:$work/components" \
      ompi_info 2>&1)
    status=$?
    grep -E "MCA mtl: (psmd|psm2)" <<<"$info"
    [[ $status == 0 && $info == *"MCA mtl: psmd"* && $info == *"MCA mtl: psm2"* ]] ||
      { echo "run_mtl: ompi_info with the drop-in loaded exit $status:" >&2
        tail -20 <<<"$info" >&2; status=1; }
    mpi 2 --mca mtl_base_verbose 10 "$work/mpi_semantics" >"$work/out.log" 2>&1 || status=1
    grep -E "mtl:psmd: selected|^(PASS|FAIL)" "$work/out.log"
    # In the ranks too Open MPI loads every mtl component before it asks
    # them (mca_mtl_psm2.so, and with it the drop-in, then declines).
    grep -q "mtl:psmd: selected" "$work/out.log" ||
      { echo "run_mtl: not run on mtl psmd:" >&2; tail -30 "$work/out.log" >&2; status=1; }
    min=2000
    ;;
  *) echo "usage: run_mtl.sh semantics N | datatypes | mpi4py_suite [ARGS] | netpipe" \
          "| selection | decline | semantics_nodes | netpipe_nodes" \
          "| mpi4py_nodes [ARGS] | node_lost | with_dropin | restart | upgrade" >&2; exit 2 ;;
esac
if [[ -n ${PSMD_UPGRADES:-} ]]; then
  touch "$work/case_done"
  wait "$upgrader"
  ups=$(grep -c '^ok$' "$work/upgrades") failed=$(grep -c '^failed$' "$work/upgrades")
  echo "run_mtl: $ups upgrades of psmd while the case ran, $failed failed"
  ((ups > 0 && failed == 0)) || { tail -5 "$work/upgrades.out" >&2; status=1; }
fi
if [[ $case_name == *_nodes ]]; then  # not node_lost: node 2 is gone
  check_node_traffic "$psmctl" || status=1
fi
check_shards || status=1
if [[ $case_name != decline ]]; then
  after=$(sent)
  echo "run_mtl: $case_name exit $status; psmd carried $((after - before)) messages (at least $min expected)"
  ((after - before >= min)) || { echo "run_mtl: traffic did not go through psmd" >&2; status=1; }
fi
if [[ ($case_name == *_nodes || $case_name == node_lost) && $status != 0 ]]; then
  print_node_logs
fi
[[ $status == 0 ]] || exit 1
