#!/usr/bin/env bash
# Issue 3's matcher target, measured the way docs/perf.md reports it: the
# exact-tag batch rows of bench/match_bench (the daemon's prefetched path) at
# depth 1 and 65536, back to back in each round, and the ratio per round.
# Per round because on this VM the neighbours' memory traffic moves the
# depth-65536 cost between rounds minutes apart. Usage:
#   scripts/bench_match_ratio.sh [ROUNDS]   (default 10)
# Placement: CPU 1 (PLACE_BENCH overrides; empty = unpinned).
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-10}
bash scripts/deps.sh
bazel build -c opt //bench:match_bench 2>/dev/null
bench="$(bazel info -c opt bazel-bin 2>/dev/null)/bench/match_bench"
pin=()
if [[ -n "${PLACE_BENCH-1}" ]]; then pin=(taskset -c "${PLACE_BENCH-1}"); fi

echo "# match_bench batch rows, $rounds rounds, cpus=${PLACE_BENCH-1}"
for _ in $(seq "$rounds"); do
  "${pin[@]}" "$bench" --benchmark_filter='ExactBatch<.*depth:(1|65536)/' \
    --benchmark_min_time=0.15 2>/dev/null | awk '/^BM/ {print $1, $2}'
done | python3 -c '
import re, statistics, sys
rounds = {}
for line in sys.stdin:
    name, ns = line.split()
    queue, depth = re.match(r"BM_(\w+)ExactBatch<.*depth:(\d+)", name).groups()
    rounds.setdefault(queue, {}).setdefault(depth, []).append(float(ns))
for queue, by_depth in rounds.items():
    shallow, deep = by_depth["1"], by_depth["65536"]
    ratios = sorted(d / s for s, d in zip(shallow, deep))
    print(f"{queue:10} depth 1 median {statistics.median(shallow):6.1f} ns, "
          f"65536 median {statistics.median(deep):6.1f} ns, ratio per round "
          f"{ratios[0]:.2f}-{ratios[-1]:.2f} (median {statistics.median(ratios):.2f})")
'
