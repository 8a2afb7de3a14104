// msg_rate: streaming message rate between two PSM2 processes.
//
//   msg_rate --rank 0|1 --dir DIR [--size B] [--messages N] [--reps R]
//
// Rank 0 keeps a window of 64 outstanding psm2_mq_isend2 (8 B by default):
// each time the oldest completes it starts the next. Rank 1 keeps 64
// receives posted, re-posting each as it completes, and acknowledges the
// last message of a repetition. Rank 0 times each repetition from its first
// send to the acknowledgement and prints every rate and the median, and the
// CPU each rank ran on. Works on psmd's libpsm2.so.2 and on Intel's alike
// (choose with LD_LIBRARY_PATH).
#include <psm2.h>
#include <psm2_mq.h>
#include <sched.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "tests/programs/rendezvous.h"

using psmd::testing::CheckPsm;

namespace {

constexpr int kWindow = 64;

}  // namespace

int main(int argc, char** argv) {
  int rank = -1, reps = 9;
  std::string dir;
  uint32_t size = 8;
  long messages = 100000;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string flag = argv[i], value = argv[i + 1];
    if (flag == "--rank")
      rank = atoi(value.c_str());
    else if (flag == "--dir")
      dir = value;
    else if (flag == "--size")
      size = static_cast<uint32_t>(strtoul(value.c_str(), nullptr, 10));
    else if (flag == "--messages")
      messages = atol(value.c_str());
    else if (flag == "--reps")
      reps = atoi(value.c_str());
  }
  psm2_uuid_t uuid;
  psmd::testing::ParseUuid("5053d0d0000000000000000000000b02", uuid);
  if ((rank != 0 && rank != 1) || dir.empty() || messages < kWindow ||
      reps < 1) {
    fprintf(
        stderr,
        "usage: msg_rate --rank 0|1 --dir DIR [--size B] [--messages N>=64] "
        "[--reps R]\n");
    return 2;
  }
  psmd::testing::ConnectedPair pair =
      psmd::testing::OpenAndConnect(uuid, dir, rank);
  psm2_ep_t ep = pair.ep;
  psm2_mq_t mq = pair.mq;
  psm2_epaddr_t peer = pair.peer;

  std::vector<char> bufs(size_t{kWindow} * std::max<uint32_t>(size, 1), 'm');
  std::vector<psm2_mq_req_t> reqs(kWindow, PSM2_MQ_REQINVALID);
  psm2_mq_tag_t data{}, ack{}, sel;
  ack.tag2 = 1;
  memset(&sel, 0xff, sizeof(sel));
  char ack_byte = 0;
  std::vector<double> rates;
  for (int rep = 0; rep < reps; rep++) {
    if (rank == 0) {
      psm2_mq_req_t ack_req;
      CheckPsm(psm2_mq_irecv2(mq, peer, &ack, &sel, 0, &ack_byte, 1, nullptr,
                              &ack_req),
               "irecv ack");
      auto start = std::chrono::steady_clock::now();
      for (long i = 0; i < messages; i++) {
        psm2_mq_req_t& slot = reqs[i % kWindow];
        CheckPsm(psm2_mq_wait2(&slot, nullptr), "wait send");
        CheckPsm(psm2_mq_isend2(mq, peer, 0, &data, &bufs[(i % kWindow) * size],
                                size, nullptr, &slot),
                 "isend2");
      }
      for (auto& r : reqs) CheckPsm(psm2_mq_wait2(&r, nullptr), "wait send");
      CheckPsm(psm2_mq_wait2(&ack_req, nullptr), "wait ack");
      double s = std::chrono::duration<double>(
                     std::chrono::steady_clock::now() - start)
                     .count();
      rates.push_back(messages / s);
    } else {
      auto post = [&](long i) {
        CheckPsm(psm2_mq_irecv2(mq, peer, &data, &sel, 0,
                                &bufs[(i % kWindow) * size], size, nullptr,
                                &reqs[i % kWindow]),
                 "irecv2");
      };
      for (long i = 0; i < kWindow; i++) post(i);
      for (long i = 0; i < messages; i++) {
        CheckPsm(psm2_mq_wait2(&reqs[i % kWindow], nullptr), "wait recv");
        if (i + kWindow < messages) post(i + kWindow);
      }
      CheckPsm(psm2_mq_send2(mq, peer, 0, &ack, &ack_byte, 1), "send ack");
    }
  }
  if (rank == 0) {
    std::vector<double> sorted = rates;
    std::sort(sorted.begin(), sorted.end());
    printf(
        "# msg_rate: %u B messages, window %d, %ld messages x %d reps, rank 0 "
        "on CPU %d\n",
        size, kWindow, messages, reps, sched_getcpu());
    printf("rates (Mmsg/s):");
    for (double r : rates) printf(" %.3f", r / 1e6);
    printf("\nmedian %.3f Mmsg/s\n", sorted[sorted.size() / 2] / 1e6);
  } else {
    printf("# msg_rate: rank 1 on CPU %d\n", sched_getcpu());
  }
  fflush(stdout);
  psm2_ep_close(ep, PSM2_EP_CLOSE_GRACEFUL, 0);
  psm2_finalize();
  return 0;
}
