// am_rate: Active Message rates between two PSM2 processes.
//
//   am_rate --rank 0|1 --dir DIR [--roundtrips N] [--requests N] [--window W]
//           [--reps R] [--seconds S] [--uuid HEX]
//
// (a) Round trips: rank 0 sends a request (8-byte payload, 2 args); rank 1's
//     handler replies (8 bytes, 2 args); rank 0 waits for its reply handler
//     before the next request. Reported as round trips per second and the
//     mean round trip in microseconds.
// (b) One-way rate: rank 0 streams requests (8 bytes, 2 args) with at most W
//     unacknowledged; every W/4-th request asks rank 1's handler for a reply
//     carrying its count (the others are PSM2_AM_FLAG_NOREPLY). Reported as
//     requests per second, from the first request to the last one's ack.
// Each is run R times after a warm-up, a run stopping early once it has taken
// S seconds (--seconds, default 2: a slow implementation still gets a rate);
// rank 0 prints the median (and the
// range), which library it loaded (Intel's or psmd's libpsm2.so.2, chosen
// with LD_LIBRARY_PATH) and the CPU each rank ran on at the start and the
// end (sched_getcpu; rank 1's comes back in its replies). The last line,
// "RESULT key=value ...", is for scripts/bench_am_rate.sh. Exit status 4: a
// request or reply went missing (nothing arrived for 10 s).
#include <dlfcn.h>
#include <psm2.h>
#include <psm2_am.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "tests/programs/rendezvous.h"

namespace {

using psmd::testing::CheckPsm;
using Clock = std::chrono::steady_clock;

// Handler table, registered in this order on both ranks.
enum Handler { kEcho, kEchoReply, kSink, kSinkAck, kStop, kNumHandlers };

int g_idx[kNumHandlers];
psm2_ep_t g_ep;

// Rank 0.
uint64_t g_replies = 0;
uint64_t g_acked = 0;  // requests rank 1 has run, as of its latest ack
int g_peer_cpu = -1;
int g_peer_cpu_first = -1;

// Rank 1.
uint64_t g_sunk = 0;
bool g_stop = false;
Clock::time_point g_last_activity;

int Echo(psm2_am_token_t token, psm2_amarg_t* args, int, void* src,
         uint32_t len) {
  g_last_activity = Clock::now();
  psm2_amarg_t reply[2];
  reply[0] = args[0];
  reply[1].u64 = static_cast<uint64_t>(sched_getcpu());
  CheckPsm(psm2_am_reply_short(token, g_idx[kEchoReply], reply, 2, src, len,
                               PSM2_AM_FLAG_NONE, nullptr, nullptr),
           "psm2_am_reply_short");
  return 0;
}

int EchoReply(psm2_am_token_t, psm2_amarg_t* args, int, void*, uint32_t) {
  g_replies++;
  g_peer_cpu = static_cast<int>(args[1].u64);
  if (g_peer_cpu_first < 0) g_peer_cpu_first = g_peer_cpu;
  return 0;
}

// args[0] = sequence number; args[1] = 1 if an ack is wanted.
int Sink(psm2_am_token_t token, psm2_amarg_t* args, int, void*, uint32_t) {
  g_sunk++;
  if (args[1].u64 == 1) {
    g_last_activity = Clock::now();
    psm2_amarg_t ack[2];
    ack[0].u64 = g_sunk;
    ack[1].u64 = args[0].u64;
    CheckPsm(psm2_am_reply_short(token, g_idx[kSinkAck], ack, 2, nullptr, 0,
                                 PSM2_AM_FLAG_NONE, nullptr, nullptr),
             "psm2_am_reply_short");
  }
  return 0;
}

int SinkAck(psm2_am_token_t, psm2_amarg_t* args, int, void*, uint32_t) {
  g_acked = args[0].u64;
  return 0;
}

int Stop(psm2_am_token_t, psm2_amarg_t*, int, void*, uint32_t) {
  g_stop = true;
  return 0;
}

// Polls until done(); exits 4 if nothing arrives for 10 s (a lost request or
// reply), so that a broken implementation is reported instead of hanging.
template <typename Done>
void PollUntil(Done done, const char* what) {
  auto deadline = Clock::now() + std::chrono::seconds(10);
  for (uint32_t n = 0; !done(); n++) {
    psm2_poll(g_ep);
    // psm2_poll may sleep when idle (psmd's does): look at the clock often.
    if ((n & 63) == 63 && Clock::now() > deadline) {
      fprintf(stderr, "am_rate rank 0: stalled for 10 s waiting for %s\n",
              what);
      exit(4);
    }
  }
}

void Request(psm2_epaddr_t peer, int handler, uint64_t a0, uint64_t a1,
             int flags) {
  psm2_amarg_t args[2];
  args[0].u64 = a0;
  args[1].u64 = a1;
  uint64_t payload = a0 ^ 0x5a5a5a5a5a5a5a5aULL;
  CheckPsm(psm2_am_request_short(peer, g_idx[handler], args, 2, &payload,
                                 sizeof(payload), flags, nullptr, nullptr),
           "psm2_am_request_short");
}

// One round trip: request, then poll until its reply handler ran.
void RoundTrip(psm2_epaddr_t peer, uint64_t i) {
  uint64_t want = g_replies + 1;
  Request(peer, kEcho, i, 0, PSM2_AM_FLAG_NONE);
  PollUntil([&] { return g_replies >= want; }, "a reply");
}

// A repetition runs n operations or until its time budget is spent,
// whichever comes first (so that a slow implementation still gives a rate
// instead of a timeout), and returns operations per second.
double RoundTripsPerSecond(psm2_epaddr_t peer, uint64_t n, double budget_s) {
  auto t0 = Clock::now();
  auto stop = t0 + std::chrono::duration<double>(budget_s);
  uint64_t i = 0;
  while (i < n) {
    RoundTrip(peer, i++);
    if ((i & 63) == 0 && Clock::now() > stop) break;
  }
  return i / std::chrono::duration<double>(Clock::now() - t0).count();
}

double RequestsPerSecond(psm2_epaddr_t peer, uint64_t n, uint64_t window,
                         double budget_s) {
  uint64_t ack_every = std::max<uint64_t>(window / 4, 1);
  uint64_t base = g_acked;  // rank 1's count before this run
  auto t0 = Clock::now();
  auto stop = t0 + std::chrono::duration<double>(budget_s);
  uint64_t i = 0;
  for (bool last = false; !last; i++) {
    if (base + i - g_acked >= window) {
      PollUntil([&] { return base + i - g_acked < window; }, "an ack");
    }
    last = i == n - 1 || ((i & 63) == 63 && Clock::now() > stop);
    bool want_ack = last || i % ack_every == ack_every - 1;
    Request(peer, kSink, i, want_ack ? 1 : 0,
            want_ack ? PSM2_AM_FLAG_NONE : PSM2_AM_FLAG_NOREPLY);
  }
  PollUntil([&] { return g_acked >= base + i; }, "the last ack");
  return i / std::chrono::duration<double>(Clock::now() - t0).count();
}

struct Summary {
  double median, min, max;
};

Summary Summarize(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return {v[v.size() / 2], v.front(), v.back()};
}

// Which libpsm2.so.2 the dynamic linker gave us.
std::string LibraryPath() {
  Dl_info info;
  if (dladdr(reinterpret_cast<void*>(&psm2_init), &info) && info.dli_fname) {
    return info.dli_fname;
  }
  return "unknown";
}

std::string ImplName(const std::string& lib) {
  return lib.find("/usr/lib/x86_64-linux-gnu/") == 0 ? "intel" : "psmd";
}

}  // namespace

int main(int argc, char** argv) {
  int rank = -1;
  std::string dir, uuid_text = "a3a7e000000000000000000000000a01";
  uint64_t roundtrips = 20000, requests = 200000, window = 256;
  int reps = 5;
  double budget_s = 2;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string flag = argv[i], value = argv[i + 1];
    if (flag == "--rank") {
      rank = atoi(value.c_str());
    } else if (flag == "--dir") {
      dir = value;
    } else if (flag == "--roundtrips") {
      roundtrips = strtoull(value.c_str(), nullptr, 10);
    } else if (flag == "--requests") {
      requests = strtoull(value.c_str(), nullptr, 10);
    } else if (flag == "--window") {
      window = strtoull(value.c_str(), nullptr, 10);
    } else if (flag == "--reps") {
      reps = atoi(value.c_str());
    } else if (flag == "--seconds") {
      budget_s = atof(value.c_str());
    } else if (flag == "--uuid") {
      uuid_text = value;
    } else {
      fprintf(stderr, "unknown flag %s\n", flag.c_str());
      return 2;
    }
  }
  psm2_uuid_t uuid;
  if ((rank != 0 && rank != 1) || dir.empty() || roundtrips == 0 ||
      requests == 0 || window == 0 || reps < 1 || budget_s <= 0 ||
      !psmd::testing::ParseUuid(uuid_text, uuid)) {
    fprintf(
        stderr,
        "usage: am_rate --rank 0|1 --dir DIR [--roundtrips N] [--requests N] "
        "[--window W] [--reps R] [--seconds S] [--uuid HEX]\n");
    return 2;
  }
  int cpu_start = sched_getcpu();
  psmd::testing::ConnectedPair pair =
      psmd::testing::OpenAndConnect(uuid, dir, rank);
  g_ep = pair.ep;
  psm2_epaddr_t peer = pair.peer;
  psm2_am_handler_fn_t fns[kNumHandlers] = {Echo, EchoReply, Sink, SinkAck,
                                            Stop};
  CheckPsm(psm2_am_register_handlers(g_ep, fns, kNumHandlers, g_idx),
           "psm2_am_register_handlers");

  // Requests that beat the target's registration would be dropped: rank 1
  // says when it is ready through a file (as the epids are exchanged).
  const std::string ready = dir + "/am_rate.ready";
  if (rank == 1) {
    if (FILE* f = fopen(ready.c_str(), "w")) fclose(f);
    // Serve until told to stop; give up if rank 0 goes quiet (it failed).
    g_last_activity = Clock::now();
    while (!g_stop) {
      psm2_poll(g_ep);
      if (Clock::now() - g_last_activity > std::chrono::seconds(20)) {
        fprintf(stderr, "am_rate rank 1: no request for 20 s; giving up\n");
        return 3;
      }
    }
  } else {
    auto deadline = Clock::now() + std::chrono::seconds(30);
    while (access(ready.c_str(), F_OK) != 0) {
      psm2_poll(g_ep);
      if (Clock::now() > deadline) {
        fprintf(stderr, "am_rate rank 0: rank 1 never became ready\n");
        return 3;
      }
    }
    // Warm-up.
    RoundTripsPerSecond(peer, std::min<uint64_t>(roundtrips, 2000),
                        budget_s / 4);
    RequestsPerSecond(peer, std::min<uint64_t>(requests, 20000), window,
                      budget_s / 4);

    std::vector<double> rt, oneway;
    for (int r = 0; r < reps; r++)
      rt.push_back(RoundTripsPerSecond(peer, roundtrips, budget_s));
    for (int r = 0; r < reps; r++) {
      oneway.push_back(RequestsPerSecond(peer, requests, window, budget_s));
    }
    RoundTrip(peer, 0);  // rank 1's CPU at the end
    int cpu_end = sched_getcpu();

    Summary a = Summarize(rt), b = Summarize(oneway);
    std::string lib = LibraryPath(), impl = ImplName(lib);
    printf("# am_rate: %s (%s); rank 0 on cpu %d..%d, rank 1 on cpu %d..%d\n",
           impl.c_str(), lib.c_str(), cpu_start, cpu_end, g_peer_cpu_first,
           g_peer_cpu);
    printf(
        "# %d reps of %llu round trips and of %llu one-way requests (window "
        "%llu), each "
        "cut at %.1f s; median [min, max]\n",
        reps, static_cast<unsigned long long>(roundtrips),
        static_cast<unsigned long long>(requests),
        static_cast<unsigned long long>(window), budget_s);
    printf("roundtrips/s  %12.0f  [%.0f, %.0f]  (%.2f us per round trip)\n",
           a.median, a.min, a.max, 1e6 / a.median);
    printf("requests/s    %12.0f  [%.0f, %.0f]\n", b.median, b.min, b.max);
    printf(
        "RESULT impl=%s roundtrips_per_s=%.0f rt_us=%.3f requests_per_s=%.0f "
        "rank0_cpu=%d..%d rank1_cpu=%d..%d\n",
        impl.c_str(), a.median, 1e6 / a.median, b.median, cpu_start, cpu_end,
        g_peer_cpu_first, g_peer_cpu);
    fflush(stdout);
    Request(peer, kStop, 0, 0, PSM2_AM_FLAG_NOREPLY);
  }
  psm2_am_unregister_handlers(g_ep);
  psm2_ep_close(g_ep, PSM2_EP_CLOSE_GRACEFUL, 2'000'000'000LL);
  psm2_finalize();
  return 0;
}
