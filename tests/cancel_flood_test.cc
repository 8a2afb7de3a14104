// The flood-then-cancel attack of issue 38 against a live psmd: a tenant
// posts 1,000,000 receives that nothing matches (tests/programs/hostile,
// posted-recvs), which its library hands to psmd as fast as psmd's rings
// take them, and then cancels and reposts them one by one in a loop. A
// bystander job runs an 8 B ping-pong from the moment the tenant starts,
// again and again until its posting calls returned, then once more: "from
// the first second", while psmd takes the posts in (it took 1.5-2.5 s
// here, and each pass gave the tenant 128 of them, 40-600 us).
//
//   (a) Each turn psmd's worker gives the tenant while the bystander has
//       work too is short: at most 30% of them take over 8 us, at most a
//       tenth over 64 us (psmctl stats, worker: shared_slices...). A
//       bystander's message waits for at most one such turn each way, about
//       half of one on average, so at the 2-5 us of its quiet half round
//       trip here that keeps its median and mean within 3x. (Before the
//       bound, 128 of the tenant's receives took 40-600 us a turn: the
//       bystander's median went to 80-160 us.) The gate counts psmd's work
//       per turn rather than the bystander's wall-clock latency: on these
//       two cores shared with other jobs the same ping-pong beside an idle
//       psmd measured a mean of 5 us in one run and 74 us in the next, so a
//       3x gate on latency would judge the machine's load. The bystander's
//       median and mean, beside its same-run quiet controls, are printed.
//   (b) psmd's resident memory comes back within kMemoryFactor of what it
//       was before the flood: once the tenant ended, and, for a tenant that
//       cancels every receive it posted and keeps its endpoint, once its
//       cancels are done.
//
// Exclusive (Bazel runs nothing beside it): it compares latencies.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>

#include <atomic>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "tests/harness.h"
#include "tests/verdicts.h"

namespace psmd::testing {
namespace {

const char kBystanderJob[] = "5053d0d0cccccccccccccccccccccccc";
const char kTenantJob[] = "0bad0bad0bad0bad0bad0bad0bad0ca5";
constexpr long kFlood = 1'000'000;
// Receives the tenant of (b)'s second half posts and cancels one by one
// (each cancel is a round trip: a million took 9-16 s here).
constexpr long kCancelled = 250'000;
// Bystander round trips per measurement: 0.2 s at the control's pace, long
// enough to cover the whole intake of the flood at the pace it had before
// the fix.
constexpr int kIters = 20'000;
// Work per turn (a).
constexpr double kMostOver8us = 0.3;
constexpr double kMostOver64us = 0.1;
constexpr long long kLeastSlices = 100;
constexpr double kMemoryFactor = 2.0;

class CancelFloodTest : public ::testing::Test {
 protected:
  // The bystander's 8 B ping-pong, kIters round trips.
  PingPongResult Bystander() {
    const std::string rv = dir_.path() + "/pp" + std::to_string(runs_++);
    mkdir(rv.c_str(), 0755);
    const PingPongResult p =
        PingPong8(dir_, daemon_, rv, kBystanderJob, kIters);
    EXPECT_EQ(p.error, "");
    return p;
  }

  Process Tenant(const std::string& name, long count, bool cancel_all) {
    return Process::Start(
        {Runfile("tests/programs/hostile"), "--attack", "posted-recvs",
         "--seconds", "600", "--uuid", kTenantJob, "--count",
         std::to_string(count), "--cancel-all", cancel_all ? "1" : "0"},
        daemon_.ClientEnv(), dir_.path() + "/" + name + ".out",
        dir_.path() + "/" + name + ".err");
  }

  // Starts a tenant (as Tenant) and waits until it posted all `count`.
  ::testing::AssertionResult Flooded(Process& tenant, const std::string& name,
                                     long count) {
    WaitUntil(120, [&] {
      return Reported(Out(name), "ready", "posted") == count ||
             tenant.Wait(0) != -1;
    });
    if (Reported(Out(name), "ready", "posted") == count)
      return ::testing::AssertionSuccess();
    return ::testing::AssertionFailure()
           << "the tenant did not post all " << count << ": " << Out(name);
  }

  std::string Out(const std::string& name) {
    return ReadFile(dir_.path() + "/" + name + ".out");
  }

  std::string Stats() { return Psmctl(dir_, daemon_, {"stats", "--json"}).out; }

  long long Endpoints() { return JsonNumber(Stats(), "", "endpoint_count"); }

  long long Rss() { return ResidentKiB(daemon_.pid()); }

  // Waits until psmd's memory is back within kMemoryFactor of `base`;
  // false (with what it held) if it is not within `seconds`.
  ::testing::AssertionResult MemoryBack(long long base, double seconds) {
    long long rss = 0;
    if (WaitUntil(seconds, [&] {
          rss = Rss();
          return rss <= kMemoryFactor * base;
        })) {
      return ::testing::AssertionSuccess() << rss << " KiB";
    }
    return ::testing::AssertionFailure()
           << "psmd holds " << rss << " KiB, from " << base
           << " KiB before the flood";
  }

  TempDir dir_;
  Daemon daemon_{dir_};
  int runs_ = 0;
};

TEST_F(CancelFloodTest, ABystanderKeepsItsRoundTripFromTheFirstSecond) {
  Bystander();  // psmd's first clients' allocations, before the baseline
  const PingPongResult before = Bystander();
  const long long base_rss = Rss();
  // The bystander runs from the attack's start, again and again while the
  // tenant posts its receives, then once more beside its cancels. Run only
  // after the tenant had posted them all, it could miss the tenant's turns
  // altogether on a loaded machine (CI, 2026-12-08, beside another test:
  // none in 20,000 round trips, 3 runs of 3; alone, 9,923): psmd may be
  // through the last of the flood before the bystander's first message.
  const std::string from = Stats();
  Process tenant = Tenant("tenant", kFlood, /*cancel_all=*/false);
  PingPongResult attacked;
  std::atomic<bool> posted{false};
  std::thread beside([&] {
    while (!posted.load()) attacked = Bystander();
  });
  const ::testing::AssertionResult flooded = Flooded(tenant, "tenant", kFlood);
  posted.store(true);
  beside.join();
  ASSERT_TRUE(flooded);
  attacked = Bystander();
  const std::string to = Stats();
  const long long flooded_rss = Rss();
  tenant.Kill(SIGTERM);
  ASSERT_EQ(tenant.Wait(30), 0) << ReadFile(dir_.path() + "/tenant.err");
  // It attacked: it held every receive and cancelled some.
  EXPECT_GE(Reported(Out("tenant"), "done", "cancels"), 1) << Out("tenant");
  ASSERT_TRUE(WaitUntil(30, [&] { return Endpoints() == 0; }));
  const PingPongResult after = Bystander();
  auto moved = [&](const char* key) {
    return JsonNumber(to, "worker", key) - JsonNumber(from, "worker", key);
  };
  const long long slices = moved("shared_slices");
  const long long over_8us = moved("shared_slices_over_8us");
  const long long over_64us = moved("shared_slices_over_64us");
  const double quiet_median = (before.median_us + after.median_us) / 2;
  const double quiet_mean = (before.mean_us + after.mean_us) / 2;
  printf(
      "bystander beside the flood: median %.2f us (%.2fx), mean %.2f us "
      "(%.2fx), quiet before/after %.2f/%.2f and %.2f/%.2f us\n"
      "the tenant's turns while the bystander had work: %lld, mean %.2f "
      "us, %lld over 8 us, %lld over 64 us\n"
      "psmd %lld KiB before, %lld KiB flooded\n%s",
      attacked.median_us, attacked.median_us / quiet_median, attacked.mean_us,
      attacked.mean_us / quiet_mean, before.median_us, before.mean_us,
      after.median_us, after.mean_us, slices,
      slices > 0 ? moved("shared_slice_ns") / 1e3 / slices : 0.0, over_8us,
      over_64us, base_rss, flooded_rss, Out("tenant").c_str());
  fflush(stdout);
  // (a)
  ASSERT_GE(slices, kLeastSlices)
      << "the tenant was never busy beside the bystander: this proves nothing";
  EXPECT_LE(over_8us, kMostOver8us * slices);
  EXPECT_LE(over_64us, kMostOver64us * slices);
  // (b) Once it ended.
  EXPECT_TRUE(MemoryBack(base_rss, 10)) << "after the tenant ended";
  EXPECT_TRUE(daemon_.Stop());
  EXPECT_TRUE(ShmLeftovers().empty());
}

// (b) for a tenant that keeps its endpoint: its receives cancelled, psmd
// gives their memory back (it kept every node and both hash tables of the
// queue's peak until the endpoint closed).
TEST_F(CancelFloodTest, CancelledReceivesGiveTheirMemoryBack) {
  Bystander();  // as above: the baseline after a client
  const long long base_rss = Rss();
  Process tenant = Tenant("tenant", kCancelled, /*cancel_all=*/true);
  ASSERT_TRUE(Flooded(tenant, "tenant", kCancelled));
  // The loop ran (and psmd took every post in: the cancels wait for them).
  ASSERT_TRUE(WaitUntil(60, [&] {
    return JsonNumber(Stats(), "total", "posted_recvs") > kCancelled;
  }));
  const long long flooded_rss = Rss();
  tenant.Kill(SIGTERM);
  ASSERT_TRUE(WaitUntil(120, [&] {
    return Reported(Out("tenant"), "cancelled", "n") >= 0 ||
           tenant.Wait(0) != -1;
  })) << Out("tenant");
  ASSERT_EQ(Reported(Out("tenant"), "cancelled", "n"), kCancelled)
      << Out("tenant");
  EXPECT_EQ(Endpoints(), 1) << "the tenant keeps its endpoint";
  const ::testing::AssertionResult back = MemoryBack(base_rss, 10);
  printf("psmd %lld KiB before, %lld KiB flooded, after the cancels: %s\n",
         base_rss, flooded_rss, back.message());
  EXPECT_TRUE(back);
  EXPECT_GT(flooded_rss, kMemoryFactor * base_rss)
      << "the flood never grew psmd: this proves nothing";
  tenant.Kill(SIGTERM);
  EXPECT_EQ(tenant.Wait(30), 0);
  EXPECT_TRUE(daemon_.Stop());
  EXPECT_TRUE(ShmLeftovers().empty());
}

}  // namespace
}  // namespace psmd::testing
