#!/usr/bin/env bash
# Fuzzes the fabric's frame decoder (hw/frame_fuzz.cc) with libFuzzer and
# Debian's clang for a bounded time, starting from a copy of the seed corpus
# hw/frame_fuzz_corpus/ (scripts/libfuzzer.sh runs it):
#   hw/frame_fuzz.sh [SECONDS]      (default 20, a fresh random seed)
#   hw/frame_fuzz.sh --ci           (4000000 inputs from seed 1)
#   hw/frame_fuzz.sh --write-seeds  (regenerates the seed corpus)
# It is also the Bazel test //hw:frame_fuzz_test (--ci).
# Fails on a crash, a sanitizer report or a failed round-trip check, and
# when the run never decoded a header under one of the four limit sets,
# never had a frame refused by each tighter limit, or never decoded a
# handshake payload (the target's "reached" line).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/libfuzzer.sh
fuzz_main frame_fuzz hw/frame_fuzz_corpus 4000000 2048 \
  "^frame_fuzz: reached decoded=[1-9][0-9]*,[1-9][0-9]*,[1-9][0-9]*,[1-9][0-9]* too_long=[1-9][0-9]* bad_offset=[1-9][0-9]* payloads=[1-9][0-9]*$" \
  "${1:-}" hw/frame_fuzz.cc hw/frame.cc
