#!/usr/bin/env bash
# Fuzzes the inter-node wire decoders (daemon/remote/wire_fuzz.cc) with
# libFuzzer and Debian's clang for a bounded time, starting from a copy of
# the seed corpus daemon/remote/wire_fuzz_corpus/ (a valid frame of every
# op; scripts/libfuzzer.sh runs it):
#   daemon/remote/wire_fuzz.sh [SECONDS]      (default 20, a fresh random seed)
#   daemon/remote/wire_fuzz.sh --ci           (2000000 inputs from seed 1)
#   daemon/remote/wire_fuzz.sh --write-seeds  (regenerates the seed corpus)
# It is also the Bazel test //daemon/remote:wire_fuzz_test (--ci).
# Fails on a crash, a sanitizer report or a failed check (decoded bytes
# that do not re-encode, or that the op's builder would not write), and
# when the run never accepted a frame of some op (20) or never refused one
# for some reason (7) (the target's "reached" line).
set -euo pipefail
cd "$(dirname "$0")/../.."
source scripts/libfuzzer.sh
fuzz_main wire_fuzz daemon/remote/wire_fuzz_corpus 2000000 256 \
  "^wire_fuzz: reached ops=([1-9][0-9]*,){19}[1-9][0-9]* refused=([1-9][0-9]*,){6}[1-9][0-9]*$" \
  "${1:-}" daemon/remote/wire_fuzz.cc daemon/remote/wire.cc
