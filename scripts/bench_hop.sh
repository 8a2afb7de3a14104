#!/usr/bin/env bash
# The hop through psmd beside its hardware floor, in one run (issue 16, "The
# hop"): bench/hop self (one client sends 8 B to itself: one trip to psmd
# and back per message) with psmd pinned to CPU 1 and the client to CPU 0,
# and bench/hop cacheline (a cache line bounced between CPUs 0 and 1).
# Interleaved RUNS times; prints each run and the medians with their ratio.
# Usage: [RUNS=5] [ITERS=200000] scripts/bench_hop.sh [psmd flags...]
set -euo pipefail
cd "$(dirname "$0")/.."
runs=${RUNS:-5} iters=${ITERS:-200000}
bash scripts/deps.sh
bazel build //daemon:psmd //bench:hop 2>/dev/null
source scripts/lib.sh
start_psmd taskset -c 1 -- "$@"
echo "# $(date -u '+%F %T') UTC, load $(cut -d' ' -f1-3 /proc/loadavg); psmd on CPU 1 ($*), client on CPU 0"
self=() line=()
for run in $(seq "$runs"); do
  s=$(taskset -c 0 bazel-bin/bench/hop self --iters "$iters" | awk '{print $2}')
  l=$(bazel-bin/bench/hop cacheline --cpus 0,1 --iters "$iters" | awk '{print $2}')
  echo "run $run: self $s ns per message, cache line $l ns round trip"
  self+=("$s") line+=("$l")
done
median() { printf '%s\n' "$@" | sort -g | awk '{v[NR]=$1} END {print v[int((NR+1)/2)]}'; }
ms=$(median "${self[@]}") ml=$(median "${line[@]}")
echo "| self round trip through psmd | cache-line round trip | ratio |"
echo "| ---: | ---: | ---: |"
awk -v s="$ms" -v l="$ml" 'BEGIN {printf "| %.0f ns | %.0f ns | %.2f |\n", s, l, s / l}'
