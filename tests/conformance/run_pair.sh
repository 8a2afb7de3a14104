#!/bin/bash
# run_pair.sh intel|psmd PROGRAM [ARGS...]: runs both ranks of a conformance
# program against one implementation of PSM2 and exits 0 only if both pass.
#   intel: Intel's libpsm2 (LD_LIBRARY_PATH=/usr/lib/...) inside the
#          fake-adapter namespace of scripts/fake_hfi.sh (needs root).
#   psmd:  our libpsm2.so.2 (the program's RUNPATH) and a private psmd
#          ($PSMD_BIN, default daemon/psmd as in Bazel runfiles).
# Every process it starts is ended by PID; its scratch directory is removed.
set -uo pipefail
impl=$1; shift
program=$1; shift
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
work=$(mktemp -d /tmp/psmd-conf-XXXXXX)
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill -KILL "$pid" 2>/dev/null || true; done
  for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
  rm -rf "$work"
}
trap cleanup EXIT
timeout_s=${PSMD_CONFORMANCE_TIMEOUT:-120}

case "$impl" in
  intel)
    wrap=("$root/scripts/fake_hfi.sh" env LD_LIBRARY_PATH=/usr/lib/x86_64-linux-gnu
          PSMD_CONFORMANCE_IMPL=intel)
    if ! LD_LIBRARY_PATH=/usr/lib/x86_64-linux-gnu ldd "$program" |
        grep -q "libpsm2.so.2 => /usr/lib/x86_64-linux-gnu/"; then
      echo "run_pair: $program does not load Intel's libpsm2 with LD_LIBRARY_PATH" >&2
      exit 1
    fi
    ;;
  psmd)
    export PSMD_SOCKET="$work/psmd.sock"
    "${PSMD_BIN:-daemon/psmd}" --socket "$PSMD_SOCKET" --log-level warn &
    pids+=($!)
    for _ in $(seq 100); do [[ -S "$PSMD_SOCKET" ]] && break; sleep 0.05; done
    wrap=(env PSMD_CONFORMANCE_IMPL=psmd)
    ;;
  *) echo "usage: run_pair.sh intel|psmd PROGRAM [ARGS...]" >&2; exit 2 ;;
esac

# Both ranks share one namespace on intel (shared memory must be common).
"${wrap[@]}" bash -c '
  program=$1; work=$2; timeout_s=$3; shift 3
  timeout -s KILL "$timeout_s" "$program" --rank 0 --dir "$work" "$@" & r0=$!
  timeout -s KILL "$timeout_s" "$program" --rank 1 --dir "$work" "$@" & r1=$!
  wait $r0; s0=$?; wait $r1; s1=$?
  echo "run_pair: rank 0 exit $s0, rank 1 exit $s1" >&2
  [[ $s0 == 0 && $s1 == 0 ]]' run_pair "$program" "$work" "$timeout_s" "$@"
status=$?
exit $status
