# shellcheck shell=bash disable=SC2154  # $work and $pids: from workdir.sh
# Several "nodes" on one machine, for the scripts and test drivers that
# source workdir.sh first (they provide $work and $pids, and end every
# process in $pids):
#   source scripts/nodes.sh
#   start_nodes PSMD COUNT [FLAGS...]
# starts a munged of our own (a generated key, its socket
# $work/munge/socket) and COUNT psmd (the binary PSMD) linked by the fabric:
# daemon i listens on 127.0.0.(2+i) at a free port, has node id i+1 and the
# control socket ${node_socket[i]} and the PID ${node_pid[i]}, logs to
# $work/psmd<i>.log, and is
# authenticated by that munged; one node table ($work/nodes) names them all.
# FLAGS go to every psmd; with PSMD_TEST_OFI_PROVIDER set (a libfabric
# provider, e.g. "tcp;ofi_rxm"), they run the ofi backend over it. With
# NODE_CPUS set (a CPU list per node, e.g.
# "0 1"), daemon i runs pinned to the i-th (taskset). With NODES_TAG set (a
# word), the files are $work/nodes$NODES_TAG, psmd$NODES_TAG<i>.sock and
# .log: a second set of daemons beside the first (scripts/bench_fabric.sh
# runs one set over sockets, one over ofi), sharing the munged. Returns
# once every control socket is up; else prints the log of the one that is
# not and returns 1.
start_nodes() {
  local psmd=$1 count=$2 i addr port listen=() tag=${NODES_TAG:-}
  shift 2
  if [[ ! -S "$work/munge/socket" ]]; then start_munged || return 1; fi
  local table=$work/nodes$tag
  : >"$table"
  for ((i = 0; i < count; i++)); do
    addr=127.0.0.$((2 + i))
    # A free port on that address (the node table names it before the
    # daemons start).
    port=$(python3 -c 'import socket,sys; s=socket.socket(); s.bind((sys.argv[1],0)); print(s.getsockname()[1])' "$addr")
    echo "$((i + 1)) node$((i + 1)) $((i + 1))@$addr:$port" >>"$table"
    listen[i]="$addr:$port"
  done
  # Over tcp;ofi_rxm the tests and benchmarks read rendezvous chunks by RMA
  # (psmd's default is off: docs/design.md, "Rendezvous by RMA read");
  # PSMD_TEST_FABRIC_RMA=off streams them. Over udp;ofi_rxd they stream
  # unless PSMD_TEST_FABRIC_RMA=on: its reads are slow (a 256 KiB one
  # outlasted the fabric timeout under CI's load, failing
  # mq_conformance_nodes_ofi_udp's 64 MiB message); fabric_ofi_udp_test
  # reads over it.
  if [[ -n "${PSMD_TEST_OFI_PROVIDER:-}" ]]; then
    local rma=on
    [[ $PSMD_TEST_OFI_PROVIDER == udp* ]] && rma=off
    set -- --fabric ofi --fabric-provider "$PSMD_TEST_OFI_PROVIDER" \
      --fabric-rma "${PSMD_TEST_FABRIC_RMA:-$rma}" "$@"
  fi
  node_socket=() node_pid=()
  local cpus=()
  read -r -a cpus <<<"${NODE_CPUS:-}"
  for ((i = 0; i < count; i++)); do
    node_socket[i]="$work/psmd$tag$i.sock"
    local pin=()
    [[ -n "${cpus[i]:-}" ]] && pin=(taskset -c "${cpus[i]}")
    "${pin[@]}" "$psmd" --socket "${node_socket[i]}" --node-id $((i + 1)) \
      --fabric-listen "${listen[i]}" --fabric-nodes "$table" \
      --munge-socket "$work/munge/socket" "$@" 2>"$work/psmd$tag$i.log" &
    node_pid[i]=$!
    pids+=($!)
  done
  for ((i = 0; i < count; i++)); do
    for _ in $(seq 100); do [[ -S "${node_socket[i]}" ]] && continue 2; sleep 0.05; done
    echo "psmd $i did not come up on ${node_socket[i]}:" >&2
    cat "$work/psmd$tag$i.log" >&2
    return 1
  done
}

# start_munged: a munged of our own (a generated key, its socket
# $work/munge/socket, its PID appended to $pids); returns once the socket is
# up, else 1.
start_munged() {
  chmod go+x "$work"  # munged wants its socket's directories searchable
  mkdir -m 0711 "$work/munge"
  head -c 1024 /dev/urandom >"$work/munge/key"
  chmod 0600 "$work/munge/key"
  /usr/sbin/munged --foreground --force --socket="$work/munge/socket" \
    --key-file="$work/munge/key" --pid-file="$work/munge/pid" \
    --log-file="$work/munge/log" --seed-file="$work/munge/seed" \
    </dev/null >/dev/null 2>&1 &
  pids+=($!)
  for _ in $(seq 200); do [[ -S "$work/munge/socket" ]] && return 0; sleep 0.05; done
  echo "munged did not come up on $work/munge/socket" >&2
  return 1
}

# check_node_traffic PSMCTL: daemons 0 and 1 each sent the other node more
# than 100,000 payload bytes (their per-peer-node rows in psmctl stats), over
# the backend and provider asked for (ofi and PSMD_TEST_OFI_PROVIDER when it
# is set, else socket). Prints both; returns 1 if either did not.
check_node_traffic() {
  local psmctl=$1 i line bytes over status=0
  local want=socket
  if [[ -n "${PSMD_TEST_OFI_PROVIDER:-}" ]]; then
    want="ofi $PSMD_TEST_OFI_PROVIDER"
  fi
  for i in 0 1; do
    line=$("$psmctl" --socket "${node_socket[i]}" --json stats |
      python3 -c 'import json,sys; s=json.load(sys.stdin); print(sum(r["bytes_sent"] for r in s["peer_nodes"]), s["fabric_backend"], s["fabric_provider"])')
    read -r bytes over <<<"$line"
    echo "psmd $i sent $bytes payload bytes to the other node (fabric: $over)"
    ((bytes > 100000)) || { echo "psmd $i: no traffic to the other node" >&2; status=1; }
    [[ $over == "$want" ]] ||
      { echo "psmd $i: fabric is '$over', not '$want'" >&2; status=1; }
  done
  return "$status"
}

# print_node_logs: the last lines of each daemon's log, on stderr (for a
# failed case).
print_node_logs() {
  local i
  for i in "${!node_socket[@]}"; do
    echo "---- psmd${NODES_TAG:-}$i log" >&2
    tail -n 40 "$work/psmd${NODES_TAG:-}$i.log" >&2
  done
}
