// psmd between nodes across a link that goes down: two daemons, each in a
// network namespace of its own, linked by a veth pair that this test makes
// (10.77.0.1/30 and .2), authenticated by a private munged. munged, the
// clients and psmctl stay in the test's namespace: they reach the daemons
// over Unix sockets, which a network namespace does not separate. Clients
// stream eager and rendezvous messages both ways; `ip link set down` in the
// middle must end every request on both sides with PSM2_EPID_UNREACHABLE or
// PSM2_TIMEOUT within --fabric-timeout-ms plus a margin, leak nothing, and
// after `ip link set up` new clients exchange again; a link down for less
// than the timeout loses nothing (a verified exchange runs across it). Needs
// root (or
// CAP_NET_ADMIN and CAP_SYS_ADMIN); skipped otherwise. Every process is
// ended by PID; the namespaces (and with them the veth pair) are deleted
// even when the test fails, and ones left by a killed run are swept.
// With PSMD_TEST_OFI_PROVIDER set (//tests:fabric_netns_ofi_test), the
// daemons run the ofi backend over that libfabric provider: the same
// bounds hold, since over ofi too the engine's heartbeats find the silence
// (an RDM endpoint reports no broken link).
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <set>
#include <sstream>
#include <string>
#include <thread>

#include "tests/harness.h"

namespace psmd::testing {
namespace {

const char kJob[] = "11f1a90000000000000000000000beef";
constexpr int kTimeoutMs = 1000;
// Heartbeats are checked every 100 ms at most, and the machine is shared.
constexpr int kMarginMs = 1500;
const char kPrefix[] = "psmd-netns-";

// The libfabric provider the daemons use, empty for the socket backend.
std::string OfiProvider() {
  const char* p = std::getenv("PSMD_TEST_OFI_PROVIDER");
  return p == nullptr ? std::string() : std::string(p);
}

bool HaveNetAdmin() {
  if (geteuid() != 0) return false;
  std::istringstream in(ReadFile("/proc/self/status"));
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("CapEff:", 0) == 0) {
      const unsigned long long caps = std::stoull(line.substr(7), nullptr, 16);
      return (caps >> 12 & 1) != 0 && (caps >> 21 & 1) != 0;  // NET/SYS_ADMIN
    }
  }
  return false;
}

// `ip ARGS...`; true when it exited 0 (its stderr appended to *err).
bool Ip(const TempDir& dir, std::vector<std::string> args,
        std::string* err = nullptr, std::string* out = nullptr) {
  args.insert(args.begin(), "/usr/sbin/ip");
  RunResult r = RunToEnd(dir, args, {}, 10);
  if (err != nullptr) *err += r.err;
  if (out != nullptr) *out = r.out;
  return r.exit_code == 0;
}

std::set<std::string> NetnsNames(const TempDir& dir) {
  std::string out;
  Ip(dir, {"netns", "list"}, nullptr, &out);
  std::set<std::string> names;
  std::istringstream in(out);
  std::string line;
  while (std::getline(in, line)) names.insert(line.substr(0, line.find(' ')));
  return names;
}

// Namespaces psmd-netns-PID-N whose test process is gone (killed before
// its destructors ran): deleting one deletes its veth end too.
void SweepStale(const TempDir& dir) {
  for (const std::string& name : NetnsNames(dir)) {
    if (name.rfind(kPrefix, 0) != 0) continue;
    const pid_t pid = atoi(name.c_str() + sizeof(kPrefix) - 1);
    if (pid > 0 && kill(pid, 0) != 0 && errno == ESRCH) {
      Ip(dir, {"netns", "del", name});
    }
  }
}

// Two network namespaces and a veth pair between them, link i (fl<i>) in
// namespace i with address 10.77.0.<i+1>/30. The pair is made inside the
// namespaces, so it never exists in the test's own.
class NetnsPair {
 public:
  explicit NetnsPair(const TempDir& dir) : dir_(dir) {
    SweepStale(dir_);
    for (int i = 0; i < 2; i++) {
      ns_[i] = kPrefix + std::to_string(getpid()) + "-" + std::to_string(i);
    }
  }
  ~NetnsPair() { Delete(); }
  bool Create(std::string* err) {
    for (int i = 0; i < 2; i++) {
      if (!Ip(dir_, {"netns", "add", ns_[i]}, err)) return false;
      made_[i] = true;
    }
    if (!Ip(dir_,
            {"link", "add", "fl0", "netns", ns_[0], "type", "veth", "peer",
             "name", "fl1", "netns", ns_[1]},
            err)) {
      return false;
    }
    for (int i = 0; i < 2; i++) {
      const std::string fl = "fl" + std::to_string(i);
      if (!Ip(dir_,
              {"-n", ns_[i], "addr", "add", Address(i) + "/30", "dev", fl},
              err) ||
          !Ip(dir_, {"-n", ns_[i], "link", "set", "lo", "up"}, err) ||
          !Ip(dir_, {"-n", ns_[i], "link", "set", fl, "up"}, err)) {
        return false;
      }
    }
    return AwaitCarrier(true);
  }
  // Sets namespace 0's end down or up; up returns once both ends carry.
  bool SetLink(bool up, std::string* err) {
    return Ip(dir_, {"-n", ns_[0], "link", "set", "fl0", up ? "up" : "down"},
              err) &&
           (!up || AwaitCarrier(true));
  }
  void Delete() {
    for (int i = 0; i < 2; i++) {
      if (made_[i]) Ip(dir_, {"netns", "del", ns_[i]});
      made_[i] = false;
    }
  }
  std::vector<std::string> Enter(int i) const {
    return {"/usr/bin/nsenter", "--net=/run/netns/" + ns_[i], "--"};
  }
  const std::string& name(int i) const { return ns_[i]; }
  static std::string Address(int i) {
    return "10.77.0." + std::to_string(i + 1);
  }

 private:
  bool AwaitCarrier(bool up) {
    for (int n = 0; n < 500; n++) {
      bool all = true;
      for (int i = 0; i < 2; i++) {
        std::string out;
        Ip(dir_, {"-n", ns_[i], "link", "show", "fl" + std::to_string(i)},
           nullptr, &out);
        all = all && (out.find("LOWER_UP") != std::string::npos) == up;
      }
      if (all) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return false;
  }

  const TempDir& dir_;
  std::string ns_[2];
  bool made_[2] = {false, false};
};

long long NowMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

class FabricNetnsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!HaveNetAdmin()) {
      GTEST_SKIP() << "needs root with CAP_NET_ADMIN and CAP_SYS_ADMIN to "
                      "make network namespaces and a veth pair";
    }
    chmod(dir_.path().c_str(), 0711);
    munged_ = std::make_unique<Munged>(dir_.path() + "/munge");
    std::ofstream nodes(dir_.path() + "/nodes");
    for (int i = 0; i < 2; i++) {
      nodes << (i + 1) << " node" << (i + 1) << " " << (i + 1) << "@"
            << NetnsPair::Address(i) << ":7400\n";
    }
  }
  std::unique_ptr<Daemon> StartNode(int i, int timeout_ms = kTimeoutMs) {
    std::vector<std::string> flags = {
        "--node-id",           std::to_string(i + 1),
        "--fabric-listen",     NetnsPair::Address(i) + ":7400",
        "--fabric-nodes",      dir_.path() + "/nodes",
        "--munge-socket",      munged_->socket(),
        "--fabric-timeout-ms", std::to_string(timeout_ms),
        "--log-level",         "info"};
    if (!OfiProvider().empty()) {
      flags.insert(flags.end(),
                   {"--fabric", "ofi", "--fabric-provider", OfiProvider()});
    }
    return std::make_unique<Daemon>(node_dir_[i], flags,
                                    std::map<std::string, std::string>{},
                                    net_.Enter(i));
  }
  // tests/programs/exchange, rank 0 on a and rank 1 on b; rank 0's result.
  RunResult Exchange(const Daemon& a, const Daemon& b, const std::string& name,
                     int* exit1) {
    std::string rv = dir_.path() + "/" + name;
    std::filesystem::create_directories(rv);
    Process r1 = Process::Start(ExchangeArgs(dir_, rv, 1, kJob, 300, 200000),
                                b.ClientEnv(), rv + "/r1.out", rv + "/r1.err");
    RunResult r0 = RunToEnd(dir_, ExchangeArgs(dir_, rv, 0, kJob, 300, 200000),
                            a.ClientEnv(), 60);
    *exit1 = r1.Wait(60);
    r0.err += ReadFile(rv + "/r1.err");
    return r0;
  }
  // Nothing of a client left in d: no endpoint, no job (so every pool and
  // inbox chunk went back with its pool), no segment mapped.
  void ExpectNoClientState(const Daemon& d) {
    for (int i = 0; i < 500 && CountMappings(d.pid(), "memfd:psmd") != 0; i++) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    EXPECT_EQ(CountMappings(d.pid(), "memfd:psmd"), 0);
    RunResult stats = Psmctl(dir_, d, {"stats", "--format", "json"});
    EXPECT_EQ(stats.out.find("\"epid\""), std::string::npos) << stats.out;
    RunResult jobs = Psmctl(dir_, d, {"jobs", "--format", "json"});
    EXPECT_EQ(jobs.exit_code, 0) << jobs.err;
    EXPECT_EQ(jobs.out.find("job_uuid"), std::string::npos) << jobs.out;
  }

  TempDir dir_;
  TempDir node_dir_[2];
  std::unique_ptr<Munged> munged_;
  NetnsPair net_{dir_};
};

TEST_F(FabricNetnsTest, LinkDownMidTransferFailsBothSidesInTimeAndLinkUpWorks) {
  const std::vector<std::string> shm_before = ShmLeftovers();
  std::string err;
  ASSERT_TRUE(net_.Create(&err)) << err;
  // (Locals: stopped before the fixture deletes the namespaces.)
  auto a = StartNode(0);
  auto b = StartNode(1);
  // The daemons live in other network namespaces than this test and its
  // clients.
  for (pid_t pid : {a->pid(), b->pid()}) {
    EXPECT_NE(std::filesystem::read_symlink("/proc/" + std::to_string(pid) +
                                            "/ns/net"),
              std::filesystem::read_symlink("/proc/self/ns/net"));
  }
  int exit1 = -1;
  RunResult warm = Exchange(*a, *b, "warm", &exit1);
  ASSERT_EQ(warm.exit_code, 0) << warm.err << a->Log() << b->Log();
  ASSERT_EQ(exit1, 0) << warm.err;
  ExpectNoClientState(*a);
  ExpectNoClientState(*b);
  // The backend under test is the one that carried it.
  for (const Daemon* d : {a.get(), b.get()}) {
    RunResult s = Psmctl(dir_, *d, {"stats", "--format", "json"});
    const std::string backend = OfiProvider().empty() ? "socket" : "ofi";
    EXPECT_NE(
        s.out.find("\"fabric_backend\": \"" + backend +
                   "\",\n \"fabric_provider\": \"" + OfiProvider() + "\""),
        std::string::npos)
        << s.out;
  }
  const int fds_a = OpenFds(a->pid()), fds_b = OpenFds(b->pid());

  std::string rv = dir_.path() + "/flap";
  std::filesystem::create_directories(rv);
  auto args = [&](int rank) {
    return std::vector<std::string>{Runfile("tests/programs/link_flap"),
                                    "--rank",
                                    std::to_string(rank),
                                    "--dir",
                                    rv,
                                    "--uuid",
                                    kJob};
  };
  Process r0 =
      Process::Start(args(0), a->ClientEnv(), rv + "/0.out", rv + "/0.err");
  Process r1 =
      Process::Start(args(1), b->ClientEnv(), rv + "/1.out", rv + "/1.err");
  for (int i = 0; i < 3000 && !(std::filesystem::exists(rv + "/streaming0") &&
                                std::filesystem::exists(rv + "/streaming1"));
       i++) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_TRUE(std::filesystem::exists(rv + "/streaming0") &&
              std::filesystem::exists(rv + "/streaming1"))
      << ReadFile(rv + "/0.err") << ReadFile(rv + "/1.err") << a->Log()
      << b->Log();

  const long long down_ms = NowMs();
  ASSERT_TRUE(net_.SetLink(false, &err)) << err;
  // No hang: both clients end (a late request that hangs is given up after
  // 10 s, which the exit code then reports).
  int exit_code[2] = {r0.Wait(30), r1.Wait(30)};
  for (int rank = 0; rank < 2; rank++) {
    const std::string out = ReadFile(rv + "/" + std::to_string(rank) + ".out");
    const std::string log =
        out + ReadFile(rv + "/" + std::to_string(rank) + ".err");
    EXPECT_EQ(exit_code[rank], 0)
        << "rank " << rank
        << (exit_code[rank] == -1 ? " still running 30 s after the link went "
                                    "down (a request never ended): "
                                  : ": ")
        << log << a->Log() << b->Log();
    long long first = 0, last = 0;
    int ok = 0, failed = 0;
    ASSERT_EQ(sscanf(out.c_str(), "ended first %lld last %lld ok %d failed %d",
                     &first, &last, &ok, &failed),
              4)
        << log;
    EXPECT_GT(failed, 0) << log;
    EXPECT_LE(last - down_ms, kTimeoutMs + kMarginMs) << log;
    printf(
        "rank %d (node %d): %d requests failed, %lld ms to %lld ms after the "
        "link went down (timeout %d ms); %s",
        rank, rank + 1, failed, first - down_ms, last - down_ms, kTimeoutMs,
        out.c_str());
  }
  for (const Daemon* d : {a.get(), b.get()}) {
    EXPECT_NE(d->Log().find("silent for"), std::string::npos) << d->Log();
  }
  // Nothing leaked while the link is still down: the clients' endpoints,
  // jobs and pools are gone from both daemons.
  ExpectNoClientState(*a);
  ExpectNoClientState(*b);

  ASSERT_TRUE(net_.SetLink(true, &err)) << err;
  RunResult there = Exchange(*a, *b, "there", &exit1);
  EXPECT_EQ(there.exit_code, 0) << there.err << a->Log() << b->Log();
  EXPECT_EQ(exit1, 0) << there.err;
  RunResult back = Exchange(*b, *a, "back", &exit1);
  EXPECT_EQ(back.exit_code, 0) << back.err << a->Log() << b->Log();
  EXPECT_EQ(exit1, 0) << back.err;
  for (const Daemon* d : {a.get(), b.get()}) {
    RunResult s = Psmctl(dir_, *d, {"stats", "--format", "json"});
    EXPECT_GE(JsonNumber(s.out, "peer_nodes", "connects"), 2) << s.out;
  }
  ExpectNoClientState(*a);
  ExpectNoClientState(*b);
  // One fabric connection again, as before the break: the dead one's
  // socket was closed.
  EXPECT_EQ(OpenFds(a->pid()), fds_a);
  EXPECT_EQ(OpenFds(b->pid()), fds_b);
  EXPECT_EQ(ShmLeftovers(), shm_before);

  EXPECT_TRUE(a->Stop());
  EXPECT_TRUE(b->Stop());
  net_.Delete();
  const std::set<std::string> left = NetnsNames(dir_);
  EXPECT_EQ(left.count(net_.name(0)) + left.count(net_.name(1)), 0u);
  EXPECT_FALSE(Ip(dir_, {"link", "show", "fl0"}));
}

// Issue 33, item 4: a link that goes down and comes back within
// --fabric-timeout-ms loses nothing. A verified exchange (every message
// checked, in order, byte for byte, eager and rendezvous up to 200 KB) runs
// from node 1 to node 2 while the veth link is down for 1.5 s under a 5 s
// timeout: it ends with every message, and no request failed.
TEST_F(FabricNetnsTest, ALinkDownForLessThanTheTimeoutLosesNothing) {
  constexpr int kLongTimeoutMs = 5000;
  std::string err;
  ASSERT_TRUE(net_.Create(&err)) << err;
  auto a = StartNode(0, kLongTimeoutMs);
  auto b = StartNode(1, kLongTimeoutMs);
  const std::string rv = dir_.path() + "/blip";
  std::filesystem::create_directories(rv);
  Process r1 = Process::Start(ExchangeArgs(dir_, rv, 1, kJob, 20000, 200000),
                              b->ClientEnv(), rv + "/r1.out", rv + "/r1.err");
  Process r0 = Process::Start(ExchangeArgs(dir_, rv, 0, kJob, 20000, 200000),
                              a->ClientEnv(), rv + "/r0.out", rv + "/r0.err");
  auto errors = [&] {
    return ReadFile(rv + "/r0.err") + ReadFile(rv + "/r1.err") + a->Log() +
           b->Log();
  };
  // Until traffic crosses the link (node 1 sent node 2 a megabyte).
  ASSERT_TRUE(WaitUntil(20, [&] {
    return JsonNumber(Psmctl(dir_, *a, {"stats", "--format", "json"}).out,
                      "peer_nodes", "bytes_sent") > (1 << 20);
  })) << errors();
  ASSERT_TRUE(net_.SetLink(false, &err)) << err;
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));
  const bool ran_across = r0.Wait(0) == -1 && r1.Wait(0) == -1;
  ASSERT_TRUE(net_.SetLink(true, &err)) << err;
  EXPECT_TRUE(ran_across)
      << "the exchange ended while the link was down; raise its messages";
  EXPECT_EQ(r0.Wait(120), 0) << errors();
  EXPECT_EQ(r1.Wait(30), 0) << errors();
  EXPECT_NE(ReadFile(rv + "/r1.out").find("all intact and in order"),
            std::string::npos)
      << ReadFile(rv + "/r1.out") << errors();
  for (const Daemon* d : {a.get(), b.get()}) {
    EXPECT_EQ(d->Log().find("silent for"), std::string::npos) << d->Log();
  }
  EXPECT_TRUE(a->Stop());
  EXPECT_TRUE(b->Stop());
  net_.Delete();
}

}  // namespace
}  // namespace psmd::testing
