#!/usr/bin/env bash
# Bazel's workspace status command (see .bazelrc): the commit psmd is built
# from, stamped into //version. Outside a git checkout the commit is "unknown".
commit=$(git rev-parse --short=12 HEAD 2>/dev/null || echo unknown)
if [[ "$commit" != unknown ]] && ! git diff --quiet HEAD 2>/dev/null; then
  commit="$commit-dirty"
fi
echo "STABLE_PSMD_COMMIT $commit"
