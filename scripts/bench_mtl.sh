#!/usr/bin/env bash
# Open MPI point-to-point over psmd's own MTL (pml cm, mtl psmd) beside the
# drop-in (mtl psm2 on psmd's libpsm2.so.2), Intel's libpsm2 (shm, fake
# adapter: for comparison only) and btl vader, in one run: NetPIPE (full
# default range; one-way latency and bandwidth at selected sizes) and
# bench/mpi_msg_rate (8-byte streaming message rate). Prints the markdown
# tables of docs/perf.md. Usage: scripts/bench_mtl.sh
# Placement: mpirun's default for 2 ranks (cores 0 and 1); psmd unpinned.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/deps.sh
bazel build //daemon:psmd //client:libpsm2.so.2 //ompi:mca_mtl_psmd 2>/dev/null
source scripts/lib.sh
start_psmd --
mpicxx -std=c++17 -O2 -o "$work/mpi_msg_rate" bench/mpi_msg_rate.cc
mkdir "$work/components" && cp bazel-bin/ompi/mca_mtl_psmd.so "$work/components/"
ompi=$(dirname "$(find /usr/lib/x86_64-linux-gnu/openmpi/lib -name mca_pml_cm.so | head -1)")
lib=$(pwd)/bazel-bin/client
mpi=(mpirun --allow-run-as-root -np 2)

# run NAME PROGRAM... : one transport, by name
run() {
  local name=$1; shift
  case $name in
    mtl_psmd)
      (cd "$work" && OMPI_MCA_mca_base_component_path="$ompi:$work/components" "${mpi[@]}" \
        --mca pml cm --mca mtl psmd -x PSMD_SOCKET -x OMPI_MCA_mca_base_component_path "$@") ;;
    dropin)
      (cd "$work" && "$OLDPWD/scripts/fake_hfi.sh" env LD_LIBRARY_PATH="$lib" "${mpi[@]}" \
        --mca pml cm --mca mtl psm2 --mca btl self -x LD_LIBRARY_PATH -x PSMD_SOCKET "$@") ;;
    intel)
      (cd "$work" && "$OLDPWD/scripts/fake_hfi.sh" env LD_LIBRARY_PATH=/usr/lib/x86_64-linux-gnu \
        "${mpi[@]}" --mca pml cm --mca mtl psm2 --mca btl self -x LD_LIBRARY_PATH "$@") ;;
    vader)
      (cd "$work" && "${mpi[@]}" --mca pml ob1 --mca btl self,vader "$@") ;;
  esac
}

names=(mtl_psmd dropin intel vader)
for n in "${names[@]}"; do
  echo "== $n" >&2
  run "$n" NPopenmpi -o "$work/$n.np" >/dev/null
  run "$n" "$work/mpi_msg_rate" 8 2000 5 | grep mpi_msg_rate | sed "s/^/$n /" >>"$work/rate.txt"
done

python3 - "$work" "${names[@]}" <<'PY'
import sys
work, names = sys.argv[1], sys.argv[2:]
def load(name):
    rows = {}
    for line in open(f"{work}/{name}.np"):
        b, mbps, t = line.split()
        rows[int(b)] = (float(t) * 1e6, float(mbps) / 8)  # us one way, MB/s
    return rows
runs = {n: load(n) for n in names}
sizes = [1, 8, 64, 512, 4093, 32771, 65539, 262147, 1048579, 4194307]
print("| bytes | " + " | ".join(f"{n} µs" for n in names) + " | " +
      " | ".join(f"{n} MB/s" for n in names) + " |")
print("| ---: |" + " ---: |" * (2 * len(names)))
for s in sizes:
    near = {n: min(r, key=lambda b: abs(b - s)) for n, r in runs.items()}
    vals = [runs[n][near[n]] for n in names]
    print(f"| {near[names[0]]} | " + " | ".join(f"{v[0]:.2f}" for v in vals) +
          " | " + " | ".join(f"{v[1]:.0f}" for v in vals) + " |")
print()
print("| transport | 8 B messages/s |")
print("| --- | ---: |")
for line in open(f"{work}/rate.txt"):
    w = line.split()
    print(f"| {w[0]} | {float(w[-2]):,.0f} |")
PY
