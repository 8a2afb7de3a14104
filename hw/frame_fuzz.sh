#!/usr/bin/env bash
# Fuzzes the fabric's frame decoder (hw/frame_fuzz.cc) with libFuzzer and
# Debian's clang (-fsanitize=fuzzer,address,undefined) for a bounded time,
# starting from a copy of the seed corpus hw/frame_fuzz_corpus/:
#   hw/frame_fuzz.sh [SECONDS]      (default 20, a fresh random seed)
#   hw/frame_fuzz.sh --ci           (4000000 inputs from seed 1)
#   hw/frame_fuzz.sh --write-seeds  (regenerates the seed corpus)
# It is also the Bazel test //hw:frame_fuzz_test (--ci): a gate gives the
# same verdict on every run of one commit (daemon/engine/engine_fuzz.sh says why).
# Exits non-zero on a crash, a sanitizer report or a failed round-trip
# check, and when the run never decoded a header under one of the four
# limit sets, never had a frame refused by each tighter limit, or never
# decoded a handshake payload (the target's "reached" line): a run that
# only ever saw bad magic has checked nothing. The reproducer is left in
# the work directory it names.
set -euo pipefail
cd "$(dirname "$0")/.."
work=$(mktemp -d "${TEST_TMPDIR:-${PSMD_TEST_TMP:-/tmp}}/psmd-fuzz-XXXXXX")
clang++ -std=c++17 -O1 -g -I. -fsanitize=fuzzer,address,undefined \
  -fno-sanitize-recover=undefined \
  hw/frame_fuzz.cc hw/frame.cc -o "$work/frame_fuzz"
if [ "${1:-}" = --write-seeds ]; then
  rm -rf hw/frame_fuzz_corpus
  mkdir hw/frame_fuzz_corpus
  FRAME_FUZZ_WRITE_SEEDS=hw/frame_fuzz_corpus "$work/frame_fuzz"
  rm -rf "$work"
  exit 0
fi
if [ "${1:-}" = --ci ]; then
  budget=(-runs=4000000 -seed=1)
  what="4000000 inputs, seed 1"
else
  budget=(-max_total_time="${1:-20}")
  what="${1:-20} s"
fi
# reached_everything LOG: every count on the target's last "reached" line
# is above zero.
reached_everything() {
  grep -E "^frame_fuzz: reached " "$1" | tail -1 |
    grep -Eq "^frame_fuzz: reached decoded=[1-9][0-9]*,[1-9][0-9]*,[1-9][0-9]*,[1-9][0-9]* too_long=[1-9][0-9]* bad_offset=[1-9][0-9]* payloads=[1-9][0-9]*$"
}
if [ "${1:-}" = --ci ]; then
  # The gate's negative control: 20000 inputs from no corpus never get a
  # header past its checks, and the gate must say so.
  mkdir "$work/empty"
  "$work/frame_fuzz" -runs=20000 -seed=1 "$work/empty" >"$work/empty.log" 2>&1
  if reached_everything "$work/empty.log"; then
    grep "frame_fuzz: reached" "$work/empty.log"
    echo "frame_fuzz: FAILED: the reached gate passed a run without a corpus"
    exit 1
  fi
fi
cp -r hw/frame_fuzz_corpus "$work/corpus"
if "$work/frame_fuzz" "${budget[@]}" -max_len=2048 \
  -print_final_stats=1 "$work/corpus" >"$work/log" 2>&1; then
  grep -E "stat::number_of_executed_units|Done|frame_fuzz: reached" "$work/log" | tail -3
  if ! reached_everything "$work/log"; then
    echo "frame_fuzz: FAILED: the run did not reach every decode path (above); log in $work"
    exit 1
  fi
  rm -rf "$work"
  echo "frame_fuzz: ok ($what)"
else
  tail -40 "$work/log"
  echo "frame_fuzz: FAILED; reproducer and log in $work"
  exit 1
fi
