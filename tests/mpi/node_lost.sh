# shellcheck shell=bash disable=SC2154  # $work: from workdir.sh
# expect_node_lost PID RUN...: the check behind the node_lost cases of
# run_mpi.sh and run_mtl.sh. RUN (a function and its arguments) starts
# tests/mpi/node_lost.py as an mpirun with rank 0 on node 1's psmd and rank 1
# on node 2's, whose pid is PID; $1 of the program is $work/run. Once both
# ranks passed their barrier and rank 0 posted its receive from
# MPI_ANY_SOURCE (each writes ready<rank> then, not a time later) node 2's
# psmd is SIGKILLed. Passes (returns 0) if mpirun then ends with an error
# within 30 s and its output names the lost node;
# before psmd told endpoints of a lost node (kNodeLost) the job hung.
expect_node_lost() {
  local node2_pid=$1 job job_status start ms status=0
  shift
  "$@" >"$work/lost.log" 2>&1 &
  job=$!
  for _ in $(seq 600); do
    [[ -e $work/run/ready0 && -e $work/run/ready1 ]] && break; sleep 0.1
  done
  start=$(date +%s%N)
  # (bash's "Killed" notice for its own background job is not news)
  { kill -KILL "$node2_pid"; wait "$node2_pid"; } 2>/dev/null
  wait "$job"; job_status=$?
  ms=$((($(date +%s%N) - start) / 1000000))
  cat "$work/lost.log"
  echo "node_lost: mpirun exit $job_status ${ms} ms after node 2's psmd was killed"
  [[ -e $work/run/ready0 && -e $work/run/ready1 ]] ||
    { echo "node_lost: the ranks never got to their receive" >&2; status=1; }
  ((job_status != 0 && job_status != 124 && ms < 30000)) ||
    { echo "node_lost: the job did not end with an error in time" >&2; status=1; }
  grep -q "lost node 2" "$work/lost.log" ||
    { echo "node_lost: no error named the lost node" >&2; status=1; }
  return "$status"
}
