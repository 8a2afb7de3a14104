#!/usr/bin/env bash
# Fuzzes the loader of the engine's handover state (MqEngine::LoadState;
# daemon/engine/engine_state_fuzz.cc) with libFuzzer and Debian's clang for
# a bounded time, starting from a copy of the seed corpus
# daemon/engine/engine_state_fuzz_corpus/ (states a node saved at each step
# of engine_state_test's scenario; scripts/libfuzzer.sh runs it):
#   daemon/engine/engine_state_fuzz.sh [SECONDS]      (default 20, a fresh random seed)
#   daemon/engine/engine_state_fuzz.sh --ci           (10000 inputs from seed 1)
#   daemon/engine/engine_state_fuzz.sh --write-seeds  (regenerates the seed corpus)
# It is also the Bazel test //daemon/engine:engine_state_fuzz_test (--ci).
# Fails on a crash, a sanitizer report or a violated property (a refused
# state changed something; budgets charged once every endpoint left), and
# when the run never loaded a state of either shard count or never refused
# one (the target's "reached" line).
set -euo pipefail
cd "$(dirname "$0")/../.."
source scripts/libfuzzer.sh
source daemon/engine/engine_sources.sh
fuzz_main engine_state_fuzz daemon/engine/engine_state_fuzz_corpus 10000 16384 \
  "^engine_state_fuzz: reached loaded=[1-9][0-9]*,[1-9][0-9]* refused=[1-9][0-9]*$" \
  "${1:-}" "${engine_flags[@]}" daemon/engine/engine_state_fuzz.cc \
  "${engine_objects[@]}" "${engine_libs[@]}"
