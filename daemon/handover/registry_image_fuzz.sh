#!/usr/bin/env bash
# Fuzzes what a successor psmd reads first of its predecessor's state (the
# state file's envelope, the registry's section, the fabric's section and an
# inbox arena's state: daemon/handover/registry_image_fuzz.cc) with
# libFuzzer and Debian's clang for a bounded time, from a copy of the seed
# corpus daemon/handover/registry_image_fuzz_corpus/ (scripts/libfuzzer.sh
# runs it):
#   daemon/handover/registry_image_fuzz.sh [SECONDS]      (default 20, random seed)
#   daemon/handover/registry_image_fuzz.sh --ci           (300000 inputs, seed 1)
#   daemon/handover/registry_image_fuzz.sh --write-seeds  (regenerates the corpus)
# It is also the Bazel test //daemon/handover:registry_image_fuzz_test (--ci).
# Fails on a crash, a sanitizer report or a failed check (an accepted image
# that breaks a rule, or that does not survive writing and reading again; an
# arena adopted that lets an allocation overlap a chunk in use), and when
# the run never accepted an image with endpoints, attached ones and Slurm
# steps, never refused one, never read an envelope both ways, or never
# accepted and refused a fabric section (with sessions) and an arena (with
# allocations after it).
set -euo pipefail
cd "$(dirname "$0")/../.."
source scripts/libfuzzer.sh
fuzz_main registry_image_fuzz daemon/handover/registry_image_fuzz_corpus 300000 4096 \
  "^registry_image_fuzz: reached images=[1-9][0-9]* endpoints=[1-9][0-9]* attached=[1-9][0-9]* steps=[1-9][0-9]* refused=[1-9][0-9]* envelopes=[1-9][0-9]*,[1-9][0-9]*,[1-9][0-9]* fabrics=[1-9][0-9]*,[1-9][0-9]*,[1-9][0-9]* arenas=[1-9][0-9]*,[1-9][0-9]*,[1-9][0-9]*$" \
  "${1:-}" daemon/handover/registry_image_fuzz.cc daemon/handover/registry_image.cc \
  daemon/handover/handover.cc hw/fabric.cc -Iinclude -lsystemd
