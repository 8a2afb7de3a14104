#!/usr/bin/env bash
# Message rate against deep matched queues (bench/deep_match), over psmd and
# over Intel's libpsm2 (shm, in the fake-adapter namespace), in one run.
# Usage:
#   scripts/bench_deep_match.sh [--reps R] [DEPTH...]   (default 1024 16384 65536)
# Placement (2-core machine): psmd on CPU 1, both ranks on CPU 0; override
# with PLACE_DAEMON / PLACE_RANKS (taskset CPU lists, empty = unpinned).
# Intel's matching is linear in the queue depth here: at 65536 one
# repetition takes it about a minute.
set -euo pipefail
cd "$(dirname "$0")/.."
reps=3
depths=()
while (($#)); do
  case "$1" in
    --reps) reps=$2; shift 2 ;;
    *) depths+=("$1"); shift ;;
  esac
done
((${#depths[@]})) || depths=(1024 16384 65536)
bash scripts/deps.sh
bazel build //daemon:psmd //bench:deep_match 2>/dev/null

place() { if [[ -n "$1" ]]; then echo "taskset -c $1"; fi; }
ranks=$(place "${PLACE_RANKS-0}")
source scripts/lib.sh

echo "== psmd (daemon cpus=${PLACE_DAEMON-1}, ranks cpus=${PLACE_RANKS-0})"
start_psmd $(place "${PLACE_DAEMON-1}") --
for d in "${depths[@]}"; do
  mkdir "$work/psmd-$d"
  $ranks bazel-bin/bench/deep_match --rank 1 --dir "$work/psmd-$d" --depth "$d" --reps "$reps" &
  pids+=($!)
  $ranks bazel-bin/bench/deep_match --rank 0 --dir "$work/psmd-$d" --depth "$d" --reps "$reps" \
    >/dev/null
  wait "${pids[-1]}"
done

echo "== Intel libpsm2 shm (ranks cpus=${PLACE_RANKS-0})"
for d in "${depths[@]}"; do
  mkdir "$work/intel-$d"
  scripts/fake_hfi.sh env LD_LIBRARY_PATH=/usr/lib/x86_64-linux-gnu bash -c "
    $ranks bazel-bin/bench/deep_match --rank 1 --dir $work/intel-$d --depth $d --reps $reps &
    $ranks bazel-bin/bench/deep_match --rank 0 --dir $work/intel-$d --depth $d --reps $reps >/dev/null
    wait"
done
