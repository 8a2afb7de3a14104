#!/usr/bin/env bash
# Runs bench/pingpong through psmd. Usage:
#   scripts/bench_pingpong.sh [--max-size B] [--iters N] [--spin-us N]
# Placement (2-core machine): rank 0 on CPU 0, rank 1 on CPU 1, psmd
# unpinned; override with PLACE_DAEMON / PLACE_RANK0 / PLACE_RANK1 (taskset
# CPU lists, empty = unpinned).
set -euo pipefail
cd "$(dirname "$0")/.."
max_size=4194304 iters=2000 spin_us=200
while (($#)); do
  case "$1" in
    --max-size) max_size=$2; shift 2 ;;
    --iters) iters=$2; shift 2 ;;
    --spin-us) spin_us=$2; shift 2 ;;
    *) echo "unknown argument $1" >&2; exit 2 ;;
  esac
done
bash scripts/deps.sh
bazel build //daemon:psmd //bench:pingpong 2>/dev/null

place() { if [[ -n "$1" ]]; then echo "taskset -c $1"; fi; }
source scripts/lib.sh
start_psmd $(place "${PLACE_DAEMON-}") -- --spin-us "$spin_us"
echo "# psmd pingpong: daemon cpus=${PLACE_DAEMON-any} rank0 cpus=${PLACE_RANK0-0} rank1 cpus=${PLACE_RANK1-1} spin_us=$spin_us"
$(place "${PLACE_RANK1-1}") bazel-bin/bench/pingpong --rank 1 --dir "$work" --max-size "$max_size" --iters "$iters" &
pids+=($!)
$(place "${PLACE_RANK0-0}") bazel-bin/bench/pingpong --rank 0 --dir "$work" --max-size "$max_size" --iters "$iters"
