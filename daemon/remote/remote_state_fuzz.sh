#!/usr/bin/env bash
# Fuzzes the loader of the inter-node engine's handover state
# (Remote::LoadState; daemon/remote/remote_state_fuzz.cc) with libFuzzer and
# Debian's clang for a bounded time, starting from a copy of the seed corpus
# daemon/remote/remote_state_fuzz_corpus/ (states with every part of the
# section; scripts/libfuzzer.sh runs it):
#   daemon/remote/remote_state_fuzz.sh [SECONDS]      (default 20, a fresh random seed)
#   daemon/remote/remote_state_fuzz.sh --ci           (4000 inputs from seed 1)
#   daemon/remote/remote_state_fuzz.sh --write-seeds  (regenerates the seed corpus)
# It is also the Bazel test //daemon/remote:remote_state_fuzz_test (--ci).
# Fails on a crash, a sanitizer report or a violated property (a refused
# state changed something; a loaded one does not save and load again; a
# converted send's chunk outlived the Remote, or another chunk was
# released; budgets charged once every endpoint left; a transfer in that
# got its last bytes did not end), and when the run never loaded a state
# with converted sends or with kept payloads, never sent a converted one
# on a kRndvGo, never ended a transfer in or never refused a state (the
# target's "reached" line).
set -euo pipefail
cd "$(dirname "$0")/../.."
source scripts/libfuzzer.sh
source daemon/engine/engine_sources.sh
# Beside the engine's archive: the inter-node engine's sources, most as one
# translation unit (remote_fuzz_sources.cc says why), and one that cannot
# join it. (At -O0 the whole command compiled in 22 s instead of 50 s, but
# its two runs took 64 s instead of 16 s; 2026-12-07.)
remote_objects=(daemon/remote/remote_fuzz_sources.cc
  daemon/remote/node_table.cc)
fuzz_main remote_state_fuzz daemon/remote/remote_state_fuzz_corpus 4000 16384 \
  "^remote_state_fuzz: reached loaded=[1-9][0-9]* converted=[1-9][0-9]* kept=[1-9][0-9]* set_aside=[1-9][0-9]* parked=[1-9][0-9]* sent=[1-9][0-9]* ended=[1-9][0-9]* refused=[1-9][0-9]*$" \
  "${1:-}" "${engine_flags[@]}" daemon/remote/remote_state_fuzz.cc \
  "${remote_objects[@]}" "${engine_objects[@]}" "${engine_libs[@]}"
