#!/bin/bash
# run_pair.sh [--ranks N] intel|psmd PROGRAM [ARGS...]: runs the ranks of a
# conformance program against one implementation of PSM2 and exits 0 only if
# every rank passes.
#   intel: Intel's libpsm2 (LD_LIBRARY_PATH=/usr/lib/...) inside the
#          fake-adapter namespace of scripts/fake_hfi.sh (needs root).
#   psmd:  our libpsm2.so.2 (the program's RUNPATH) and a private psmd
#          ($PSMD_BIN, default daemon/psmd as in Bazel runfiles).
#   psmd-nodes: the same with one psmd per "node" (--daemons D, default 2;
#          rank r uses daemon r % D), each with its own control socket and
#          fabric address 127.0.0.(2+i), node id i+1, one node table, and
#          one private munged (generated key) authenticating them: every
#          message between ranks of different daemons crosses the fabric.
#          With --workers N each daemon runs N engine shards (give it two
#          ranks or more per daemon, so that each shard has one: the fabric
#          is shard 0's, and frames cross to the others), and each daemon's
#          shards are checked as below.
# --upgrades (psmd): while the ranks run, psmd is handed over to itself
#          again and again (psmctl upgrade, docs/design.md "Handover"); the
#          run also fails if no upgrade went through, or one failed.
# Ranks: 2 by default (each gets --rank I --dir DIR); --ranks N or
# PSMD_CONFORMANCE_RANKS=N (the option wins) starts N, and for N != 2 also
# passes --ranks N to every rank.
# psmd is stopped with SIGTERM once the ranks are done, and the run passes
# only if it then exits 0 with no sanitizer report in its log (under
# --config=asan that is psmd's shutdown and LeakSanitizer checked too).
# Every process it starts is ended by PID; its scratch directory is removed.
set -uo pipefail
ranks=${PSMD_CONFORMANCE_RANKS:-2}
daemons=2
workers=1
upgrades=0
while [[ "${1:-}" == --* ]]; do
  case "$1" in
    --ranks) ranks=$2; shift 2 ;;
    --daemons) daemons=$2; shift 2 ;;
    # psmd with that many engine shards; afterwards every shard must have
    # carried traffic and messages must have crossed between them.
    --workers) workers=$2; shift 2 ;;
    --upgrades) upgrades=1; shift ;;
    *) break ;;
  esac
done
if ! [[ "$ranks" =~ ^[0-9]+$ ]] || ((ranks < 2)); then
  echo "run_pair: the rank count must be a number >= 2 (got '$ranks')" >&2
  exit 2
fi
impl=$1; shift
program=$1; shift
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
source "$root/scripts/workdir.sh" psmd-conf
timeout_s=${PSMD_CONFORMANCE_TIMEOUT:-120}
daemon_pids=()

case "$impl" in
  intel)
    wrap=("$root/scripts/fake_hfi.sh" env LD_LIBRARY_PATH=/usr/lib/x86_64-linux-gnu
          PSMD_CONFORMANCE_IMPL=intel)
    # ldd's whole output first: `ldd | grep -q` under pipefail fails at
    # random when grep exits early and ldd gets SIGPIPE.
    libs=$(LD_LIBRARY_PATH=/usr/lib/x86_64-linux-gnu ldd "$program" 2>&1)
    if ! grep -q "libpsm2.so.2 => /usr/lib/x86_64-linux-gnu/" <<<"$libs"; then
      echo "run_pair: $program does not load Intel's libpsm2 with LD_LIBRARY_PATH" >&2
      exit 1
    fi
    ;;
  psmd)
    export PSMD_SOCKET="$work/psmd.sock"
    "${PSMD_BIN:-daemon/psmd}" --socket "$PSMD_SOCKET" --log-level warn \
      --workers "$workers" 2>"$work/psmd0.log" &
    pids+=($!)
    daemon_pids=($!)
    for _ in $(seq 100); do [[ -S "$PSMD_SOCKET" ]] && break; sleep 0.05; done
    wrap=(env PSMD_CONFORMANCE_IMPL=psmd)
    ;;
  psmd-nodes)
    source "$root/scripts/nodes.sh"
    # shellcheck disable=SC2086  # PSMD_FABRIC_FLAGS: flags, split on purpose
    start_nodes "${PSMD_BIN:-daemon/psmd}" "$daemons" \
      --log-level "${PSMD_LOG_LEVEL:-warn}" --workers "$workers" \
      ${PSMD_FABRIC_FLAGS:-} || exit 1
    export PSMD_SOCKETS="${node_socket[*]}"
    daemon_pids=("${node_pid[@]}")
    wrap=(env PSMD_CONFORMANCE_IMPL=psmd)
    ;;
  *) echo "usage: run_pair.sh [--ranks N] [--daemons D] [--workers W] [--upgrades] intel|psmd|psmd-nodes PROGRAM [ARGS...]" >&2; exit 2 ;;
esac

# --upgrades: psmctl upgrade every 200 ms while the ranks run; a line per
# upgrade in $work/upgrades ("ok" or the error).
if ((upgrades)); then
  (while [[ ! -e $work/ranks_done ]]; do
     if "${PSMCTL_BIN:-tools/psmctl}" --socket "$PSMD_SOCKET" upgrade \
       >>"$work/upgrades.out" 2>&1; then echo ok; else echo failed; fi
     sleep 0.2
   done >"$work/upgrades") &
  upgrader=$!
  pids+=("$upgrader")
fi

# All ranks share one namespace on intel (shared memory must be common).
"${wrap[@]}" bash -c '
  program=$1; work=$2; timeout_s=$3; ranks=$4; shift 4
  extra=()
  if ((ranks != 2)); then extra=(--ranks "$ranks"); fi
  pids=()
  read -r -a sockets <<<"${PSMD_SOCKETS:-}"
  for ((r = 0; r < ranks; r++)); do
    if ((${#sockets[@]} > 0)); then
      export PSMD_SOCKET=${sockets[r % ${#sockets[@]}]}
    fi
    timeout -s KILL "$timeout_s" "$program" --rank "$r" --dir "$work" "${extra[@]}" "$@" &
    pids+=($!)
  done
  ok=1 report=""
  for ((r = 0; r < ranks; r++)); do
    wait "${pids[r]}"; s=$?
    report+="${report:+, }rank $r exit $s"
    [[ $s == 0 ]] || ok=0
  done
  echo "run_pair: $report" >&2
  ((ok))' run_pair "$program" "$work" "$timeout_s" "$ranks" "$@" | tee "$work/results"
ranks_status=${PIPESTATUS[0]}
upgrades_ok=1
if ((upgrades)); then
  touch "$work/ranks_done"
  wait "$upgrader"
  done_n=$(grep -c '^ok$' "$work/upgrades")
  failed_n=$(grep -c '^failed$' "$work/upgrades")
  echo "run_pair: $done_n upgrades of psmd while the ranks ran, $failed_n failed" >&2
  if ((done_n == 0 || failed_n > 0)); then
    tail -5 "$work/upgrades.out" >&2
    upgrades_ok=0
  fi
fi
if [[ $ranks_status != 0 || -n "${PSMD_SHOW_LOGS:-}" ]]; then
  for i in "${!daemon_pids[@]}"; do
    echo "---- psmd$i log" >&2
    tail -n 40 "$work/psmd$i.log" >&2
  done
fi
# With shards: on every daemon each carried traffic, and messages crossed
# between them (psmctl stats, root's view of the workers).
shards_ok=1
if ((workers > 1)); then
  if ((EUID != 0)); then
    echo "run_pair: the shard check needs root (psmctl's worker figures)" >&2
    shards_ok=0
  else
    read -r -a check_sockets <<<"${PSMD_SOCKETS:-$PSMD_SOCKET}"
    for i in "${!check_sockets[@]}"; do
      echo "run_pair: shards of psmd$i" >&2
      "${PSMCTL_BIN:-tools/psmctl}" --socket "${check_sockets[i]}" stats \
        --format json >"$work/stats$i.json" || shards_ok=0
      python3 "$root/tests/check_shards.py" "$work/stats$i.json" "$workers" ||
        shards_ok=0
    done
  fi
fi
status=$ranks_status daemons_ok=1
((shards_ok)) || status=1
((upgrades_ok)) || status=1
for i in "${!daemon_pids[@]}"; do
  stop_daemon "${daemon_pids[i]}" "psmd$i" "$work/psmd$i.log" || daemons_ok=0
done
((daemons_ok)) || status=1

# Under Bazel, one JUnit test case per conformance case (passed only if it
# passed on every rank), plus one for the run as a whole (exit statuses).
if [[ -n "${XML_OUTPUT_FILE:-}" ]]; then
  python3 - "$work/results" "$ranks_status" "$(basename "$program")_$impl$( ((workers > 1)) && echo "_workers$workers")$( ((upgrades)) && echo "_upgrades")" "${#daemon_pids[@]}" \
    "$daemons_ok" "$( ((workers > 1)) && echo "$shards_ok" || echo -)" \
    "$( ((upgrades)) && echo "$upgrades_ok" || echo -)" \
    >"$XML_OUTPUT_FILE" <<'PY'
import sys
from xml.sax.saxutils import quoteattr
results, status, suite = sys.argv[1], int(sys.argv[2]), sys.argv[3]
daemons, daemons_ok = int(sys.argv[4]), sys.argv[5] == "1"
shards, upgrades = sys.argv[6], sys.argv[7]
cases = {}
for line in open(results):
    parts = line.split()
    if len(parts) == 3 and parts[0] in ("PASS", "FAIL") and parts[1].startswith("rank"):
        cases[parts[2]] = cases.get(parts[2], True) and parts[0] == "PASS"
cases["all_ranks_exit_0"] = status == 0
if daemons:
    cases["psmd_exits_0_on_sigterm"] = daemons_ok
if shards != "-":
    cases["every_shard_carried_traffic_and_messages_crossed"] = shards == "1"
if upgrades != "-":
    cases["psmd_upgraded_while_the_ranks_ran"] = upgrades == "1"
failures = sum(not ok for ok in cases.values())
print(f'<?xml version="1.0" encoding="UTF-8"?>')
print(f'<testsuites><testsuite name={quoteattr(suite)} tests="{len(cases)}" failures="{failures}">')
for name, ok in cases.items():
    body = "" if ok else '<failure message="failed on some rank (see test.log)"/>'
    print(f"  <testcase name={quoteattr(name)} classname={quoteattr(suite)}>{body}</testcase>")
print("</testsuite></testsuites>")
PY
fi
exit $status
