// Copies in place (issue 16): psmd moves a rendezvous payload from the
// sender's memory into the receive buffer itself (daemon/engine/cross_copy.h),
// so a large message arrives while both ranks compute without calling PSM2.
// Real psmd, real client processes (tests/programs/async_progress).
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/types.h>

#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>
#include <vector>

#include "tests/harness.h"

namespace psmd::testing {
namespace {

const char kJob[] = "5053d0d0cccccccccccccccccccccccc";
constexpr uid_t kNobody = 65534;

struct RankOutputs {
  int exit0 = -1, exit1 = -1;
  std::string out0, out1, err;
};

class CopyInPlaceTest : public ::testing::Test {
 protected:
  void TearDown() override {
    EXPECT_TRUE(ShmLeftovers().empty())
        << "something of ours was left in /dev/shm";
  }

  // Runs both ranks of async_progress with `extra` arguments and the
  // daemon's client environment plus `env`, as `uid` (then from copies in
  // dir_: the runfiles tree is private to root).
  RankOutputs Run(const Daemon& d, const std::string& name,
                  const std::vector<std::string>& extra,
                  const std::map<std::string, std::string>& env = {},
                  uid_t uid = static_cast<uid_t>(-1)) {
    const std::string rv = dir_.path() + "/" + name;
    mkdir(rv.c_str(), 0777);
    chmod(rv.c_str(), 0777);
    std::map<std::string, std::string> all = d.ClientEnv();
    all.insert(env.begin(), env.end());
    std::string program = Runfile("tests/programs/async_progress");
    if (uid != static_cast<uid_t>(-1)) {
      EXPECT_EQ(system(("cp " + program + " " + Runfile("client/libpsm2.so.2") +
                        " " + dir_.path() + " && chmod 755 " + dir_.path() +
                        "/async_progress " + dir_.path() + "/libpsm2.so.2")
                           .c_str()),
                0);
      program = dir_.path() + "/async_progress";
      all["LD_LIBRARY_PATH"] = dir_.path();
    }
    auto args = [&](int rank) {
      std::vector<std::string> a = {
          program, "--rank", std::to_string(rank), "--dir", rv, "--uuid", kJob};
      a.insert(a.end(), extra.begin(), extra.end());
      return a;
    };
    Process r1 =
        Process::Start(args(1), all, rv + "/1.out", rv + "/1.err", uid);
    Process r0 =
        Process::Start(args(0), all, rv + "/0.out", rv + "/0.err", uid);
    RankOutputs o;
    o.exit0 = r0.Wait(60);
    o.exit1 = r1.Wait(60);
    o.out0 = ReadFile(rv + "/0.out");
    o.out1 = ReadFile(rv + "/1.out");
    o.err = ReadFile(rv + "/0.err") + ReadFile(rv + "/1.err");
    return o;
  }

  // The *_workers2 variant (psmd with two engine shards): the two ranks of
  // the job sit on different shards (placement spreads a job), so what
  // moved between them crossed: each shard took submissions, and messages
  // crossed, as many taken as handed over (psmctl stats --format json, its
  // "workers"; cross_in and cross_out count messages, not chunks).
  static bool Shards() { return getenv("PSMD_TEST_WORKERS") != nullptr; }
  void ExpectShardsCrossed(const Daemon& d) {
    if (!Shards()) return;
    RunResult s = Psmctl(dir_, d, {"stats", "--format", "json"});
    ASSERT_EQ(s.exit_code, 0) << s.err;
    long long in = 0, out = 0;
    for (int shard = 0; shard < 2; shard++) {
      EXPECT_GT(WorkerNumber(s.out, shard, "submissions"), 0)
          << "shard " << shard << ": " << s.out;
      in += WorkerNumber(s.out, shard, "cross_in");
      out += WorkerNumber(s.out, shard, "cross_out");
    }
    EXPECT_GT(out, 0) << s.out;
    EXPECT_EQ(in, out) << s.out;
  }

  TempDir dir_;
};

// What rank 1 of async_progress saw: the fraction of the message in its
// buffer when it came back from computing, and whether psm2_mq_test then
// completed the receive.
struct Arrival {
  double arrived = -1;
  int test = -1;
  int intact = -1;
};

Arrival ParseArrival(const std::string& out) {
  Arrival a;
  sscanf(out.c_str(), "arrived %lf test %d intact %d", &a.arrived, &a.test,
         &a.intact);
  return a;
}

TEST_F(CopyInPlaceTest, ALargeMessageArrivesWhileBothRanksCompute) {
  Daemon d(dir_);
  // 64 MiB, one second of computing: the copy itself takes ~10-30 ms here.
  const std::vector<std::string> args = {
      "--bytes", std::to_string(64 << 20), "--compute-ms",
      std::to_string(static_cast<int>(1000 * TimeScale()))};
  RankOutputs on = Run(d, "on", args);
  ASSERT_EQ(on.exit0, 0) << on.err;
  ASSERT_EQ(on.exit1, 0) << on.err;
  Arrival a = ParseArrival(on.out1);
  EXPECT_EQ(a.arrived, 1.0) << on.out1;
  EXPECT_EQ(a.test, 1) << on.out1;
  EXPECT_EQ(a.intact, 1) << on.out1;
  // psmd copied it (with two shards: from one shard's endpoint to the
  // other's, which the copy and the stats say).
  RunResult copied = Psmctl(dir_, d, {"stats", "--format", "json"});
  EXPECT_EQ(JsonNumber(copied.out, "total", "rndv_msgs_copied"), 1)
      << copied.out;
  ExpectShardsCrossed(d);

  // The same program streaming through the pool: nothing can move while the
  // sender computes (its library must publish each chunk), so this test
  // would fail without copies in place.
  RankOutputs off = Run(d, "off", args, {{"PSMD_COPY_IN_PLACE", "off"}});
  ASSERT_EQ(off.exit0, 0) << off.err;
  ASSERT_EQ(off.exit1, 0) << off.err;
  Arrival b = ParseArrival(off.out1);
  EXPECT_LT(b.arrived, 0.5) << off.out1;
  EXPECT_EQ(b.intact, 1) << off.out1;

  // psmctl counts the copy (the second run streamed).
  RunResult stats = Psmctl(dir_, d, {"stats", "--format", "json"});
  EXPECT_EQ(stats.exit_code, 0) << stats.err;
  EXPECT_EQ(JsonNumber(stats.out, "total", "rndv_msgs_copied"), 1) << stats.out;
  EXPECT_EQ(JsonNumber(stats.out, "total", "rndv_bytes_copied"), 64 << 20)
      << stats.out;
  EXPECT_TRUE(d.Stop());
}

TEST_F(CopyInPlaceTest, ManySizesAcrossTheThresholdArriveIntact) {
  Daemon d(dir_, {"--copy-min-bytes", "100000"});
  for (size_t bytes : {size_t{64001}, size_t{99999}, size_t{100000},
                       size_t{(1 << 20) + 3}, size_t{(5 << 20) + 4095}}) {
    RankOutputs o = Run(
        d, "size" + std::to_string(bytes),
        {"--bytes", std::to_string(bytes), "--compute-ms", "0", "--reps", "3"});
    EXPECT_EQ(o.exit0, 0) << bytes << ": " << o.err;
    EXPECT_EQ(o.exit1, 0) << bytes << ": " << o.err << o.out1;
  }
  ExpectShardsCrossed(d);
  EXPECT_TRUE(d.Stop());
}

TEST_F(CopyInPlaceTest, ASenderThatUnmapsItsBufferFailsOnlyThatMessage) {
  Daemon d(dir_);
  RankOutputs o =
      Run(d, "unmap", {"--bytes", std::to_string(8 << 20), "--unmap"});
  // Both requests failed with PSM2_PARAM_ERR (3), and the pair then
  // exchanged another message.
  EXPECT_EQ(o.exit0, 0) << o.out0 << o.err;
  EXPECT_EQ(o.exit1, 0) << o.out1 << o.err;
  EXPECT_NE(o.out0.find("error 3"), std::string::npos) << o.out0;
  EXPECT_NE(o.out1.find("error 3"), std::string::npos) << o.out1;
  EXPECT_NE(d.Log().find("is not mapped in its process"), std::string::npos)
      << d.Log();
  EXPECT_EQ(Psmctl(dir_, d, {"health"}).exit_code, 0);
  ExpectShardsCrossed(d);
  EXPECT_TRUE(d.Stop());
}

TEST_F(CopyInPlaceTest, WithCopiesOffTheStreamStillCarriesEverything) {
  Daemon d(dir_, {"--copy-in-place", "off"});
  RankOutputs o = Run(
      d, "off", {"--bytes", std::to_string(16 << 20), "--compute-ms", "200"});
  EXPECT_EQ(o.exit0, 0) << o.err;
  EXPECT_EQ(o.exit1, 0) << o.err;
  Arrival a = ParseArrival(o.out1);
  EXPECT_LT(a.arrived, 0.5) << o.out1;
  EXPECT_EQ(a.intact, 1) << o.out1;
  EXPECT_TRUE(d.Stop());
}

TEST_F(CopyInPlaceTest, WithoutThePrivilegeMessagesStreamInstead) {
  // psmd as root without CAP_SYS_PTRACE, clients of another uid: the kernel
  // refuses the copy (EPERM) before a byte moves, and the message streams
  // through the pool instead, intact.
  Daemon d(dir_, {}, {},
           {"/usr/bin/setpriv", "--bounding-set", "-sys_ptrace", "--inh-caps",
            "-sys_ptrace"});
  RankOutputs o = Run(d, "denied",
                      {"--bytes", std::to_string(8 << 20), "--compute-ms",
                       "100", "--reps", "2"},
                      {}, kNobody);
  EXPECT_EQ(o.exit0, 0) << o.err;
  EXPECT_EQ(o.exit1, 0) << o.err;
  Arrival a = ParseArrival(o.out1);
  EXPECT_EQ(a.intact, 1) << o.out1;
  EXPECT_LT(a.arrived, 0.5) << o.out1;
  EXPECT_NE(d.Log().find("may not read its memory (EPERM)"), std::string::npos)
      << d.Log();
  RunResult stats = Psmctl(dir_, d, {"stats", "--format", "json"});
  EXPECT_EQ(JsonNumber(stats.out, "total", "rndv_msgs_copied"), 0) << stats.out;
  ExpectShardsCrossed(d);
  EXPECT_TRUE(d.Stop());
}

}  // namespace
}  // namespace psmd::testing
