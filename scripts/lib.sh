# Shared by the scripts: a temporary work directory and a psmd on a socket in
# it, both removed (by PID) when the script exits.
source "$(dirname "${BASH_SOURCE[0]}")/workdir.sh" psmd
source "$(dirname "${BASH_SOURCE[0]}")/nodes.sh"
export PSMD_SOCKET="$work/psmd.sock"

# start_psmd [taskset-prefix...] -- [psmd flags...]
start_psmd() {
  local prefix=()
  while (($#)) && [[ "$1" != "--" ]]; do prefix+=("$1"); shift; done
  (($#)) && shift
  "${prefix[@]}" bazel-bin/daemon/psmd --socket "$PSMD_SOCKET" --log-level warn "$@" &
  pids+=($!)
  for _ in $(seq 100); do [[ -S "$PSMD_SOCKET" ]] && return 0; sleep 0.05; done
  echo "psmd did not come up on $PSMD_SOCKET" >&2
  return 1
}


# busy_percent SECONDS: how much of all CPUs' time was not idle over the
# next SECONDS (/proc/stat; iowait counts as idle, steal as busy: a VM's
# stolen time disturbs a measurement as much as a neighbour does).
busy_percent() {
  local a b
  read -r -a a </proc/stat
  sleep "$1"
  read -r -a b </proc/stat
  awk -v a="${a[*]:1:8}" -v b="${b[*]:1:8}" 'BEGIN {
    split(a, x); split(b, y)
    for (i = 1; i <= 8; i++) { d = y[i] - x[i]; total += d; if (i == 4 || i == 5) idle += d }
    printf "%d\n", total ? 100 * (total - idle) / total : 0 }'
}

# wait_quiet LIMIT PERCENT: returns once one second passed with the CPUs
# less than PERCENT busy, or after LIMIT seconds regardless; prints
# "quiet B% after W s" or "busy B% after W s" (B: the last sample).
wait_quiet() {
  local start=$SECONDS b
  while b=$(busy_percent 1); ((b >= $2)); do
    if ((SECONDS - start >= $1)); then
      echo "busy $b% after $((SECONDS - start)) s"
      return
    fi
  done
  echo "quiet $b% after $((SECONDS - start)) s"
}

# run_pair LIB OUT CPU0 CPU1 LIMIT PROGRAM [ARGS...]: ranks 0 and 1 of a
# PSM2 program that meets its peer through --dir (a fresh directory in
# $work), pinned with taskset (an empty CPU list: unpinned), on psmd's
# libpsm2.so.2 (LIB psmd; the psmd of $PSMD_SOCKET) or on Intel's (LIB
# intel, both ranks in one fake-adapter namespace). Rank N's output goes to
# OUT.rN; each rank is ended after LIMIT seconds. Returns rank 0's status,
# or rank 1's if that failed.
run_pair() {
  local lib=$1 out=$2 cpu0=$3 cpu1=$4 limit=$5 dir
  shift 5
  dir=$(mktemp -d "$work/pair-XXXXXX")
  # shellcheck disable=SC2016  # expanded by the inner shell
  local body='
    out=$1 cpu0=$2 cpu1=$3 limit=$4 dir=$5; shift 5
    pin() { if [[ -n "$1" ]]; then echo "taskset -c $1"; fi; }
    $(pin "$cpu1") timeout -k 5 "$limit" "$@" --rank 1 --dir "$dir" >"$out.r1" 2>&1 & r1=$!
    s=0
    $(pin "$cpu0") timeout -k 5 "$limit" "$@" --rank 0 --dir "$dir" >"$out.r0" 2>&1 || s=$?
    s1=0; wait "$r1" || s1=$?
    exit $((s ? s : s1))'
  case $lib in
    psmd) env LD_LIBRARY_PATH="$PWD/bazel-bin/client" \
      bash -c "$body" pair "$out" "$cpu0" "$cpu1" "$limit" "$dir" "$@" ;;
    intel) scripts/fake_hfi.sh env LD_LIBRARY_PATH=/usr/lib/x86_64-linux-gnu \
      bash -c "$body" pair "$out" "$cpu0" "$cpu1" "$limit" "$dir" "$@" ;;
    *) echo "run_pair: unknown library $lib" >&2; return 2 ;;
  esac
}

# setup_mpi_transports: what run_mpi needs (psmd's MTL component in $work).
# Needs //ompi:mca_mtl_psmd and //client:libpsm2.so.2 built.
setup_mpi_transports() {
  mkdir -p "$work/components" && cp bazel-bin/ompi/mca_mtl_psmd.so "$work/components/"
  ompi_components=$(dirname "$(find /usr/lib/x86_64-linux-gnu/openmpi/lib -name mca_pml_cm.so | head -1)")
  psmd_lib=$(pwd)/bazel-bin/client
  mpi=(mpirun --allow-run-as-root -np 2 --cpu-set 0,1 --bind-to core)
}

# run_mpi NAME PROGRAM...: two ranks of an MPI program (bound to cores 0
# and 1) over one transport: mtl_psmd (psmd's MTL), mtl_psmd_stream (the
# same with PSMD_COPY_IN_PLACE=off: rendezvous through the pool), dropin (mtl psm2 on
# psmd's libpsm2.so.2), intel (mtl psm2 on Intel's libpsm2, fake-adapter
# namespace: for comparison only) or vader (btl self,vader).
run_mpi() {
  local name=$1; shift
  case $name in
    mtl_psmd|mtl_psmd_stream)
      local copies=auto
      [[ $name == mtl_psmd ]] || copies=off
      (cd "$work" && PSMD_COPY_IN_PLACE=$copies \
        OMPI_MCA_mca_base_component_path="$ompi_components:$work/components" "${mpi[@]}" \
        --mca pml cm --mca mtl psmd --mca btl self -x PSMD_SOCKET -x PSMD_COPY_IN_PLACE \
        -x OMPI_MCA_mca_base_component_path "$@") ;;
    dropin)
      (cd "$work" && "$OLDPWD/scripts/fake_hfi.sh" env LD_LIBRARY_PATH="$psmd_lib" "${mpi[@]}" \
        --mca pml cm --mca mtl psm2 --mca btl self -x LD_LIBRARY_PATH -x PSMD_SOCKET "$@") ;;
    intel)
      (cd "$work" && "$OLDPWD/scripts/fake_hfi.sh" env LD_LIBRARY_PATH=/usr/lib/x86_64-linux-gnu \
        "${mpi[@]}" --mca pml cm --mca mtl psm2 --mca btl self -x LD_LIBRARY_PATH "$@") ;;
    vader)
      (cd "$work" && "${mpi[@]}" --mca pml ob1 --mca btl self,vader "$@") ;;
    *) echo "run_mpi: unknown transport $name" >&2; return 2 ;;
  esac
}
