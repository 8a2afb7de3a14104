#!/usr/bin/env bash
# Formats psmd's C and C++ sources with the repository's .clang-format
# (Google style). With --check, changes nothing and exits 1 if a file is
# not formatted, naming it.
set -euo pipefail
cd "$(dirname "$0")/.."
mapfile -t files < <(git ls-files '*.cc' '*.h' '*.c' | grep -v '^third_party/')
if [[ "${1:-}" == "--check" ]]; then
  clang-format --dry-run --Werror "${files[@]}"
else
  clang-format -i "${files[@]}"
fi
