// growth_step: the longest single post() (in thread CPU time) into a
// PostedQueue that grows to N receives (a stop-the-world rehash shows up as one
// post taking as long as re-inserting everything), the memory it ends with, and
// what matching a message nobody waits for costs at that depth (issue 12, item
// 1).
//
//   growth_step [--count N] [--mode exact|tag64] [--misses M]
//
// Uses only post() and take_match(), so the same source
// also builds against an older daemon/engine/matcher.h (docs/reliability.md).
#include <time.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "daemon/engine/matcher.h"

namespace {
using Clock = std::chrono::steady_clock;
double Ms(Clock::duration d) {
  return std::chrono::duration<double, std::milli>(d).count();
}
// Resident set size of this process, in MB.
double RssMb() {
  long pages = 0, resident = 0;
  if (FILE* f = fopen("/proc/self/statm", "r")) {
    if (fscanf(f, "%ld %ld", &pages, &resident) != 2) resident = 0;
    fclose(f);
  }
  return resident * 4096.0 / 1e6;
}
// CPU time of this thread, in ms: a post's own cost, without the time the
// scheduler gave the core to someone else (the benchmark machine is shared).
double ThreadCpuMs() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}
struct Recv {
  uint64_t req;
  uint32_t capacity;
};
}  // namespace

int main(int argc, char** argv) {
  long count = 16'700'000;
  long misses = 100;
  std::string mode = "exact";
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string flag = argv[i], value = argv[i + 1];
    if (flag == "--count") count = atol(value.c_str());
    if (flag == "--mode") mode = value;
    if (flag == "--misses") misses = atol(value.c_str());
  }
  const bool tag64 = mode == "tag64";
  auto pattern = [&](long i) {
    psmd::RecvPattern p;
    p.source = psmd::kAnySource;
    p.tag = psmd::Tag96{{static_cast<uint32_t>(i), 0x5eed, 0}};
    p.sel = tag64 ? psmd::Tag64(~0ULL) : psmd::kTagSelAll;
    return p;
  };
  const double rss0 = RssMb();
  psmd::PostedQueue<Recv> q;
  std::vector<std::pair<long, double>> slow;  // posts over 1 ms CPU
  double worst = 0;
  long worst_at = 0;
  const auto t0 = Clock::now();
  for (long i = 0; i < count; i++) {
    const double a = ThreadCpuMs();
    q.post(pattern(i), Recv{static_cast<uint64_t>(i), 8});
    const double ms = ThreadCpuMs() - a;
    if (ms > worst) {
      worst = ms;
      worst_at = i;
    }
    if (ms > 1.0) slow.emplace_back(i, ms);
  }
  const double total = Ms(Clock::now() - t0);
  printf(
      "growth_step %s: %ld posts in %.0f ms (%.0f ns each); longest post "
      "%.3f ms CPU (at %ld); RSS +%.0f MB\n",
      mode.c_str(), count, total, total * 1e6 / count, worst, worst_at,
      RssMb() - rss0);
  printf("growth_step %s: %zu posts took over 1 ms CPU:", mode.c_str(),
         slow.size());
  for (size_t k = 0; k < slow.size() && k < 8; k++)
    printf(" %.1f ms at %ld;", slow[k].second, slow[k].first);
  printf("\n");
  std::vector<double> miss;
  for (long k = 0; k < misses; k++) {
    psmd::MsgKey key{
        7, psmd::Tag96{{static_cast<uint32_t>(count + k), 0x5eed, 0}}};
    const auto a = Clock::now();
    if (q.take_match(key)) return 1;
    miss.push_back(Ms(Clock::now() - a) * 1000);
  }
  std::sort(miss.begin(), miss.end());
  if (!miss.empty())
    printf("growth_step %s: unmatched message at depth %ld: median %.2f us\n",
           mode.c_str(), count, miss[miss.size() / 2]);
  return 0;
}
