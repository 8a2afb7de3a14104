#!/usr/bin/env bash
# Fuzzes what the ofi backend decodes from the network (hw/ofi/ofi_wire.h:
# message prefix, contact/accept address, stream segment placement) with
# libFuzzer and Debian's clang for a bounded time, starting from a copy of
# the seed corpus hw/ofi/ofi_wire_fuzz_corpus/ (scripts/libfuzzer.sh runs
# it):
#   hw/ofi/ofi_wire_fuzz.sh [SECONDS]      (default 20, a fresh random seed)
#   hw/ofi/ofi_wire_fuzz.sh --ci           (1000000 inputs from seed 1)
#   hw/ofi/ofi_wire_fuzz.sh --write-seeds  (regenerates the seed corpus)
# It is also the Bazel test //hw/ofi:ofi_wire_fuzz_test (--ci).
# Fails on a crash, a sanitizer report or a failed check (a round trip, or
# a segment verdict other than the one computed without 64-bit sums), and
# when the run never decoded a prefix of every kind, an address, or a
# segment of each verdict (the target's "reached" line).
set -euo pipefail
cd "$(dirname "$0")/../.."
source scripts/libfuzzer.sh
fuzz_main ofi_wire_fuzz hw/ofi/ofi_wire_fuzz_corpus 1000000 512 \
  "^ofi_wire_fuzz: reached kinds=([1-9][0-9]*,){5}[1-9][0-9]* addresses=[1-9][0-9]* segments=[1-9][0-9]*,[1-9][0-9]*,[1-9][0-9]*$" \
  "${1:-}" hw/ofi/ofi_wire_fuzz.cc hw/ofi/ofi_wire.cc
