#!/usr/bin/env bash
# A bystander pair's ping-pong next to a client with a deep posted-receive
# queue (issue 12, item 1; docs/reliability.md). Usage:
#   scripts/bench_posted_dos.sh [--mode exact|tag64|none] [--count N]
#                               [--iters N] [--psmd PATH]
# --mode none runs the ping-pong alone (the baseline). --psmd runs another
# psmd binary (e.g. one built from an older commit) instead of bazel-bin's.
set -euo pipefail
cd "$(dirname "$0")/.."
mode=exact count=1000000 iters=20000 psmd_bin=bazel-bin/daemon/psmd
while (($#)); do
  case "$1" in
    --mode) mode=$2; shift 2 ;;
    --count) count=$2; shift 2 ;;
    --iters) iters=$2; shift 2 ;;
    --psmd) psmd_bin=$2; shift 2 ;;
    *) echo "unknown argument $1" >&2; exit 2 ;;
  esac
done
bazel build //daemon:psmd //bench:pingpong //bench:posted_dos 2>/dev/null
source scripts/lib.sh
"$psmd_bin" --socket "$PSMD_SOCKET" --log-level warn --spin-us 200 &
pids+=($!)
for _ in $(seq 100); do [[ -S "$PSMD_SOCKET" ]] && break; sleep 0.05; done
if [[ "$mode" != none ]]; then
  mkdir -p "$work/dos"
  bazel-bin/bench/posted_dos --dir "$work/dos" --mode "$mode" --count "$count" \
    --seconds 3600 &
  dos=$!
  pids+=($dos)
  for _ in $(seq 1200); do [[ -e "$work/dos/ready" ]] && break; sleep 0.1; done
  [[ -e "$work/dos/ready" ]] || { echo "posted_dos never got ready" >&2; exit 1; }
fi
echo "# bystander pingpong next to posted_dos --mode $mode --count $count"
bazel-bin/bench/pingpong --rank 1 --dir "$work" --max-size 8 --iters "$iters" --tail 1 &
pids+=($!)
bazel-bin/bench/pingpong --rank 0 --dir "$work" --max-size 8 --iters "$iters" --tail 1
if [[ "$mode" != none ]]; then
  touch "$work/dos/stop"
  wait "$dos"
fi
