# Sourced by the scripts and test drivers that start processes:
#   source scripts/workdir.sh PREFIX
# makes a private directory $work (/tmp/PREFIX-XXXXXX) and a list $pids; on
# exit every process in $pids gets signal $stop_signal (TERM unless set), is
# waited for, and $work is removed.
#
# A driver that must know how a daemon ended (its shutdown is part of what
# is tested) stops it itself, before exit, with
#   stop_daemon PID NAME [LOG]
# which sends SIGTERM, waits up to $stop_daemon_seconds (30 unless set;
# times PSMD_TEST_TIME_SCALE) and
# returns 0 only if the process exited with status 0 and LOG, when given,
# holds no sanitizer report; otherwise it says which on stderr (with the
# log's report) and returns 1. A process that outlives the wait is killed.
work=$(mktemp -d "/tmp/$1-XXXXXX")
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill "-${stop_signal:-TERM}" "$pid" 2>/dev/null || true; done
  for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
  rm -rf "$work"
}
trap cleanup EXIT

# The lines by which AddressSanitizer, LeakSanitizer, UBSan and
# ThreadSanitizer report.
sanitizer_report_pattern='ERROR: (AddressSanitizer|LeakSanitizer)|runtime error:|WARNING: ThreadSanitizer|SUMMARY: (Address|Leak|Thread|UndefinedBehavior)Sanitizer'

stop_daemon() {
  local pid=$1 name=$2 log=${3:-} status i limit ok=0 kept=() p
  limit=$((${stop_daemon_seconds:-30} * 10 * ${PSMD_TEST_TIME_SCALE:-1}))  # tenths of a second
  kill -TERM "$pid" 2>/dev/null
  for ((i = 0; i < limit; i++)); do
    kill -0 "$pid" 2>/dev/null || break
    # A zombie has exited already: wait reaps it below.
    [[ "$(awk '{print $3}' "/proc/$pid/stat" 2>/dev/null)" == Z ]] && break
    sleep 0.1
  done
  if ((i == limit)); then
    echo "$name (pid $pid) did not exit within $((limit / 10)) s of SIGTERM; killed" >&2
    kill -KILL "$pid" 2>/dev/null
    ok=1
  fi
  wait "$pid"
  status=$?
  for p in "${pids[@]}"; do [[ $p == "$pid" ]] || kept+=("$p"); done
  pids=("${kept[@]}")
  if ((ok == 0 && status != 0)); then
    echo "$name (pid $pid) exited with status $status after SIGTERM (want 0)" >&2
    ok=1
  fi
  if [[ -n "$log" ]] && grep -Eq "$sanitizer_report_pattern" "$log"; then
    echo "$name (pid $pid): sanitizer report in its log:" >&2
    grep -E -A 20 "$sanitizer_report_pattern" "$log" | head -60 >&2
    ok=1
  elif ((ok)) && [[ -n "$log" ]]; then
    tail -n 40 "$log" >&2
  fi
  return "$ok"
}
