// pingpong: half round-trip latency and bandwidth between two PSM2 processes.
//
//   pingpong --rank 0|1 --dir DIR [--max-size B] [--iters N] [--uuid HEX]
//            [--tail 1]
//
// Rank 0 sends a message of each size (8 B doubling up to --max-size) and
// waits for the echo; rank 1 echoes. For every size, after a warm-up, each
// round trip is timed separately; rank 0 prints the median half round trip
// and the bandwidth it implies (size / half round trip). Works on psmd's
// libpsm2.so.2 and on Intel's alike (choose with LD_LIBRARY_PATH).
#include <psm2.h>
#include <psm2_mq.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "tests/programs/rendezvous.h"

int main(int argc, char** argv) {
  int rank = -1;
  std::string dir, uuid_text = "5053d0d0000000000000000000000b01";
  uint32_t max_size = 1u << 22;
  int iters = 1000;
  bool tail = false;  // --tail 1: also print the 99th percentile and worst
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string flag = argv[i], value = argv[i + 1];
    if (flag == "--rank")
      rank = atoi(value.c_str());
    else if (flag == "--dir")
      dir = value;
    else if (flag == "--max-size")
      max_size = static_cast<uint32_t>(strtoul(value.c_str(), nullptr, 10));
    else if (flag == "--iters")
      iters = atoi(value.c_str());
    else if (flag == "--uuid")
      uuid_text = value;
    else if (flag == "--tail")
      tail = atoi(value.c_str()) != 0;
  }
  psm2_uuid_t uuid;
  if ((rank != 0 && rank != 1) || dir.empty() ||
      !psmd::testing::ParseUuid(uuid_text, uuid)) {
    fprintf(
        stderr,
        "usage: pingpong --rank 0|1 --dir DIR [--max-size B] [--iters N]\n");
    return 2;
  }
  psmd::testing::ConnectedPair pair =
      psmd::testing::OpenAndConnect(uuid, dir, rank);
  psm2_ep_t ep = pair.ep;
  psm2_mq_t mq = pair.mq;
  psm2_epaddr_t peer = pair.peer;

  std::vector<char> buf(max_size, 'p');
  psm2_mq_tag_t tag{}, sel;
  memset(&sel, 0xff, sizeof(sel));
  auto exchange = [&](uint32_t size, bool send_first) {
    psm2_mq_req_t req;
    psm2_mq_status2_t st;
    if (send_first) {
      psmd::testing::CheckPsm(
          psm2_mq_send2(mq, peer, 0, &tag, buf.data(), size), "send");
      psmd::testing::CheckPsm(psm2_mq_irecv2(mq, peer, &tag, &sel, 0,
                                             buf.data(), size, nullptr, &req),
                              "irecv");
      psmd::testing::CheckPsm(psm2_mq_wait2(&req, &st), "wait");
    } else {
      psmd::testing::CheckPsm(psm2_mq_irecv2(mq, peer, &tag, &sel, 0,
                                             buf.data(), size, nullptr, &req),
                              "irecv");
      psmd::testing::CheckPsm(psm2_mq_wait2(&req, &st), "wait");
      psmd::testing::CheckPsm(
          psm2_mq_send2(mq, peer, 0, &tag, buf.data(), size), "send");
    }
  };
  if (rank == 0)
    printf("%10s %12s %12s %8s\n", "bytes", "half_rtt_us", "MB/s", "iters");
  for (uint32_t size = 8; size <= max_size; size *= 2) {
    int n = size >= (1u << 20) ? std::max(iters / 20, 20) : iters;
    int warmup = std::max(n / 10, 5);
    std::vector<double> half_rtt_us;
    half_rtt_us.reserve(n);
    for (int i = 0; i < warmup + n; i++) {
      auto t0 = std::chrono::steady_clock::now();
      exchange(size, rank == 0);
      auto t1 = std::chrono::steady_clock::now();
      if (i >= warmup) {
        half_rtt_us.push_back(
            std::chrono::duration<double, std::micro>(t1 - t0).count() / 2);
      }
    }
    if (rank == 0) {
      std::nth_element(half_rtt_us.begin(), half_rtt_us.begin() + n / 2,
                       half_rtt_us.end());
      double median = half_rtt_us[n / 2];
      printf("%10u %12.2f %12.1f %8d\n", size, median, size / median, n);
      if (tail) {
        std::sort(half_rtt_us.begin(), half_rtt_us.end());
        printf("# %u B half round trip: p99 %.2f us, max %.2f us\n", size,
               half_rtt_us[n * 99 / 100], half_rtt_us.back());
      }
      fflush(stdout);
    }
  }
  psm2_mq_finalize(mq);
  psm2_ep_close(ep, PSM2_EP_CLOSE_GRACEFUL, 0);
  psm2_finalize();
  return 0;
}
