// posted_dos: one client with a deep posted-receive queue keeps psmd's
// worker busy on its behalf (issue 12, item 1), while a bystander pair (run
// bench/pingpong next to it) measures what that costs everyone else.
//
//   posted_dos --dir DIR [--mode exact|tag64] [--count N] [--seconds S]
//              [--uuid HEX]
//
// Posts N receives nobody sends to, each with its own tag: --mode exact with
// psm2_mq_irecv2 and a full 96-bit selector, --mode tag64 with psm2_mq_irecv
// and a full 64-bit selector (tag2 is not compared, so psmd used to file
// these as wildcards). It times the posting (until psmd has matched a
// message to the newest receive, so it has seen them all), writes DIR/ready,
// and then for S seconds (or until DIR/stop exists) alternates
//   cancel: psm2_mq_cancel of a random posted receive (a round trip through
//           psmd), then posts it again;
//   match:  sends itself a message for the newest receive, waits for it, and
//           posts it again (the newest is the last a scan would reach).
// It prints the median and worst time of each, and how many it did.
#include <psm2.h>
#include <psm2_mq.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "tests/programs/rendezvous.h"

using psmd::testing::CheckPsm;

namespace {

using Clock = std::chrono::steady_clock;

double Us(Clock::duration d) {
  return std::chrono::duration<double, std::micro>(d).count();
}

struct Stats {
  std::vector<double> us;
  void Print(const char* what) {
    if (us.empty()) return;
    std::sort(us.begin(), us.end());
    printf("%s: %zu ops, median %.1f us, p99 %.1f us, max %.1f us\n", what,
           us.size(), us[us.size() / 2], us[us.size() * 99 / 100], us.back());
  }
};

}  // namespace

int main(int argc, char** argv) {
  std::string dir, mode = "exact",
                   uuid_text = "5053d0d0000000000000000000000d05";
  long count = 1'000'000;
  double seconds = 10;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string flag = argv[i], value = argv[i + 1];
    if (flag == "--dir")
      dir = value;
    else if (flag == "--mode")
      mode = value;
    else if (flag == "--count")
      count = atol(value.c_str());
    else if (flag == "--seconds")
      seconds = atof(value.c_str());
    else if (flag == "--uuid")
      uuid_text = value;
  }
  psm2_uuid_t uuid;
  if (dir.empty() || count < 1 || (mode != "exact" && mode != "tag64") ||
      !psmd::testing::ParseUuid(uuid_text, uuid)) {
    fprintf(stderr,
            "usage: posted_dos --dir DIR [--mode exact|tag64] [--count N] "
            "[--seconds S]\n");
    return 2;
  }
  psm2_ep_t ep;
  psm2_epid_t epid;
  psm2_mq_t mq = psmd::testing::InitOpenWithMq(uuid, &ep, &epid);
  psm2_epaddr_t self;
  psm2_error_t conn_err;
  CheckPsm(psm2_ep_connect(ep, 1, &epid, nullptr, &conn_err, &self,
                           30'000'000'000LL),
           "psm2_ep_connect (self)");

  const bool tag64 = mode == "tag64";
  auto tag_of = [](long i) {
    psm2_mq_tag_t t{};
    t.tag0 = 0x40000000u + static_cast<uint32_t>(i);
    t.tag1 = 0x5eed;
    return t;
  };
  auto tag64_of = [&](long i) {
    psm2_mq_tag_t t = tag_of(i);
    return (uint64_t{t.tag1} << 32) | t.tag0;
  };
  std::vector<psm2_mq_req_t> reqs(count);
  uint32_t sink;
  auto post = [&](long i) {
    if (tag64) {
      CheckPsm(psm2_mq_irecv(mq, tag64_of(i), ~0ULL, 0, &sink, sizeof(sink),
                             nullptr, &reqs[i]),
               "psm2_mq_irecv");
    } else {
      psm2_mq_tag_t t = tag_of(i), sel;
      sel.tag0 = sel.tag1 = sel.tag2 = ~0u;
      CheckPsm(psm2_mq_irecv2(mq, PSM2_MQ_ANY_ADDR, &t, &sel, 0, &sink,
                              sizeof(sink), nullptr, &reqs[i]),
               "psm2_mq_irecv2");
    }
  };
  // Sends a message for receive i to ourselves and waits for the receive.
  auto match = [&](long i) {
    uint32_t v = static_cast<uint32_t>(i);
    if (tag64) {
      CheckPsm(psm2_mq_send(mq, self, 0, tag64_of(i), &v, sizeof(v)),
               "psm2_mq_send");
    } else {
      psm2_mq_tag_t t = tag_of(i);
      CheckPsm(psm2_mq_send2(mq, self, 0, &t, &v, sizeof(v)), "psm2_mq_send2");
    }
    CheckPsm(psm2_mq_wait(&reqs[i], nullptr), "psm2_mq_wait");
    if (sink != v) {
      fprintf(stderr, "posted_dos: receive %ld got %u\n", i, sink);
      exit(1);
    }
  };

  const auto t0 = Clock::now();
  for (long i = 0; i < count; i++) post(i);
  match(count - 1);  // psmd has seen every receive once this one matched
  post(count - 1);
  const double post_s =
      std::chrono::duration<double>(Clock::now() - t0).count();
  printf("posted_dos %s: posted %ld receives in %.3f s (%.0f ns each)\n",
         mode.c_str(), count, post_s, post_s * 1e9 / count);
  fflush(stdout);
  std::ofstream(dir + "/ready") << "ready\n";

  std::mt19937_64 rng(1);
  Stats cancels, matches;
  const auto end = t0 + std::chrono::duration_cast<Clock::duration>(
                            std::chrono::duration<double>(seconds + post_s));
  // The newest receive: the one just reposted.
  long newest = count - 1;
  const std::string stop = dir + "/stop";
  while (Clock::now() < end && access(stop.c_str(), F_OK) != 0) {
    const long i = static_cast<long>(rng() % count);
    auto a = Clock::now();
    psm2_error_t err = psm2_mq_cancel(&reqs[i]);
    if (err != PSM2_OK) {
      fprintf(stderr, "posted_dos: cancel of %ld: %d\n", i, err);
      return 1;
    }
    CheckPsm(psm2_mq_test(&reqs[i], nullptr), "psm2_mq_test (cancelled)");
    cancels.us.push_back(Us(Clock::now() - a));
    post(i);
    newest = i;
    a = Clock::now();
    match(newest);
    matches.us.push_back(Us(Clock::now() - a));
    post(newest);
  }
  cancels.Print("cancel (round trip)");
  matches.Print("match of the newest receive (send to self + wait)");
  fflush(stdout);
  // Closing drops the receives still posted (cancelling a million of them
  // one by one would take hours on a psmd whose cancel scans them all).
  psm2_mq_finalize(mq);
  psm2_ep_close(ep, PSM2_EP_CLOSE_GRACEFUL, 0);
  psm2_finalize();
  return 0;
}
