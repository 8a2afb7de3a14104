// mpi_restart DIR ROUNDS: two MPI ranks in a verified exchange, as a user
// would write one: each round rank 0 sends a message (its size cycling from
// 0 to 64 KiB, so both eager and rendezvous sends), rank 1 checks every byte
// and answers with the round's number. ROUNDS 0 runs until a call fails.
//
// Once 200 rounds went through, each rank writes DIR/ready<rank> holding its
// pid, so that a test can kill psmd mid-exchange (tests/mpi/run_mtl.sh,
// case restart). Errors return to the program (MPI_ERRORS_RETURN): the first
// failed call prints
//   rank R: CALL failed at <CLOCK_MONOTONIC ms> cpu_ms <CPU ms used>: TEXT
// and aborts the job (status 3); a data mismatch aborts it with status 1. A
// run of ROUNDS > 0 that ends well prints "rank R: N rounds intact" on each
// rank and exits 0.
#include <mpi.h>
#include <sys/resource.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

namespace {

constexpr int kMaxBytes = 64 * 1024;
constexpr long kReadyAfter = 200;

long long MonotonicMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

long long CpuMs() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return (usage.ru_utime.tv_sec + usage.ru_stime.tv_sec) * 1000LL +
         (usage.ru_utime.tv_usec + usage.ru_stime.tv_usec) / 1000;
}

int rank = -1;

// Says which call failed, when and at what CPU cost, then ends the job.
void Check(int rc, const char* call) {
  if (rc == MPI_SUCCESS) return;
  const long long at = MonotonicMs();
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, text, &len);
  printf("rank %d: %s failed at %lld cpu_ms %lld: %s\n", rank, call, at,
         CpuMs(), text);
  fflush(stdout);
  MPI_Abort(MPI_COMM_WORLD, 3);
}

int SizeOf(long round) { return static_cast<int>((round * 4099) % kMaxBytes); }

unsigned char ByteOf(long round, int i) {
  return static_cast<unsigned char>(round * 31 + i * 7);
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (argc != 3) {
    fprintf(stderr, "usage: mpi_restart DIR ROUNDS\n");
    MPI_Abort(MPI_COMM_WORLD, 2);
  }
  const std::string dir = argv[1];
  const long rounds = atol(argv[2]);
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  std::vector<unsigned char> buf(kMaxBytes);
  for (long round = 0; rounds == 0 || round < rounds; round++) {
    const int size = SizeOf(round);
    long answer = -1;
    if (rank == 0) {
      for (int i = 0; i < size; i++) buf[i] = ByteOf(round, i);
      Check(MPI_Send(buf.data(), size, MPI_BYTE, 1, 7, MPI_COMM_WORLD),
            "MPI_Send");
      Check(MPI_Recv(&answer, 1, MPI_LONG, 1, 8, MPI_COMM_WORLD,
                     MPI_STATUS_IGNORE),
            "MPI_Recv");
      if (answer != round) {
        printf("rank 0: round %ld answered as %ld\n", round, answer);
        fflush(stdout);
        MPI_Abort(MPI_COMM_WORLD, 1);
      }
    } else {
      MPI_Status status;
      Check(MPI_Recv(buf.data(), kMaxBytes, MPI_BYTE, 0, 7, MPI_COMM_WORLD,
                     &status),
            "MPI_Recv");
      int got = -1;
      MPI_Get_count(&status, MPI_BYTE, &got);
      for (int i = 0; i < size && got == size; i++) {
        if (buf[i] != ByteOf(round, i)) got = -1;
      }
      if (got != size) {
        printf("rank 1: round %ld: %d bytes, or wrong ones (want %d)\n", round,
               got, size);
        fflush(stdout);
        MPI_Abort(MPI_COMM_WORLD, 1);
      }
      answer = round;
      Check(MPI_Send(&answer, 1, MPI_LONG, 0, 8, MPI_COMM_WORLD), "MPI_Send");
    }
    if (round + 1 == kReadyAfter) {
      const std::string path = dir + "/ready" + std::to_string(rank);
      FILE* f = fopen((path + ".tmp").c_str(), "w");
      // Whole or absent for a reader: written, then renamed.
      if (f == nullptr || fprintf(f, "%d\n", getpid()) < 0 || fclose(f) != 0 ||
          rename((path + ".tmp").c_str(), path.c_str()) != 0) {
        Check(MPI_ERR_OTHER, "writing the ready file");
      }
    }
  }
  printf("rank %d: %ld rounds intact\n", rank, rounds);
  MPI_Finalize();
  return 0;
}
