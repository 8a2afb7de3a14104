# Shared by the scripts: a temporary work directory and a psmd on a socket in
# it, both removed (by PID) when the script exits.
source "$(dirname "${BASH_SOURCE[0]}")/workdir.sh" psmd
export PSMD_SOCKET="$work/psmd.sock"

# start_psmd [taskset-prefix...] -- [psmd flags...]
start_psmd() {
  local prefix=()
  while (($#)) && [[ "$1" != "--" ]]; do prefix+=("$1"); shift; done
  (($#)) && shift
  "${prefix[@]}" bazel-bin/daemon/psmd --socket "$PSMD_SOCKET" --log-level warn "$@" &
  pids+=($!)
  for _ in $(seq 100); do [[ -S "$PSMD_SOCKET" ]] && return 0; sleep 0.05; done
  echo "psmd did not come up on $PSMD_SOCKET" >&2
  return 1
}
