#!/usr/bin/env bash
# Open MPI point-to-point over psmd's own MTL (pml cm, mtl psmd) beside the
# drop-in (mtl psm2 on psmd's libpsm2.so.2), Intel's libpsm2 (shm, fake
# adapter: for comparison only) and btl vader, in one run: NetPIPE (full
# default range; one-way latency and bandwidth at selected sizes) and
# bench/mpi_msg_rate (8-byte streaming message rate). Prints the markdown
# tables of docs/perf.md, each value the median of RUNS runs (interleaved:
# every transport once per round, so a disturbance hits all of them).
# Usage: [RUNS=3] [TRANSPORTS="mtl_psmd dropin intel vader"] [NP_ARGS=...]
#        [KEEP=DIR] scripts/bench_mtl.sh
# NP_ARGS: more NetPIPE flags, e.g. "-l 4194304 -u 4194304" for 4 MiB only
# (many short interleaved runs: an A/B comparison on a busy machine).
# KEEP: where to copy the raw NetPIPE outputs and message rates.
# Placement: ranks bound to cores 0 and 1 (--cpu-set 0,1 --bind-to core);
# psmd unpinned.
set -euo pipefail
cd "$(dirname "$0")/.."
runs=${RUNS:-3}
read -r -a names <<<"${TRANSPORTS:-mtl_psmd dropin intel vader}"
bash scripts/deps.sh
bazel build //daemon:psmd //client:libpsm2.so.2 //ompi:mca_mtl_psmd 2>/dev/null
source scripts/lib.sh
start_psmd --
mpicxx -std=c++17 -O2 -o "$work/mpi_msg_rate" bench/mpi_msg_rate.cc
setup_mpi_transports

for r in $(seq "$runs"); do
  for n in "${names[@]}"; do
    echo "== $n, run $r of $runs" >&2
    # shellcheck disable=SC2086  # NP_ARGS is a list of flags
    run_mpi "$n" NPopenmpi ${NP_ARGS:-} -o "$work/$n.$r.np" >/dev/null
    run_mpi "$n" "$work/mpi_msg_rate" 8 2000 5 | grep mpi_msg_rate | sed "s/^/$n /" >>"$work/rate.txt"
  done
done
[[ -z "${KEEP:-}" ]] || { mkdir -p "$KEEP" && cp "$work"/*.np "$work/rate.txt" "$KEEP/"; }

python3 - "$work" "$runs" "${names[@]}" <<'PY'
import statistics, sys
work, nruns, names = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
# NetPIPE measures each size 2^k and its neighbours 2^k - 3 and 2^k + 3; a
# size's value is the median of those three over all runs (9 samples with
# RUNS=3): one-way time in us, and the bandwidth that time gives at 2^k.
def load(name):
    rows = {}
    for r in range(1, nruns + 1):
        for line in open(f"{work}/{name}.{r}.np"):
            b, mbps, t = line.split()
            rows.setdefault(int(b), []).append(float(t) * 1e6)
    return rows
runs = {n: load(n) for n in names}
sizes = [1, 8, 64, 512, 4096, 32768, 65536, 262144, 1048576, 4194304, 16777216, 67108864]
print("| bytes | " + " | ".join(f"{n} µs" for n in names) + " | " +
      " | ".join(f"{n} MB/s" for n in names) + " |")
print("| ---: |" + " ---: |" * (2 * len(names)))
for s in sizes:
    samples = [[t for b, ts in runs[n].items() if abs(b - s) <= 3 for t in ts] for n in names]
    if not all(samples):
        continue  # not measured (NP_ARGS)
    us = [statistics.median(x) for x in samples]
    print(f"| {s} | " + " | ".join(f"{u:.2f}" for u in us) +
          " | " + " | ".join(f"{s / u:.0f}" for u in us) + " |")
print()
print("| transport | 8 B messages/s |")
print("| --- | ---: |")
rates = {}
for line in open(f"{work}/rate.txt"):
    w = line.split()
    rates.setdefault(w[0], []).append(float(w[-2]))
for n in names:
    print(f"| {n} | {statistics.median(rates[n]):,.0f} |")
PY
