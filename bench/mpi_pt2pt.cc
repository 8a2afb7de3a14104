// mpi_pt2pt: bench/pingpong's ping-pong, bench/msg_rate's stream and the
// asynchronous-progress measurement between MPI ranks 0 and 1
// (bench/pt2pt.h), so that MPI over any transport is measured exactly as
// PSM2 and plain TCP are.
//
//   mpirun -np 2 mpi_pt2pt [--min-size B] [--max-size B] [--iters N]
//                          [--tail 1] [--stream SIZE:MESSAGES,...] [--reps R]
//                          [--overlap B]
#include <mpi.h>

#include <cstdio>

#include "bench/pt2pt.h"

namespace {

constexpr int kData = 1, kAck = 2;

class MpiTransport {
 public:
  explicit MpiTransport(int rank) : peer_(1 - rank) {}

  void Send(const char* p, size_t n) {
    MPI_Send(p, static_cast<int>(n), MPI_CHAR, peer_, kData, MPI_COMM_WORLD);
  }
  void Recv(char* p, size_t n) {
    MPI_Recv(p, static_cast<int>(n), MPI_CHAR, peer_, kData, MPI_COMM_WORLD,
             MPI_STATUS_IGNORE);
  }
  void Isend(int slot, const char* p, size_t n) {
    MPI_Isend(p, static_cast<int>(n), MPI_CHAR, peer_, kData, MPI_COMM_WORLD,
              &reqs_[slot]);
  }
  void WaitSend(int slot) { MPI_Wait(&reqs_[slot], MPI_STATUS_IGNORE); }
  void Irecv(int slot, char* p, size_t n) {
    MPI_Irecv(p, static_cast<int>(n), MPI_CHAR, peer_, kData, MPI_COMM_WORLD,
              &reqs_[slot]);
  }
  void WaitRecv(int slot) { MPI_Wait(&reqs_[slot], MPI_STATUS_IGNORE); }
  void PostAck() {
    MPI_Irecv(&ack_, 1, MPI_CHAR, peer_, kAck, MPI_COMM_WORLD, &ack_req_);
  }
  void WaitAck() { MPI_Wait(&ack_req_, MPI_STATUS_IGNORE); }
  void SendAck() { MPI_Send(&ack_, 1, MPI_CHAR, peer_, kAck, MPI_COMM_WORLD); }

 private:
  int peer_;
  MPI_Request reqs_[psmd::bench::kWindow];
  MPI_Request ack_req_ = MPI_REQUEST_NULL;
  char ack_ = 0;
};

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank, size;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  psmd::bench::Options o = psmd::bench::ParseOptions(argc, argv);
  if (size != 2 || !o.extra.empty()) {
    if (rank == 0)
      fprintf(
          stderr,
          "usage: mpirun -np 2 mpi_pt2pt [--min-size B] [--max-size B] "
          "[--iters N] "
          "[--tail 1] [--stream SIZE:MESSAGES,...] [--reps R] [--overlap B]\n");
    MPI_Finalize();
    return 2;
  }
  MpiTransport t(rank);
  psmd::bench::Run(t, rank, o);
  MPI_Finalize();
  return 0;
}
