#!/usr/bin/env bash
# The quick start: builds psmd, starts it on a temporary socket, runs a
# two-process tagged-message exchange through libpsmclient, prints
# `psmctl stats`, stops everything and leaves nothing behind.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/deps.sh
bazel build //daemon:psmd //tools:psmctl //tests/programs:exchange

source scripts/lib.sh
start_psmd

echo "== two processes exchange 10000 tagged messages (0..8 KiB) through psmd"
bazel-bin/tests/programs/exchange --rank 1 --dir "$work" --messages 10000 --max-size 8192 &
receiver=$!
bazel-bin/tests/programs/exchange --rank 0 --dir "$work" --messages 10000 --max-size 8192
wait "$receiver"

echo "== psmctl stats"
bazel-bin/tools/psmctl stats
