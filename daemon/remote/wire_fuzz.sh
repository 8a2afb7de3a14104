#!/usr/bin/env bash
# Fuzzes the inter-node wire decoders (daemon/remote/wire_fuzz.cc) with
# libFuzzer and Debian's clang (-fsanitize=fuzzer,address,undefined) for a
# bounded time, starting from a copy of the seed corpus
# daemon/remote/wire_fuzz_corpus/ (a valid frame of every op):
#   daemon/remote/wire_fuzz.sh [SECONDS]      (default 20, a fresh random seed)
#   daemon/remote/wire_fuzz.sh --ci           (2000000 inputs from seed 1)
#   daemon/remote/wire_fuzz.sh --write-seeds  (regenerates the seed corpus)
# It is also the Bazel test //daemon/remote:wire_fuzz_test (--ci): a gate
# gives the same verdict on every run of one commit (daemon/engine/engine_fuzz.sh
# says why).
# Exits non-zero on a crash, a sanitizer report or a failed check (decoded
# bytes that do not re-encode, or that the op's builder would not write),
# and when the run never accepted a frame of some op or never refused one
# for some reason (the target's "reached" line): a run that only ever saw
# unknown ops has checked nothing. The reproducer is left in the work
# directory it names.
set -euo pipefail
cd "$(dirname "$0")/../.."
work=$(mktemp -d "${TEST_TMPDIR:-${PSMD_TEST_TMP:-/tmp}}/psmd-wire-fuzz-XXXXXX")
clang++ -std=c++17 -O1 -g -I. -fsanitize=fuzzer,address,undefined \
  -fno-sanitize-recover=undefined \
  daemon/remote/wire_fuzz.cc daemon/remote/wire.cc -o "$work/wire_fuzz"
if [ "${1:-}" = --write-seeds ]; then
  rm -rf daemon/remote/wire_fuzz_corpus
  mkdir daemon/remote/wire_fuzz_corpus
  WIRE_FUZZ_WRITE_SEEDS=daemon/remote/wire_fuzz_corpus "$work/wire_fuzz"
  rm -rf "$work"
  exit 0
fi
if [ "${1:-}" = --ci ]; then
  budget=(-runs=2000000 -seed=1)
  what="2000000 inputs, seed 1"
else
  budget=(-max_total_time="${1:-20}")
  what="${1:-20} s"
fi
# reached_everything LOG: every count on the target's last "reached" line
# is above zero (18 ops accepted, 7 reasons refused).
reached_everything() {
  grep -E "^wire_fuzz: reached " "$1" | tail -1 |
    grep -Eq "^wire_fuzz: reached ops=([1-9][0-9]*,){17}[1-9][0-9]* refused=([1-9][0-9]*,){6}[1-9][0-9]*$"
}
if [ "${1:-}" = --ci ]; then
  # The gate's negative control: 20000 inputs from no corpus never get a
  # frame of every op past the decoder, and the gate must say so.
  mkdir "$work/empty"
  "$work/wire_fuzz" -runs=20000 -seed=1 "$work/empty" >"$work/empty.log" 2>&1
  if reached_everything "$work/empty.log"; then
    grep "wire_fuzz: reached" "$work/empty.log"
    echo "wire_fuzz: FAILED: the reached gate passed a run without a corpus"
    exit 1
  fi
fi
cp -r daemon/remote/wire_fuzz_corpus "$work/corpus"
if "$work/wire_fuzz" "${budget[@]}" -max_len=256 \
  -print_final_stats=1 "$work/corpus" >"$work/log" 2>&1; then
  grep -E "stat::number_of_executed_units|Done|wire_fuzz: reached" "$work/log" | tail -3
  if ! reached_everything "$work/log"; then
    echo "wire_fuzz: FAILED: the run did not reach every decode path (above); log in $work"
    exit 1
  fi
  rm -rf "$work"
  echo "wire_fuzz: ok ($what)"
else
  tail -40 "$work/log"
  echo "wire_fuzz: FAILED; reproducer and log in $work"
  exit 1
fi
