// Tenants apart on the control plane (issue 12, items 4 and 6), as uid
// nobody against a real psmd: one uid cannot hold psmd's control
// connections without bound, cannot learn which epids exist in other
// uids' jobs, and sees no node-wide activity figures.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "tests/harness.h"

namespace psmd::testing {
namespace {

constexpr uid_t kNobody = 65534;
const char kJob[] = "5053d0d0cccccccccccccccccccccccc";

class TenantTest : public ::testing::Test {
 protected:
  void SetUp() override {
    // The runfiles tree is private to root: copies nobody can run.
    ASSERT_EQ(system(("cp " + Runfile("tests/programs/exchange") + " " +
                      Runfile("client/libpsm2.so.2") + " " +
                      Runfile("tools/psmctl") + " " + dir_.path() +
                      " && chmod 755 " + dir_.path() + "/exchange " +
                      dir_.path() + "/libpsm2.so.2 " + dir_.path() + "/psmctl")
                         .c_str()),
              0);
  }
  void TearDown() override {
    EXPECT_TRUE(ShmLeftovers().empty())
        << "something of ours was left in /dev/shm";
  }

  RunResult PsmctlAs(const Daemon& d, uid_t uid,
                     const std::vector<std::string>& args) {
    std::vector<std::string> argv = {dir_.path() + "/psmctl", "--socket",
                                     d.socket()};
    argv.insert(argv.end(), args.begin(), args.end());
    return RunToEnd(dir_, argv, {}, 20, uid);
  }

  // A rendezvous directory both uids may use.
  std::string SharedDir(const std::string& name) {
    std::string p = dir_.path() + "/" + name;
    mkdir(p.c_str(), 0777);
    chmod(p.c_str(), 0777);
    return p;
  }

  TempDir dir_;
};

// Only root may hand psmd over (psmctl upgrade runs a binary as root).
TEST_F(TenantTest, UpgradeIsRootOnly) {
  Daemon d(dir_);
  RunResult up = PsmctlAs(d, kNobody, {"upgrade"});
  EXPECT_EQ(up.exit_code, 1);
  EXPECT_NE(up.err.find("root"), std::string::npos) << up.err;
  EXPECT_EQ(d.Log().find("handing over"), std::string::npos);
}

// A child process, running as `uid`, that opens `n` connections to `socket`
// and speaks just enough HTTP/2 (the preface and an empty SETTINGS frame)
// for psmd to hand each to gRPC, then holds them until killed. Returns its
// pid once it has sent everything (it writes one byte to a pipe), or -1.
pid_t HoldGrpcConnections(const std::string& socket, int n, uid_t uid) {
  int ready[2];
  if (pipe(ready) != 0) return -1;
  pid_t pid = fork();
  if (pid == 0) {
    // Only system calls from here: the parent has threads.
    close(ready[0]);
    if (setgid(uid) != 0 || setuid(uid) != 0) _exit(2);
    static const char kPreface[] = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
    static const unsigned char kSettings[9] = {0, 0, 0, 4, 0, 0, 0, 0, 0};
    for (int i = 0; i < n; i++) {
      int s = ::socket(AF_UNIX, SOCK_STREAM, 0);
      sockaddr_un addr{};
      addr.sun_family = AF_UNIX;
      strncpy(addr.sun_path, socket.c_str(), sizeof(addr.sun_path) - 1);
      if (connect(s, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0)
        _exit(3);
      if (write(s, kPreface, sizeof(kPreface) - 1) < 0 ||
          write(s, kSettings, sizeof(kSettings)) < 0) {
        _exit(4);
      }
    }
    if (write(ready[1], "r", 1) != 1) _exit(5);
    for (;;) pause();
  }
  close(ready[1]);
  char c;
  bool ok = pid > 0 && read(ready[0], &c, 1) == 1;
  close(ready[0]);
  if (!ok && pid > 0) {
    kill(pid, SIGKILL);
    waitpid(pid, nullptr, 0);
    return -1;
  }
  return pid;
}

TEST_F(TenantTest, ControlConnectionsOfOneUidAreBounded) {
  Daemon d(dir_, {"--max-control-connections-per-uid", "3"});
  pid_t holder = HoldGrpcConnections(d.socket(), 3, kNobody);
  ASSERT_GT(holder, 0);
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  // The uid's fourth connection is refused, and the log names the limit.
  RunResult refused = PsmctlAs(d, kNobody, {"health"});
  EXPECT_NE(refused.exit_code, 0) << refused.out;
  EXPECT_NE(d.Log().find("max_control_connections_per_uid"), std::string::npos)
      << d.Log();
  // Others are not held back.
  RunResult root = PsmctlAs(d, 0, {"health"});
  EXPECT_EQ(root.exit_code, 0) << root.err;
  // Once the holder's connections close, the uid gets in again.
  kill(holder, SIGKILL);
  waitpid(holder, nullptr, 0);
  int exit_code = -1;
  for (int i = 0; i < 50 && exit_code != 0; i++) {
    exit_code = PsmctlAs(d, kNobody, {"health"}).exit_code;
    if (exit_code != 0)
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  EXPECT_EQ(exit_code, 0);
  // The refusal is counted for that uid (root sees every uid's).
  RunResult stats = PsmctlAs(d, kNobody, {"stats", "--format", "json"});
  EXPECT_GE(JsonNumber(stats.out, "refusals", "control_connections_refused"), 1)
      << stats.out;
  EXPECT_GE(JsonNumber(PsmctlAs(d, 0, {"stats", "--format", "json"}).out,
                       "refusals", "control_connections_refused"),
            1);
  EXPECT_TRUE(d.Stop());
}

TEST_F(TenantTest, AnotherUidsEndpointLooksExactlyLikeNoEndpoint) {
  Daemon d(dir_);
  std::string rv = SharedDir("rv");
  auto env = d.ClientEnv();
  env["LD_LIBRARY_PATH"] = dir_.path();
  auto args = [&](int rank) {
    std::vector<std::string> a = ExchangeArgs(dir_, rv, rank, kJob, 10, 10);
    a[0] = dir_.path() + "/exchange";
    return a;
  };
  // Same job uuid, different uids: root's endpoint must be invisible to
  // nobody, not "another job".
  Process root_rank = Process::Start(args(1), env, dir_.path() + "/r1.out",
                                     dir_.path() + "/r1.err");
  RunResult nobody_rank = RunToEnd(dir_, args(0), env, 30, kNobody);
  EXPECT_EQ(nobody_rank.exit_code, 3) << nobody_rank.out << nobody_rank.err;
  EXPECT_EQ(nobody_rank.out.find("another job"), std::string::npos)
      << nobody_rank.out;
  EXPECT_EQ(nobody_rank.err.find("another job"), std::string::npos)
      << nobody_rank.err;
  EXPECT_NE(nobody_rank.err.find("of this uid on this node"), std::string::npos)
      << nobody_rank.err;
  EXPECT_EQ(root_rank.Wait(30), 3);
  EXPECT_TRUE(d.Stop());
}

TEST_F(TenantTest, OnlyRootSeesNodeWideCounts) {
  Daemon d(dir_);
  std::string rv = SharedDir("busy");
  // Root's pair holds two endpoints open while the others look.
  Process r1 =
      Process::Start(ExchangeArgs(dir_, rv, 1, kJob, 10, 10, 3), d.ClientEnv(),
                     dir_.path() + "/b1.out", dir_.path() + "/b1.err");
  Process r0 =
      Process::Start(ExchangeArgs(dir_, rv, 0, kJob, 10, 10, 3), d.ClientEnv(),
                     dir_.path() + "/b0.out", dir_.path() + "/b0.err");
  long long root_count = 0;
  for (int i = 0; i < 200 && root_count < 2; i++) {
    root_count = JsonNumber(PsmctlAs(d, 0, {"health", "--format", "json"}).out,
                            "", "endpoint_count");
    if (root_count < 2)
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(root_count, 2);
  RunResult health = PsmctlAs(d, kNobody, {"health", "--format", "json"});
  ASSERT_EQ(health.exit_code, 0) << health.err;
  EXPECT_EQ(JsonNumber(health.out, "", "endpoint_count"), 0) << health.out;
  RunResult stats = PsmctlAs(d, kNobody, {"stats", "--format", "json"});
  ASSERT_EQ(stats.exit_code, 0) << stats.err;
  EXPECT_EQ(JsonNumber(stats.out, "", "endpoint_count"), 0) << stats.out;
  EXPECT_EQ(JsonNumber(stats.out, "", "doorbells"), 0) << stats.out;
  EXPECT_EQ(JsonNumber(stats.out, "", "sleeps"), 0) << stats.out;
  RunResult root_stats = PsmctlAs(d, 0, {"stats", "--format", "json"});
  EXPECT_GT(JsonNumber(root_stats.out, "", "sleeps"), 0) << root_stats.out;
  EXPECT_EQ(r0.Wait(30), 0);
  EXPECT_EQ(r1.Wait(30), 0);
  EXPECT_TRUE(d.Stop());
}

}  // namespace
}  // namespace psmd::testing
