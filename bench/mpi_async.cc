// mpi_async: asynchronous progress of one large message over MPI (issue 16),
// the MPI twin of tests/programs/async_progress, so that Open MPI's own
// transports (vader) are measured the same way as psmd and Intel's libpsm2.
//
//   mpirun -np 2 mpi_async BYTES COMPUTE_MS REPS
//
// Each repetition: rank 1 posts MPI_Irecv into a zeroed buffer, a barrier,
// rank 0 posts MPI_Isend; then both compute for COMPUTE_MS without calling
// MPI (rank 1 straight after the barrier). Rank 1 then counts the 4 KiB pages
// that already hold the message, before any MPI call, and calls MPI_Test once.
// Prints per repetition:
//   mpi_async bytes B arrived F test T
// and "intact 0" (exit 1) if the message was wrong once complete.
#include <mpi.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

namespace {

unsigned char Pattern(size_t i, int rep) {
  return static_cast<unsigned char>((i * 131 + rep * 7 + (i >> 12)) | 1);
}

void Compute(int ms) {
  auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(ms);
  volatile double x = 1.0;
  while (std::chrono::steady_clock::now() < end) {
    for (int i = 0; i < 1000; i++) x = x * 1.0000001 + 1e-9;
  }
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (argc != 4) {
    if (rank == 0) fprintf(stderr, "usage: mpi_async BYTES COMPUTE_MS REPS\n");
    MPI_Finalize();
    return 2;
  }
  const size_t bytes = strtoull(argv[1], nullptr, 0);
  const int compute_ms = atoi(argv[2]), reps = atoi(argv[3]);
  std::vector<unsigned char> buf(bytes);
  int bad = 0;
  for (int rep = 0; rep < reps; rep++) {
    MPI_Request req;
    if (rank == 1) {
      memset(buf.data(), 0, bytes);
      MPI_Irecv(buf.data(), static_cast<int>(bytes), MPI_BYTE, 0, rep,
                MPI_COMM_WORLD, &req);
    } else {
      for (size_t i = 0; i < bytes; i++) buf[i] = Pattern(i, rep);
    }
    MPI_Barrier(MPI_COMM_WORLD);  // the receive is posted
    if (rank == 0) {
      MPI_Isend(buf.data(), static_cast<int>(bytes), MPI_BYTE, 1, rep,
                MPI_COMM_WORLD, &req);
    }
    Compute(compute_ms);  // no MPI call in between
    if (rank == 1) {
      size_t pages = 0, whole = 0;
      for (size_t off = 0; off < bytes; off += 4096, pages++) {
        const size_t end = off + 4096 < bytes ? off + 4096 : bytes;
        bool here = true;
        for (size_t i = off; i < end && here; i++) {
          here = buf[i] == Pattern(i, rep);
        }
        whole += here;
      }
      int done = 0;
      MPI_Test(&req, &done, MPI_STATUS_IGNORE);
      if (!done) MPI_Wait(&req, MPI_STATUS_IGNORE);
      for (size_t i = 0; i < bytes && !bad; i++)
        bad = buf[i] != Pattern(i, rep);
      printf("mpi_async bytes %zu arrived %.4f test %d%s\n", bytes,
             static_cast<double>(whole) / pages, done, bad ? " intact 0" : "");
      fflush(stdout);
    } else {
      MPI_Wait(&req, MPI_STATUS_IGNORE);
    }
  }
  MPI_Finalize();
  return bad;
}
