#!/usr/bin/env bash
# The benchmark suite (issue 16, "The suite"): every benchmark on every
# system it exists for, in one run, interleaved, with tables and plots.
#
#   scripts/bench.sh [--quick] [--out DIR]
#   environment: RUNS (3), SYSTEMS ("psmd intel vader ucx"; mtl_psmd adds
#   Open MPI's native psmd MTL), QUIET_WAIT (60 s; --quick 3),
#   QUIET_PERCENT (25), IDLE_SECONDS (10; --quick 2)
#
# Systems: psmd (its drop-in libpsm2.so.2; under Open MPI pml cm + mtl
# psm2, in the fake-adapter namespace Open MPI's psm2 MTL needs), intel
# (Debian's libpsm2, shm, fake-adapter namespace; for comparison only),
# vader (Open MPI pml ob1, btl self,vader), ucx (Open MPI pml ucx,
# UCX_TLS=sm,self). Benchmarks, and the systems they exist for:
#   pt2pt      bench/mpi_pt2pt (bench/pt2pt.h) on all: ping-pong half round
#              trip 0 B .. 64 MiB, streaming bandwidth (64 outstanding)
#              8 B .. 4 MiB whose 8 B row is the message rate, asynchronous
#              progress of one 64 MiB message (Overlap in bench/pt2pt.h)
#   am_rate    bench/am_rate: AM round trip and one-way request rate (PSM2)
#   deep_match bench/deep_match: matching against deep queues (PSM2)
#   hop        bench/hop: an 8 B message to oneself (PSM2) beside the
#              cache-line round trip between the two cores (the floor)
#   ep_open    bench/ep_open: psm2_init, psm2_ep_open, psm2_ep_connect to a
#              peer, psm2_ep_close, each in a fresh process (PSM2)
#   idle       psmd's CPU time (/proc/PID/stat utime + stime) over
#              IDLE_SECONDS with no client and with one idle client
# Each round runs every benchmark on every system once (a disturbance hits
# all of them); before each measurement the script waits up to QUIET_WAIT
# seconds for a second in which the CPUs are less than QUIET_PERCENT busy
# and records whether it got one. A cell is the median over RUNS rounds of
# each round's value (itself the benchmark's median), with min and max.
# Placement (2 cores): ranks on CPUs 0 and 1, psmd unpinned; deep_match
# both ranks on CPU 0 and psmd on CPU 1; hop the client on CPU 0, psmd on
# CPU 1 (psmd's affinity is changed for those two with taskset -p).
# Output: DIR/tables.md (the tables, also printed), DIR/latency.png and
# DIR/bandwidth.png (gnuplot), DIR/raw/ (every program's output and the
# quiet-machine log). Without --out, DIR is temporary and only the tables
# remain (on stdout). No benchmark figure is a pass/fail condition.
set -euo pipefail
cd "$(dirname "$0")/.."
quick=0 out=""
while (($#)); do
  case $1 in
    --quick) quick=1; shift ;;
    --out) out=$2; shift 2 ;;
    *) echo "usage: scripts/bench.sh [--quick] [--out DIR]" >&2; exit 2 ;;
  esac
done
runs=${RUNS:-3}
read -r -a systems <<<"${SYSTEMS:-psmd intel vader ucx}"
quiet_percent=${QUIET_PERCENT:-25}
if ((quick)); then
  quiet_wait=${QUIET_WAIT:-3} idle_s=${IDLE_SECONDS:-2}
  # shellcheck disable=SC2054  # the commas are in one --stream value
  pt2pt=(--min-size 0 --max-size 65536 --iters 100 --stream 8:2000,65536:200 --reps 3
    --overlap 4194304)
  am=(--roundtrips 2000 --requests 20000 --reps 3 --seconds 1)
  depths=(1024) deep_reps=1 hop_iters=20000 ep_iters=5
else
  quiet_wait=${QUIET_WAIT:-60} idle_s=${IDLE_SECONDS:-10}
  # A stream repetition moves up to 64 MiB: at most 50,000, at least 64
  # messages.
  stream=""
  for s in 8 64 512 4096 32768 262144 1048576 4194304; do
    m=$((64 * 1048576 / s)); ((m > 50000)) && m=50000; ((m < 64)) && m=64
    stream+="${stream:+,}$s:$m"
  done
  pt2pt=(--min-size 0 --max-size 67108864 --iters 1000 --stream "$stream" --reps 5
    --overlap 67108864)
  am=(--reps 5)
  depths=(1024 16384 65536) deep_reps=1 hop_iters=200000 ep_iters=50
fi

bash scripts/deps.sh
bazel build --jobs=2 //daemon:psmd //client:libpsm2.so.2 //ompi:mca_mtl_psmd //bench:am_rate \
  //bench:deep_match //bench:hop //bench:ep_open //bench:mpi_pt2pt 2>/dev/null
source scripts/lib.sh
start_psmd --
psmd_pid=${pids[-1]}
if [[ -z "$out" ]]; then out=$work/out; fi
mkdir -p "$out/raw"
out=$(realpath "$out") raw=$(realpath "$out")/raw
mkdir "$work/components" && cp bazel-bin/ompi/mca_mtl_psmd.so "$work/components/"
ompi=$(dirname "$(find /usr/lib/x86_64-linux-gnu/openmpi/lib -name mca_pml_cm.so | head -1)")
bin=$PWD/bazel-bin/bench

# Ranks 0 and 1 on cores 0 and 1; --report-bindings states it in the raw
# output.
mpirun=(timeout -k 10 900 mpirun --allow-run-as-root -np 2 --bind-to core --map-by core
  --report-bindings)

# pt2pt SYSTEM OUT: bench/mpi_pt2pt on SYSTEM.
pt2pt() {
  local lib=$PWD/bazel-bin/client
  case $1 in
    psmd) (cd "$work" && "$OLDPWD/scripts/fake_hfi.sh" env LD_LIBRARY_PATH="$lib" "${mpirun[@]}" \
      --mca pml cm --mca mtl psm2 --mca btl self -x LD_LIBRARY_PATH -x PSMD_SOCKET \
      "$bin/mpi_pt2pt" "${pt2pt[@]}") ;;
    mtl_psmd) (cd "$work" && OMPI_MCA_mca_base_component_path="$ompi:$work/components" \
      "${mpirun[@]}" --mca pml cm --mca mtl psmd --mca btl self -x PSMD_SOCKET \
      -x OMPI_MCA_mca_base_component_path "$bin/mpi_pt2pt" "${pt2pt[@]}") ;;
    intel) (cd "$work" && "$OLDPWD/scripts/fake_hfi.sh" \
      env LD_LIBRARY_PATH=/usr/lib/x86_64-linux-gnu "${mpirun[@]}" \
      --mca pml cm --mca mtl psm2 --mca btl self -x LD_LIBRARY_PATH "$bin/mpi_pt2pt" "${pt2pt[@]}") ;;
    vader) (cd "$work" && "${mpirun[@]}" --mca pml ob1 --mca btl self,vader \
      "$bin/mpi_pt2pt" "${pt2pt[@]}") ;;
    # Open MPI 4.1 enables pml ucx only over the transports it lists in
    # opal_common_ucx_tls unless told otherwise.
    ucx) (cd "$work" && UCX_TLS=sm,self "${mpirun[@]}" --mca pml ucx \
      --mca opal_common_ucx_tls any --mca opal_common_ucx_devices any -x UCX_TLS \
      "$bin/mpi_pt2pt" "${pt2pt[@]}") ;;
  esac
}

# pin_psmd CPUS: psmd's threads onto CPUS.
pin_psmd() { taskset -a -p -c "$1" "$psmd_pid" >/dev/null; }
all_cpus=$(taskset -c -p "$psmd_pid" | awk '{print $NF}')

# cpu_ticks PID: utime + stime of PID, clock ticks.
cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }

# idle_cpu OUT: psmd's share of one CPU over idle_s, with no client, then
# with one that has an endpoint open and sleeps.
idle_cpu() {
  local hz t0 t1 client
  hz=$(getconf CLK_TCK)
  t0=$(cpu_ticks "$psmd_pid"); sleep "$idle_s"; t1=$(cpu_ticks "$psmd_pid")
  echo "idle none $(awk -v d=$((t1 - t0)) -v hz="$hz" -v s="$idle_s" 'BEGIN {print 100 * d / hz / s}')"
  LD_LIBRARY_PATH=$PWD/bazel-bin/client "$bin/ep_open" idle --seconds $((idle_s + 2)) >"$1.client" &
  client=$!
  pids+=("$client")
  # Measure once the client is attached (it says so).
  for _ in $(seq 100); do grep -q sleeping "$1.client" 2>/dev/null && break; sleep 0.05; done
  t0=$(cpu_ticks "$psmd_pid"); sleep "$idle_s"; t1=$(cpu_ticks "$psmd_pid")
  echo "idle one $(awk -v d=$((t1 - t0)) -v hz="$hz" -v s="$idle_s" 'BEGIN {print 100 * d / hz / s}')"
  wait "$client"
  unset 'pids[-1]'
}

# measure BENCH SYSTEM ROUND: one measurement into raw/BENCH.SYSTEM.ROUND*,
# after waiting for a quiet machine. A failure is recorded, not fatal.
measure() {
  local b=$1 s=$2 r=$3 f="$raw/$1.$2.$3" status=0 q
  q=$(wait_quiet "$quiet_wait" "$quiet_percent")
  echo "== round $r of $runs: $b on $s ($q)" >&2
  case $b in
    pt2pt) pt2pt "$s" >"$f.r0" 2>"$f.err" || status=$? ;;
    am_rate) run_pair "$s" "$f" 0 1 300 "$bin/am_rate" "${am[@]}" || status=$? ;;
    deep_match)
      if [[ $s == psmd ]]; then pin_psmd 1; fi
      for d in "${depths[@]}"; do
        run_pair "$s" "$f.$d" 0 0 600 "$bin/deep_match" --depth "$d" --reps "$deep_reps" ||
          status=$?
      done
      if [[ $s == psmd ]]; then pin_psmd "$all_cpus"; fi ;;
    hop)
      case $s in
        psmd) pin_psmd 1
          taskset -c 0 timeout -k 5 120 "$bin/hop" self --iters "$hop_iters" >"$f.r0" 2>&1 ||
            status=$?
          pin_psmd "$all_cpus" ;;
        intel) scripts/fake_hfi.sh env LD_LIBRARY_PATH=/usr/lib/x86_64-linux-gnu \
          taskset -c 0 timeout -k 5 120 "$bin/hop" self --iters "$hop_iters" >"$f.r0" 2>&1 ||
          status=$? ;;
        floor) "$bin/hop" cacheline --cpus 0,1 --iters "$hop_iters" >"$f.r0" 2>&1 || status=$? ;;
      esac ;;
    ep_open) run_pair "$s" "$f" 0 1 300 "$bin/ep_open" --iters "$ep_iters" || status=$? ;;
    idle) idle_cpu "$f" >"$f.r0" || status=$? ;;
  esac
  echo "$b $s $r $q status $status" >>"$raw/conditions"
  ((status == 0)) || echo "   $b on $s failed (exit $status); see $f.*" >&2
}

# Which systems each benchmark exists for, in the order of $systems.
psm2_systems=()
for s in "${systems[@]}"; do [[ $s == psmd || $s == intel ]] && psm2_systems+=("$s"); done
declare -A bench_systems=(
  [pt2pt]="${systems[*]}" [am_rate]="${psm2_systems[*]}" [deep_match]="${psm2_systems[*]}"
  [hop]="${psm2_systems[*]} floor" [ep_open]="${psm2_systems[*]}" [idle]=psmd)
benches=(pt2pt am_rate deep_match hop ep_open idle)

{
  echo "started $(date -u '+%F %H:%M:%S') UTC, load $(cut -d' ' -f1-3 /proc/loadavg), $(nproc) CPUs, niceness $(nice) (psmd and the ranks inherit it)"
  echo "psmd: pid $psmd_pid, unpinned (CPUs $all_cpus) but for deep_match and hop (CPU 1)"
  echo "quick $quick, RUNS $runs, quiet: < $quiet_percent% busy for 1 s, waiting up to $quiet_wait s"
} >"$raw/conditions.head"
for r in $(seq "$runs"); do
  for b in "${benches[@]}"; do
    for s in ${bench_systems[$b]}; do measure "$b" "$s" "$r"; done
  done
done
echo "ended $(date -u '+%F %H:%M:%S') UTC, load $(cut -d' ' -f1-3 /proc/loadavg)" \
  >>"$raw/conditions.head"

python3 scripts/bench_report.py "$raw" "$out" "$runs" "${systems[@]}" | tee "$out/tables.md"
(cd "$out" && gnuplot plots.gp)
if [[ "$out" != "$work/out" ]]; then
  echo "tables, plots and raw data in $out" >&2
fi
