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

# busy_percent SECONDS: how much of all CPUs' time was not idle over the
# next SECONDS (/proc/stat; iowait counts as idle, steal as busy: a VM's
# stolen time disturbs a measurement as much as a neighbour does).
busy_percent() {
  local a b
  read -r -a a </proc/stat
  sleep "$1"
  read -r -a b </proc/stat
  awk -v a="${a[*]:1:8}" -v b="${b[*]:1:8}" 'BEGIN {
    split(a, x); split(b, y)
    for (i = 1; i <= 8; i++) { d = y[i] - x[i]; total += d; if (i == 4 || i == 5) idle += d }
    printf "%d\n", total ? 100 * (total - idle) / total : 0 }'
}

# wait_quiet LIMIT PERCENT: returns once one second passed with the CPUs
# less than PERCENT busy, or after LIMIT seconds regardless; prints
# "quiet B% after W s" or "busy B% after W s" (B: the last sample).
wait_quiet() {
  local start=$SECONDS b
  while b=$(busy_percent 1); ((b >= $2)); do
    if ((SECONDS - start >= $1)); then
      echo "busy $b% after $((SECONDS - start)) s"
      return
    fi
  done
  echo "quiet $b% after $((SECONDS - start)) s"
}

# run_pair LIB OUT CPU0 CPU1 LIMIT PROGRAM [ARGS...]: ranks 0 and 1 of a
# PSM2 program that meets its peer through --dir (a fresh directory in
# $work), pinned with taskset (an empty CPU list: unpinned), on psmd's
# libpsm2.so.2 (LIB psmd; the psmd of $PSMD_SOCKET) or on Intel's (LIB
# intel, both ranks in one fake-adapter namespace). Rank N's output goes to
# OUT.rN; each rank is ended after LIMIT seconds. Returns rank 0's status,
# or rank 1's if that failed.
run_pair() {
  local lib=$1 out=$2 cpu0=$3 cpu1=$4 limit=$5 dir
  shift 5
  dir=$(mktemp -d "$work/pair-XXXXXX")
  # shellcheck disable=SC2016  # expanded by the inner shell
  local body='
    out=$1 cpu0=$2 cpu1=$3 limit=$4 dir=$5; shift 5
    pin() { if [[ -n "$1" ]]; then echo "taskset -c $1"; fi; }
    $(pin "$cpu1") timeout -k 5 "$limit" "$@" --rank 1 --dir "$dir" >"$out.r1" 2>&1 & r1=$!
    s=0
    $(pin "$cpu0") timeout -k 5 "$limit" "$@" --rank 0 --dir "$dir" >"$out.r0" 2>&1 || s=$?
    s1=0; wait "$r1" || s1=$?
    exit $((s ? s : s1))'
  case $lib in
    psmd) env LD_LIBRARY_PATH="$PWD/bazel-bin/client" \
      bash -c "$body" pair "$out" "$cpu0" "$cpu1" "$limit" "$dir" "$@" ;;
    intel) scripts/fake_hfi.sh env LD_LIBRARY_PATH=/usr/lib/x86_64-linux-gnu \
      bash -c "$body" pair "$out" "$cpu0" "$cpu1" "$limit" "$dir" "$@" ;;
    *) echo "run_pair: unknown library $lib" >&2; return 2 ;;
  esac
}
