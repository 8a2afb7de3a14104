#!/usr/bin/env bash
# Between two psmd daemons over loopback (issue 14's numbers), beside Open
# MPI's and UCX's tcp paths and plain TCP, in one run: ping-pong half round
# trip and streaming bandwidth at 8 B .. 4 MiB and the 8-byte message rate
# with 64 sends outstanding. Every peer runs the same two loops
# (bench/pt2pt.h: bench/pingpong's ping-pong, bench/msg_rate's stream):
#   tcp_block, tcp_spin  bench/tcp_pt2pt, one TCP connection 127.0.0.2 ->
#                 127.0.0.3, TCP_NODELAY, waiting in recv() or spinning on
#                 a non-blocking socket
#   psmd_psm2     bench/pingpong (PSM2), rank 0 on psmd node 1, rank 1 on
#                 psmd node 2 (fabric 127.0.0.2 <-> 127.0.0.3, MUNGE)
#   psmd_mpi      bench/mpi_pt2pt, Open MPI pml cm + mtl psmd, ranks on the
#                 same two daemons (MPMD mpirun, one PSMD_SOCKET per rank)
#   ob1_tcp       bench/mpi_pt2pt, Open MPI pml ob1 + btl tcp,self over lo
#   ucx_tcp       bench/mpi_pt2pt, Open MPI pml ucx, UCX_TLS=tcp,self over lo
#   psmd_ofi_psm2, psmd_ofi_mpi  as psmd_psm2 and psmd_mpi, on a second pair
#                 of psmd linked by the ofi backend over OFI_PROVIDER
#                 (default tcp;ofi_rxm; --fabric ofi --fabric-provider,
#                 --fabric-rma on unless PSMD_TEST_FABRIC_RMA=off)
#   mtl_ofi       bench/mpi_pt2pt, Open MPI pml cm + mtl ofi on the same
#                 provider (mtl_ofi_provider_include), bound to lo
#                 (FI_TCP_IFACE/FI_UDP_IFACE): libfabric's direct path, no
#                 daemon
# Each value is the median over RUNS runs (interleaved: every peer once per
# round) of each run's median (ping-pong: of every timed round trip;
# stream: of 5 repetitions). Prints the markdown tables of docs/perf.md.
# Usage: [RUNS=3] [PEERS="tcp_block tcp_spin psmd_psm2 psmd_mpi ob1_tcp
#        ucx_tcp psmd_ofi_psm2 psmd_ofi_mpi mtl_ofi"] [OFI_PROVIDER=P]
#        [KEEP=DIR] scripts/bench_fabric.sh
# KEEP: where to copy every program's output. DAEMON_FLAGS: more flags for
# every psmd (e.g. "--fabric-sessions off", to compare).
# Placement: rank 0 on CPU 0, rank 1 on CPU 1 (taskset; mpirun --bind-to
# none); the psmd unpinned, default --spin-us; munged unpinned. On 2 cores
# the two daemons share the ranks' cores (the idle pair, the other backend's,
# sleeps). NODE_CPUS="0 1" pins node 1's psmd
# beside rank 0 and node 2's beside rank 1, as on two real nodes, where a
# daemon never shares a core with the other node's rank.
set -euo pipefail
cd "$(dirname "$0")/.."
runs=${RUNS:-3}
read -r -a peers <<<"${PEERS:-tcp_block tcp_spin psmd_psm2 psmd_mpi ob1_tcp ucx_tcp psmd_ofi_psm2 psmd_ofi_mpi mtl_ofi}"
provider=${OFI_PROVIDER:-tcp;ofi_rxm}
bash scripts/deps.sh
bazel build --jobs=2 //daemon:psmd //tools:psmctl //bench:pingpong //bench:tcp_pt2pt \
  //bench:mpi_pt2pt //ompi:mca_mtl_psmd 2>/dev/null
source scripts/lib.sh
read -r -a daemon_flags <<<"${DAEMON_FLAGS:-}"
start_nodes bazel-bin/daemon/psmd 2 --log-level warn "${daemon_flags[@]}"
sock_nodes=("${node_socket[@]}")
# The ofi pair beside it (its own node table and sockets, the same munged).
ofi_nodes=()
if [[ " ${peers[*]} " == *" psmd_ofi_"* ]]; then
  PSMD_TEST_OFI_PROVIDER=$provider NODES_TAG=ofi start_nodes bazel-bin/daemon/psmd 2 \
    --log-level warn "${daemon_flags[@]}"
  ofi_nodes=("${node_socket[@]}")
fi
mkdir "$work/components" && cp bazel-bin/ompi/mca_mtl_psmd.so "$work/components/"
ompi=$(dirname "$(find /usr/lib/x86_64-linux-gnu/openmpi/lib -name mca_pml_cm.so | head -1)")

# 8 B .. 4 MiB in powers of 4 (and 8 B); a stream repetition moves up to
# 64 MiB, at most 50,000 and at least 64 messages.
sizes=(8 64 256 1024 4096 16384 65536 262144 1048576 4194304)
stream=""
for s in "${sizes[@]}"; do
  m=$((64 * 1048576 / s)); ((m > 50000)) && m=50000; ((m < 64)) && m=64
  stream+="${stream:+,}$s:$m"
done
args=(--max-size 4194304 --iters 1000 --stream "$stream" --reps 5)
limit=(timeout -k 10 600)

# The two daemons a run uses (set by run: the socket pair or the ofi pair).
at=("${sock_nodes[@]}")

# pair DIR PROGRAM [ARGS...]: ranks 1 and 0 of a program that meets its peer
# through --dir, each pinned and on its node's psmd; rank 0's output.
pair() {
  local dir=$1; shift
  mkdir "$dir"
  PSMD_SOCKET=${at[1]} "${limit[@]}" taskset -c 1 "$@" --rank 1 --dir "$dir" "${args[@]}" &
  pids+=($!)
  PSMD_SOCKET=${at[0]} "${limit[@]}" taskset -c 0 "$@" --rank 0 --dir "$dir" "${args[@]}"
  wait "${pids[-1]}"
  unset 'pids[-1]'
}

# mpi ENV... -- MPIRUN-ARGS...: bench/mpi_pt2pt with rank 0 on CPU 0 and
# node 1's psmd, rank 1 on CPU 1 and node 2's (the MPMD form run_mtl.sh's
# *_nodes cases use; other transports ignore PSMD_SOCKET).
mpi() {
  local env=()
  while [[ "$1" != "--" ]]; do env+=("$1"); shift; done
  shift
  (cd "$work" && env "${env[@]}" "${limit[@]}" mpirun --allow-run-as-root --bind-to none "$@" \
    -np 1 env PSMD_SOCKET="${at[0]}" taskset -c 0 "$OLDPWD/bazel-bin/bench/mpi_pt2pt" "${args[@]}" : \
    -np 1 env PSMD_SOCKET="${at[1]}" taskset -c 1 "$OLDPWD/bazel-bin/bench/mpi_pt2pt" "${args[@]}")
}

# fabric_bytes SOCKET...: payload bytes those daemons sent each other (their
# per-node counters); 0 for none.
fabric_bytes() {
  local s total=0
  for s in "$@"; do
    total=$((total + $(bazel-bin/tools/psmctl --socket "$s" --json stats |
      python3 -c 'import json,sys; print(sum(r["bytes_sent"] for r in json.load(sys.stdin)["peer_nodes"]))')))
  done
  echo "$total"
}

run() {
  local name=$1 dir=$work/$1.$2
  at=("${sock_nodes[@]}")
  [[ $name == psmd_ofi_* ]] && at=("${ofi_nodes[@]}")
  case $name in
    tcp_block|tcp_spin) pair "$dir" bazel-bin/bench/tcp_pt2pt --poll "${name#tcp_}" ;;
    psmd_psm2|psmd_ofi_psm2) pair "$dir" bazel-bin/bench/pingpong ;;
    psmd_mpi|psmd_ofi_mpi) mpi OMPI_MCA_mca_base_component_path="$ompi:$work/components" -- \
      --mca pml cm --mca mtl psmd ;;
    # Open MPI's own libfabric path on the provider psmd's ofi pair uses,
    # bound to loopback as psmd's are (the providers take the first
    # interface otherwise).
    mtl_ofi) mpi FI_TCP_IFACE=lo FI_UDP_IFACE=lo -- --mca pml cm --mca mtl ofi \
      --mca mtl_ofi_provider_include "$provider" -x FI_TCP_IFACE -x FI_UDP_IFACE ;;
    ob1_tcp) mpi -- --mca pml ob1 --mca btl tcp,self --mca btl_tcp_if_include lo ;;
    # Open MPI enables pml ucx only over the verbs/mlx5 transports it lists
    # in opal_common_ucx_tls unless told otherwise.
    ucx_tcp) mpi UCX_TLS=tcp,self UCX_NET_DEVICES=lo -- --mca pml ucx \
      --mca opal_common_ucx_tls any --mca opal_common_ucx_devices any -x UCX_TLS -x UCX_NET_DEVICES ;;
    *) echo "bench_fabric: unknown peer $name" >&2; return 2 ;;
  esac
}

# The machine is shared: say how busy it was (load average, 1/5/15 min).
echo "started $(date -u '+%F %H:%M') UTC, load $(cut -d' ' -f1-3 /proc/loadavg)," \
  "psmd CPUs: ${NODE_CPUS:-any}, ofi provider: $provider"
for r in $(seq "$runs"); do
  for n in "${peers[@]}"; do
    echo "== $n, run $r of $runs" >&2
    before=$(fabric_bytes "${sock_nodes[@]}") before_ofi=$(fabric_bytes "${ofi_nodes[@]}")
    run "$n" "$r" >"$work/$n.$r.out"
    moved=$(($(fabric_bytes "${sock_nodes[@]}") - before))
    moved_ofi=$(($(fabric_bytes "${ofi_nodes[@]}") - before_ofi))
    # The psmd peers' bytes must have crossed their pair's fabric, the
    # others' neither.
    crossed=0 expected=0
    ((moved > 100000000)) && crossed=1
    ((moved_ofi > 100000000)) && crossed=$((crossed + 2))
    [[ $n == psmd_* ]] && expected=1
    [[ $n == psmd_ofi_* ]] && expected=2
    if ((crossed != expected)); then
      echo "bench_fabric: $n moved $moved payload bytes between the socket pair," \
        "$moved_ofi between the ofi pair" >&2
      exit 1
    fi
  done
done
echo "ended $(date -u '+%F %H:%M') UTC, load $(cut -d' ' -f1-3 /proc/loadavg)"
echo
[[ -z "${KEEP:-}" ]] || { mkdir -p "$KEEP" && cp "$work"/*.out "$KEEP/"; }

python3 - "$work" "$runs" "${peers[@]}" <<'PY'
import re, statistics, sys
work, nruns, names = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
lat, rate = {}, {}  # (name, size) -> per-run medians
for n in names:
    for r in range(1, nruns + 1):
        size = None
        for line in open(f"{work}/{n}.{r}.out"):
            w = line.split()
            if len(w) == 4 and w[0].isdigit():
                lat.setdefault((n, int(w[0])), []).append(float(w[1]))
            elif m := re.match(r"# stream: (\d+) B", line):
                size = int(m.group(1))
            elif m := re.match(r"median (\S+) Mmsg/s", line):
                rate.setdefault((n, size), []).append(float(m.group(1)) * 1e6)
sizes = sorted({s for (_, s) in rate})
med = lambda d, n, s: statistics.median(d[(n, s)])
floor = "tcp_spin" if "tcp_spin" in names else names[0]
mpis = [p for p in ("ob1_tcp", "ucx_tcp") if p in names]
psmds = [p for p in ("psmd_psm2", "psmd_mpi") if p in names]
ratios = [(p, q) for p in psmds for q in [floor] + (mpis if p == "psmd_mpi" else [])]
# psmd over ofi against Open MPI's own path on the same provider.
ratios += [(p, "mtl_ofi") for p in ("psmd_ofi_mpi", "psmd_ofi_psm2")
           if p in names and "mtl_ofi" in names]

def table(title, unit, value, better):
    print(f"{title}\n")
    print("| bytes | " + " | ".join(f"{n} {unit}" for n in names) + " | " +
          " | ".join(f"{p}/{q}" for p, q in ratios) + " |")
    print("| ---: |" + " ---: |" * (len(names) + len(ratios)))
    for s in sizes:
        v = {n: value(n, s) for n in names}
        cells = [f"{v[n]:,.2f}" if v[n] < 100 else f"{v[n]:,.0f}" for n in names]
        print(f"| {s} | " + " | ".join(cells) + " | " +
              " | ".join(f"{v[p] / v[q]:.2f}" for p, q in ratios) + " |")
    print(f"\n({better})\n")

table("Half round trip (median), µs", "µs", lambda n, s: med(lat, n, s),
      "ratios: psmd's time over the peer's; below 1 psmd is faster")
table("Streaming bandwidth (64 outstanding), MB/s", "MB/s",
      lambda n, s: med(rate, n, s) * s / 1e6,
      "ratios: psmd's bandwidth over the peer's; above 1 psmd is faster")
mine = [p for p in ("psmd_psm2", "psmd_mpi", "psmd_ofi_psm2", "psmd_ofi_mpi")
        if p in names]
print("| peer | 8 B messages/s, 64 outstanding | " +
      " | ".join(f"{p} / peer" for p in mine) + " |")
print("| --- | ---: |" + " ---: |" * len(mine))
for n in names:
    r = med(rate, n, 8)
    print(f"| {n} | {r:,.0f} | " +
          " | ".join(f"{med(rate, p, 8) / r:.2f}" for p in mine) + " |")
PY
