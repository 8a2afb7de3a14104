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

# start_nodes: instead of one psmd, two linked by the fabric on 127.0.0.2
# and 127.0.0.3 (node ids 1 and 2, one node table) with a munged of our own
# (generated key) authenticating them, each with its control socket
# ${node_socket[0]}, ${node_socket[1]} and its log in $work/psmdI.log.
# Extra arguments go to both psmd.
start_nodes() {
  chmod 0711 "$work"  # munged wants its socket's directories searchable
  mkdir -m 0711 "$work/munge"
  head -c 1024 /dev/urandom >"$work/munge/key"
  chmod 0600 "$work/munge/key"
  /usr/sbin/munged --foreground --force --socket="$work/munge/socket" \
    --key-file="$work/munge/key" --pid-file="$work/munge/pid" \
    --log-file="$work/munge/log" --seed-file="$work/munge/seed" 2>/dev/null &
  pids+=($!)
  for _ in $(seq 200); do [[ -S "$work/munge/socket" ]] && break; sleep 0.05; done
  : >"$work/nodes"
  local i addr port listen=()
  for i in 0 1; do
    addr=127.0.0.$((2 + i))
    # A free port on that address (the node table names it before the
    # daemons start).
    port=$(python3 -c 'import socket,sys; s=socket.socket(); s.bind((sys.argv[1],0)); print(s.getsockname()[1])' "$addr")
    echo "$((i + 1)) node$((i + 1)) $((i + 1))@$addr:$port" >>"$work/nodes"
    listen[i]="$addr:$port"
  done
  for i in 0 1; do
    node_socket[i]="$work/psmd$i.sock"
    bazel-bin/daemon/psmd --socket "${node_socket[i]}" --log-level warn --node-id $((i + 1)) \
      --fabric-listen "${listen[i]}" --fabric-nodes "$work/nodes" \
      --munge-socket "$work/munge/socket" "$@" 2>"$work/psmd$i.log" &
    pids+=($!)
  done
  for i in 0 1; do
    for _ in $(seq 100); do [[ -S "${node_socket[i]}" ]] && continue 2; sleep 0.05; done
    echo "psmd $i did not come up on ${node_socket[i]}:" >&2
    cat "$work/psmd$i.log" >&2
    return 1
  done
}
