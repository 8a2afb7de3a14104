"""mpi4py over Open MPI's mtl/psm2 (psmd's libpsm2.so.2 in run_mpi.sh).

Pickled objects, raw buffers up to 4 MiB with checksums, and collectives.
Prints PASS/FAIL lines on rank 0; exits non-zero on any failure.
"""
import hashlib
import sys

from mpi4py import MPI

comm = MPI.COMM_WORLD
rank, size = comm.Get_rank(), comm.Get_size()
failures = 0


def check(ok, what):
    global failures
    if not ok:
        failures += 1
        print(f"rank {rank}: FAILED: {what}", file=sys.stderr)


def pattern(seed, n):
    return bytes((seed * 977 + i * 13) & 0xFF for i in range(n)) if n < 4096 else (
        hashlib.sha256(str(seed).encode()).digest() * (n // 32 + 1))[:n]


# Pickled objects around a ring.
obj = {"from": rank, "items": list(range(rank * 10))}
got = comm.sendrecv(obj, dest=(rank + 1) % size, source=(rank - 1) % size)
src = (rank - 1) % size
check(got == {"from": src, "items": list(range(src * 10))}, "pickled sendrecv")

# Raw buffers of growing size between neighbours.
peer = rank ^ 1
if peer < size:
    for n in (0, 1, 1000, 65536, 1 << 20, 4 << 20):
        out = bytearray(pattern(rank * 100 + n, n))
        inp = bytearray(n)
        comm.Sendrecv(out, dest=peer, recvbuf=inp, source=peer)
        check(bytes(inp) == pattern(peer * 100 + n, n), f"buffer of {n} bytes")

# Collectives.
check(comm.allreduce(rank, op=MPI.SUM) == size * (size - 1) // 2, "allreduce")
check(comm.bcast("hello" if rank == 0 else None, root=0) == "hello", "bcast")
check(comm.gather(rank, root=0) == (list(range(size)) if rank == 0 else None), "gather")

total = comm.allreduce(failures, op=MPI.SUM)
if rank == 0:
    print("PASS mpi4py" if total == 0 else f"FAIL mpi4py ({total} failures)")
sys.exit(0 if total == 0 else 1)
