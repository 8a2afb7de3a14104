// pingpong: half round-trip latency and bandwidth between two PSM2 processes.
//
//   pingpong --rank 0|1 --dir DIR [--min-size B] [--max-size B] [--iters N]
//            [--uuid HEX] [--tail 1] [--stream SIZE:MESSAGES,... [--reps R]]
//            [--overlap B]
//
// Rank 0 sends a message of each size (--min-size, 8 B by default, doubling
// up to --max-size) and waits for the echo; rank 1 echoes. For every size,
// after a warm-up, each round trip is timed separately; rank 0 prints the
// median half round trip and the bandwidth it implies (size / half round
// trip). --stream then runs msg_rate's stream at each size, --overlap the
// asynchronous-progress measurement (bench/pt2pt.h). Works on psmd's
// libpsm2.so.2 and on Intel's alike (choose with LD_LIBRARY_PATH).
#include <cstdio>
#include <cstdlib>
#include <string>

#include "bench/psm2_transport.h"
#include "bench/pt2pt.h"

int main(int argc, char** argv) {
  psmd::bench::Options o = psmd::bench::ParseOptions(argc, argv);
  int rank = -1;
  std::string dir, uuid_text = "5053d0d0000000000000000000000b01";
  for (auto& [flag, value] : o.extra) {
    if (flag == "--rank")
      rank = atoi(value.c_str());
    else if (flag == "--dir")
      dir = value;
    else if (flag == "--uuid")
      uuid_text = value;
  }
  psm2_uuid_t uuid;
  if ((rank != 0 && rank != 1) || dir.empty() ||
      !psmd::testing::ParseUuid(uuid_text, uuid)) {
    fprintf(stderr,
            "usage: pingpong --rank 0|1 --dir DIR [--min-size B] [--max-size "
            "B] [--iters N] "
            "[--uuid HEX] [--tail 1] [--stream SIZE:MESSAGES,...] "
            "[--reps R] [--overlap B]\n");
    return 2;
  }
  psmd::bench::Psm2Transport t(uuid, dir, rank);
  psmd::bench::Run(t, rank, o);
  return 0;
}
