#!/usr/bin/env bash
# engine_fuzz_lib.sh OUT: the engine's sources (engine_sources.sh) compiled
# once, with the fuzz targets' flags (scripts/libfuzzer.sh), into the
# archive OUT, which //daemon/engine:engine_fuzz_test and
# engine_state_fuzz_test both link (ENGINE_FUZZ_LIB): compiled by each, they
# took longer than the two runs. Run from the repository's root (Bazel's
# genrule //daemon/engine:engine_fuzz_lib).
set -euo pipefail
out=$1
source scripts/libfuzzer.sh
source daemon/engine/engine_sources.sh
objects=$(mktemp -d "${TMPDIR:-/tmp}/psmd-engine-fuzz-lib-XXXXXX")
trap 'rm -rf "$objects"' EXIT
i=0
for src in "${engine_sources[@]}"; do
  clang++ "${fuzz_cflags[@]}" "${engine_flags[@]}" -c "$src" -o "$objects/$i.o"
  i=$((i + 1))
done
rm -f "$out"
ar rcs "$out" "$objects"/*.o
