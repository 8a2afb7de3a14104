#!/usr/bin/env bash
# Streaming message rate (bench/msg_rate: window of 64 isend2, 8 B by
# default) over psmd and over Intel's libpsm2 (shm, in the fake-adapter
# namespace), in one run. Usage:
#   scripts/bench_msg_rate.sh [--size B] [--messages N] [--reps R]
# Placement (2-core machine): rank 0 on CPU 0, rank 1 on CPU 1, psmd
# unpinned; override with PLACE_DAEMON / PLACE_RANK0 / PLACE_RANK1 (taskset
# CPU lists, empty = unpinned).
set -euo pipefail
cd "$(dirname "$0")/.."
args=("$@")
bash scripts/deps.sh
bazel build //daemon:psmd //bench:msg_rate 2>/dev/null

place() { if [[ -n "$1" ]]; then echo "taskset -c $1"; fi; }
r0=$(place "${PLACE_RANK0-0}") r1=$(place "${PLACE_RANK1-1}")
source scripts/lib.sh

echo "== psmd (daemon cpus=${PLACE_DAEMON-any}, rank0 cpus=${PLACE_RANK0-0}, rank1 cpus=${PLACE_RANK1-1})"
start_psmd $(place "${PLACE_DAEMON-}") --
mkdir "$work/psmd"
$r1 bazel-bin/bench/msg_rate --rank 1 --dir "$work/psmd" "${args[@]}" &
pids+=($!)
$r0 bazel-bin/bench/msg_rate --rank 0 --dir "$work/psmd" "${args[@]}"
wait "${pids[-1]}"

echo "== Intel libpsm2 shm (rank0 cpus=${PLACE_RANK0-0}, rank1 cpus=${PLACE_RANK1-1})"
mkdir "$work/intel"
scripts/fake_hfi.sh env LD_LIBRARY_PATH=/usr/lib/x86_64-linux-gnu bash -c "
  $r1 bazel-bin/bench/msg_rate --rank 1 --dir $work/intel ${args[*]} &
  $r0 bazel-bin/bench/msg_rate --rank 0 --dir $work/intel ${args[*]}
  wait"
