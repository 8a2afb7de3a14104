#!/usr/bin/env bash
# --config=tsan runs every test under this (.bazelrc, --run_under): it points
# ThreadSanitizer at tests/tsan_suppressions.txt by absolute path, for the
# test and every process it starts.
here=$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")
export TSAN_OPTIONS="suppressions=$here/tsan_suppressions.txt ${TSAN_OPTIONS:-}"
exec "$@"
