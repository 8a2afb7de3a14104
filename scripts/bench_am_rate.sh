#!/usr/bin/env bash
# Runs bench/am_rate (Active Message round trips/s and one-way requests/s)
# against Intel's libpsm2 (shared memory, inside scripts/fake_hfi.sh; needs
# root) and against psmd, and prints them side by side. Usage:
#   scripts/bench_am_rate.sh [--roundtrips N] [--requests N] [--window W]
#                            [--reps R] [--seconds S] [--spin-us N]
# Placement (2-core machine): rank 0 on CPU 0, rank 1 on CPU 1, psmd
# unpinned; override with PLACE_DAEMON / PLACE_RANK0 / PLACE_RANK1 (taskset
# CPU lists, empty = unpinned). Both implementations get the same placement.
# AM_RATE_BIN=path: use that am_rate build and skip the Bazel build (psmd
# then comes from bazel-bin as built before); PSMD_LIB_DIR (default
# bazel-bin/client) holds psmd's libpsm2.so.2. AM_RATE_TIMEOUT (default 120)
# bounds each implementation's run in seconds.
# Exit status 0 only if both implementations ran.
set -euo pipefail
cd "$(dirname "$0")/.."
am_args=() spin_us=200
while (($#)); do
  case "$1" in
    --roundtrips|--requests|--window|--reps|--seconds) am_args+=("$1" "$2"); shift 2 ;;
    --spin-us) spin_us=$2; shift 2 ;;
    *) echo "unknown argument $1" >&2; exit 2 ;;
  esac
done
if [[ -z "${AM_RATE_BIN-}" ]]; then
  bash scripts/deps.sh
  bazel build //daemon:psmd //bench:am_rate 2>/dev/null
fi
bin=$(realpath "${AM_RATE_BIN:-bazel-bin/bench/am_rate}")
psmd_lib_dir=$(realpath "${PSMD_LIB_DIR:-bazel-bin/client}")
place0=${PLACE_RANK0-0} place1=${PLACE_RANK1-1}
timeout_s=${AM_RATE_TIMEOUT:-120}

source scripts/lib.sh

# Runs both ranks (rank 1 in the background) with the given placement and
# exits with rank 0's status. Rank 1 ends on rank 0's stop request; if rank 0
# failed it is ended by PID.
inner='
  bin=$1 dir=$2 p0=$3 p1=$4 timeout_s=$5; shift 5
  pin() { if [[ -n "$1" ]]; then echo "taskset -c $1"; fi; }
  $(pin "$p1") "$bin" --rank 1 --dir "$dir" "$@" & r1=$!
  $(pin "$p0") timeout -s KILL "$timeout_s" "$bin" --rank 0 --dir "$dir" "$@"; s0=$?
  for _ in $(seq 50); do kill -0 "$r1" 2>/dev/null || break; sleep 0.1; done
  kill -KILL "$r1" 2>/dev/null; wait "$r1" 2>/dev/null
  exit $s0'

# run IMPL: rank 0's output goes to $work/IMPL.out; returns its status.
run() {
  local impl=$1 dir="$work/$1"
  mkdir -p "$dir"
  case "$impl" in
    intel)
      scripts/fake_hfi.sh env LD_LIBRARY_PATH=/usr/lib/x86_64-linux-gnu \
        bash -c "$inner" am_rate "$bin" "$dir" "$place0" "$place1" "$timeout_s" "${am_args[@]}" \
        >"$work/$impl.out" 2>"$work/$impl.err" ;;
    psmd)
      env LD_LIBRARY_PATH="$psmd_lib_dir" \
        bash -c "$inner" am_rate "$bin" "$dir" "$place0" "$place1" "$timeout_s" "${am_args[@]}" \
        >"$work/$impl.out" 2>"$work/$impl.err" ;;
  esac
}

place() { if [[ -n "$1" ]]; then echo "taskset -c $1"; fi; }
declare -A status
echo "# am_rate: rank 0 cpus=${place0:-any} rank 1 cpus=${place1:-any};" \
  "psmd: daemon cpus=${PLACE_DAEMON:-any} spin_us=$spin_us"
echo "# intel: running..."
status[intel]=0; run intel || status[intel]=$?
start_psmd $(place "${PLACE_DAEMON-}") -- --spin-us "$spin_us"
echo "# psmd: running..."
status[psmd]=0; run psmd || status[psmd]=$?

# value IMPL KEY: KEY's value on IMPL's RESULT line (empty if none).
value() {
  sed -n "s/^RESULT .*\<$2=\([^ ]*\).*/\1/p" "$work/$1.out" 2>/dev/null | tail -1
}
for impl in intel psmd; do
  echo "# --- $impl (exit ${status[$impl]})"
  sed 's/^/#   /' "$work/$impl.out"
  if [[ ${status[$impl]} != 0 ]]; then sed 's/^/#   stderr: /' "$work/$impl.err" | tail -5; fi
  loaded=$(value "$impl" impl)
  if [[ ${status[$impl]} == 0 && "$loaded" != "$impl" ]]; then
    echo "#   error: the $impl run loaded ${loaded:-an unknown} libpsm2" >&2
    status[$impl]=99
  fi
done

cell() {  # cell IMPL KEY
  case ${status[$1]} in
    0) value "$1" "$2" ;;
    137) echo "timed out (${timeout_s} s)" ;;
    *) echo "failed (exit ${status[$1]})" ;;
  esac
}
ratio() {  # ratio KEY: psmd / intel
  if [[ ${status[intel]} != 0 || ${status[psmd]} != 0 ]]; then echo "-"; return; fi
  awk -v a="$(value psmd "$1")" -v b="$(value intel "$1")" \
    'BEGIN { if (b > 0) printf "%.3g", a / b; else print "-" }'
}
echo
printf "%-24s %20s %20s %12s\n" metric intel psmd psmd/intel
printf "%-24s %20s %20s %12s\n" "roundtrips/s" "$(cell intel roundtrips_per_s)" \
  "$(cell psmd roundtrips_per_s)" "$(ratio roundtrips_per_s)"
printf "%-24s %20s %20s %12s\n" "us per round trip" "$(cell intel rt_us)" \
  "$(cell psmd rt_us)" "$(ratio rt_us)"
printf "%-24s %20s %20s %12s\n" "one-way requests/s" "$(cell intel requests_per_s)" \
  "$(cell psmd requests_per_s)" "$(ratio requests_per_s)"
printf "%-24s %20s %20s\n" "rank 0 cpu (start..end)" "$(cell intel rank0_cpu)" \
  "$(cell psmd rank0_cpu)"
printf "%-24s %20s %20s\n" "rank 1 cpu (start..end)" "$(cell intel rank1_cpu)" \
  "$(cell psmd rank1_cpu)"
[[ ${status[intel]} == 0 && ${status[psmd]} == 0 ]]
