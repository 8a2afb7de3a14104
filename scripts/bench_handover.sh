#!/usr/bin/env bash
# The blackout of psmctl upgrade (docs/design.md, "Handover") against the
# endpoints psmd holds and the depth of their queues: for each ENDPOINTS:DEPTH
# (bench/handover_hold: ENDPOINTS endpoints in jobs of 32, each with DEPTH
# receives posted and DEPTH messages queued unexpected), psmd is handed over
# REPS times to itself; prints the median, minimum and maximum blackout and
# the size of the state, then checks that every queued message and posted
# receive came through. Placement: unpinned (psmd's own workers and the
# holding process are idle while held).
# Usage: scripts/bench_handover.sh [--reps R] [ENDPOINTS:DEPTH...]
#   (default 2:0 64:0 64:1000 512:100 1000:0)
set -euo pipefail
cd "$(dirname "$0")/.."
reps=5
configs=()
while (($#)); do
  case "$1" in
    --reps) reps=$2; shift 2 ;;
    *) configs+=("$1"); shift ;;
  esac
done
((${#configs[@]})) || configs=(2:0 64:0 64:1000 512:100 1000:0)
bash scripts/deps.sh
bazel build -c opt //daemon:psmd //tools:psmctl //bench:handover_hold 2>/dev/null
source scripts/lib.sh
# (not start_psmd: its --log-level warn would hide the state's size)
bazel-bin/daemon/psmd --socket "$PSMD_SOCKET" --max-endpoints 1024 \
  2>"$work/psmd.log" &
pids+=($!)
for _ in $(seq 100); do [[ -S "$PSMD_SOCKET" ]] && break; sleep 0.05; done
psmctl=bazel-bin/tools/psmctl
printf "%-10s %-6s %-12s %-12s %-12s %-12s %s\n" endpoints depth "median ms" \
  "min ms" "max ms" "state KiB" verified
for c in "${configs[@]}"; do
  n=${c%%:*} depth=${c##*:}
  dir="$work/hold-$n-$depth"
  mkdir "$dir"
  bazel-bin/bench/handover_hold --endpoints "$n" --depth "$depth" --dir "$dir" \
    >"$dir/out" 2>&1 &
  hold=$!
  pids+=("$hold")
  for _ in $(seq 1200); do [[ -e $dir/ready ]] && break; sleep 0.05; done
  [[ -e $dir/ready ]] || { cat "$dir/out"; echo "handover_hold never got ready" >&2; exit 1; }
  ms=()
  for _ in $(seq "$reps"); do
    line=$("$psmctl" upgrade)
    ms+=("$(sed -n 's/.*blackout \([0-9.]*\) ms.*/\1/p' <<<"$line")")
  done
  state=$(grep -o 'descriptors, [0-9]* bytes of state' "$work/psmd.log" | tail -1 |
    awk '{ printf "%.1f", $2 / 1024 }')
  touch "$dir/go"
  verified=no
  wait "$hold" && grep -q "verified $n endpoints $depth deep" "$dir/out" && verified=yes
  sorted=$(printf "%s\n" "${ms[@]}" | sort -n)
  printf "%-10s %-6s %-12s %-12s %-12s %-12s %s\n" "$n" "$depth" \
    "$(sed -n "$(((reps + 1) / 2))p" <<<"$sorted")" "$(head -1 <<<"$sorted")" \
    "$(tail -1 <<<"$sorted")" "$state" "$verified"
  [[ $verified == yes ]] || { cat "$dir/out"; exit 1; }
done
