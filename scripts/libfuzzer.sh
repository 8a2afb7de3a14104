# The common part of psmd's libFuzzer drivers (hw/frame_fuzz.sh,
# daemon/remote/wire_fuzz.sh), sourced by them from the repository's root:
#   fuzz_main NAME CORPUS CI_RUNS MAX_LEN GATE MODE CLANG_ARGS...
# builds the target NAME from CLANG_ARGS with Debian's clang
# (-fsanitize=fuzzer,address,undefined), then by MODE:
#   --write-seeds  regenerates the seed corpus CORPUS (the target writes it
#                  when ${NAME^^}_WRITE_SEEDS names a directory);
#   --ci           CI_RUNS inputs from seed 1, from a copy of CORPUS: a gate
#                  gives the same verdict on every run of one commit
#                  (daemon/engine/engine_fuzz.sh says why);
#   SECONDS        that long (default 20), with a fresh random seed.
# A run fails on a crash, a sanitizer report or a failed check of the
# target, and when the target's last "NAME: reached ..." line (printed at
# exit: what the run got to) does not match the extended regex GATE: a run
# that only ever saw inputs the decoder refuses at once has checked
# nothing. With --ci, a run without corpus must fail the gate first (its
# negative control). The reproducer and the log are left in the work
# directory a failure names.

# What every target, and objects compiled ahead for one
# (daemon/engine/engine_fuzz_lib.sh), compile with.
fuzz_cflags=(-std=c++17 -O1 -g -I. -fsanitize=fuzzer,address,undefined
  -fno-sanitize-recover=undefined)

# reached NAME GATE LOG: the last "reached" line in LOG matches GATE.
fuzz_reached() {
  grep -E "^$1: reached " "$3" | tail -1 | grep -Eq "$2"
}

fuzz_main() {
  local name=$1 corpus=$2 ci_runs=$3 max_len=$4 gate=$5 mode=$6
  shift 6
  local work
  work=$(mktemp -d "${TEST_TMPDIR:-${PSMD_TEST_TMP:-/tmp}}/psmd-$name-XXXXXX")
  clang++ "${fuzz_cflags[@]}" "$@" -o "$work/$name"
  if [ "$mode" = --write-seeds ]; then
    rm -rf "$corpus"
    mkdir "$corpus"
    env "${name^^}_WRITE_SEEDS=$corpus" "$work/$name"
    rm -rf "$work"
    return 0
  fi
  local budget what
  if [ "$mode" = --ci ]; then
    budget=(-runs="$ci_runs" -seed=1)
    what="$ci_runs inputs, seed 1"
    mkdir "$work/empty"
    "$work/$name" -runs=20000 -seed=1 -artifact_prefix="$work/" "$work/empty" \
      >"$work/empty.log" 2>&1
    if fuzz_reached "$name" "$gate" "$work/empty.log"; then
      grep "$name: reached" "$work/empty.log"
      echo "$name: FAILED: the reached gate passed a run without a corpus"
      return 1
    fi
  else
    budget=(-max_total_time="${mode:-20}")
    what="${mode:-20} s"
  fi
  cp -r "$corpus" "$work/corpus"
  # -artifact_prefix: a crash's reproducer goes to the work directory the
  # failure names, not to the current one (the repository, or Bazel's
  # runfiles).
  if "$work/$name" "${budget[@]}" -max_len="$max_len" \
    -artifact_prefix="$work/" -print_final_stats=1 "$work/corpus" \
    >"$work/log" 2>&1; then
    grep -E "stat::number_of_executed_units|Done|$name: reached" "$work/log" |
      tail -3
    if ! fuzz_reached "$name" "$gate" "$work/log"; then
      echo "$name: FAILED: the run did not reach every decode path (above); log in $work"
      return 1
    fi
    rm -rf "$work"
    echo "$name: ok ($what)"
  else
    tail -40 "$work/log"
    echo "$name: FAILED; reproducer and log in $work"
    return 1
  fi
}
