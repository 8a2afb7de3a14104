# Sourced by the scripts and test drivers that start processes:
#   source scripts/workdir.sh PREFIX
# makes a private directory $work (/tmp/PREFIX-XXXXXX) and a list $pids; on
# exit every process in $pids gets signal $stop_signal (TERM unless set), is
# waited for, and $work is removed.
work=$(mktemp -d "/tmp/$1-XXXXXX")
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill "-${stop_signal:-TERM}" "$pid" 2>/dev/null || true; done
  for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
  rm -rf "$work"
}
trap cleanup EXIT
