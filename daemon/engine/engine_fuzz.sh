#!/usr/bin/env bash
# Fuzzes the descriptor validator and the engine's dispatch on in-memory
# segments (daemon/engine/engine_fuzz.cc) with libFuzzer and Debian's clang
# (-fsanitize=fuzzer,address,undefined) for a bounded time, starting from a
# copy of the seed corpus daemon/engine/engine_fuzz_corpus/:
#   daemon/engine/engine_fuzz.sh [SECONDS]      (default 20, a fresh random seed)
#   daemon/engine/engine_fuzz.sh --ci           (20000 inputs from seed 1)
#   daemon/engine/engine_fuzz.sh --write-seeds  (regenerates the seed corpus)
# It is also the Bazel test //daemon/engine:engine_fuzz_test (--ci): a gate must
# give the same verdict on every run of one commit, so CI replays a fixed
# seed for a fixed number of inputs; exploring (and finding what is new) is
# what the timed runs with random seeds are for.
# Exits non-zero on a crash, a sanitizer report or a violated property; the
# reproducer is left in the work directory it names (run it again with
# `$work/engine_fuzz $work/crash-...`).
set -euo pipefail
cd "$(dirname "$0")/../.."
work=$(mktemp -d "${TEST_TMPDIR:-${PSMD_TEST_TMP:-/tmp}}/psmd-engine-fuzz-XXXXXX")
source scripts/libfuzzer.sh
source daemon/engine/engine_sources.sh
clang++ "${fuzz_cflags[@]}" "${engine_flags[@]}" \
  daemon/engine/engine_fuzz.cc "${engine_objects[@]}" "${engine_libs[@]}" \
  -o "$work/engine_fuzz"
if [ "${1:-}" = --write-seeds ]; then
  rm -rf daemon/engine/engine_fuzz_corpus
  mkdir daemon/engine/engine_fuzz_corpus
  ENGINE_FUZZ_WRITE_SEEDS=daemon/engine/engine_fuzz_corpus "$work/engine_fuzz"
  rm -rf "$work"
  exit 0
fi
if [ "${1:-}" = --ci ]; then
  budget=(-runs=20000 -seed=1)
  what="20000 inputs, seed 1"
else
  budget=(-max_total_time="${1:-20}")
  what="${1:-20} s"
fi
cp -r daemon/engine/engine_fuzz_corpus "$work/corpus"
# -artifact_prefix: the reproducer goes to $work (above), not to the current
# directory.
if "$work/engine_fuzz" "${budget[@]}" -max_len=4096 -artifact_prefix="$work/" \
  -print_final_stats=1 "$work/corpus" >"$work/log" 2>&1; then
  grep -E "stat::number_of_executed_units|Done" "$work/log" | tail -2
  rm -rf "$work"
  echo "engine_fuzz: ok ($what)"
else
  tail -60 "$work/log"
  echo "engine_fuzz: FAILED; reproducer and log in $work"
  exit 1
fi
