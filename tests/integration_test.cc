// End-to-end tests of psmd: a real daemon, real client processes, real shared
// memory and sockets (tests/harness.h).
#include <gtest/gtest.h>
#include <psm2.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <memory>
#include <thread>

#include "tests/harness.h"
#include "tests/programs/survivor.h"
#include "tests/verdicts.h"

namespace psmd::testing {
namespace {

const char kJobA[] = "5053d0d0aaaaaaaaaaaaaaaaaaaaaaaa";
const char kJobB[] = "5053d0d0bbbbbbbbbbbbbbbbbbbbbbbb";

// Runs an exchange pair of `messages` messages (up to 1000 B) in job `uuid`
// to the end and expects both ranks to succeed.
void ExpectExchangeRuns(const TempDir& dir, const Daemon& d,
                        const std::string& name, const std::string& uuid,
                        int messages) {
  std::string rv = Subdir(dir, name);
  Process r1 = Process::Start(ExchangeArgs(dir, rv, 1, uuid, messages, 1000),
                              d.ClientEnv(), rv + "/r1.out", rv + "/r1.err");
  RunResult r0 = RunToEnd(dir, ExchangeArgs(dir, rv, 0, uuid, messages, 1000),
                          d.ClientEnv(), 30);
  EXPECT_EQ(r0.exit_code, 0) << r0.err;
  EXPECT_EQ(r1.Wait(30), 0) << ReadFile(rv + "/r1.err");
}

// Returns true once `d` lists an endpoint of process `pid` (what root sees).
bool WaitForEndpointOf(const TempDir& dir, const Daemon& d, pid_t pid) {
  return WaitUntil(10, [&] {
    return Psmctl(dir, d, {"endpoints", "--json"})
               .out.find("\"pid\": " + std::to_string(pid) + ",") !=
           std::string::npos;
  });
}

class IntegrationTest : public ::testing::Test {
 protected:
  void TearDown() override {
    EXPECT_TRUE(ShmLeftovers().empty())
        << "something of ours was left in /dev/shm";
  }
  TempDir dir_;
};

TEST_F(IntegrationTest, TwoProcessesExchangeTenThousandMessagesAndStatsMatch) {
  Daemon d(dir_);
  std::string rv = Subdir(dir_, "rv");
  Process receiver = Process::Start(
      ExchangeArgs(dir_, rv, 1, kJobA, 10000, 8192), d.ClientEnv(),
      dir_.path() + "/r1.out", dir_.path() + "/r1.err");
  RunResult sender = RunToEnd(
      dir_, ExchangeArgs(dir_, rv, 0, kJobA, 10000, 8192), d.ClientEnv());
  ASSERT_EQ(sender.exit_code, 0) << sender.out << sender.err;
  ASSERT_EQ(receiver.Wait(60), 0) << ReadFile(dir_.path() + "/r1.err");
  EXPECT_NE(ReadFile(dir_.path() + "/r1.out").find("all intact and in order"),
            std::string::npos);

  unsigned long long payload = 0;
  ASSERT_EQ(sscanf(sender.out.c_str(),
                   "rank 0: sent 10000 messages, %llu bytes", &payload),
            1);
  RunResult stats = Psmctl(dir_, d, {"stats", "--json"});
  ASSERT_EQ(stats.exit_code, 0) << stats.err;
  // 10000 messages one way plus one 4-byte acknowledgement the other way.
  EXPECT_EQ(JsonNumber(stats.out, "total", "msgs_sent"), 10001) << stats.out;
  EXPECT_EQ(JsonNumber(stats.out, "total", "msgs_received"), 10001)
      << stats.out;
  EXPECT_EQ(JsonNumber(stats.out, "total", "bytes_sent"),
            static_cast<long long>(payload + 4));
  EXPECT_EQ(JsonNumber(stats.out, "total", "bytes_received"),
            static_cast<long long>(payload + 4));
  EXPECT_EQ(JsonNumber(stats.out, "total", "bad_descriptors"), 0);
  EXPECT_GE(JsonNumber(stats.out, "", "uptime_seconds"), 0);
  EXPECT_EQ(JsonNumber(stats.out, "", "endpoint_count"), 0);
  EXPECT_TRUE(d.Stop());
}

TEST_F(IntegrationTest, MessagesOutliveTheirClosedSender) {
  Daemon d(dir_);
  std::string rv = Subdir(dir_, "rv");
  std::vector<std::string> r1_args =
      ExchangeArgs(dir_, rv, 1, kJobA, 500, 8192);
  std::vector<std::string> r0_args =
      ExchangeArgs(dir_, rv, 0, kJobA, 500, 8192);
  r1_args.push_back("--no-ack");
  r0_args.push_back("--no-ack");
  Process receiver = Process::Start(
      r1_args, d.ClientEnv(), dir_.path() + "/r1.out", dir_.path() + "/r1.err");
  RunResult sender = RunToEnd(dir_, r0_args, d.ClientEnv());
  ASSERT_EQ(sender.exit_code, 0) << sender.err;
  EXPECT_EQ(receiver.Wait(60), 0) << ReadFile(dir_.path() + "/r1.err");
  RunResult stats = Psmctl(dir_, d, {"stats", "--json"});
  EXPECT_EQ(JsonNumber(stats.out, "total", "msgs_received"), 500) << stats.out;
  EXPECT_EQ(JsonNumber(stats.out, "total", "unexpected_msgs"), 500)
      << stats.out;
}

TEST_F(IntegrationTest, StatsListEveryOpenEndpointWithItsCounters) {
  Daemon d(dir_);
  std::string rv = Subdir(dir_, "rv");
  Process r1 = Process::Start(ExchangeArgs(dir_, rv, 1, kJobA, 100, 64, 2),
                              d.ClientEnv(), dir_.path() + "/r1.out",
                              dir_.path() + "/r1.err");
  Process r0 = Process::Start(ExchangeArgs(dir_, rv, 0, kJobA, 100, 64, 2),
                              d.ClientEnv(), dir_.path() + "/r0.out",
                              dir_.path() + "/r0.err");
  ASSERT_TRUE(WaitForEndpointOf(dir_, d, r0.pid()) &&
              WaitForEndpointOf(dir_, d, r1.pid()));
  RunResult list = Psmctl(dir_, d, {"endpoints"});
  ASSERT_EQ(list.exit_code, 0) << list.err;
  EXPECT_NE(list.out.find(std::to_string(r0.pid())), std::string::npos)
      << list.out;
  EXPECT_NE(list.out.find(std::to_string(r1.pid())), std::string::npos)
      << list.out;
  EXPECT_NE(list.out.find("5053d0d0-aaaa-aaaa-aaaa-aaaaaaaaaaaa"),
            std::string::npos);
  RunResult json = Psmctl(dir_, d, {"endpoints", "--json"});
  EXPECT_EQ(JsonNumber(json.out, "", "pid") > 0, true) << json.out;
  ASSERT_EQ(r0.Wait(30), 0);
  ASSERT_EQ(r1.Wait(30), 0);
  RunResult text = Psmctl(dir_, d, {"stats"});
  EXPECT_NE(text.out.find("total"), std::string::npos) << text.out;
}

TEST_F(IntegrationTest, KilledClientIsReclaimedAndOthersKeepWorking) {
  Daemon d(dir_);
  std::string rv_a = Subdir(dir_, "a");
  Process a1 = Process::Start(
      ExchangeArgs(dir_, rv_a, 1, kJobA, 100000000, 8192), d.ClientEnv(),
      dir_.path() + "/a1.out", dir_.path() + "/a1.err");
  Process a0 = Process::Start(
      ExchangeArgs(dir_, rv_a, 0, kJobA, 100000000, 8192), d.ClientEnv(),
      dir_.path() + "/a0.out", dir_.path() + "/a0.err");
  // Mid-stream: the receiver has taken a thousand messages.
  ASSERT_TRUE(WaitUntil(30,
                        [&] {
                          return JsonNumber(
                                     Psmctl(dir_, d, {"stats", "--json"}).out,
                                     "total", "msgs_received") >= 1000;
                        }))
      << ReadFile(dir_.path() + "/a0.err") << ReadFile(dir_.path() + "/a1.err");
  ASSERT_TRUE(a0.running());
  EXPECT_EQ(CountMappings(d.pid(), "memfd:psmd-endpoint"), 2);
  pid_t dead = a0.pid();
  KillOutcome killed;
  killed.killed_at_ms = MonotonicMs();
  a0.Kill(SIGKILL);
  killed.victim_status = a0.Wait(5);

  // Within a second the endpoint is gone from the list and its segment from
  // the daemon's address space.
  bool gone = false;
  for (int i = 0; i < 100 && !gone; i++) {
    RunResult list = Psmctl(dir_, d, {"endpoints", "--json"});
    gone = list.out.find("\"pid\": " + std::to_string(dead) + ",") ==
           std::string::npos;
    if (!gone) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_TRUE(gone) << "killed client still listed after 1 s";
  // Its peer was receiving from it by name: that receive fails with
  // PSM2_EPID_UNREACHABLE (the peer's endpoint is gone,
  // docs/reliability.md) instead of waiting forever, so the survivor ends
  // with that error (exit 4; not a crash, not a data mismatch) and its
  // segment is unmapped too.
  killed.survivor_status = a1.Wait(5);  // -1: still waiting after 5 s
  killed.survivor_out = ReadFile(dir_.path() + "/a1.out");
  killed.allowed_ms = static_cast<long long>(5000 * TimeScale());
  EXPECT_EQ(KillVerdict(killed), "") << ReadFile(dir_.path() + "/a1.err");
  for (int i = 0; i < 100 && CountMappings(d.pid(), "memfd:psmd-endpoint") != 0;
       i++) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(CountMappings(d.pid(), "memfd:psmd-endpoint"), 0);

  // Another job runs to completion on the same daemon.
  std::string rv_b = Subdir(dir_, "b");
  Process b1 = Process::Start(ExchangeArgs(dir_, rv_b, 1, kJobB, 2000, 8192),
                              d.ClientEnv(), dir_.path() + "/b1.out",
                              dir_.path() + "/b1.err");
  RunResult b0 = RunToEnd(dir_, ExchangeArgs(dir_, rv_b, 0, kJobB, 2000, 8192),
                          d.ClientEnv());
  EXPECT_EQ(b0.exit_code, 0) << b0.err;
  EXPECT_EQ(b1.Wait(30), 0) << ReadFile(dir_.path() + "/b1.err");
  EXPECT_EQ(Psmctl(dir_, d, {"health"}).exit_code, 0);
  EXPECT_TRUE(d.Stop());
}

// Runs the two roles of tests/programs/peer_death, waits for `ready` (a file
// the victim's peer writes once the transfer is under way), SIGKILLs the
// victim and returns how long the survivor's wait took to end after the
// kill, in ms (-1: it did not end within 10 s). `survivor_out` gets its
// output.
long KillMidTransfer(const TempDir& dir, const Daemon& d,
                     const std::string& sender_role,
                     const std::string& receiver_role, bool kill_sender,
                     const std::string& ready, int* survivor_exit,
                     std::string* survivor_out) {
  std::string rv = Subdir(dir, sender_role);
  auto args = [&](const std::string& role, int rank) {
    return std::vector<std::string>{Runfile("tests/programs/peer_death"),
                                    "--role",
                                    role,
                                    "--rank",
                                    std::to_string(rank),
                                    "--dir",
                                    rv,
                                    "--uuid",
                                    kJobA};
  };
  Process sender = Process::Start(args(sender_role, 0), d.ClientEnv(),
                                  rv + "/0.out", rv + "/0.err");
  Process receiver = Process::Start(args(receiver_role, 1), d.ClientEnv(),
                                    rv + "/1.out", rv + "/1.err");
  for (int i = 0; i < 2000 && access((rv + "/" + ready).c_str(), F_OK) != 0;
       i++) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(access((rv + "/" + ready).c_str(), F_OK), 0)
      << "the transfer never got going: " << ReadFile(rv + "/0.err")
      << ReadFile(rv + "/1.err");
  Process& victim = kill_sender ? sender : receiver;
  Process& survivor = kill_sender ? receiver : sender;
  auto killed_at = std::chrono::steady_clock::now();
  victim.Kill(SIGKILL);
  victim.Wait(5);
  *survivor_exit = survivor.Wait(10);
  std::string out_path = rv + (kill_sender ? "/1.out" : "/0.out");
  *survivor_out =
      ReadFile(out_path) + ReadFile(rv + (kill_sender ? "/1.err" : "/0.err"));
  long long ended_ms = 0;
  int error = 0;
  if (sscanf(ReadFile(out_path).c_str(), "ended %d at %lld", &error,
             &ended_ms) != 2)
    return -1;
  long long killed_ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                            killed_at.time_since_epoch())
                            .count();
  return static_cast<long>(ended_ms - killed_ms);
}

TEST_F(IntegrationTest,
       SenderKilledMidRendezvousFailsTheReceiverWithinASecond) {
  // The stream through the pool, which needs the sender: psmd copying the
  // message in place (tests/copy_in_place_test.cc) would finish it without.
  Daemon d(dir_, {"--copy-in-place", "off"});
  int exit_code = 0;
  std::string out;
  long ms =
      KillMidTransfer(dir_, d, "stalled-sender", "waiting-receiver",
                      /*kill_sender=*/true, "streaming", &exit_code, &out);
  EXPECT_EQ(exit_code, 0) << out;
  EXPECT_GE(ms, 0) << "the receiver's wait did not end: " << out;
  EXPECT_LE(ms, 1000) << out;
  EXPECT_NE(out.find("ended 41 "), std::string::npos)
      << out;  // PSM2_EPID_UNREACHABLE
  EXPECT_EQ(Psmctl(dir_, d, {"health"}).exit_code, 0);
  EXPECT_TRUE(d.Stop());
}

TEST_F(IntegrationTest,
       ReceiverKilledWithUnreadMessagesFailsTheSenderAndFreesItsRegion) {
  // The stream, as above: copied in place, the large send would complete
  // although the receiver reads nothing.
  Daemon d(dir_, {"--copy-in-place", "off"});
  int exit_code = 0;
  std::string out;
  long ms = KillMidTransfer(dir_, d, "stuck-sender", "idle-receiver",
                            /*kill_sender=*/false, "stuck", &exit_code, &out);
  EXPECT_GE(ms, 0) << "the sender's wait did not end: " << out;
  EXPECT_LE(ms, 1000) << out;
  EXPECT_NE(out.find("ended 41 "), std::string::npos) << out;
  // More than its send region holds went through afterwards.
  EXPECT_NE(out.find("other traffic ok"), std::string::npos) << out;
  EXPECT_EQ(exit_code, 0) << out;
  EXPECT_TRUE(d.Stop());
}

TEST_F(IntegrationTest, GarbageInARingFailsOnlyThatClientsRequests) {
  Daemon d(dir_);
  std::string rv = Subdir(dir_, "rv");
  Process r1 = Process::Start(ExchangeArgs(dir_, rv, 1, kJobA, 5000, 8192),
                              d.ClientEnv(), dir_.path() + "/r1.out",
                              dir_.path() + "/r1.err");
  Process r0 = Process::Start(ExchangeArgs(dir_, rv, 0, kJobA, 5000, 8192),
                              d.ClientEnv(), dir_.path() + "/r0.out",
                              dir_.path() + "/r0.err");
  RunResult garbage =
      RunToEnd(dir_, {Runfile("tests/programs/garbage_client")}, d.ClientEnv());
  EXPECT_EQ(garbage.exit_code, 0) << garbage.out << garbage.err;
  EXPECT_EQ(r0.Wait(60), 0) << ReadFile(dir_.path() + "/r0.err");
  EXPECT_EQ(r1.Wait(60), 0) << ReadFile(dir_.path() + "/r1.err");
  RunResult stats = Psmctl(dir_, d, {"stats", "--json"});
  EXPECT_GE(JsonNumber(stats.out, "total", "bad_descriptors"), 6) << stats.out;
  std::string log = d.Log();
  EXPECT_NE(log.find("rejected submission"), std::string::npos) << log;
  EXPECT_NE(log.find("corrupted by the client"), std::string::npos) << log;
  EXPECT_TRUE(d.Stop()) << "daemon did not survive the garbage";
}

TEST_F(IntegrationTest, DoorbellFloodDoesNotKeepTheDaemonBusy) {
  Daemon d(dir_);
  // 3 s of flood (longer in a slower build, whose opening takes longer).
  Process flood = Process::Start(
      {Runfile("tests/programs/garbage_client"), "--doorbell-flood",
       std::to_string(static_cast<int>(3 * TimeScale()))},
      d.ClientEnv(), dir_.path() + "/flood.out", dir_.path() + "/flood.err");
  // Open, and ringing: psmd logs that it stops listening to it.
  ASSERT_TRUE(WaitUntil(
      10,
      [&] {
        return d.Log().find("rings its doorbell with nothing submitted") !=
               std::string::npos;
      }))
      << d.Log() << ReadFile(dir_.path() + "/flood.err");
  double before = CpuSeconds(d.pid());
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));
  double used = CpuSeconds(d.pid()) - before;
  ASSERT_EQ(flood.Wait(0), -1) << "the flood ended before the window did";
  if (CpuBoundsMeaningful()) {
    EXPECT_LT(used, 0.3) << "psmd used " << used
                         << " s of CPU in 1.5 s of doorbell flood";
  }
  EXPECT_EQ(flood.Wait(10), 0) << ReadFile(dir_.path() + "/flood.err");
  std::string log = d.Log();
  EXPECT_NE(log.find("rings its doorbell with nothing submitted"),
            std::string::npos)
      << log;
  // A client that rings for real is served as before.
  ExpectExchangeRuns(dir_, d, "rv", kJobA, 1000);
  EXPECT_TRUE(d.Stop());
}

TEST_F(IntegrationTest,
       NoDaemonGivesAClearErrorAtOnceAStoppedOneAfterTheDeadline) {
  std::string missing = dir_.path() + "/nobody-listens.sock";
  RunResult r = RunToEnd(dir_, ExchangeArgs(dir_, dir_.path(), 0, kJobA, 1, 1),
                         {{"PSMD_SOCKET", missing}}, 10);
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_LT(r.seconds, 1.0 * TimeScale());  // a sanitizer starts slowly
  EXPECT_NE(r.err.find(missing), std::string::npos) << r.err;

  // A stale socket file (daemon crashed without cleanup): refused at once.
  int s = socket(AF_UNIX, SOCK_STREAM, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  strcpy(addr.sun_path, missing.c_str());
  ASSERT_EQ(bind(s, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  close(s);
  r = RunToEnd(dir_, ExchangeArgs(dir_, dir_.path(), 0, kJobA, 1, 1),
               {{"PSMD_SOCKET", missing}}, 10);
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_LT(r.seconds, 1.0 * TimeScale());  // a sanitizer starts slowly
  EXPECT_NE(r.err.find(missing), std::string::npos) << r.err;

  // A daemon that is there but does not answer (stopped): an error naming
  // it after the deadline (5 s, or the sanitizer configuration's), not a hang.
  {
    Daemon d(dir_);
    kill(d.pid(), SIGSTOP);
    r = RunToEnd(dir_, ExchangeArgs(dir_, dir_.path(), 0, kJobA, 1, 1),
                 d.ClientEnv(), 60);
    kill(d.pid(), SIGCONT);
    EXPECT_EQ(r.exit_code, 2) << r.err;
    EXPECT_GE(r.seconds, 4.5);
    EXPECT_LT(r.seconds, 20.0 * TimeScale());
    EXPECT_NE(r.err.find("did not answer within"), std::string::npos) << r.err;
    EXPECT_TRUE(d.Stop());
  }

  RunResult ctl = RunToEnd(
      dir_, {Runfile("tools/psmctl"), "--socket", missing + "x", "stats"}, {});
  EXPECT_EQ(ctl.exit_code, 1);
  EXPECT_NE(ctl.err.find(missing + "x"), std::string::npos);
  EXPECT_EQ(std::count(ctl.err.begin(), ctl.err.end(), '\n'), 1) << ctl.err;
}

TEST_F(IntegrationTest, EndpointsOfDifferentJobsCannotConnect) {
  Daemon d(dir_);
  std::string rv = Subdir(dir_, "rv");
  Process r1 =
      Process::Start(ExchangeArgs(dir_, rv, 1, kJobB, 10, 10), d.ClientEnv(),
                     dir_.path() + "/r1.out", dir_.path() + "/r1.err");
  RunResult r0 =
      RunToEnd(dir_, ExchangeArgs(dir_, rv, 0, kJobA, 10, 10), d.ClientEnv());
  EXPECT_EQ(r0.exit_code, 3) << r0.out << r0.err;
  EXPECT_NE(r0.out.find("another job"), std::string::npos) << r0.out;
  EXPECT_NE(r0.err.find("different jobs never connect"), std::string::npos)
      << r0.err;
  EXPECT_EQ(r1.Wait(30), 3);
}

TEST_F(IntegrationTest, IdleDaemonWithConnectedIdleClientsSleeps) {
  constexpr int kHoldSeconds = 4;  // each client's, idle and connected
  Daemon d(dir_);
  std::string rv = Subdir(dir_, "rv");
  Process r1 = Process::Start(
      ExchangeArgs(dir_, rv, 1, kJobA, 10, 10, kHoldSeconds), d.ClientEnv(),
      dir_.path() + "/r1.out", dir_.path() + "/r1.err");
  Process r0 = Process::Start(
      ExchangeArgs(dir_, rv, 0, kJobA, 10, 10, kHoldSeconds), d.ClientEnv(),
      dir_.path() + "/r0.out", dir_.path() + "/r0.err");
  // Opened and connected: each rank says when its idle hold began.
  long long held_since[2] = {0, 0};
  ASSERT_TRUE(
      WaitUntil(10,
                [&] {
                  for (int rank = 0; rank < 2; rank++) {
                    const std::string at =
                        ReadFile(rv + "/holding." + std::to_string(rank));
                    if (sscanf(at.c_str(), "%lld", &held_since[rank]) != 1)
                      return false;
                  }
                  return true;
                }))
      << "the pair never got to its hold: " << ReadFile(dir_.path() + "/r0.err")
      << ReadFile(dir_.path() + "/r1.err");
  double before = CpuSeconds(d.pid());
  std::this_thread::sleep_for(std::chrono::milliseconds(2500));
  double used = CpuSeconds(d.pid()) - before;
  // The window measured must lie inside both holds, or it saw the
  // exchange.
  ASSERT_LE(MonotonicMs(),
            std::min(held_since[0], held_since[1]) + kHoldSeconds * 1000)
      << "the measurement outlasted the hold";
  if (CpuBoundsMeaningful()) {
    EXPECT_LT(used / 2.5, 0.05)
        << "idle psmd used " << used << " s of CPU in 2.5 s";
  }
  EXPECT_EQ(r0.Wait(30), 0);
  EXPECT_EQ(r1.Wait(30), 0);
}

// A raw connection to the control socket (what a hostile local user can
// open); -1 on failure.
int ConnectRaw(const std::string& path) {
  int s = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  strcpy(addr.sun_path, path.c_str());
  if (connect(s, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    close(s);
    return -1;
  }
  return s;
}

TEST_F(IntegrationTest, PartialRequestOnTheControlSocketCostsNoCpu) {
  Daemon d(dir_);
  int s = ConnectRaw(d.socket());
  ASSERT_GE(s, 0);
  ASSERT_EQ(send(s, "PRI", 3, 0),
            3);  // the start of gRPC's preface, then nothing
  double before = CpuSeconds(d.pid());
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));
  double used = CpuSeconds(d.pid()) - before;
  if (CpuBoundsMeaningful()) {
    EXPECT_LT(used, 0.1) << "psmd used " << used
                         << " s of CPU in 1.5 s on a 3-byte connection";
  }
  close(s);
  EXPECT_TRUE(d.Stop());
}

TEST_F(IntegrationTest, OutOfFileDescriptorsNeitherSpinsNorFloodsTheLog) {
  Daemon d(dir_);
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  const int open_fds = OpenFds(d.pid());
  rlimit original{}, tight{};
  ASSERT_EQ(prlimit(d.pid(), RLIMIT_NOFILE, nullptr, &original), 0);
  tight.rlim_cur = open_fds + 4;  // the soft limit only: it can be raised again
  tight.rlim_max = original.rlim_max;
  ASSERT_EQ(prlimit(d.pid(), RLIMIT_NOFILE, &tight, nullptr), 0);
  std::vector<int> held;
  for (int i = 0; i < 40; i++) {
    int s = ConnectRaw(d.socket());
    if (s >= 0)
      held.push_back(s);  // the backlog takes them; psmd runs out of fds
  }
  double before = CpuSeconds(d.pid());
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));
  double used = CpuSeconds(d.pid()) - before;
  if (CpuBoundsMeaningful()) {
    EXPECT_LT(used, 0.2) << "psmd used " << used
                         << " s of CPU in 1.5 s without free fds";
  }
  std::string log = d.Log();
  size_t lines = 0;
  for (size_t at = log.find("cannot accept"); at != std::string::npos;
       at = log.find("cannot accept", at + 1)) {
    lines++;
  }
  EXPECT_GE(lines, 1u) << log;
  EXPECT_LE(lines, 4u) << log;
  // Once fds free up, clients get in again.
  for (int s : held) close(s);
  ASSERT_EQ(prlimit(d.pid(), RLIMIT_NOFILE, &original, nullptr), 0);
  ExpectExchangeRuns(dir_, d, "rv", kJobA, 100);
  EXPECT_TRUE(d.Stop());
}

// psmd SIGKILLed mid-exchange and at once replaced on its socket, as
// systemd's Restart= does: the new psmd knows nothing of the old one's
// endpoints, so their clients must learn that they lost their psmd (their
// attach connection hung up) instead of polling rings nobody serves. The
// receiver only polls (test2 + psm2_poll, as Open MPI's progress loop), so
// it never sleeps in a wait, where the library used to look (issue 33: it
// spun at 86% CPU until killed). `busy` processes that never sleep share
// the 2 cores meanwhile: each of the poller's idle yields can then cost a
// time slice, and a look every 1024 empty polls took up to 2.4 s with 4.
// The receive must end with PSM2_EP_WAS_CLOSED and "lost psmd" within a
// second of the kill, having used little CPU since; the sender's send fails
// too; and a new pair runs on the new psmd.
void ExpectKilledPsmdsPollerFailsSoon(const TempDir& dir, int busy) {
  std::string rv = Subdir(dir, "rv");
  auto old = std::make_unique<Daemon>(dir);
  std::vector<std::string> poller =
      ExchangeArgs(dir, rv, 1, kJobA, 100000000, 64);
  poller.push_back("--poll-only");
  Process r1 = Process::Start(poller, old->ClientEnv(), dir.path() + "/r1.out",
                              dir.path() + "/r1.err");
  Process r0 = Process::Start(ExchangeArgs(dir, rv, 0, kJobA, 100000000, 64),
                              old->ClientEnv(), dir.path() + "/r0.out",
                              dir.path() + "/r0.err");
  ASSERT_TRUE(WaitUntil(20 * TimeScale(), [&] {
    return JsonNumber(Psmctl(dir, *old, {"stats", "--json"}).out, "total",
                      "msgs_received") > 1000;
  })) << "the pair never got going";
  ASSERT_TRUE(r0.running() && r1.running());
  std::vector<Process> spinners;
  for (int i = 0; i < busy; i++) {
    spinners.push_back(Process::Start({"/bin/sh", "-c", "while :; do :; done"},
                                      {}, "/dev/null", "/dev/null"));
  }
  const double cpu_before_kill = CpuSeconds(r1.pid());
  const long long killed_ms = MonotonicMs();
  ASSERT_EQ(kill(old->pid(), SIGKILL), 0);
  old.reset();  // reaped
  Daemon fresh(dir);

  const int poller_exit = r1.Wait(5 * TimeScale());
  for (Process& p : spinners) {
    p.Kill(SIGKILL);
    p.Wait(5);
  }
  const std::string out = ReadFile(dir.path() + "/r1.out");
  const std::string err = ReadFile(dir.path() + "/r1.err");
  ASSERT_EQ(poller_exit, kExitRequestFailed)
      << "(-1: still running 5 s after the kill) " << out << err;
  unsigned error = 0;
  long long ended_ms = 0, cpu_ms = 0;
  const size_t at = out.find("ended ");
  ASSERT_NE(at, std::string::npos) << out;
  ASSERT_EQ(sscanf(out.c_str() + at, "ended %u at %lld cpu_ms %lld", &error,
                   &ended_ms, &cpu_ms),
            3)
      << out;
  printf(
      "the poller failed %lld ms after the kill, having used %lld ms of "
      "CPU since (%d busy processes)\n",
      ended_ms - killed_ms,
      cpu_ms - static_cast<long long>(cpu_before_kill * 1000), busy);
  EXPECT_EQ(error, static_cast<unsigned>(PSM2_EP_WAS_CLOSED)) << out;
  EXPECT_GE(ended_ms, killed_ms);
  EXPECT_LE(ended_ms - killed_ms, 1000 * TimeScale())
      << "ms from the kill to the poller's failure, with " << busy
      << " busy processes";
  EXPECT_NE(err.find("lost psmd"), std::string::npos) << err;
  if (CpuBoundsMeaningful()) {
    EXPECT_LT(cpu_ms - cpu_before_kill * 1000, 500)
        << "CPU ms the poller used between the kill and its failure";
  }
  const int sender_exit = r0.Wait(5 * TimeScale());
  EXPECT_TRUE(sender_exit == kExitCallFailed ||
              sender_exit == kExitRequestFailed)
      << sender_exit << " " << ReadFile(dir.path() + "/r0.err");

  // The new psmd serves new clients.
  ExpectExchangeRuns(dir, fresh, "rv2", kJobA, 100);
}

TEST_F(IntegrationTest, ClientsOfAKilledPsmdFailEvenWhenANewOneTakesItsSocket) {
  ExpectKilledPsmdsPollerFailsSoon(dir_, 0);
}

TEST_F(IntegrationTest, ClientsOfAKilledPsmdFailWithinASecondOnABusyNode) {
  ExpectKilledPsmdsPollerFailsSoon(dir_, 4);
}

// Clients of a SIGKILLed psmd that were computing (not calling PSM2) while
// a new psmd took the socket and a new job opened endpoints on it: ids
// start at 1 in every psmd, so the new job's endpoints have the old ones'
// ids. When the old clients then close, they must find their psmd lost and
// close nothing of the new job (they closed its endpoints by id, and the new
// job, started after the new psmd was up, failed with "lost psmd").
TEST_F(IntegrationTest, ClientsOfAKilledPsmdCloseNothingOfTheNextOnesJobs) {
  auto old = std::make_unique<Daemon>(dir_);
  std::string rv_old = Subdir(dir_, "old");
  // Idle (in sleep) after their exchange, endpoints open, for `linger` s.
  const int linger = static_cast<int>(6 * TimeScale());
  std::vector<Process> stale;
  for (int rank : {1, 0}) {
    std::vector<std::string> argv =
        ExchangeArgs(dir_, rv_old, rank, kJobA, 10, 1000);
    argv.insert(argv.end(), {"--linger-seconds", std::to_string(linger)});
    stale.push_back(Process::Start(
        argv, old->ClientEnv(), rv_old + "/r" + std::to_string(rank) + ".out",
        rv_old + "/r" + std::to_string(rank) + ".err"));
  }
  ASSERT_TRUE(WaitUntil(20, [&] {
    return ReadFile(rv_old + "/r1.out").find("received 10") !=
               std::string::npos &&
           ReadFile(rv_old + "/r0.out").find("sent 10") != std::string::npos;
  })) << "the first pair did not finish its exchange";
  ASSERT_EQ(kill(old->pid(), SIGKILL), 0);
  old.reset();
  Daemon fresh(dir_);
  // The next job holds its endpoints open and idle until well after the
  // first one's close, then exchanges.
  std::string rv_new = Subdir(dir_, "new");
  Process n1 = Process::Start(
      ExchangeArgs(dir_, rv_new, 1, kJobB, 100, 1000, linger + 2),
      fresh.ClientEnv(), rv_new + "/r1.out", rv_new + "/r1.err");
  Process n0 = Process::Start(
      ExchangeArgs(dir_, rv_new, 0, kJobB, 100, 1000, linger + 2),
      fresh.ClientEnv(), rv_new + "/r0.out", rv_new + "/r0.err");
  ASSERT_TRUE(WaitUntil(20, [&] {
    return access((rv_new + "/holding.0").c_str(), F_OK) == 0 &&
           access((rv_new + "/holding.1").c_str(), F_OK) == 0;
  })) << "the next pair never held its endpoints open";
  // Only then did the first pair close, else this proves nothing.
  ASSERT_TRUE(stale[0].running() && stale[1].running())
      << "the first pair closed before the next one opened; raise linger";
  const std::string ids =
      Psmctl(dir_, fresh, {"endpoints", "--json"}).out;  // ids 1 and 2 again
  for (Process& p : stale) EXPECT_EQ(p.Wait(linger + 10), 0);
  for (int rank : {0, 1}) {
    const std::string err =
        ReadFile(rv_old + "/r" + std::to_string(rank) + ".err");
    EXPECT_NE(err.find("lost psmd"), std::string::npos) << err;
  }
  EXPECT_EQ(n0.Wait(linger + 30), 0) << ReadFile(rv_new + "/r0.err") << ids;
  EXPECT_EQ(n1.Wait(30), 0) << ReadFile(rv_new + "/r1.err") << ids;
}

// The endpoint journal (issue 33; daemon/control/endpoint_journal.h): psmd
// SIGKILLed while a job's two ranks exchange, and started again on its
// socket, names in its log the endpoints that ended with the old one (the
// ranks' pids), and psmctl stats and health count the crash; a second
// crash with nothing open counts again. A psmd that stops removes its
// journal, so the start after it reports nothing and counts none.
TEST_F(IntegrationTest, APsmdStartedAfterACrashSaysWhatEndedWithIt) {
  std::string rv = Subdir(dir_, "rv");
  auto old = std::make_unique<Daemon>(dir_);
  const std::string journal = old->socket() + ".journal";
  Process r1 = Process::Start(ExchangeArgs(dir_, rv, 1, kJobA, 100000000, 64),
                              old->ClientEnv(), dir_.path() + "/r1.out",
                              dir_.path() + "/r1.err");
  Process r0 = Process::Start(ExchangeArgs(dir_, rv, 0, kJobA, 100000000, 64),
                              old->ClientEnv(), dir_.path() + "/r0.out",
                              dir_.path() + "/r0.err");
  ASSERT_TRUE(WaitUntil(20 * TimeScale(), [&] {
    return JsonNumber(Psmctl(dir_, *old, {"stats", "--json"}).out, "total",
                      "msgs_received") > 100;
  })) << "the pair never got going";
  ASSERT_EQ(kill(old->pid(), SIGKILL), 0);
  old.reset();  // reaped
  auto fresh = std::make_unique<Daemon>(dir_);
  // (Its socket listens before it reads the journal.)
  auto logged = [&](const std::string& line) {
    return WaitUntil(
        5, [&] { return fresh->Log().find(line) != std::string::npos; });
  };
  EXPECT_TRUE(
      logged("ended without stopping (killed or crashed): the 2 "
             "endpoints it served ended with it"))
      << fresh->Log();
  const std::string log = fresh->Log();
  for (const Process* p : {&r0, &r1}) {
    EXPECT_NE(log.find("pid " + std::to_string(p->pid()) + ", uid "),
              std::string::npos)
        << log;
  }
  EXPECT_NE(log.find("Restart 1 after a crash"), std::string::npos) << log;
  std::string stats = Psmctl(dir_, *fresh, {"stats", "--json"}).out;
  EXPECT_EQ(JsonNumber(stats, "", "crash_restarts"), 1) << stats;
  EXPECT_EQ(JsonNumber(stats, "", "last_crash_lost_endpoints"), 2) << stats;
  std::string health = Psmctl(dir_, *fresh, {"health", "--json"}).out;
  EXPECT_EQ(JsonNumber(health, "", "crash_restarts"), 1) << health;
  EXPECT_NE(
      Psmctl(dir_, *fresh, {"stats"})
          .out.find(
              "restarted after a crash 1 time since the last clean start: "
              "the last crash ended 2 endpoints"),
      std::string::npos);
  EXPECT_NE(Psmctl(dir_, *fresh, {"stats", "--format", "prometheus"})
                .out.find("\npsmd_crash_restarts 1\n"),
            std::string::npos);
  r0.Wait(10 * TimeScale());
  r1.Wait(10 * TimeScale());

  ASSERT_EQ(kill(fresh->pid(), SIGKILL), 0);
  fresh.reset();
  fresh = std::make_unique<Daemon>(dir_);
  EXPECT_TRUE(logged("the 0 endpoints it served ended with it"))
      << fresh->Log();
  stats = Psmctl(dir_, *fresh, {"stats", "--json"}).out;
  EXPECT_EQ(JsonNumber(stats, "", "crash_restarts"), 2) << stats;
  EXPECT_EQ(JsonNumber(stats, "", "last_crash_lost_endpoints"), 0) << stats;

  EXPECT_TRUE(fresh->Stop());
  EXPECT_NE(access(journal.c_str(), F_OK), 0) << "a stopped psmd's journal";
  fresh = std::make_unique<Daemon>(dir_);
  EXPECT_TRUE(logged(") serving ")) << fresh->Log();
  EXPECT_EQ(fresh->Log().find("ended without stopping"), std::string::npos)
      << fresh->Log();
  stats = Psmctl(dir_, *fresh, {"stats", "--json"}).out;
  EXPECT_EQ(JsonNumber(stats, "", "crash_restarts"), 0) << stats;
  ExpectExchangeRuns(dir_, *fresh, "rv2", kJobA, 100);
  EXPECT_TRUE(fresh->Stop());
}

TEST_F(IntegrationTest, SigtermRemovesSocketAndSegments) {
  auto d = std::make_unique<Daemon>(dir_);
  std::string rv = Subdir(dir_, "rv");
  Process r1 = Process::Start(ExchangeArgs(dir_, rv, 1, kJobA, 10, 10, 30),
                              d->ClientEnv(), dir_.path() + "/r1.out",
                              dir_.path() + "/r1.err");
  // An endpoint open, its segment and its job's pool mapped by psmd and
  // the client (shared memory that psmd must not leave anywhere).
  ASSERT_TRUE(WaitForEndpointOf(dir_, *d, r1.pid()));
  EXPECT_EQ(CountMappings(d->pid(), "memfd:psmd-endpoint"), 1);
  // psmd lists the endpoint once opened; the client maps its segments
  // after that, when its attach is answered.
  EXPECT_TRUE(WaitUntil(10 * TimeScale(), [&] {
    return CountMappings(r1.pid(), "memfd:psmd") >= 2;
  })) << "the client never mapped its segment and pool";
  EXPECT_TRUE(d->Stop());
  EXPECT_NE(access(d->socket().c_str(), F_OK), 0) << "socket file left behind";
  // With the client still holding its endpoint: nothing named in
  // /dev/shm (the segments are memfds, gone with their last mapping).
  EXPECT_TRUE(ShmLeftovers().empty());
  EXPECT_TRUE(r1.running());
  r1.Kill(SIGKILL);
  r1.Wait(5);
}

TEST_F(IntegrationTest, OtherUsersSeeNothingAndCannotClose) {
  Daemon d(dir_);
  std::string rv = Subdir(dir_, "rv");
  Process r1 =
      Process::Start(ExchangeArgs(dir_, rv, 1, kJobA, 10, 10, 3), d.ClientEnv(),
                     dir_.path() + "/r1.out", dir_.path() + "/r1.err");
  ASSERT_TRUE(WaitForEndpointOf(dir_, d, r1.pid()));
  // The runfiles tree is private to root: run a copy of psmctl as nobody.
  const uid_t nobody = 65534;
  std::string psmctl = dir_.path() + "/psmctl";
  ASSERT_EQ(system(("cp " + Runfile("tools/psmctl") + " " + psmctl +
                    " && chmod 755 " + psmctl)
                       .c_str()),
            0);
  RunResult list = RunToEnd(dir_, {psmctl, "--socket", d.socket(), "endpoints"},
                            {}, 10, nobody);
  ASSERT_EQ(list.exit_code, 0) << list.err;
  EXPECT_EQ(list.out.find(std::to_string(r1.pid())), std::string::npos)
      << list.out;
  RunResult root_list = Psmctl(dir_, d, {"endpoints", "--json"});
  EXPECT_NE(root_list.out.find(std::to_string(r1.pid())), std::string::npos);
  std::string id = std::to_string(JsonNumber(root_list.out, "", "endpoint_id"));
  RunResult refused = RunToEnd(
      dir_, {psmctl, "--socket", d.socket(), "close", id}, {}, 10, nobody);
  EXPECT_EQ(refused.exit_code, 1);
  // The answer an id that names nothing gets: no owner, no existence.
  EXPECT_NE(refused.err.find("no endpoint " + id + " of yours"),
            std::string::npos)
      << refused.err;
  EXPECT_EQ(refused.err.find("uid 0"), std::string::npos) << refused.err;
  EXPECT_EQ(Psmctl(dir_, d, {"close", id}).exit_code, 0);
  EXPECT_EQ(Psmctl(dir_, d, {"endpoints", "--json"})
                .out.find(std::to_string(r1.pid())),
            std::string::npos);
  r1.Kill(SIGKILL);
  r1.Wait(5);
}

TEST_F(IntegrationTest, OneUidCannotTakeEveryEndpointSlot) {
  Daemon d(dir_, {"--max-endpoints-per-uid", "2"});
  // Copies of the client program and library that uid nobody can run.
  const uid_t nobody = 65534;
  std::string exchange = dir_.path() + "/exchange";
  ASSERT_EQ(
      system(("cp " + Runfile("tests/programs/exchange") + " " +
              Runfile("client/libpsm2.so.2") + " " + dir_.path() +
              " && chmod 755 " + exchange + " " + dir_.path() + "/libpsm2.so.2")
                 .c_str()),
      0);
  auto env = d.ClientEnv();
  env["LD_LIBRARY_PATH"] = dir_.path();
  auto args = [&](const std::string& rv, int rank, int hold) {
    std::vector<std::string> a =
        ExchangeArgs(dir_, rv, rank, kJobA, 10, 10, hold);
    a[0] = exchange;
    return a;
  };
  std::string rv = Subdir(dir_, "held");
  chmod(rv.c_str(), 0777);
  Process h1 = Process::Start(args(rv, 1, 3), env, dir_.path() + "/h1.out",
                              dir_.path() + "/h1.err", nobody);
  Process h0 = Process::Start(args(rv, 0, 3), env, dir_.path() + "/h0.out",
                              dir_.path() + "/h0.err", nobody);
  bool both_open = false;
  for (int i = 0; i < 200 && !both_open; i++) {
    RunResult list = Psmctl(dir_, d, {"endpoints", "--json"});
    both_open = list.out.find(std::to_string(h0.pid())) != std::string::npos &&
                list.out.find(std::to_string(h1.pid())) != std::string::npos;
    if (!both_open) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_TRUE(both_open) << ReadFile(dir_.path() + "/h0.err")
                         << ReadFile(dir_.path() + "/h1.err");
  // A third endpoint of the same uid is refused, with the limit named.
  std::string rv3 = Subdir(dir_, "third");
  chmod(rv3.c_str(), 0777);
  RunResult third = RunToEnd(dir_, args(rv3, 0, 0), env, 10, nobody);
  EXPECT_EQ(third.exit_code, 2);
  EXPECT_NE(third.err.find("--max-endpoints-per-uid"), std::string::npos)
      << third.err;
  EXPECT_EQ(JsonNumber(Psmctl(dir_, d, {"stats", "--json"}).out, "refusals",
                       "endpoints_refused"),
            1);
  // Another uid (root) still opens and exchanges.
  ExpectExchangeRuns(dir_, d, "root", kJobB, 100);
  EXPECT_EQ(h0.Wait(30), 0) << ReadFile(dir_.path() + "/h0.err");
  EXPECT_EQ(h1.Wait(30), 0) << ReadFile(dir_.path() + "/h1.err");
  EXPECT_TRUE(d.Stop());
}

// tests/programs/flood's command line for `rank` in rendezvous dir `rv`,
// then `flags`.
std::vector<std::string> FloodArgs(const std::string& rv, int rank,
                                   const std::vector<std::string>& flags) {
  std::vector<std::string> args = {Runfile("tests/programs/flood"), "--rank",
                                   std::to_string(rank), "--dir", rv};
  args.insert(args.end(), flags.begin(), flags.end());
  return args;
}

TEST_F(IntegrationTest,
       FloodOfUnexpectedMessagesStaysWithinTheBudgetAndArrivesIntact) {
  // 1 Mi messages of 8 B and then 2 GiB of 32 KiB messages at a receiver that
  // posts nothing for 3 s. Without the budget psmd's memory grows by ~150 MB
  // (measured); with it, by at most the budget plus fixed overhead.
  constexpr long long kBudgetMiB = 16;
  Daemon d(dir_, {"--unexpected-mib", std::to_string(kBudgetMiB)});
  std::string rv = Subdir(dir_, "rv");
  long long baseline = OwnMemoryKiB(d.pid());
  ASSERT_GT(baseline, 0);
  auto args = [&](int rank) {
    return FloodArgs(rv, rank, {"--idle-seconds", "3"});
  };
  Process receiver = Process::Start(
      args(1), d.ClientEnv(), dir_.path() + "/r1.out", dir_.path() + "/r1.err");
  Process sender = Process::Start(
      args(0), d.ClientEnv(), dir_.path() + "/r0.out", dir_.path() + "/r0.err");
  long long peak = baseline;
  int receiver_exit = -1;
  // A liveness bound, not a timing (54 s measured with three other builds
  // running beside it on 2 cores; the old 60 s bound failed there).
  for (int i = 0; i < 3000 && receiver_exit == -1; i++) {
    peak = std::max(peak, OwnMemoryKiB(d.pid()));
    receiver_exit = receiver.Wait(0.05);
  }
  ASSERT_EQ(receiver_exit, 0) << ReadFile(dir_.path() + "/r1.err");
  ASSERT_EQ(sender.Wait(30), 0) << ReadFile(dir_.path() + "/r0.err");
  EXPECT_NE(ReadFile(dir_.path() + "/r1.out").find("0 wrong"),
            std::string::npos);
  const long long kFixedOverheadKiB = 16 << 10;
  if (MemoryBoundsMeaningful()) {
    EXPECT_LE(peak - baseline, (kBudgetMiB << 10) + kFixedOverheadKiB)
        << "psmd grew from " << baseline << " KiB to " << peak << " KiB";
  }
  RunResult stats = Psmctl(dir_, d, {"stats", "--json"});
  EXPECT_GT(JsonNumber(stats.out, "total", "sends_held"), 0) << stats.out;
  EXPECT_EQ(JsonNumber(stats.out, "total", "msgs_received"),
            (1 << 20) + 65536 + 2)
      << stats.out;
}

// Runs two flood pairs (tests/programs/flood) with the given job uuids, each
// sending 256 Ki 8-byte messages at a receiver idle for 3 s, checks that
// every message arrived intact and that psmd held some sends back, and
// returns how much psmd's own memory (OwnMemoryKiB) grew at its peak, in
// KiB.
long long FloodTwoPairs(const TempDir& dir, const Daemon& d,
                        const std::string uuids[2]) {
  long long baseline = OwnMemoryKiB(d.pid());
  EXPECT_GT(baseline, 0);
  std::vector<Process> receivers, senders;
  for (int p = 0; p < 2; p++) {
    std::string rv = Subdir(dir, "flood" + std::to_string(p));
    auto args = [&](int rank) {
      return FloodArgs(rv, rank,
                       {"--small", "262144", "--bytes", "0", "--idle-seconds",
                        "3", "--uuid", uuids[p]});
    };
    receivers.push_back(
        Process::Start(args(1), d.ClientEnv(), rv + "/1.out", rv + "/1.err"));
    senders.push_back(
        Process::Start(args(0), d.ClientEnv(), rv + "/0.out", rv + "/0.err"));
  }
  long long peak = baseline;
  std::vector<int> exits(receivers.size(), -1);
  // A liveness bound (150 s), not a timing: see the flood test above.
  for (int i = 0; i < 3000 && (exits[0] == -1 || exits[1] == -1); i++) {
    peak = std::max(peak, OwnMemoryKiB(d.pid()));
    for (size_t r = 0; r < receivers.size(); r++) {
      if (exits[r] == -1) exits[r] = receivers[r].Wait(0.025);
    }
  }
  for (size_t r = 0; r < receivers.size(); r++) {
    const std::string rv = dir.path() + "/flood" + std::to_string(r);
    EXPECT_EQ(exits[r], 0) << ReadFile(rv + "/1.err");
    EXPECT_EQ(senders[r].Wait(30), 0) << ReadFile(rv + "/0.err");
    EXPECT_NE(ReadFile(rv + "/1.out").find("0 wrong"), std::string::npos)
        << ReadFile(rv + "/1.out");
  }
  RunResult stats = Psmctl(dir, d, {"stats", "--json"});
  EXPECT_GT(JsonNumber(stats.out, "total", "sends_held"), 0) << stats.out;
  // Held for 3 s: not a stall worth a word (shm::kBudgetStallNs).
  EXPECT_EQ(JsonNumber(stats.out, "total", "budget_stalls"), 0) << stats.out;
  std::cout << "psmd grew from " << baseline << " KiB to " << peak << " KiB\n";
  return peak - baseline;
}

TEST_F(IntegrationTest, SendsHeldTenSecondsByAFullBudgetAreReported) {
  // 20,000 8 B messages at a receiver that posts nothing for 13 s, with a
  // 1 MiB budget (8192 messages): the sender is held past 10 s (psmd looks
  // once a second; 3 s to spare on a loaded machine) while the
  // receiver takes none of them, which is how a program that waits for a
  // message sent after the ones filling the budget looks. psmd says so,
  // once, in its log, in the counter and through the receiver's library;
  // then the receiver takes everything as usual.
  Daemon d(dir_, {"--unexpected-mib", "1"});
  std::string rv = Subdir(dir_, "rv");
  auto args = [&](int rank) {
    return FloodArgs(
        rv, rank, {"--small", "20000", "--bytes", "0", "--idle-seconds", "13"});
  };
  Process receiver =
      Process::Start(args(1), d.ClientEnv(), rv + "/1.out", rv + "/1.err");
  Process sender =
      Process::Start(args(0), d.ClientEnv(), rv + "/0.out", rv + "/0.err");
  ASSERT_EQ(receiver.Wait(60), 0) << ReadFile(rv + "/1.err");
  ASSERT_EQ(sender.Wait(30), 0) << ReadFile(rv + "/0.err");
  EXPECT_NE(ReadFile(rv + "/1.out").find("0 wrong"), std::string::npos)
      << ReadFile(rv + "/1.out");
  const std::string warned = ReadFile(rv + "/1.err");
  EXPECT_NE(warned.find("libpsmclient: warning: endpoint "), std::string::npos)
      << warned;
  EXPECT_NE(warned.find("sends to it have waited 10 s for its own "
                        "unexpected-message budget (1 MiB), and it received "
                        "none of its 8192 unexpected messages meanwhile"),
            std::string::npos)
      << warned;
  EXPECT_NE(warned.find("raise PSM2_MQ_MAX_SYSBUF_MBYTES"), std::string::npos)
      << warned;
  EXPECT_NE(d.Log().find("unexpected-message budget (1 MiB)"),
            std::string::npos)
      << d.Log();
  RunResult stats = Psmctl(dir_, d, {"stats", "--json"});
  EXPECT_EQ(JsonNumber(stats.out, "total", "budget_stalls"), 1) << stats.out;
  EXPECT_EQ(JsonNumber(stats.out, "total", "msgs_received"), 20000 + 2)
      << stats.out;
  EXPECT_TRUE(d.Stop());
}

constexpr long long kFixedOverheadKiB = 16 << 10;

TEST_F(IntegrationTest, JobBudgetBoundsTheUnexpectedMessagesOfAllItsEndpoints) {
  // Both pairs in one job. Each receiver may hold 64 MiB of unexpected
  // messages, the job 8 MiB for both: psmd grows by what the job's budget
  // allows. Without the job budget both receivers fill up (2 x 32 MiB of
  // charged cost; psmd grew by 73 MB when run so).
  constexpr long long kJobBudgetMiB = 8;
  Daemon d(dir_, {"--unexpected-mib", "64", "--job-unexpected-mib",
                  std::to_string(kJobBudgetMiB)});
  const std::string one_job[2] = {kJobA, kJobA};
  const long long grew = FloodTwoPairs(dir_, d, one_job);
  if (MemoryBoundsMeaningful()) {
    EXPECT_LE(grew, (kJobBudgetMiB << 10) + kFixedOverheadKiB);
  }
}

TEST_F(IntegrationTest, UidBudgetBoundsTheUnexpectedMessagesOfAllItsJobs) {
  // The pairs in two jobs of one uid, each job allowed 64 MiB, the uid 8 MiB:
  // a uid cannot multiply its budget by opening more job uuids.
  constexpr long long kUidBudgetMiB = 8;
  Daemon d(dir_, {"--unexpected-mib", "64", "--job-unexpected-mib", "64",
                  "--uid-unexpected-mib", std::to_string(kUidBudgetMiB)});
  const std::string two_jobs[2] = {kJobA, kJobB};
  const long long grew = FloodTwoPairs(dir_, d, two_jobs);
  if (MemoryBoundsMeaningful()) {
    EXPECT_LE(grew, (kUidBudgetMiB << 10) + kFixedOverheadKiB);
  }
}

}  // namespace
}  // namespace psmd::testing
