// hop: the cost of one trip through psmd, beside the floor it is measured
// against (issue 16, "The hop").
//
//   hop self [--iters N] [--uuid UUID]
//       one endpoint sends 8 bytes to itself: psm2_mq_isend2 +
//       psm2_mq_irecv2, then waits for both. Through psmd that is one hop to
//       the daemon (which matches the send against the receive) and one
//       back. Prints the median time per message, ns.
//   hop cacheline --cpus A,B [--iters N]
//       two threads pinned to CPUs A and B pass a counter back and forth in
//       one cache line: the round trip of a cache line between the two cores,
//       the hardware floor for any hop between processes on them. Prints the
//       median round trip, ns.
//
// Both time batches of 1000 and report the median batch's mean, so a
// preemption spoils one batch, not the result. Pin the process with taskset
// (self) and psmd with taskset too; scripts/bench_hop.sh does both and runs
// the two side by side.
#include <psm2.h>
#include <psm2_mq.h>
#include <pthread.h>
#include <sched.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "tests/programs/rendezvous.h"

using psmd::testing::CheckPsm;

namespace {

using Clock = std::chrono::steady_clock;
constexpr int kBatch = 1000;

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Runs `one` kBatch times per batch, iters / kBatch batches; returns the
// median batch's mean, ns.
template <typename F>
double TimeBatches(long iters, F one) {
  std::vector<double> means;
  for (long b = 0; b < std::max(1L, iters / kBatch); b++) {
    auto start = Clock::now();
    for (int i = 0; i < kBatch; i++) one();
    std::chrono::duration<double, std::nano> took = Clock::now() - start;
    means.push_back(took.count() / kBatch);
  }
  return Median(means);
}

int Self(long iters, const std::string& uuid_text) {
  psm2_uuid_t uuid;
  if (!psmd::testing::ParseUuid(uuid_text, uuid)) {
    fprintf(stderr, "hop: bad --uuid %s\n", uuid_text.c_str());
    return 2;
  }
  psm2_ep_t ep;
  psm2_epid_t epid;
  psmd::testing::InitAndOpen(uuid, &ep, &epid);
  psm2_epaddr_t self;
  psm2_error_t conn_err;
  CheckPsm(psm2_ep_connect(ep, 1, &epid, nullptr, &conn_err, &self,
                           10'000'000'000LL),
           "psm2_ep_connect");
  psm2_mq_t mq;
  CheckPsm(psm2_mq_init(ep, PSM2_MQ_ORDERMASK_ALL, nullptr, 0, &mq),
           "psm2_mq_init");
  psm2_mq_tag_t tag, sel;
  memset(&tag, 0, sizeof(tag));
  memset(&sel, 0xff, sizeof(sel));
  uint64_t out = 0, in = 0;
  auto one = [&] {
    psm2_mq_req_t s, r;
    out++;
    CheckPsm(
        psm2_mq_irecv2(mq, self, &tag, &sel, 0, &in, sizeof(in), nullptr, &r),
        "psm2_mq_irecv2");
    CheckPsm(psm2_mq_isend2(mq, self, 0, &tag, &out, sizeof(out), nullptr, &s),
             "psm2_mq_isend2");
    CheckPsm(psm2_mq_wait2(&s, nullptr), "psm2_mq_wait2");
    CheckPsm(psm2_mq_wait2(&r, nullptr), "psm2_mq_wait2");
    if (in != out) {
      fprintf(stderr, "hop: message %llu arrived as %llu\n",
              static_cast<unsigned long long>(out),
              static_cast<unsigned long long>(in));
      exit(1);
    }
  };
  TimeBatches(iters / 10, one);  // warm-up
  printf("self %.1f ns per message\n", TimeBatches(iters, one));
  psm2_mq_finalize(mq);
  psm2_ep_close(ep, PSM2_EP_CLOSE_GRACEFUL, 0);
  psm2_finalize();
  return 0;
}

void Pin(int cpu) {
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  if (pthread_setaffinity_np(pthread_self(), sizeof(set), &set) != 0) {
    fprintf(stderr, "hop: cannot pin to CPU %d\n", cpu);
    exit(2);
  }
}

int Cacheline(long iters, int cpu_a, int cpu_b) {
  // The line alone in its cache line: nothing else shares it.
  struct alignas(64) Line {
    std::atomic<uint64_t> value{0};
  };
  static Line line;
  static_assert(sizeof(Line) == 64, "one cache line");
  const long total = (std::max(1L, iters / kBatch) + iters / 10 / kBatch + 1) *
                     static_cast<long>(kBatch);
  // B answers every odd value with the next even one.
  std::thread echo([&] {
    Pin(cpu_b);
    for (uint64_t want = 1; want < 2 * static_cast<uint64_t>(total);
         want += 2) {
      while (line.value.load(std::memory_order_acquire) != want) {
      }
      line.value.store(want + 1, std::memory_order_release);
    }
  });
  Pin(cpu_a);
  uint64_t v = 0;
  auto one = [&] {
    line.value.store(v + 1, std::memory_order_release);
    while (line.value.load(std::memory_order_acquire) != v + 2) {
    }
    v += 2;
  };
  TimeBatches(iters / 10, one);  // warm-up
  double rtt = TimeBatches(iters, one);
  // Let the echo thread finish its count.
  while (static_cast<long>(v / 2) < total) one();
  echo.join();
  printf("cacheline %.1f ns round trip (CPUs %d and %d)\n", rtt, cpu_a, cpu_b);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    fprintf(stderr,
            "usage: hop self [--iters N] [--uuid UUID]\n"
            "       hop cacheline --cpus A,B [--iters N]\n");
    return 2;
  }
  std::string mode = argv[1];
  long iters = 200000;
  std::string uuid = "40b0b0b0-0000-4000-8000-000000000001";
  int cpu_a = 0, cpu_b = 1;
  for (int i = 2; i + 1 < argc; i += 2) {
    std::string flag = argv[i];
    if (flag == "--iters") {
      iters = atol(argv[i + 1]);
    } else if (flag == "--uuid") {
      uuid = argv[i + 1];
    } else if (flag == "--cpus") {
      if (sscanf(argv[i + 1], "%d,%d", &cpu_a, &cpu_b) != 2) {
        fprintf(stderr, "hop: --cpus A,B\n");
        return 2;
      }
    } else {
      fprintf(stderr, "hop: unknown flag %s\n", flag.c_str());
      return 2;
    }
  }
  if (mode == "self") return Self(iters, uuid);
  if (mode == "cacheline") return Cacheline(iters, cpu_a, cpu_b);
  fprintf(stderr, "hop: unknown mode %s\n", mode.c_str());
  return 2;
}
