// MPI streaming message rate between 2 ranks: rank 0 sends windows of 64
// nonblocking S-byte messages, rank 1 pre-posts the matching receives and
// answers each window with a 0-byte ack. Prints messages per second (the
// best of R repetitions). Usage: mpi_msg_rate [S=8] [windows=2000] [R=5].
#include <mpi.h>

#include <cstdio>
#include <cstdlib>
#include <vector>

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  const int size = argc > 1 ? atoi(argv[1]) : 8;
  const int windows = argc > 2 ? atoi(argv[2]) : 2000;
  const int reps = argc > 3 ? atoi(argv[3]) : 5;
  constexpr int kWindow = 64;
  std::vector<char> buf(static_cast<size_t>(size) * kWindow, 1);
  MPI_Request reqs[kWindow];
  double best = 0;
  for (int r = 0; r < reps; r++) {
    MPI_Barrier(MPI_COMM_WORLD);
    double start = MPI_Wtime();
    for (int w = 0; w < windows; w++) {
      for (int i = 0; i < kWindow; i++) {
        char* p = buf.data() + static_cast<size_t>(i) * size;
        if (rank == 0) {
          MPI_Isend(p, size, MPI_CHAR, 1, 1, MPI_COMM_WORLD, &reqs[i]);
        } else {
          MPI_Irecv(p, size, MPI_CHAR, 0, 1, MPI_COMM_WORLD, &reqs[i]);
        }
      }
      MPI_Waitall(kWindow, reqs, MPI_STATUSES_IGNORE);
      if (rank == 0) {
        MPI_Recv(nullptr, 0, MPI_CHAR, 1, 2, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
      } else {
        MPI_Send(nullptr, 0, MPI_CHAR, 0, 2, MPI_COMM_WORLD);
      }
    }
    double rate =
        static_cast<double>(windows) * kWindow / (MPI_Wtime() - start);
    if (rate > best) best = rate;
  }
  if (rank == 0) printf("mpi_msg_rate: %d B: %.0f msgs/s\n", size, best);
  MPI_Finalize();
  return 0;
}
