#!/usr/bin/env bash
# Asynchronous progress (issue 16): how much of one large message has arrived
# when both ranks come back from computing without calling the library, in
# one run over
#   PSM2 programs (tests/programs/async_progress):
#     psmd         psmd's libpsm2.so.2, copies in place (the default)
#     psmd_stream  the same with PSMD_COPY_IN_PLACE=off (the pool stream)
#     intel        Intel's libpsm2 (shm, fake-adapter namespace)
#   MPI programs (bench/mpi_async):
#     mtl_psmd     Open MPI over psmd's MTL
#     vader        Open MPI's btl vader (CMA single copy where it can)
# Prints the markdown table of docs/perf.md: the median fraction of 4 KiB
# pages in place on return (min-max) over REPS repetitions, and how often
# the first MPI_Test/psm2_mq_test completed the receive. Usage:
#   [SIZES="4194304 67108864"] [COMPUTE_MS=200] [REPS=5] scripts/bench_async.sh
# Placement: rank 0 on CPU 0, rank 1 on CPU 1, psmd unpinned: while both
# ranks compute, psmd's copier shares their cores.
set -euo pipefail
cd "$(dirname "$0")/.."
read -r -a sizes <<<"${SIZES:-4194304 67108864}"
compute_ms=${COMPUTE_MS:-200}
reps=${REPS:-5}
bash scripts/deps.sh
bazel build //daemon:psmd //client:libpsm2.so.2 //ompi:mca_mtl_psmd \
  //tests/programs:async_progress 2>/dev/null
source scripts/lib.sh
start_psmd --
mpicxx -std=c++17 -O2 -o "$work/mpi_async" bench/mpi_async.cc
setup_mpi_transports
prog=$PWD/bazel-bin/tests/programs/async_progress
uuid=5053d0d0ba5eba5eba5eba5eba5eba5e

for bytes in "${sizes[@]}"; do
  args=(--uuid "$uuid" --bytes "$bytes" --compute-ms "$compute_ms" --reps "$reps")
  echo "== $bytes B: psmd, psmd_stream, intel (PSM2)" >&2
  run_pair psmd "$work/psmd.$bytes" 0 1 300 "$prog" "${args[@]}"
  PSMD_COPY_IN_PLACE=off run_pair psmd "$work/psmd_stream.$bytes" 0 1 300 "$prog" "${args[@]}"
  run_pair intel "$work/intel.$bytes" 0 1 300 "$prog" "${args[@]}"
  for t in mtl_psmd vader; do
    echo "== $bytes B: $t (MPI)" >&2
    run_mpi "$t" "$work/mpi_async" "$bytes" "$compute_ms" "$reps" >"$work/$t.$bytes.r1"
  done
done

python3 - "$work" "$compute_ms" "${sizes[@]}" <<'PY'
import re, statistics, sys
work, compute_ms, sizes = sys.argv[1], sys.argv[2], sys.argv[3:]
names = ["psmd", "psmd_stream", "intel", "mtl_psmd", "vader"]
print(f"| bytes | " + " | ".join(names) + " |")
print("| ---: |" + " ---: |" * len(names))
for b in sizes:
    cells = []
    for n in names:
        rows = [(float(m.group(1)), int(m.group(2))) for m in
                re.finditer(r"arrived ([0-9.]+) test (\d)", open(f"{work}/{n}.{b}.r1").read())]
        if not rows:
            cells.append("–"); continue
        f = [r[0] * 100 for r in rows]
        done = sum(r[1] for r in rows)
        cells.append(f"{statistics.median(f):.0f}% ({min(f):.0f}–{max(f):.0f}), test {done}/{len(rows)}")
    mib = int(b) / 2**20
    print(f"| {mib:g} MiB | " + " | ".join(cells) + " |")
print(f"\nBoth ranks computed {compute_ms} ms; ranks on CPUs 0 and 1, psmd unpinned.")
PY
