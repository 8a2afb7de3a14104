#!/bin/bash
# stop_daemon (scripts/workdir.sh) fed daemons that end each way it must
# catch: only a clean exit 0 with a clean log passes.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
source "$here/workdir.sh" psmd-workdir-test
stop_daemon_seconds=2
failures=0

expect() {  # expect WANT DESCRIPTION: the last stop_daemon's status
  local got=$? want=$1
  if [[ $got == "$want" ]]; then
    echo "ok: $2"
  else
    echo "FAILED: $2 (stop_daemon returned $got, want $want)"
    failures=$((failures + 1))
  fi
}

# Each fake daemon waits for SIGTERM as psmd does, then does what its case says.
daemon() {  # daemon EXIT_STATUS [LOG_LINE]
  bash -c 'trap "echo \"$2\" >&2; exit $1" TERM; while :; do sleep 0.05; done' \
    daemon "$@" 2>"$work/log" &
  pids+=($!)
  for _ in $(seq 100); do [[ -e "$work/log" ]] && break; sleep 0.01; done
  sleep 0.2  # let bash install its trap
}

daemon 0 "signal 15: shutting down"
stop_daemon "$!" clean "$work/log"
expect 0 "exit 0 with a clean log passes"

daemon 3 "shutting down"
stop_daemon "$!" status3 "$work/log"
expect 1 "exit 3 fails"

daemon 0 "==1==ERROR: LeakSanitizer: detected memory leaks"
stop_daemon "$!" leak "$work/log"
expect 1 "a LeakSanitizer report fails"

daemon 0 "daemon/remote/remote.cc:12:3: runtime error: signed integer overflow"
stop_daemon "$!" ubsan "$work/log"
expect 1 "a UBSan report fails"

bash -c 'trap "" TERM; while :; do sleep 0.05; done' &
pids+=($!)
sleep 0.2
stop_daemon "$!" deaf
expect 1 "a process that ignores SIGTERM fails (and is killed)"
kill -0 "$!" 2>/dev/null && { echo "FAILED: the deaf process still runs"; failures=$((failures + 1)); }

((${#pids[@]} == 0)) || { echo "FAILED: stop_daemon left ${pids[*]} in \$pids"; failures=$((failures + 1)); }
echo "$failures failed"
((failures == 0))
