// msg_rate: streaming message rate between two PSM2 processes.
//
//   msg_rate --rank 0|1 --dir DIR [--size B] [--messages N] [--reps R]
//
// Rank 0 keeps a window of 64 outstanding psm2_mq_isend2 (8 B by default):
// each time the oldest completes it starts the next. Rank 1 keeps 64
// receives posted, re-posting each as it completes, and acknowledges the
// last message of a repetition. Rank 0 times each repetition from its first
// send to the acknowledgement and prints every rate and the median, and the
// CPU each rank ran on (the stream of bench/pt2pt.h). Works on psmd's
// libpsm2.so.2 and on Intel's alike (choose with LD_LIBRARY_PATH).
#include <sched.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

#include "bench/psm2_transport.h"
#include "bench/pt2pt.h"

int main(int argc, char** argv) {
  psmd::bench::Options o = psmd::bench::ParseOptions(argc, argv);
  int rank = -1;
  std::string dir;
  uint32_t size = 8;
  long messages = 100000;
  for (auto& [flag, value] : o.extra) {
    if (flag == "--rank")
      rank = atoi(value.c_str());
    else if (flag == "--dir")
      dir = value;
    else if (flag == "--size")
      size = static_cast<uint32_t>(strtoul(value.c_str(), nullptr, 10));
    else if (flag == "--messages")
      messages = atol(value.c_str());
  }
  psm2_uuid_t uuid;
  psmd::testing::ParseUuid("5053d0d0000000000000000000000b02", uuid);
  if ((rank != 0 && rank != 1) || dir.empty() ||
      messages < psmd::bench::kWindow) {
    fprintf(
        stderr,
        "usage: msg_rate --rank 0|1 --dir DIR [--size B] [--messages N>=64] "
        "[--reps R]\n");
    return 2;
  }
  psmd::bench::Psm2Transport t(uuid, dir, rank);
  std::vector<double> rates =
      psmd::bench::Stream(t, rank, size, messages, o.reps);
  if (rank == 0) {
    printf(
        "# msg_rate: %u B messages, window %d, %ld messages x %d reps, rank 0 "
        "on CPU %d\n",
        size, psmd::bench::kWindow, messages, o.reps, sched_getcpu());
    psmd::bench::PrintRates(std::move(rates), size);
  } else {
    printf("# msg_rate: rank 1 on CPU %d\n", sched_getcpu());
    fflush(stdout);
  }
  return 0;
}
