#!/usr/bin/env bash
# Fuzzes the fabric's frame decoder (hw/frame_fuzz.cc) with libFuzzer and
# Debian's clang (-fsanitize=fuzzer,address,undefined) for a bounded time:
#   hw/frame_fuzz.sh [SECONDS]      (default 20, a fresh random seed)
#   hw/frame_fuzz.sh --ci           (4000000 inputs from seed 1)
# It is also the Bazel test //hw:frame_fuzz_test (--ci): a gate gives the
# same verdict on every run of one commit (daemon/engine_fuzz.sh says why).
# Exits non-zero on a crash, a sanitizer report or a failed round-trip
# check; the reproducer is left in the work directory it names.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "${1:-}" = --ci ]; then
  budget=(-runs=4000000 -seed=1)
  what="4000000 inputs, seed 1"
else
  budget=(-max_total_time="${1:-20}")
  what="${1:-20} s"
fi
work=$(mktemp -d "${TEST_TMPDIR:-${PSMD_TEST_TMP:-/tmp}}/psmd-fuzz-XXXXXX")
clang++ -std=c++17 -O1 -g -I. -fsanitize=fuzzer,address,undefined \
  -fno-sanitize-recover=undefined \
  hw/frame_fuzz.cc hw/frame.cc -o "$work/frame_fuzz"
mkdir "$work/corpus"
if "$work/frame_fuzz" "${budget[@]}" -max_len=2048 \
  -print_final_stats=1 "$work/corpus" >"$work/log" 2>&1; then
  grep -E "stat::number_of_executed_units|Done" "$work/log" | tail -2
  rm -rf "$work"
  echo "frame_fuzz: ok ($what)"
else
  tail -40 "$work/log"
  echo "frame_fuzz: FAILED; reproducer and log in $work"
  exit 1
fi
