# Sourced by the MPI test drivers (after scripts/workdir.sh): a psmd of the
# test's own on $work/psmd.sock, ended with the test (its PID joins $pids),
# and `sent`, the messages it has carried (psmctl stats), with which a
# driver proves that the traffic went through psmd.
psmd=${PSMD_BIN:-$root/daemon/psmd}
psmctl=${PSMCTL_BIN:-$root/tools/psmctl}
export PSMD_SOCKET="$work/psmd.sock"

# PSMD_WORKERS=N (the *_workers2 targets): psmd with N engine shards, and
# check_shards to prove afterwards that they all carried traffic.
start_psmd() {
  "$psmd" --socket "$PSMD_SOCKET" --log-level warn \
    --workers "${PSMD_WORKERS:-1}" &
  pids+=($!)
  # Until it answers: the socket file alone may be a killed psmd's.
  for _ in $(seq 100); do
    "$psmctl" --socket "$PSMD_SOCKET" health >/dev/null 2>&1 && break
    sleep 0.05
  done
}

sent() {
  "$psmctl" --socket "$PSMD_SOCKET" --json stats |
    python3 -c 'import json,sys; print(json.load(sys.stdin)["total"]["msgs_sent"])'
}

# Every daemon's: the test's own, or each of scripts/nodes.sh's.
check_shards() {
  ((${PSMD_WORKERS:-1} > 1)) || return 0
  local sockets=("${node_socket[@]:-$PSMD_SOCKET}") i status=0
  for i in "${!sockets[@]}"; do
    "$psmctl" --socket "${sockets[i]}" stats --format json >"$work/stats$i.json" &&
      python3 "$root/tests/check_shards.py" "$work/stats$i.json" "$PSMD_WORKERS" ||
      status=1
  done
  return "$status"
}
