// psmd between nodes: real daemons on 127.0.0.2 and 127.0.0.3 (one "node"
// each, its own control socket and node id), linked by the io_uring fabric
// and authenticated by one real munged that this test starts with a
// generated key; real client processes, each choosing its daemon by
// PSMD_SOCKET. Every process is ended by PID and every file removed.
// With PSMD_TEST_OFI_PROVIDER set (//tests:fabric_ofi_test), the daemons
// and the test's own node use the ofi backend over that libfabric provider
// instead; the tests that speak raw TCP to a daemon skip there.
#include <arpa/inet.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "hw/fabric.h"
#include "hw/ofi/ofi_fabric.h"
#include "hw/socket/cut_proxy.h"
#include "hw/socket/socket_fabric.h"
#include "tests/harness.h"

namespace psmd::testing {
namespace {

const char kJobA[] = "fab1c0deaaaaaaaaaaaaaaaaaaaaaaaa";
const char kJobB[] = "fab1c0debbbbbbbbbbbbbbbbbbbbbbbb";
const char kJobHold[] = "fab1c0de0000000000000000000000a0";

// fabric_test_workers2: every daemon runs two engine shards
// (tests/harness.cc), shard 0 owning the fabric.
bool Shards() { return std::getenv("PSMD_TEST_WORKERS") != nullptr; }

// A port free on `addr` right now (the node table names it before the
// daemon starts).
int FreePort(const std::string& addr) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  inet_pton(AF_INET, addr.c_str(), &sa.sin_addr);
  bind(fd, reinterpret_cast<sockaddr*>(&sa), sizeof(sa));
  socklen_t len = sizeof(sa);
  getsockname(fd, reinterpret_cast<sockaddr*>(&sa), &len);
  close(fd);
  return ntohs(sa.sin_port);
}

// The libfabric provider the daemons use, empty for the socket backend.
std::string OfiProvider() {
  const char* p = std::getenv("PSMD_TEST_OFI_PROVIDER");
  return p == nullptr ? std::string() : std::string(p);
}

// How a daemon killed on another node is reported, and how soon. With
// sessions (psmd's default) a connection that breaks is a pause: the
// survivor waits --fabric-timeout-ms (5 s here) for it to resume, then its
// requests fail with PSM2_TIMEOUT. Without them (PSMD_TEST_FABRIC_SESSIONS=
// off, fabric_test_sessions_off) the killed daemon's sockets close, so over
// TCP the survivor sees it at once: PSM2_EPID_UNREACHABLE within a second.
// A libfabric RDM endpoint reports no peer's death (ofi_rxm reconnects
// quietly; UDP has nothing to see), so over ofi the engine's heartbeats
// find the silence: PSM2_TIMEOUT within the timeout and a little, either
// way.
bool Sessions() {
  const char* s = getenv("PSMD_TEST_FABRIC_SESSIONS");
  return s == nullptr || strcmp(s, "off") != 0;
}
int ExpectedLossError() {
  return OfiProvider().empty() && !Sessions() ? 41 : 11;
}
long long LossBoundMs() {
  return OfiProvider().empty() && !Sessions() ? 1000 : 6500;
}

// Frames as a daemon writes them (daemon/remote/wire.h): a 32-byte
// record {tag[3], len, flags, error, x}, after it 24 bytes of region.
struct WireRecord {
  uint32_t tag[3];
  uint32_t len;
  uint32_t flags;
  int32_t error;
  uint64_t x;
};

struct SendingNode;

// tests/programs/flood's command line: rank `rank` of the job meeting in
// `rv`, whose receiver idles `idle_s` seconds first, then `more`.
std::vector<std::string> FloodArgs(const std::string& rv, int rank, int idle_s,
                                   const std::vector<std::string>& more) {
  std::vector<std::string> v = {Runfile("tests/programs/flood"),
                                "--rank",
                                std::to_string(rank),
                                "--dir",
                                rv,
                                "--idle-seconds",
                                std::to_string(idle_s)};
  v.insert(v.end(), more.begin(), more.end());
  return v;
}

class FabricTest : public ::testing::Test {
 protected:
  FabricTest() : munged_(dir_.path() + "/munge") {
    chmod(dir_.path().c_str(), 0711);
    for (int i = 0; i < 2; i++) {
      addr_[i] = "127.0.0." + std::to_string(2 + i);
      listen_[i] = addr_[i] + ":" + std::to_string(FreePort(addr_[i]));
    }
    std::ofstream nodes(nodes_path());
    for (int i = 0; i < 2; i++) {
      nodes << (i + 1) << " node" << (i + 1) << " " << (i + 1) << "@"
            << listen_[i] << "\n";
    }
  }
  std::string nodes_path() const { return dir_.path() + "/nodes"; }
  std::vector<std::string> Flags(int i) const {
    std::vector<std::string> flags = {"--node-id",       std::to_string(i + 1),
                                      "--fabric-listen", listen_[i],
                                      "--fabric-nodes",  nodes_path(),
                                      "--munge-socket",  munged_.socket(),
                                      "--log-level",     "info"};
    if (!OfiProvider().empty()) {
      flags.insert(flags.end(),
                   {"--fabric", "ofi", "--fabric-provider", OfiProvider()});
    }
    flags.insert(flags.end(), {"--fabric-sessions", Sessions() ? "on" : "off"});
    // RMA reads are off unless configured: these tests turn them on (over
    // sockets the flag changes nothing), but for RmaReadsAreOffByDefault.
    if (rma_) flags.insert(flags.end(), {"--fabric-rma", "on"});
    return flags;
  }
  // With shards (fabric_test_workers2), each daemon started here first
  // gets an endpoint of a job of its own, held until the test ends: it sits
  // on shard 0, so the test's endpoints land on shard 1 (the registry puts
  // an endpoint on the shard with the fewest of its job, then the fewest
  // overall), and every frame and every send of theirs crosses between
  // shard 1 and shard 0, which owns the fabric.
  std::unique_ptr<Daemon> StartNode(
      int i, const std::vector<std::string>& extra = {}) {
    std::vector<std::string> flags = Flags(i);
    flags.insert(flags.end(), extra.begin(), extra.end());
    auto d = std::make_unique<Daemon>(node_dir_[i], flags);
    if (Shards()) {
      const std::string out =
          dir_.path() + "/hold" + std::to_string(holds_.size());
      holds_.push_back(Process::Start(
          {Runfile("tests/programs/hold_endpoint"), "--uuid", kJobHold},
          d->ClientEnv(), out, out + ".err"));
      EXPECT_TRUE(WaitUntil(
          10, [&] { return ReadFile(out).find("held") != std::string::npos; }))
          << ReadFile(out + ".err") << d->Log();
    }
    return d;
  }
  // With shards: on daemon d both shards carried the test's messages (its
  // endpoints' shard 1 took their submissions) and messages crossed both
  // ways between them, as many taken as handed over (psmctl stats).
  void ExpectShardsCrossed(const Daemon& d) {
    if (!Shards()) return;
    RunResult s = Psmctl(dir_, d, {"stats", "--format", "json"});
    ASSERT_EQ(s.exit_code, 0) << s.err;
    long long handed = 0, taken = 0;
    for (int shard = 0; shard < 2; shard++) {
      const long long in = WorkerNumber(s.out, shard, "cross_in");
      const long long out = WorkerNumber(s.out, shard, "cross_out");
      const long long took = WorkerNumber(s.out, shard, "submissions");
      printf("shard %d: %lld submissions, %lld messages in, %lld out\n", shard,
             took, in, out);
      EXPECT_GT(in, 0) << "shard " << shard << ": " << s.out;
      EXPECT_GT(out, 0) << "shard " << shard << ": " << s.out;
      if (shard == 1) {  // the test's endpoints
        EXPECT_GT(took, 0) << s.out;
      }
      handed += out;
      taken += in;
    }
    EXPECT_EQ(handed, taken) << s.out;
  }
  // A fresh directory for one run's rendezvous files (numbered: a name used
  // twice in a test must not find the first run's files).
  std::string Rendezvous(const std::string& name) {
    std::string rv =
        dir_.path() + "/" + name + "." + std::to_string(++rendezvous_runs_);
    std::filesystem::create_directories(rv);
    return rv;
  }
  // Rank 0 on daemon a, rank 1 on daemon b; returns rank 0's result.
  RunResult Exchange(const Daemon& a, const Daemon& b, const std::string& name,
                     int messages, int max_size, const char* uuid0 = kJobA,
                     const char* uuid1 = kJobA, int* exit1 = nullptr) {
    std::string rv = Rendezvous(name);
    Process r1 =
        Process::Start(ExchangeArgs(dir_, rv, 1, uuid1, messages, max_size),
                       b.ClientEnv(), rv + "/r1.out", rv + "/r1.err");
    RunResult r0 =
        RunToEnd(dir_, ExchangeArgs(dir_, rv, 0, uuid0, messages, max_size),
                 a.ClientEnv(), 90);
    int code = r1.Wait(90);
    if (exit1 != nullptr) *exit1 = code;
    r0.err += ReadFile(rv + "/r1.err");
    return r0;
  }

  // With `read_by_rma`, F's rendezvous chunks are read by RMA (over ofi):
  // they wait in its sender's pool for inbox space instead of parking, so
  // node 2 switches nothing off.
  void StallOneTenant(const std::vector<std::string>& flood_args,
                      bool sends_held, bool read_by_rma = false);

  // The two roles of tests/programs/peer_death in directory `rv`: rank 0 on
  // daemon a, rank 1 on daemon b, of job `uuid`.
  struct PeerDeathPair {
    std::string rv;
    Process rank0, rank1;
    std::string Errors() const {
      return ReadFile(rv + "/0.err") + ReadFile(rv + "/1.err");
    }
  };
  // Starts them and waits (up to 20 s) until file `ready` exists.
  PeerDeathPair StartPeerDeath(const Daemon& a, const Daemon& b,
                               const std::string& role0,
                               const std::string& role1, const char* uuid,
                               const std::string& ready) {
    PeerDeathPair pair;
    pair.rv = Rendezvous(role0 + "-" + role1 + "-" + uuid);
    auto args = [&](const std::string& role, int rank) {
      return std::vector<std::string>{Runfile("tests/programs/peer_death"),
                                      "--role",
                                      role,
                                      "--rank",
                                      std::to_string(rank),
                                      "--dir",
                                      pair.rv,
                                      "--uuid",
                                      uuid};
    };
    pair.rank0 = Process::Start(args(role0, 0), a.ClientEnv(),
                                pair.rv + "/0.out", pair.rv + "/0.err");
    pair.rank1 = Process::Start(args(role1, 1), b.ClientEnv(),
                                pair.rv + "/1.out", pair.rv + "/1.err");
    const std::string path = pair.rv + "/" + ready;
    for (int i = 0; i < 2000 && access(path.c_str(), F_OK) != 0; i++) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return pair;
  }

  // Runs StartPeerDeath (sender rank 0, receiver rank 1, job A); once
  // `ready` exists SIGKILLs one client and expects the survivor's wait to
  // end with PSM2_EPID_UNREACHABLE within a second and the survivor to exit
  // 0. Prints `what` with the time taken; returns the survivor's output.
  std::string KillClient(const Daemon& a, const Daemon& b,
                         const std::string& sender_role,
                         const std::string& receiver_role, bool kill_sender,
                         const std::string& ready, const char* what) {
    PeerDeathPair pair =
        StartPeerDeath(a, b, sender_role, receiver_role, kJobA, ready);
    const std::string& rv = pair.rv;
    EXPECT_EQ(access((rv + "/" + ready).c_str(), F_OK), 0) << pair.Errors();
    Process& victim = kill_sender ? pair.rank0 : pair.rank1;
    Process& survivor = kill_sender ? pair.rank1 : pair.rank0;
    auto killed_at = std::chrono::steady_clock::now();
    victim.Kill(SIGKILL);
    victim.Wait(5);
    const int survivor_exit = survivor.Wait(10);
    std::string out_path = rv + (kill_sender ? "/1.out" : "/0.out");
    std::string out =
        ReadFile(out_path) + ReadFile(rv + (kill_sender ? "/1.err" : "/0.err"));
    long long ended_ms = 0;
    int error = 0;
    if (sscanf(ReadFile(out_path).c_str(), "ended %d at %lld", &error,
               &ended_ms) != 2) {
      ADD_FAILURE() << "the survivor's wait did not end: " << out << a.Log()
                    << b.Log();
      return out;
    }
    long long killed_ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                              killed_at.time_since_epoch())
                              .count();
    printf("%s after %lld ms\n", what, ended_ms - killed_ms);
    EXPECT_LE(ended_ms - killed_ms, 1000) << out;
    EXPECT_EQ(error, 41) << out;  // PSM2_EPID_UNREACHABLE
    EXPECT_EQ(survivor_exit, 0) << out;
    return out;
  }

  // Whether the rendezvous messages daemon `d` received from the other node
  // went by RMA read: over ofi (both providers here offer reads) they must
  // have (its rma_reads and rma_bytes from node `from` above zero), over
  // sockets never. Returns the bytes read.
  // Whether Flags turns RMA reads on (--fabric-rma on), or leaves psmd's
  // default.
  bool rma_ = true;

  long long ExpectRmaReads(const Daemon& d, int from) {
    RunResult st = Psmctl(dir_, d, {"stats", "--format", "json"});
    EXPECT_EQ(st.exit_code, 0) << st.err;
    EXPECT_EQ(JsonNumber(st.out, "peer_nodes", "node"), from) << st.out;
    const long long reads = JsonNumber(st.out, "peer_nodes", "rma_reads");
    const long long bytes = JsonNumber(st.out, "peer_nodes", "rma_bytes");
    if (OfiProvider().empty() || !rma_) {
      EXPECT_EQ(reads, 0) << st.out;
      EXPECT_EQ(bytes, 0) << st.out;
    } else {
      EXPECT_GT(reads, 0) << st.out << d.Log();
      EXPECT_GT(bytes, 0) << st.out;
    }
    return bytes;
  }

  // Another exchange between the two nodes still runs; then both daemons
  // stop cleanly.
  void ExchangeGoesOnThenStop(Daemon& a, Daemon& b) {
    RunResult r = Exchange(a, b, "after", 200, 100000);
    EXPECT_EQ(r.exit_code, 0) << r.err;
    ExpectShardsCrossed(a);
    ExpectShardsCrossed(b);
    EXPECT_TRUE(a.Stop());
    EXPECT_TRUE(b.Stop());
  }

  // Node 1's flood of node 2's receiver, which idles `idle` s first
  // (tests/programs/flood with `flood`'s arguments), both daemons with an
  // unexpected budget of 16 MiB: node 2 parks, keeps and holds node 1 off.
  struct IdleFlood {
    std::unique_ptr<Daemon> a, b;
    std::string rv;
    int idle = 0;
    std::chrono::steady_clock::time_point start;
    Process receiver, sender;
    // Seconds until the receiver wakes.
    double IdleLeft() const {
      return idle - std::chrono::duration<double>(
                        std::chrono::steady_clock::now() - start)
                        .count();
    }
  };
  IdleFlood StartIdleFlood(const std::string& name, int idle,
                           const std::vector<std::string>& flood) {
    IdleFlood f;
    const std::vector<std::string> budget = {"--unexpected-mib", "16"};
    f.a = StartNode(0, budget);
    f.b = StartNode(1, budget);
    f.rv = Rendezvous(name);
    f.idle = idle;
    f.start = std::chrono::steady_clock::now();
    f.receiver =
        Process::Start(FloodArgs(f.rv, 1, idle, flood), f.b->ClientEnv(),
                       f.rv + "/r1.out", f.rv + "/r1.err");
    f.sender = Process::Start(FloodArgs(f.rv, 0, idle, flood), f.a->ClientEnv(),
                              f.rv + "/r0.out", f.rv + "/r0.err");
    return f;
  }
  // The flood ended well (every message received, in order, intact), and
  // another job exchanges across the nodes; then both daemons stop.
  void ExpectFloodIntactThenStop(IdleFlood& f, const char* after) {
    EXPECT_EQ(f.receiver.Wait(60), 0)
        << ReadFile(f.rv + "/r1.err") << f.a->Log() << f.b->Log();
    EXPECT_EQ(f.sender.Wait(30), 0) << ReadFile(f.rv + "/r0.err");
    EXPECT_NE(ReadFile(f.rv + "/r1.out").find(" 0 wrong"), std::string::npos)
        << ReadFile(f.rv + "/r1.out");
    RunResult r = Exchange(*f.a, *f.b, after, 100, 100000);
    EXPECT_EQ(r.exit_code, 0) << r.err << f.a->Log() << f.b->Log();
    EXPECT_TRUE(f.a->Stop());
    EXPECT_TRUE(f.b->Stop());
  }

  // The test's own node 3 as a sending daemon (SendingNode) to node 1,
  // which runs with this --fabric-timeout-ms.
  static constexpr int kNode3TimeoutMs = 2000;
  std::unique_ptr<Daemon> StartNodeForNode3();
  // A receive on node 1 of a rendezvous from node 3: peer_death's
  // posted-receiver in directory `rv`.
  struct Node3Receiver {
    std::string rv;
    Process process;
  };
  // Node 3 joins; a receive of 64 MiB is posted on daemon `a` (node 1)
  // naming node 3's endpoint, and node 3 sends it a request-to-send of
  // `bytes`; psmd's kRndvGo names the transfer (`*transfer`), offering RMA.
  ::testing::AssertionResult RendezvousFromNode3(const Daemon& a,
                                                 SendingNode& node,
                                                 uint32_t bytes,
                                                 Node3Receiver* out,
                                                 uint64_t* transfer);
  // The receiver ended, its receive with an error (`*error`, at monotonic
  // `*ended_ms`); `*landed` is what its buffer held then (peer_death's
  // "landed" line).
  ::testing::AssertionResult Node3ReceiveFailed(Node3Receiver& r, int* error,
                                                long long* ended_ms,
                                                std::string* landed);

  // A second RMA piece of node 3's rendezvous (ExpectRoguePieceDropped):
  // its frame's fields, record and region (address, key, length).
  struct RoguePiece {
    static constexpr uint32_t kMessage = 1u << 20, kPiece = 256u << 10;
    hw::FrameFields f;
    WireRecord r;
    uint64_t region[3];
    uint64_t other_key;  // of another region of node 3's, as long
    // Whether the first 256 KiB came streamed (kRndvData), not read.
    bool first_streamed = false;
  };
  using RogueEdit = std::function<void(RoguePiece&)>;
  // Node 3 sends daemon `a` a rendezvous of RoguePiece::kMessage bytes, a
  // proper first piece (read, unless `edit` says it streams), and a second
  // piece as `edit` changes it: psmd drops node 3's connection (logged and
  // counted: the `nth` time), reads nothing of it, and the receive fails
  // at once.
  void ExpectRoguePieceDropped(Daemon& a, const char* what,
                               const RogueEdit& edit, int nth);
  // Node 1 runs ExpectRoguePieceDropped for each of `rogues` (a name and
  // an edit) in turn, then still serves node 2 (ExchangeGoesOnThenStop).
  void EachRoguePieceDropsItsPeer(
      const std::vector<std::pair<const char*, RogueEdit>>& rogues);

  int rendezvous_runs_ = 0;
  TempDir dir_;
  std::vector<Process> holds_;  // StartNode's, with shards
  TempDir node_dir_[2];
  Munged munged_;
  std::string addr_[2];
  std::string listen_[2];
};

TEST_F(FabricTest, TwoDaemonsCarryEagerAndRendezvousMessagesAndCountThem) {
  auto a = StartNode(0);
  auto b = StartNode(1);
  // Sizes 0..200000: inline, pool-eager and rendezvous (above 64000).
  int exit1 = -1;
  RunResult r = Exchange(*a, *b, "rv", 3000, 200000, kJobA, kJobA, &exit1);
  EXPECT_EQ(r.exit_code, 0) << r.err << a->Log() << b->Log();
  EXPECT_EQ(exit1, 0) << r.err;
  EXPECT_NE(a->Log().find("host description 1@" + listen_[0]),
            std::string::npos)
      << a->Log();
  // Per-peer-node rows: node 1 sent node 2 the messages, and heard back.
  RunResult sa = Psmctl(dir_, *a, {"stats", "--format", "json"});
  ASSERT_EQ(sa.exit_code, 0) << sa.err;
  // (Over ofi the rendezvous payloads were read by node 2, not sent.)
  long long sent = JsonNumber(sa.out, "peer_nodes", "bytes_sent");
  RunResult sb_json = Psmctl(dir_, *b, {"stats", "--format", "json"});
  sent += JsonNumber(sb_json.out, "peer_nodes", "rma_bytes");
  EXPECT_GT(sent, 3000LL * 50000) << sa.out << sb_json.out;
  EXPECT_EQ(JsonNumber(sa.out, "peer_nodes", "node"), 2) << sa.out;
  // The fabric named: its host description, backend and provider, in each
  // format.
  const std::string backend = OfiProvider().empty() ? "socket" : "ofi";
  RunResult sb = Psmctl(dir_, *b, {"stats"});
  const std::string over =
      "fabric 2@" + listen_[1] + " over " + backend +
      (OfiProvider().empty() ? "" : " (" + OfiProvider() + ")") +
      ", sessions " + (Sessions() ? "on" : "off") + "\n";
  EXPECT_NE(sb.out.find(over), std::string::npos) << over << sb.out;
  EXPECT_NE(sa.out.find("\"fabric_backend\": \"" + backend +
                        "\",\n \"fabric_provider\": \"" + OfiProvider() +
                        "\",\n \"fabric_sessions\": " +
                        (Sessions() ? "true" : "false")),
            std::string::npos)
      << sa.out;
  RunResult prom = Psmctl(dir_, *b, {"stats", "--format", "prometheus"});
  EXPECT_NE(prom.out.find("psmd_fabric_info{backend=\"" + backend +
                          "\",provider=\"" + OfiProvider() + "\",sessions=\"" +
                          (Sessions() ? "on" : "off") + "\"} 1\n"),
            std::string::npos)
      << prom.out;
  ExpectShardsCrossed(*a);
  ExpectShardsCrossed(*b);
  EXPECT_TRUE(a->Stop());
  EXPECT_TRUE(b->Stop());
}

TEST_F(FabricTest, LargeMessagesBetweenNodesAreReadByRmaOverOfi) {
  // Over ofi the receiving daemon reads each rendezvous chunk from the
  // sending job's registered pool into its receiver's inbox (docs/design.md,
  // "Rendezvous by RMA read"); over sockets they stream, as before. Sizes
  // 0 B - 64 MiB, pseudo-random: almost none a multiple of the 256 KiB
  // chunk or of a read; every byte is checked by the receiving rank.
  auto a = StartNode(0);
  auto b = StartNode(1);
  // (Fewer over udp;ofi_rxd, whose reads are slow: 24 + 8 took 55 s.)
  const bool udp = OfiProvider().rfind("udp", 0) == 0;
  RunResult r = Exchange(*a, *b, "rma", udp ? 6 : 24, 64 << 20);
  ASSERT_EQ(r.exit_code, 0) << r.err << a->Log() << b->Log();
  const long long read = ExpectRmaReads(*b, 1);
  RunResult st = Psmctl(dir_, *b, {"stats", "--format", "json"});
  const long long streamed = JsonNumber(st.out, "peer_nodes", "bytes_received");
  if (!OfiProvider().empty()) {
    // Nearly every message is a rendezvous (above 64000 B), and their bytes
    // were read, not streamed: the stream carried envelopes and
    // announcements, and the few eager messages.
    EXPECT_GT(read, 64LL << 20) << st.out;
    EXPECT_LT(streamed, read / 100) << st.out;
    // The table and Prometheus name them too.
    RunResult table = Psmctl(dir_, *b, {"stats"});
    EXPECT_NE(table.out.find("rma_rd"), std::string::npos) << table.out;
    RunResult prom = Psmctl(dir_, *b, {"stats", "--format", "prometheus"});
    EXPECT_NE(prom.out.find("psmd_fabric_rma_bytes_total{node=\"1\"} " +
                            std::to_string(read) + "\n"),
              std::string::npos)
        << prom.out;
  } else {
    EXPECT_GT(streamed, 64LL << 20) << st.out;
  }
  // The other way too (and node 1's pool, registered for reads, is read
  // into now).
  RunResult back = Exchange(*b, *a, "rma-back", udp ? 2 : 8, 64 << 20);
  EXPECT_EQ(back.exit_code, 0) << back.err << a->Log() << b->Log();
  ExpectRmaReads(*a, 2);
  // The jobs are gone: each daemon dropped its registrations of their pools
  // with them (a registration holds its pool mapped). (With shards a job of
  // the test's own keeps an endpoint, and a pool, on each daemon.)
  for (const Daemon* d : {a.get(), b.get()}) {
    if (Shards()) break;
    for (int i = 0; i < 500 && CountMappings(d->pid(), "memfd:psmd-pool") > 0;
         i++) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    EXPECT_EQ(CountMappings(d->pid(), "memfd:psmd-pool"), 0) << d->Log();
  }
  EXPECT_TRUE(a->Stop());
  EXPECT_TRUE(b->Stop());
}

// psmd's default: a provider serves reads of registered memory to whoever
// reaches its endpoint and names a key and an address, which no daemon
// sees, so psmd registers nothing for remote reads unless told to
// (fabric_rma = "on"); its rendezvous messages stream.
TEST_F(FabricTest, RmaReadsAreOffByDefault) {
  rma_ = false;
  auto a = StartNode(0);
  auto b = StartNode(1);
  RunResult r = Exchange(*a, *b, "streamed", 6, 4 << 20);
  ASSERT_EQ(r.exit_code, 0) << r.err << a->Log() << b->Log();
  ExpectRmaReads(*b, 1);
  RunResult st = Psmctl(dir_, *b, {"stats", "--format", "json"});
  EXPECT_GT(JsonNumber(st.out, "peer_nodes", "bytes_received"), 64000)
      << st.out;
  if (!OfiProvider().empty()) {
    EXPECT_NE(a->Log().find("RMA reads off (fabric_rma)"), std::string::npos)
        << a->Log();
  }
  EXPECT_TRUE(a->Stop());
  EXPECT_TRUE(b->Stop());
}

TEST_F(FabricTest, AnEndpointOfAnotherJobIsUnreachableAndTheRefusalLogged) {
  auto a = StartNode(0);
  auto b = StartNode(1);
  int exit1 = -1;
  RunResult r = Exchange(*a, *b, "rv", 10, 100, kJobA, kJobB, &exit1);
  EXPECT_EQ(r.exit_code, 3) << r.err;  // psm2_ep_connect failed
  EXPECT_EQ(exit1, 3) << r.err;
  // Not "exists in another job": the same answer as for no endpoint at all.
  EXPECT_NE(r.err.find("has no endpoint of this job and uid"),
            std::string::npos)
      << r.err;
  EXPECT_NE(b->Log().find("no such endpoint of that job and uid"),
            std::string::npos)
      << b->Log();
  RunResult sb = Psmctl(dir_, *b, {"stats", "--format", "json"});
  EXPECT_GE(JsonNumber(sb.out, "peer_nodes", "refused"), 1) << sb.out;
  // The job's own traffic is untouched.
  RunResult ok = Exchange(*a, *b, "rv2", 100, 1000);
  EXPECT_EQ(ok.exit_code, 0) << ok.err;
  EXPECT_TRUE(a->Stop());
  EXPECT_TRUE(b->Stop());
}

// Issue 33, item 4: with --fabric-sessions on, a connection between two
// live daemons that breaks is a pause, not a failure. A relay in front of each
// daemon (the node table names the relays) cuts every connection it carries
// every 60 ms, by reset and by end of file, while a job exchanges messages of
// every size (inline, eager and rendezvous) across them: every message arrives
// once, in order and intact, no request fails, and the daemons report the
// resumed sessions and the frames sent again.
TEST_F(FabricTest, ConnectionsCutBetweenDaemonsArePausesThatLoseNothing) {
  if (!OfiProvider().empty()) GTEST_SKIP() << "the relays cut TCP connections";
  if (!Sessions()) GTEST_SKIP() << "without sessions a cut loses frames";
  std::vector<std::unique_ptr<hw::testing::CutProxy>> relays;
  std::ofstream nodes(nodes_path());
  for (int i = 0; i < 2; i++) {
    const size_t colon = listen_[i].rfind(':');
    relays.push_back(std::make_unique<hw::testing::CutProxy>(
        "127.0.0.4", listen_[i].substr(0, colon),
        static_cast<uint16_t>(std::stoi(listen_[i].substr(colon + 1)))));
    ASSERT_TRUE(relays.back()->ok());
    nodes << (i + 1) << " node" << (i + 1) << " " << (i + 1)
          << "@127.0.0.4:" << relays.back()->port() << "\n";
  }
  nodes.close();
  auto a = StartNode(0);
  auto b = StartNode(1);
  std::atomic<bool> done{false};
  std::thread cutter([&] {
    while (!done) {
      std::this_thread::sleep_for(std::chrono::milliseconds(60));
      for (auto& r : relays) r->Cut();
    }
  });
  int exit1 = -1;
  RunResult r = Exchange(*a, *b, "cut", 4000, 300000, kJobA, kJobA, &exit1);
  done = true;
  cutter.join();
  EXPECT_EQ(r.exit_code, 0) << r.err << a->Log() << b->Log();
  EXPECT_EQ(exit1, 0) << r.err;
  const int cuts = relays[0]->cuts() + relays[1]->cuts();
  long long resumes = 0, replayed = 0;
  for (const Daemon* d : {a.get(), b.get()}) {
    RunResult st = Psmctl(dir_, *d, {"stats", "--format", "json"});
    resumes += JsonNumber(st.out, "peer_nodes", "resumes");
    replayed += JsonNumber(st.out, "peer_nodes", "frames_replayed");
    EXPECT_EQ(d->Log().find("ended: not resumed"), std::string::npos)
        << d->Log();
  }
  printf(
      "%d connections cut under the exchange: %lld sessions resumed, %lld "
      "frames sent again\n",
      cuts, resumes, replayed);
  EXPECT_GE(cuts, 2) << "the exchange ended before the relays cut it";
  EXPECT_GE(resumes, 2);
  ExpectShardsCrossed(*a);
  ExpectShardsCrossed(*b);
  EXPECT_TRUE(a->Stop());
  EXPECT_TRUE(b->Stop());
}

// Issue 33, items 1 and 4 (docs/design.md, "Handover with a fabric"): each
// of two daemons is upgraded in turn (psmctl upgrade, to itself) while three
// jobs exchange across them, small messages (inline and eager: unexpected
// ones from the other node carried in the engine, their payloads in the
// inbox), medium ones (rendezvous transfers in flight both ways) and large
// ones; every message arrives once, in order, intact (the exchange program
// checks), no request fails, and each upgrade carries the sessions, which
// the peer resumes. Over ofi, without RMA reads: a job's pool stays
// registered for them while the job lives, and registrations are not
// carried (psmctl refuses the upgrade: AnUpgradeThatCannotCarryTheFabric...).
TEST_F(FabricTest, UpgradesOfEachDaemonInTurnLoseNothing) {
  if (!Sessions()) GTEST_SKIP() << "without sessions nothing can be carried";
  rma_ = false;
  auto a = StartNode(0);
  auto b = StartNode(1);
  struct Pair {
    std::string rv;
    Process r0, r1;
    std::string Errors() const {
      return ReadFile(rv + "/r0.err") + ReadFile(rv + "/r1.err") +
             ReadFile(rv + "/r0.out") + ReadFile(rv + "/r1.out");
    }
  };
  const char kJobC[] = "fab1c0decccccccccccccccccccccccc";
  auto start = [&](const std::string& name, const char* uuid, int messages,
                   int max_size) {
    Pair p;
    p.rv = Rendezvous(name);
    p.r1 = Process::Start(ExchangeArgs(dir_, p.rv, 1, uuid, messages, max_size),
                          b->ClientEnv(), p.rv + "/r1.out", p.rv + "/r1.err");
    p.r0 = Process::Start(ExchangeArgs(dir_, p.rv, 0, uuid, messages, max_size),
                          a->ClientEnv(), p.rv + "/r0.out", p.rv + "/r0.err");
    return p;
  };
  Pair small = start("small", kJobA, 400000, 64);
  Pair medium = start("medium", kJobB, 20000, 192 * 1024);
  Pair large = start("large", kJobC, 40, 8 << 20);
  // Every rank connected (past the exchange program's connect barrier):
  // both daemons have a session to carry.
  for (const Pair* p : {&small, &medium, &large}) {
    ASSERT_TRUE(WaitUntil(20, [&] {
      return access((p->rv + "/rank10.epid").c_str(), F_OK) == 0 &&
             access((p->rv + "/rank11.epid").c_str(), F_OK) == 0;
    })) << p->Errors();
  }
  int upgrades = 0;
  for (int round = 0; round < 4; round++) {
    for (Daemon* d : {a.get(), b.get()}) {
      RunResult up = Psmctl(dir_, *d, {"upgrade"});
      ASSERT_EQ(up.exit_code, 0)
          << up.out << up.err << a->Log() << b->Log() << small.Errors()
          << medium.Errors() << large.Errors();
      upgrades++;
    }
  }
  EXPECT_TRUE(small.r0.Wait(0) == -1 || small.r1.Wait(0) == -1)
      << "the small pair finished before the upgrades; raise its messages";
  EXPECT_TRUE(medium.r0.Wait(0) == -1 || medium.r1.Wait(0) == -1)
      << "the medium pair finished before the upgrades; raise its messages";
  for (Pair* p : {&small, &medium, &large}) {
    // A pair still running after 100 s has hung (the exchange's alarm ends
    // it at 120 s): what both daemons count for it, while it is open.
    std::string hung;
    if (p->r0.Wait(100) == -1) {
      hung = "hung pair " + p->rv + ":\n";
      for (const Daemon* d : {a.get(), b.get()})
        hung += Psmctl(dir_, *d, {"stats", "--format", "json"}).out;
    }
    EXPECT_EQ(p->r0.Wait(180 * TimeScale()), 0)
        << p->Errors() << hung << a->Log() << b->Log();
    EXPECT_EQ(p->r1.Wait(30), 0) << p->Errors();
    EXPECT_EQ(p->Errors().find("lost psmd"), std::string::npos);
  }
  // Each upgrade's successor adopted the session and resumed it, and so did
  // the peer (each side logs it); the blackouts, as each successor logged
  // them.
  auto count = [](const std::string& log, const std::string& what) {
    int n = 0;
    for (size_t at = log.find(what); at != std::string::npos;
         at = log.find(what, at + 1)) {
      n++;
    }
    return n;
  };
  for (const Daemon* d : {a.get(), b.get()}) {
    const std::string log = d->Log();
    EXPECT_EQ(count(log, "fabric: adopted 1 sessions"), 4) << log;
    EXPECT_GE(count(log, "resumed"), 8) << log;
    EXPECT_EQ(log.find("ended: not resumed"), std::string::npos) << log;
    for (size_t at = log.find("blackout "); at != std::string::npos;
         at = log.find("blackout ", at + 1)) {
      printf("node %c upgrade: %s\n", d == a.get() ? '1' : '2',
             log.substr(at, log.find('\n', at) - at).c_str());
    }
  }
  // New jobs between the two run on the successors.
  RunResult after = Exchange(*a, *b, "after", 1000, 100000);
  EXPECT_EQ(after.exit_code, 0) << after.err;
  EXPECT_TRUE(a->Stop());
  EXPECT_TRUE(b->Stop());
}

// A handover that could not carry the connections to other nodes (no
// sessions; over ofi, RMA reads on) is refused before anything freezes: the
// daemon serves on, in the same process, and says what it needs.
TEST_F(FabricTest, AnUpgradeThatCannotCarryTheFabricIsRefusedAtOnce) {
  if (Sessions() && (OfiProvider().empty() || !rma_)) {
    GTEST_SKIP() << "this fabric's connections can be carried";
  }
  auto a = StartNode(0);
  auto b = StartNode(1);
  const auto asked = std::chrono::steady_clock::now();
  RunResult up = Psmctl(dir_, *a, {"upgrade"});
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                      std::chrono::steady_clock::now() - asked)
                      .count();
  EXPECT_NE(up.exit_code, 0) << up.out;
  EXPECT_NE(up.err.find("cannot be handed over"), std::string::npos) << up.err;
  EXPECT_NE(up.err.find(Sessions() ? "fabric_rma = \"on\""
                                   : "fabric_sessions = \"off\""),
            std::string::npos)
      << up.err;
  EXPECT_LT(ms, 5000) << "the refusal waited for a drain";
  RunResult after = Exchange(*a, *b, "after-refusal", 100, 100000);
  EXPECT_EQ(after.exit_code, 0) << after.err << a->Log() << b->Log();
  EXPECT_EQ(a->Log().find("upgrade: executing"), std::string::npos) << a->Log();
  EXPECT_TRUE(a->Stop());
  EXPECT_TRUE(b->Stop());
}

// How many of `what` the last "handover: took over" line in `log` names
// (-1: no such line).
long long TookOver(const std::string& log, const std::string& what) {
  const size_t line = log.rfind("handover: took over ");
  if (line == std::string::npos) return -1;
  const size_t at = log.find(" " + what, line);
  if (at == std::string::npos) return -1;
  const size_t count_at = log.rfind(' ', at - 1);
  return std::stoll(log.substr(count_at + 1, at - count_at - 1));
}

// Frames parked for a receiver that posts nothing leave only as its client
// runs. A handover once waited for them: it gave the clients 3 s to take
// them, still running, and refused if some were still parked (and before,
// froze with them and waited out its whole 10 s drain). They are carried
// now (format 5): node 2 is upgraded twice while the receiver idles, each
// successor takes the parked frames over and keeps the receiver off at
// node 1, another job exchanges meanwhile, and when the receiver wakes
// every message arrives, in order, intact. (The Remote's, the same over
// every backend: run over the socket fabric. With two workers too, where
// the messages wait held on the receiver's shard instead.)
TEST_F(FabricTest, UpgradesWithFramesParkedForAnIdleReceiverCarryThem) {
  if (!Sessions()) GTEST_SKIP() << "without sessions nothing can be carried";
  if (!OfiProvider().empty()) GTEST_SKIP() << "tested over the socket fabric";
  IdleFlood f = StartIdleFlood("parked", static_cast<int>(14 * TimeScale()),
                               {"--small", "204800"});
  Daemon* a = f.a.get();
  Daemon* b = f.b.get();
  auto parked = [&] {
    return JsonNumber(Psmctl(dir_, *b, {"stats", "--format", "json"}).out,
                      "peer_nodes", "parked");
  };
  ASSERT_TRUE(WaitUntil(f.idle - 8 * TimeScale(), [&] { return parked() > 0; }))
      << "nothing parked at node 2\n"
      << b->Log();
  for (int upgrade = 1; upgrade <= 2; upgrade++) {
    const auto asked = std::chrono::steady_clock::now();
    RunResult up = Psmctl(dir_, *b, {"upgrade"});
    const double took =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - asked)
            .count();
    ASSERT_EQ(up.exit_code, 0) << up.out << up.err << b->Log();
    ASSERT_GT(f.IdleLeft(), 0) << "the receiver woke during the upgrade";
    const long long carried = TookOver(b->Log(), "frames parked");
    printf(
        "upgrade %d of node 2: %.2f s, its successor took over %lld "
        "frames parked\n",
        upgrade, took, carried);
    // (With engine shards the receiver is on shard 1: what shard 0 may not
    // hand it yet waits there, held, and is carried by the engines; frames
    // park only for a moment, while its fabric credit is out.)
    if (!Shards()) {
      EXPECT_GT(carried, 0) << b->Log();
    }
    EXPECT_LT(took, 2.5 * TimeScale()) << "the upgrade waited for the receiver";
  }
  EXPECT_EQ(b->Log().find("did not settle"), std::string::npos) << b->Log();
  // The receiver stays off at node 1 while its frames are parked: released
  // with the others by the successor, its sender would fill node 2's park,
  // and the connection, and every job's messages on it, would pause until
  // the receiver reads. Another job exchanges meanwhile.
  RunResult beside = Exchange(*a, *b, "beside-parked", 100, 1000);
  EXPECT_EQ(beside.exit_code, 0) << beside.err;
  EXPECT_GT(f.IdleLeft(), 0)
      << "the receiver woke before the other job's exchange ended";
  EXPECT_EQ(b->Log().find("reading from it pauses"), std::string::npos)
      << b->Log();
  ExpectFloodIntactThenStop(f, "after-parked");
}

// The other side of the case above: node 1, whose sender node 2 holds off
// (kXoff: frames parked there for the idle receiver), is upgraded while its
// sends wait for the receiver. With one worker they wait in the sender's
// own held sends; with engine shards, a sender of shard 1 has them held on
// shard 0 (which owns the fabric), each holding one of its credits. The
// successor once dropped those (its shard 0 wrote none of them, its shard 1
// the credits they held): the messages were lost and, with its credits
// gone, the sender hung for good, both ranks spinning until the
// exchange's alarm (a CI run of UpgradesOfEachDaemonInTurnLoseNothing with
// two workers). Now they are carried: every message arrives, in order.
TEST_F(FabricTest,
       AnUpgradeOfTheSendersNodeCarriesItsSendsHeldForAnIdleReceiver) {
  if (!Sessions()) GTEST_SKIP() << "without sessions nothing can be carried";
  if (!OfiProvider().empty()) GTEST_SKIP() << "tested over the socket fabric";
  IdleFlood f = StartIdleFlood("held", static_cast<int>(12 * TimeScale()),
                               {"--small", "204800"});
  Daemon* a = f.a.get();
  Daemon* b = f.b.get();
  // Held off for good: frames parked at node 2 for the receiver's budget,
  // no more arriving. (With shards there, frames also park for a moment
  // while the receiver's shard has its fabric credit out: kXoff, kXon.)
  long long parked = -1;
  ASSERT_TRUE(WaitUntil(
      f.idle - 6 * TimeScale(),
      [&] {
        const long long now =
            JsonNumber(Psmctl(dir_, *b, {"stats", "--format", "json"}).out,
                       "peer_nodes", "parked");
        const bool settled = now > 0 && now == parked;
        parked = now;
        if (!settled)
          std::this_thread::sleep_for(std::chrono::milliseconds(500));
        return settled;
      }))
      << "node 2 never held the sender off for good\n"
      << a->Log() << b->Log();
  RunResult up = Psmctl(dir_, *a, {"upgrade"});
  ASSERT_EQ(up.exit_code, 0) << up.out << up.err << a->Log();
  ASSERT_GT(f.IdleLeft(), 0) << "the receiver woke during the upgrade";
  if (Shards()) {
    const std::string log = a->Log();
    const size_t sends = log.rfind(" sends of other shards' endpoints held");
    const size_t at = sends == std::string::npos
                          ? sends
                          : log.rfind("handover: took over ", sends);
    long long held = 0;
    if (at != std::string::npos &&
        sscanf(log.c_str() + at, "handover: took over %lld", &held) == 1) {
      printf("node 1's successor took over %lld sends held for node 2\n", held);
    }
    EXPECT_GT(held, 0) << "the upgrade came when no send was held\n"
                       << log << b->Log();
  }
  // Frames queued to node 2 when its kXoff came were set aside (Flush):
  // carried too (before, the drain waited for them, 10 s with every client
  // of node 1 frozen, and the upgrade failed).
  printf("node 1's successor took over %lld frames set aside for node 2\n",
         TookOver(a->Log(), "frames set aside"));
  ExpectFloodIntactThenStop(f, "after-held");
}

// Node 2's receiver idles while node 1 floods it with 32 KiB messages: once
// its share of the inbox is full node 2 keeps payloads in its memory and
// asks node 1 for envelopes only (kEagerOff), so node 1 holds the payloads
// of the sends it converted to rendezvous in its sender's pool until the
// receiver asks for each (kRndvGo). Both nodes are upgraded meanwhile, in
// turn: node 1's successor takes the converted sends over, node 2's the
// kept payloads (before, the drain waited for the first until the upgrade
// failed after 10 s, and the hold for the second until it failed after
// 3 s); each is served when the receiver wakes, every message in order,
// intact.
TEST_F(FabricTest, UpgradesCarrySendsWaitingForAnIdleReceiver) {
  if (!Sessions()) GTEST_SKIP() << "without sessions nothing can be carried";
  if (!OfiProvider().empty()) GTEST_SKIP() << "tested over the socket fabric";
  const int idle = static_cast<int>(15 * TimeScale());
  IdleFlood f = StartIdleFlood(
      "waiting", idle, {"--small", "0", "--bytes", std::to_string(32 << 20)});
  Daemon* a = f.a.get();
  Daemon* b = f.b.get();
  auto stat = [&](Daemon& d, const char* name) {
    return JsonNumber(Psmctl(dir_, d, {"stats", "--format", "json"}).out,
                      "peer_nodes", name);
  };
  ASSERT_TRUE(WaitUntil(idle - 8 * TimeScale(),
                        [&] { return stat(*a, "eager_offs") > 0; }))
      << "node 2 never asked for envelopes only\n"
      << a->Log() << b->Log();
  // Whether sends wait converted at a given moment is a matter of timing
  // (the sender's progress on a busy machine, sends held on the receiver's
  // window: once, beside a busy loop, none did 0.5 s after the kEagerOff).
  // So a node is upgraded again, while the receiver idles, until its
  // successor took some over.
  double took[2] = {};
  long long carried[2] = {};
  int upgrades[2] = {};
  Daemon* nodes[2] = {a, b};
  const char* what[2] = {"eager sends converted", "payloads kept"};
  const auto last_try = f.start + std::chrono::milliseconds(static_cast<int>(
                                      (idle - 3 * TimeScale()) * 1000));
  for (int i = 0; i < 2; i++) {
    while (carried[i] <= 0 && std::chrono::steady_clock::now() < last_try) {
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
      const auto asked = std::chrono::steady_clock::now();
      RunResult up = Psmctl(dir_, *nodes[i], {"upgrade"});
      took[i] = std::chrono::duration<double>(std::chrono::steady_clock::now() -
                                              asked)
                    .count();
      ASSERT_EQ(up.exit_code, 0) << up.out << up.err << nodes[i]->Log();
      upgrades[i]++;
      carried[i] = TookOver(nodes[i]->Log(), what[i]);
    }
    EXPECT_GT(carried[i], 0) << nodes[i]->Log();
  }
  ASSERT_GT(f.IdleLeft(), 0) << "the receiver woke during the upgrades";
  printf(
      "upgrades beside an idle receiver: node 1 in %.2f s carrying %lld "
      "converted sends (upgrade %d), node 2 in %.2f s carrying %lld kept "
      "payloads (upgrade %d)\n",
      took[0], carried[0], upgrades[0], took[1], carried[1], upgrades[1]);
  ExpectFloodIntactThenStop(f, "after-waiting");
}

TEST_F(FabricTest, DaemonKilledMidRendezvousFailsTheReceiverAndReconnectWorks) {
  auto a = StartNode(0);
  auto b = StartNode(1);
  PeerDeathPair pair = StartPeerDeath(*a, *b, "stalled-sender",
                                      "waiting-receiver", kJobA, "streaming");
  const std::string& rv = pair.rv;
  Process& sender = pair.rank0;
  Process& receiver = pair.rank1;
  ASSERT_EQ(access((rv + "/streaming").c_str(), F_OK), 0)
      << pair.Errors() << a->Log() << b->Log();
  // Node 1's daemon dies (with its client): node 2's receiver must learn.
  auto killed_at = std::chrono::steady_clock::now();
  kill(a->pid(), SIGKILL);
  sender.Kill(SIGKILL);
  EXPECT_EQ(receiver.Wait(10), 0) << ReadFile(rv + "/1.err") << b->Log();
  long long ended_ms = 0;
  int error = 0;
  ASSERT_EQ(sscanf(ReadFile(rv + "/1.out").c_str(), "ended %d at %lld", &error,
                   &ended_ms),
            2)
      << ReadFile(rv + "/1.out") << ReadFile(rv + "/1.err");
  long long killed_ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                            killed_at.time_since_epoch())
                            .count();
  EXPECT_EQ(error, ExpectedLossError());
  EXPECT_LE(ended_ms - killed_ms, LossBoundMs()) << b->Log();
  printf("daemon killed: the other node's receiver failed after %lld ms\n",
         ended_ms - killed_ms);
  // Over ofi the first MiB came by RMA reads: the daemon died mid-RMA.
  ExpectRmaReads(*b, 1);
  a->Stop();
  sender.Wait(5);
  EXPECT_NE(b->Log().find("connection to node 1 ended"), std::string::npos)
      << b->Log();

  // Node 1 comes back (a new boot nonce, the same address): traffic both
  // ways works again, over a new connection.
  a.reset();
  a = StartNode(0);
  RunResult r = Exchange(*a, *b, "again", 500, 100000);
  EXPECT_EQ(r.exit_code, 0) << r.err << a->Log() << b->Log();
  RunResult back = Exchange(*b, *a, "back", 500, 100000);
  EXPECT_EQ(back.exit_code, 0) << back.err;
  RunResult sb = Psmctl(dir_, *b, {"stats", "--format", "json"});
  EXPECT_GE(JsonNumber(sb.out, "peer_nodes", "connects"), 2) << sb.out;
  EXPECT_TRUE(a->Stop());
  EXPECT_TRUE(b->Stop());
}

TEST_F(FabricTest, ADaemonRestartedAtItsAddressIsReachedWithinTheTimeout) {
  // Node 1's daemon dies while node 2 streams to it and comes back at once,
  // at the same address, before node 2 has noticed: the survivor's view of
  // that address (its connection, and over ofi the provider's per-address
  // state and the sends it still has in flight there) is stale. Traffic
  // both ways must work again within --fabric-timeout-ms of the restart.
  constexpr int kTimeoutMs = 3000;
  std::vector<std::string> flags[2] = {Flags(0), Flags(1)};
  for (auto& f : flags) {
    f.insert(f.end(), {"--fabric-timeout-ms", std::to_string(kTimeoutMs)});
  }
  auto a = std::make_unique<Daemon>(node_dir_[0], flags[0]);
  auto b = std::make_unique<Daemon>(node_dir_[1], flags[1]);
  PeerDeathPair pair = StartPeerDeath(*b, *a, "stalled-sender",
                                      "waiting-receiver", kJobA, "streaming");
  ASSERT_EQ(access((pair.rv + "/streaming").c_str(), F_OK), 0)
      << pair.Errors() << a->Log() << b->Log();
  kill(a->pid(), SIGKILL);
  pair.rank1.Kill(SIGKILL);
  pair.rank1.Wait(5);
  a.reset();  // reaps it
  auto restarted_at = std::chrono::steady_clock::now();
  a = std::make_unique<Daemon>(node_dir_[0], flags[0]);
  RunResult there = Exchange(*a, *b, "there", 100, 100000);
  EXPECT_EQ(there.exit_code, 0) << there.err << a->Log() << b->Log();
  RunResult back = Exchange(*b, *a, "back", 100, 100000);
  EXPECT_EQ(back.exit_code, 0) << back.err << a->Log() << b->Log();
  const long long ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                           std::chrono::steady_clock::now() - restarted_at)
                           .count();
  printf("daemon restarted: traffic both ways again after %lld ms\n", ms);
  // The exchanges themselves take well under a second here.
  EXPECT_LE(ms, kTimeoutMs + 2000) << a->Log() << b->Log();
  pair.rank0.Kill(SIGKILL);
  pair.rank0.Wait(5);
  EXPECT_TRUE(a->Stop());
  EXPECT_TRUE(b->Stop());
}

TEST_F(FabricTest, SenderKilledMidRendezvousFailsTheOtherNodesReceiver) {
  auto a = StartNode(0);
  auto b = StartNode(1);
  KillClient(*a, *b, "stalled-sender", "waiting-receiver",
             /*kill_sender=*/true, "streaming",
             "sender killed: the other node's receiver failed");
  // Over ofi the first MiB came by RMA reads: the sender died mid-RMA.
  ExpectRmaReads(*b, 1);
  // The connection between the nodes stays up for everyone else.
  ExchangeGoesOnThenStop(*a, *b);
}

TEST_F(FabricTest, AReceiveNamingAnEndpointOnAnotherNodeFailsWhenItGoes) {
  auto a = StartNode(0);
  auto b = StartNode(1);
  // The peer is killed, its daemon lives: that daemon tells node 2 (kGone).
  std::string out = KillClient(
      *a, *b, "idle-receiver", "unsent-receiver", /*kill_sender=*/true,
      "waiting", "peer killed: a receive naming it on the other node failed");
  EXPECT_NE(out.find("later requests fail"), std::string::npos) << out;
  // The peer's whole node goes: the connection's end fails the receive.
  PeerDeathPair pair = StartPeerDeath(*a, *b, "idle-receiver",
                                      "unsent-receiver", kJobB, "waiting");
  const std::string& rv = pair.rv;
  Process& idle = pair.rank0;
  Process& waiting = pair.rank1;
  ASSERT_EQ(access((rv + "/waiting").c_str(), F_OK), 0) << pair.Errors();
  kill(a->pid(), SIGKILL);
  idle.Kill(SIGKILL);
  EXPECT_EQ(waiting.Wait(10), 0)
      << ReadFile(rv + "/1.out") << ReadFile(rv + "/1.err") << b->Log();
  EXPECT_NE(ReadFile(rv + "/1.out").find("later requests fail"),
            std::string::npos);
  idle.Wait(5);
  a->Stop();
  EXPECT_TRUE(b->Stop());
}

TEST_F(FabricTest, ALostNodeIsReportedToTheEndpointsThatConnectedThere) {
  auto a = StartNode(0);
  auto b = StartNode(1);
  // A receive from any source names no peer, so nothing fails it when the
  // peer's node goes: the endpoint's error handler is told instead.
  PeerDeathPair pair = StartPeerDeath(*a, *b, "idle-receiver",
                                      "any-source-waiter", kJobA, "waiting");
  // Another job's pair, both on node 2, connected to nothing on node 1.
  PeerDeathPair bystanders =
      StartPeerDeath(*b, *b, "quiet-waiter", "quiet-waiter", kJobB, "waiting");
  const std::string& rv = pair.rv;
  ASSERT_EQ(access((rv + "/waiting").c_str(), F_OK), 0) << pair.Errors();
  ASSERT_EQ(access((bystanders.rv + "/waiting").c_str(), F_OK), 0)
      << bystanders.Errors();
  auto killed_at = std::chrono::steady_clock::now();
  kill(a->pid(), SIGKILL);
  pair.rank0.Kill(SIGKILL);
  const std::string out_path = rv + "/1.out";
  EXPECT_EQ(pair.rank1.Wait(30), 0)
      << ReadFile(out_path) << ReadFile(rv + "/1.err") << b->Log();
  const std::string out = ReadFile(out_path);
  long long handled_ms = 0;
  int error = 0;
  ASSERT_EQ(sscanf(out.c_str(), "handler %d at %lld", &error, &handled_ms), 2)
      << out << ReadFile(rv + "/1.err");
  long long killed_ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                            killed_at.time_since_epoch())
                            .count();
  printf(
      "daemon killed: the any-source receiver's handler ran after %lld "
      "ms:\n%s",
      handled_ms - killed_ms, out.c_str());
  EXPECT_EQ(error, ExpectedLossError()) << out;
  EXPECT_LE(handled_ms - killed_ms, LossBoundMs()) << out;
  if (OfiProvider().empty() && !Sessions()) {
    EXPECT_NE(
        out.find("lost node 1 (node1): its psmd or the link to it is down"),
        std::string::npos)
        << out;
  }
  // The library names the lost endpoint's host from the node table, which
  // psm2_ep_connect's answer carried (no psm2_map_nid_hostname here).
  EXPECT_NE(out.find(" on node1, are unreachable"), std::string::npos) << out;
  EXPECT_NE(out.find("poll returned " + std::to_string(ExpectedLossError())),
            std::string::npos)
      << out;
  // The other job, on the surviving node, heard nothing of it.
  std::ofstream(bystanders.rv + "/stop") << "1\n";
  EXPECT_EQ(bystanders.rank0.Wait(10), 0) << bystanders.Errors();
  EXPECT_EQ(bystanders.rank1.Wait(10), 0)
      << ReadFile(bystanders.rv + "/1.out") << bystanders.Errors();
  pair.rank0.Wait(5);
  a->Stop();
  EXPECT_TRUE(b->Stop());
}

TEST_F(FabricTest, AReceiverKilledOnAnotherNodeFailsItsSender) {
  struct Case {
    const char* sender_role;
    const char* ready;
    const char* what;
    const char* survivor_says;
    bool kept;
  };
  const Case cases[] = {
      // The receiver posted receives and never reads: its job's inbox on
      // node 2 fills, and node 2 stops reading from node 1 (back-pressure)
      // until the receiver is gone. The receiver's dead chunks come back.
      {"stuck-sender", "stuck",
       "receiver killed: the other node's sender failed", "other traffic ok",
       false},
      // 400 unexpected eager messages of 60000 B, every eighth synchronous:
      // node 2 keeps payloads past half the inbox and node 1 sends the rest
      // as envelopes (daemon/remote/remote.h, back-pressure 3). The receiver's
      // death ends every synchronous and rendezvous send with an error.
      {"unexpected-sender", "unreceived",
       "receiver killed with payloads kept: the sender failed", "0 left open",
       true},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.sender_role);
    auto a = StartNode(0);
    auto b = StartNode(1);
    std::string out = KillClient(*a, *b, c.sender_role,
                                 c.kept ? "silent-receiver" : "idle-receiver",
                                 /*kill_sender=*/false, c.ready, c.what);
    EXPECT_NE(out.find(c.survivor_says), std::string::npos) << out;
    if (c.kept) {
      RunResult sa = Psmctl(dir_, *a, {"stats", "--format", "json"});
      RunResult sb = Psmctl(dir_, *b, {"stats", "--format", "json"});
      EXPECT_GT(JsonNumber(sb.out, "peer_nodes", "kept"), 0) << sb.out;
      EXPECT_GT(JsonNumber(sa.out, "peer_nodes", "eager_offs"), 0) << sa.out;
      printf("%s", out.c_str());
    }
    ExchangeGoesOnThenStop(*a, *b);
  }
}

TEST_F(FabricTest, AFloodAtAnIdleReceiverOnAnotherNodeIsHeldBackNotBuffered) {
  // 200 Ki messages of 8 B and 256 MiB of 32 KiB ones at a receiver on node
  // 2 that posts nothing for 3 s: once the unexpected ones hold half its
  // job's inbox, node 2 keeps the eager payloads that were in flight and
  // asks node 1 for envelopes only (kEagerOff), whose daemon then sends
  // them as rendezvous ones; once its budget (16 MiB) is full, node 2 parks
  // what was in flight and switches the receiver off at node 1 (kXoff),
  // which holds its sender. Neither daemon grows by more than budget, inbox
  // and park plus fixed overhead, and every message arrives in order,
  // intact.
  constexpr long long kBudgetMiB = 16;
  // A fabric timeout shorter than the receiver's idle time: the connection
  // of a stalled receiver (parked, or paused with a zero TCP window past
  // the park's cap) must survive it, and heartbeats must not declare such
  // a peer dead. (Scaled: a sanitizer build's worker turns too slowly for
  // 1 s heartbeats.)
  std::vector<std::string> extra = {
      "--unexpected-mib", std::to_string(kBudgetMiB), "--fabric-timeout-ms",
      std::to_string(static_cast<int>(1000 * TimeScale()))};
  auto a = StartNode(0, extra);
  auto b = StartNode(1, extra);
  // The connection first: what setting it up costs is fixed, not held for
  // the flood (ofi_rxm preposts a receive pool of 4096 16 KiB buffers,
  // FI_OFI_RXM_MSG_RX_SIZE, in each endpoint's first connection: about
  // 40 MiB each for the ofi backend's contact and listen endpoints).
  RunResult warm = Exchange(*a, *b, "warm", 10, 100);
  ASSERT_EQ(warm.exit_code, 0) << warm.err;
  std::string rv = Rendezvous("flood");
  const long long base_a = ResidentKiB(a->pid()),
                  base_b = ResidentKiB(b->pid());
  auto args = [&](int rank) {
    return FloodArgs(
        rv, rank, 3,
        {"--small", "204800", "--bytes", std::to_string(256 << 20)});
  };
  Process receiver =
      Process::Start(args(1), b->ClientEnv(), rv + "/r1.out", rv + "/r1.err");
  Process sender =
      Process::Start(args(0), a->ClientEnv(), rv + "/r0.out", rv + "/r0.err");
  long long peak_a = base_a, peak_b = base_b;
  int receiver_exit = -1;
  for (int i = 0; i < 2400 && receiver_exit == -1; i++) {
    peak_a = std::max(peak_a, ResidentKiB(a->pid()));
    peak_b = std::max(peak_b, ResidentKiB(b->pid()));
    receiver_exit = receiver.Wait(0.05);
  }
  ASSERT_EQ(receiver_exit, 0) << ReadFile(rv + "/r1.err") << b->Log();
  ASSERT_EQ(sender.Wait(30), 0) << ReadFile(rv + "/r0.err");
  EXPECT_NE(ReadFile(rv + "/r1.out").find(" 0 wrong"), std::string::npos)
      << ReadFile(rv + "/r1.out");
  const long long kFixedOverheadKiB = 16 << 10;
  // The receiving daemon also writes the job's inbox (8 MiB, shared memory
  // that counts in its resident set once touched).
  const long long kInboxKiB = 8 << 10;
  // And it may park or keep what was in flight when it switched the
  // receiver off (daemon/remote/remote.h, back-pressure 4: kParkMax, 16 MiB per
  // connection).
  const long long kParkKiB = 16 << 10;
  // The ofi backend holds in the daemon what TCP leaves in the kernel's
  // socket buffers: bytes sent ahead of the receiver's receives, up to its
  // 2 MiB window per connection (hw/ofi/ofi_fabric.cc), its registered
  // send and receive buffers (2 MiB), and the provider's own buffers. The
  // receiving psmd grew 38 MiB over tcp;ofi_rxm against 33 MiB over
  // sockets here, once the connection was set up (above).
  const long long kBackendKiB = OfiProvider().empty() ? 0 : 8 << 10;
  if (MemoryBoundsMeaningful()) {
    EXPECT_LE(peak_b - base_b, (kBudgetMiB << 10) + kFixedOverheadKiB +
                                   kInboxKiB + kParkKiB + kBackendKiB)
        << "receiving psmd grew from " << base_b << " KiB to " << peak_b;
    EXPECT_LE(peak_a - base_a,
              (kBudgetMiB << 10) + kFixedOverheadKiB + kBackendKiB)
        << "sending psmd grew from " << base_a << " KiB to " << peak_a;
  }
  RunResult sa = Psmctl(dir_, *a, {"stats", "--format", "json"});
  RunResult sb = Psmctl(dir_, *b, {"stats", "--format", "json"});
  printf(
      "flood across nodes: psmd grew %lld KiB (sender's node), %lld KiB "
      "(receiver's); node 2 kept %lld payloads, parked %lld frames, node 1 "
      "had %lld kEagerOff, %lld kXoff\n",
      peak_a - base_a, peak_b - base_b,
      JsonNumber(sb.out, "peer_nodes", "kept"),
      JsonNumber(sb.out, "peer_nodes", "parked"),
      JsonNumber(sa.out, "peer_nodes", "eager_offs"),
      JsonNumber(sa.out, "peer_nodes", "xoffs"));
  // Both kinds of back-pressure happened, and reached the sender: its
  // eager payloads were kept and the rest asked for as envelopes, and its
  // sends were held. With shards the receiver's budget is checked on its
  // own shard, after shard 0 placed the payload (mq_engine.h invariant
  // 12), and every payload for it takes the inbox's share for unexpected
  // messages: whether that share stays full long enough for payloads to be
  // kept is a matter of timing (in most runs here it did not: the frames
  // parked and kXoff held the sender); one of the two must reach it.
  // With one worker too it is timing: here 64 and 1 payloads kept (1
  // kEagerOff each) in two runs, none in a CI run (46,795 frames parked
  // and 89 kXoff instead). Either is back-pressure reaching the sender.
  const long long eager_offs = JsonNumber(sa.out, "peer_nodes", "eager_offs");
  EXPECT_GT(eager_offs + JsonNumber(sa.out, "peer_nodes", "xoffs"), 0)
      << sa.out;
  EXPECT_GT(JsonNumber(sa.out, "total", "sends_held"), 0) << sa.out;
  // Idle for three timeouts: heartbeats keep the connection.
  std::this_thread::sleep_for(std::chrono::seconds(3));
  RunResult after = Exchange(*a, *b, "after", 100, 1000);
  EXPECT_EQ(after.exit_code, 0) << after.err;
  EXPECT_EQ(a->Log().find("ended"), std::string::npos) << a->Log();
  EXPECT_EQ(b->Log().find("ended"), std::string::npos) << b->Log();
  sa = Psmctl(dir_, *a, {"stats", "--format", "json"});
  EXPECT_EQ(JsonNumber(sa.out, "peer_nodes", "connects"), 1) << sa.out;
  ExpectShardsCrossed(*a);
  ExpectShardsCrossed(*b);
  EXPECT_TRUE(a->Stop());
  EXPECT_TRUE(b->Stop());
}

// Job F floods a receiver on node 2 that makes no progress for a while
// (tests/programs/flood with `flood_args`); its frames park at node 2,
// which switches that endpoint off at node 1 (kXoff), so node 1 holds back
// F's frames; or its eager payloads are kept at node 2, which asks node 1
// for envelopes only (kEagerOff). Job B's exchange over the same
// connection meanwhile runs at full speed, and F's messages all arrive, in
// order and intact, once its receiver reads (daemon/remote/remote.h,
// back-pressure).
void FabricTest::StallOneTenant(const std::vector<std::string>& flood_args,
                                bool sends_held, bool read_by_rma) {
  auto a = StartNode(0);
  auto b = StartNode(1);
  const int idle = static_cast<int>(8 * TimeScale());
  std::string rv = Rendezvous("flood");
  auto args = [&](int rank) { return FloodArgs(rv, rank, idle, flood_args); };
  auto peer_row = [&](const Daemon& d, const char* field) {
    return JsonNumber(Psmctl(dir_, d, {"stats", "--format", "json"}).out,
                      "peer_nodes", field);
  };
  const auto start = std::chrono::steady_clock::now();
  Process receiver =
      Process::Start(args(1), b->ClientEnv(), rv + "/r1.out", rv + "/r1.err");
  Process sender =
      Process::Start(args(0), a->ClientEnv(), rv + "/r0.out", rv + "/r0.err");
  auto switched = [&] {  // -1: not connected yet
    // (Read by RMA: node 2 read F's first chunks.)
    return read_by_rma ? std::max(peer_row(*b, "rma_reads"), 0LL)
                       : std::max(peer_row(*a, "xoffs"), 0LL) +
                             std::max(peer_row(*a, "eager_offs"), 0LL);
  };
  auto since_start = [&] {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() -
                                         start)
        .count();
  };
  // Until node 2 has switched the receiver off, or to envelopes only; at
  // most until 3 s before the receiver wakes, by the clock (a count of
  // polls was not: under load the psmctl calls took so long that over ofi
  // the bystander started 8.3 s after the flood, as the idle receiver woke,
  // and ended 0.2 s later). The bystander must end before the receiver
  // wakes either way.
  long long xoffs = 0;
  while (xoffs <= 0 && since_start() < idle - 3.0 * TimeScale()) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    xoffs = switched();
  }
  const double started_after = since_start();
  RunResult bystander =
      Exchange(*a, *b, "bystander", 200, 100000, kJobB, kJobB);
  const double done_after = since_start();
  EXPECT_EQ(bystander.exit_code, 0) << bystander.err;
  // Done while the flood's receiver still idled: nothing waited for it.
  EXPECT_LT(done_after, idle)
      << "job B's exchange ended " << done_after << " s after the flood began"
      << " (started after " << started_after << " s)\nnode 1:\n"
      << a->Log() << "\nnode 2:\n"
      << b->Log();
  // Back-pressure reached node 1, before the bystander or beside it.
  if (xoffs <= 0) xoffs = switched();
  EXPECT_GT(xoffs, 0) << b->Log();
  if (!read_by_rma) {
    EXPECT_GT(peer_row(*b, "parked") + peer_row(*b, "kept"), 0);
  }
  if (sends_held) {
    // The back-pressure reached F's sender: psmd held its sends, or, once
    // its pool region had refused space for shm::kPoolStallNs, its library
    // sent the rest of its eager messages by rendezvous, which wait for the
    // receiver (docs/design.md, "Payload pool"). Job B's exchange has ended:
    // F's endpoint is the node's only one.
    RunResult sa = Psmctl(dir_, *a, {"stats", "--format", "json"});
    EXPECT_GT(JsonNumber(sa.out, "total", "sends_held") +
                  JsonNumber(sa.out, "endpoints", "rndv_msgs_sent"),
              0)
        << sa.out;
  }
  printf(
      "bystander exchange beside a stalled tenant: started %.2f s and "
      "ended %.2f s after the flood began (its receiver idles %d s); node 2 "
      "parked %lld frames and kept %lld payloads, node 1 had %lld kXoff\n",
      started_after, done_after, idle, peer_row(*b, "parked"),
      peer_row(*b, "kept"), peer_row(*a, "xoffs"));
  ASSERT_EQ(receiver.Wait(60), 0) << ReadFile(rv + "/r1.err") << b->Log();
  ASSERT_EQ(sender.Wait(30), 0) << ReadFile(rv + "/r0.err");
  EXPECT_NE(ReadFile(rv + "/r1.out").find(" 0 wrong"), std::string::npos)
      << ReadFile(rv + "/r1.out");
  // Parking never had to fall back to pausing the connection.
  EXPECT_EQ(b->Log().find("parked for slow receivers"), std::string::npos)
      << b->Log();
  EXPECT_TRUE(a->Stop());
  EXPECT_TRUE(b->Stop());
}

TEST_F(FabricTest, AnotherTenantsIdleReceiverDoesNotStallTheConnection) {
  // Eager messages to a receiver with nothing posted: past half its job's
  // inbox their payloads are kept, the rest come as envelopes only; its
  // sender's library sends by rendezvous once its own eager messages hold
  // half its region (or psmd holds its sends over budget).
  //
  // Only 32 KiB ones, with no 8-byte messages first (those against the
  // unexpected budget are AFloodAtAnIdleReceiverOnAnotherNodeIsHeldBack...
  // 's). Behind 20,000 of them the payloads' kSendDone (the peer's ack,
  // which frees their chunks in the sender's region) came 12-37 ms after
  // their post over ofi (1,600-5,000 frames unacknowledged ahead), 3-12 ms
  // over sockets; 10 ms after its half of the region first refused space
  // (shm::kPoolStallNs) the sender's library sent the rest by rendezvous,
  // and the flood stopped, its 64 sends all rendezvous ones waiting for the
  // receiver: 127 payloads reached node 2, just what the receiver's half
  // of its inbox admits, so nothing parked or was kept and no kXoff came
  // (over ofi 9 of 19 runs, over sockets 1 of about 23). F was held back at
  // its source, as designed, and the bystander had nothing to be judged
  // against (docs/design.md, "A window per receiving endpoint").
  StallOneTenant({"--small", "0", "--bytes", std::to_string(64 << 20)},
                 /*sends_held=*/true);
}

TEST_F(FabricTest, AnotherTenantsFullInboxDoesNotStallTheConnection) {
  // 4 MiB rendezvous messages into receives posted before the receiver
  // stops making progress: their chunks fill its job's inbox and park (or,
  // read by RMA over ofi, wait in the sender's pool).
  StallOneTenant({"--small", "0", "--large", std::to_string(4 << 20), "--bytes",
                  std::to_string(64 << 20), "--post-first", "1"},
                 /*sends_held=*/false, /*read_by_rma=*/!OfiProvider().empty());
}

TEST_F(FabricTest, AnotherTenantsIdleActiveMessageTargetDoesNotStall) {
  // 20,000 active-message requests of 1 KiB at a target that polls
  // nothing: past its completion ring and 1024 waiting completions (and
  // then its job's inbox) they park.
  StallOneTenant({"--am", "20000"}, /*sends_held=*/false);
}

// A node of the test's own (node 3, authenticated with the same munged)
// speaking to psmd through hw::Fabric directly.
struct RawNode {
  std::unique_ptr<hw::Fabric> fabric;
  hw::ConnId conn = 0;
  // Opens a fabric as node 3 (127.0.0.4, MUNGE through `munge_socket`) and
  // connects to node 1 at `listen`.
  ::testing::AssertionResult Join(const std::string& munge_socket,
                                  const std::string& listen) {
    hw::FabricOptions options;
    options.node_id = 3;
    options.listen = {"127.0.0.4"};
    options.munge_socket = munge_socket;
    options.sessions = Sessions();
    options.rma = true;
    std::string error;
    options.provider = OfiProvider();
    fabric = options.provider.empty() ? hw::OpenSocketFabric(options, &error)
                                      : hw::OpenOfiFabric(options, &error);
    if (!fabric) return ::testing::AssertionFailure() << error;
    if (fabric->Connect("1@" + listen, 1, &conn) != hw::ErrorClass::kOk) {
      return ::testing::AssertionFailure() << "cannot connect to " << listen;
    }
    hw::Event e;
    if (!Await(hw::EventType::kConnected, &e)) {
      return ::testing::AssertionFailure() << "not connected within 5 s";
    }
    if (e.error != hw::ErrorClass::kOk) {
      return ::testing::AssertionFailure()
             << "connect failed, class " << static_cast<int>(e.error);
    }
    return ::testing::AssertionSuccess();
  }
  // Waits up to 5 s for an event of `type`.
  bool Await(hw::EventType type, hw::Event* out) {
    auto end = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    while (std::chrono::steady_clock::now() < end) {
      hw::Event e;
      if (fabric->Wait(&e, 1, 50) == 1) {
        if (e.type == type) {
          *out = e;
          return true;
        }
      }
    }
    return false;
  }
};

TEST_F(FabricTest,
       AnAuthenticatedPeerLearnsNothingOfOtherJobsAndBadFramesDrop) {
  auto a = StartNode(0);
  auto b = StartNode(1);
  // An endpoint of job B on node 1 (rank 1 of an exchange that waits).
  std::string rv = Rendezvous("victim");
  Process victim =
      Process::Start(ExchangeArgs(dir_, rv, 1, kJobB, 1, 10, 5), a->ClientEnv(),
                     rv + "/r1.out", rv + "/r1.err");
  uint64_t victim_epid = 0;
  for (int i = 0; i < 500 && victim_epid == 0; i++) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    RunResult list = Psmctl(dir_, *a, {"stats", "--format", "json"});
    size_t at = list.out.find("\"epid\": \"");
    if (at != std::string::npos) {
      victim_epid = strtoull(list.out.c_str() + at + 9, nullptr, 16);
    }
  }
  ASSERT_NE(victim_epid, 0u) << Psmctl(dir_, *a, {"stats"}).out;

  RawNode raw;
  ASSERT_TRUE(raw.Join(munged_.socket(), listen_[0])) << a->Log();

  // kQuery (op 1) for the victim's epid from job A, and for an epid that
  // does not exist: the same answer, so nothing is learnt of job B.
  auto ask = [&](uint64_t dst, uint64_t query) {
    hw::FrameFields f;
    f.op = 1;
    f.uid = 0;
    f.src = (uint64_t{3} << 48) | 7;
    f.dst = dst;
    std::memcpy(f.job,
                "\xfa\xb1\xc0\xde\xaa\xaa\xaa\xaa\xaa\xaa\xaa\xaa"
                "\xaa\xaa\xaa\xaa",
                16);
    f.aux = query;
    // A query's record is all zero (daemon/remote/wire.h: a field its op
    // does not use is refused), so the answer is read elsewhere.
    static const uint8_t record[32] = {};
    iovec out{const_cast<uint8_t*>(record), sizeof(record)};
    EXPECT_EQ(raw.fabric->PostSend(raw.conn, f, &out, 1, query),
              hw::ErrorClass::kOk);
    static uint8_t wire[32] = {};
    iovec iov{wire, sizeof(wire)};
    EXPECT_EQ(raw.fabric->PostRecv(raw.conn, &iov, 1, query),
              hw::ErrorClass::kOk);
    hw::Event answer;
    EXPECT_TRUE(raw.Await(hw::EventType::kRecvDone, &answer));
    int32_t err = 0;
    std::memcpy(&err, wire + 20, 4);  // wire::Record::error
    EXPECT_EQ(answer.fields.op, 2);
    EXPECT_EQ(answer.fields.aux, query);
    return err;
  };
  EXPECT_EQ(ask(victim_epid, 1), 41);         // another job's endpoint
  EXPECT_EQ(ask(victim_epid + 1000, 2), 41);  // no endpoint at all
  EXPECT_NE(a->Log().find("no such endpoint of that job and uid"),
            std::string::npos);

  // An unknown op: psmd drops the connection, logged once.
  hw::FrameFields bad;
  bad.op = 999;
  uint8_t junk[40] = {};
  iovec iov{junk, sizeof(junk)};
  ASSERT_EQ(raw.fabric->PostSend(raw.conn, bad, &iov, 1, 9),
            hw::ErrorClass::kOk);
  // (A closed connection is noticed by a posted receive.)
  ASSERT_EQ(raw.fabric->PostRecv(raw.conn, &iov, 1, 10), hw::ErrorClass::kOk);
  hw::Event e;
  ASSERT_TRUE(raw.Await(hw::EventType::kClosed, &e)) << a->Log();
  EXPECT_NE(a->Log().find("node 3 sent a frame the engine refuses"),
            std::string::npos)
      << a->Log();
  raw.fabric.reset();
  victim.Kill(SIGKILL);
  victim.Wait(5);
  // Node 1 and node 2 go on.
  ExchangeGoesOnThenStop(*a, *b);
}

// Node 3 as a sending daemon with one endpoint (kEpid), to which a receive
// posted on node 1 connects: while it waits for psmd's frames it answers
// that receiver's connect query and sends heartbeats, as a daemon would;
// it sends frames to that receiver.
struct SendingNode : RawNode {
  static constexpr uint64_t kEpid =
      (uint64_t{3} << 48) | (uint64_t{7} << 32) | 9;
  explicit SendingNode(int ping_ms) : ping_ms(ping_ms) {}
  SendingNode(const SendingNode&) = delete;  // in_iov points into it
  SendingNode& operator=(const SendingNode&) = delete;

  // The fields of a frame of `op` from kEpid to the receiver (its epid,
  // job and uid as its query named them).
  hw::FrameFields To(uint16_t op, uint64_t aux, uint64_t offset) const {
    hw::FrameFields f = receiver_side;
    f.op = op;
    std::swap(f.src, f.dst);
    f.aux = aux;
    f.offset = offset;
    return f;
  }
  // Sends record `r`, and the 24 bytes of `region` after it if given.
  hw::ErrorClass Send(const hw::FrameFields& f, const WireRecord& r,
                      const uint64_t* region = nullptr) {
    static uint8_t body[56];
    std::memcpy(body, &r, sizeof(r));
    size_t n = sizeof(r);
    if (region != nullptr) {
      std::memcpy(body + n, region, 24);
      n += 24;
    }
    iovec out{body, n};
    return fabric->PostSend(conn, f, &out, 1, cookie++);
  }
  hw::ErrorClass Send(uint16_t op, uint64_t aux, uint64_t offset,
                      const WireRecord& r, const uint64_t* region = nullptr) {
    return Send(To(op, aux, offset), r, region);
  }
  // Frames from psmd until one of op `op` (its record then in Received()),
  // or until `until` says so; false after 10 s, or once the connection
  // closed (`closed` then).
  bool AwaitOp(uint16_t op, hw::Event* got,
               const std::function<bool()>& until = nullptr) {
    auto end = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    auto ping_at = std::chrono::steady_clock::now();
    bool posted = false;
    while (std::chrono::steady_clock::now() < end) {
      if (until && until()) return true;
      if (std::chrono::steady_clock::now() >= ping_at) {
        hw::FrameFields ping;
        ping.op = 13;
        static const uint8_t zero[32] = {};
        iovec out{const_cast<uint8_t*>(zero), sizeof(zero)};
        fabric->PostSend(conn, ping, &out, 1, cookie++);
        ping_at += std::chrono::milliseconds(ping_ms);
      }
      if (!posted) {
        fabric->PostRecv(conn, &in_iov, 1, 1);
        posted = true;
      }
      hw::Event e;
      if (fabric->Wait(&e, 1, 20) != 1) continue;
      if (e.type == hw::EventType::kClosed) {
        closed = true;
        return false;
      }
      if (e.type != hw::EventType::kRecvDone) continue;
      posted = false;
      seen.push_back(e.fields.op);
      if (e.fields.op == 1) {  // kQuery: the receiver connects to kEpid
        receiver_side = e.fields;
        Send(2, e.fields.aux, 0, WireRecord{});
        continue;
      }
      if (e.fields.op == op) {
        *got = e;
        return true;
      }
    }
    return false;
  }
  WireRecord Received() const {
    WireRecord r;
    std::memcpy(&r, in, sizeof(r));
    return r;
  }

  int ping_ms;
  hw::FrameFields receiver_side;  // the receiver's epid, job and uid
  uint8_t in[64] = {};
  iovec in_iov{in, sizeof(in)};
  uint64_t cookie = 100;
  std::vector<int> seen;  // the ops psmd sent, in order
  bool closed = false;
};

std::unique_ptr<Daemon> FabricTest::StartNodeForNode3() {
  std::vector<std::string> flags = Flags(0);
  flags.insert(flags.end(),
               {"--fabric-timeout-ms", std::to_string(kNode3TimeoutMs)});
  return std::make_unique<Daemon>(node_dir_[0], flags);
}

::testing::AssertionResult FabricTest::RendezvousFromNode3(const Daemon& a,
                                                           SendingNode& node,
                                                           uint32_t bytes,
                                                           Node3Receiver* out,
                                                           uint64_t* transfer) {
  if (!node.Join(munged_.socket(), listen_[0])) {
    return ::testing::AssertionFailure() << "node 3 cannot join" << a.Log();
  }
  out->rv = Rendezvous("node3");
  std::ofstream(out->rv + "/rank0.epid") << SendingNode::kEpid << "\n";
  out->process = Process::Start(
      {Runfile("tests/programs/peer_death"), "--role", "posted-receiver",
       "--rank", "1", "--dir", out->rv, "--uuid", kJobA},
      a.ClientEnv(), out->rv + "/1.out", out->rv + "/1.err");
  hw::Event e;
  // The receiver connects (its kQuery answered) and posts its receive.
  const std::string posted = out->rv + "/posted";
  if (!node.AwaitOp(0, &e, [&] { return access(posted.c_str(), F_OK) == 0; })) {
    return ::testing::AssertionFailure()
           << "no receive posted\n"
           << ReadFile(out->rv + "/1.err") << a.Log();
  }
  // The request-to-send (kEnvelope with the rendezvous flag), matched at
  // once: psmd answers kRndvGo offering RMA (bit 62 of the transfer id).
  WireRecord rts{};
  rts.tag[0] = 1;
  rts.len = bytes;
  rts.flags = 1u << 31;
  if (node.Send(3, 5, 0, rts) != hw::ErrorClass::kOk || !node.AwaitOp(6, &e) ||
      e.fields.aux != 5) {
    return ::testing::AssertionFailure() << "no kRndvGo\n" << a.Log();
  }
  *transfer = node.Received().x;
  if ((*transfer & (1ull << 62)) == 0) {
    return ::testing::AssertionFailure() << "RMA not offered";
  }
  return ::testing::AssertionSuccess();
}

::testing::AssertionResult FabricTest::Node3ReceiveFailed(Node3Receiver& r,
                                                          int* error,
                                                          long long* ended_ms,
                                                          std::string* landed) {
  const int code = r.process.Wait(10);
  const std::string out = ReadFile(r.rv + "/1.out");
  if (code != 0) {
    return ::testing::AssertionFailure()
           << "the receiver exited " << code << " (0: its receive failed)\n"
           << out << ReadFile(r.rv + "/1.err");
  }
  if (sscanf(out.c_str(), "ended %d at %lld", error, ended_ms) != 2) {
    return ::testing::AssertionFailure() << "no \"ended\" line: " << out;
  }
  const size_t at = out.find("landed");
  *landed = at == std::string::npos ? out : out.substr(at);
  while (!landed->empty() && landed->back() == '\n') landed->pop_back();
  return ::testing::AssertionSuccess();
}

long long MonotonicMs(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             t.time_since_epoch())
      .count();
}

TEST_F(FabricTest, AnRmaPieceWithAForgedKeyFailsTheReceiveNotTheDaemon) {
  // The test's own node 3 plays a sending daemon that announces a
  // rendezvous piece with a key it never registered. psmd's read fails;
  // over tcp;ofi_rxm the tcp provider also drops the connection under it
  // (seen here: the read ends FI_ECANCELED and psmd's next send finds the
  // endpoint not connected), so the forger loses its connection, and the
  // receive fails with PSM2_TIMEOUT within --fabric-timeout-ms, as for a
  // streamed rendezvous from a dead peer (had the connection lived, the
  // read would be retried until the timeout and node 3 told with kError
  // and an erring kRndvReadDone). The daemon serves on. Over sockets
  // nothing is offered; over udp;ofi_rxd such a read never completes
  // (docs/design.md, "RMA reads"): tcp;ofi_rxm only.
  if (OfiProvider() != "tcp;ofi_rxm") GTEST_SKIP() << "over tcp;ofi_rxm only";
  auto a = StartNodeForNode3();
  SendingNode node(kNode3TimeoutMs / 4);
  Node3Receiver receiver;
  uint64_t transfer = 0;
  // A 64 MiB message (the receive's whole buffer).
  ASSERT_TRUE(RendezvousFromNode3(*a, node, 64u << 20, &receiver, &transfer));
  // A piece of it, in a region whose key node 3 never registered.
  WireRecord piece{};
  piece.tag[0] = 77;  // its piece id
  piece.len = 256 << 10;
  const uint64_t region[3] = {0, 0xdeadbeefcafeull, 64u << 20};
  auto sent_at = std::chrono::steady_clock::now();
  ASSERT_EQ(node.Send(19, transfer, 0, piece, region), hw::ErrorClass::kOk);
  // Node 3 is told (the piece back with an error, after kError for its
  // send), or loses its connection (AwaitOp is false then).
  // The piece may also come back without an error: psmd reads it again
  // once a broken connection resumed, and that read has completed without
  // one (CI runs, 2026-12-07: the first read failed, the retry after the
  // resume did not; not root-caused: node 3's provider served the key, or
  // reported a read done that was not). Either way only the forger's own
  // message is touched: the read names node 3's memory and lands in the
  // inbox chunk of this transfer, whose receive still fails within the
  // timeout, below.
  hw::Event e;
  if (node.AwaitOp(20, &e)) {
    EXPECT_EQ(e.fields.aux, 77u);
    if (node.Received().error != 0) {
      EXPECT_NE(std::find(node.seen.begin(), node.seen.end(), 11),
                node.seen.end())
          << "no kError before the piece came back";
    } else {
      printf("forged key: node 3's provider served the read psmd retried\n");
    }
  }
  // The receive failed with PSM2_TIMEOUT, within the timeout.
  int error = 0;
  long long ended_ms = 0;
  std::string landed;
  ASSERT_TRUE(Node3ReceiveFailed(receiver, &error, &ended_ms, &landed))
      << a->Log();
  // (Before reads waited for a broken connection's session to resume, the
  // read posted meanwhile failed the receive at once with
  // PSM2_EPID_UNREACHABLE, unlike a streamed rendezvous.)
  EXPECT_EQ(error, 11) << a->Log();  // PSM2_TIMEOUT
  EXPECT_LE(ended_ms - MonotonicMs(sent_at), kNode3TimeoutMs + 1500)
      << a->Log();
  printf("forged key: the receive failed with %d after %lld ms\n", error,
         ended_ms - MonotonicMs(sent_at));
  EXPECT_NE(a->Log().find("an RMA read of 262144 bytes from node 3 failed"),
            std::string::npos)
      << a->Log();
  node.fabric.reset();
  // The daemon serves on: nodes 1 and 2 exchange.
  auto b = std::make_unique<Daemon>(node_dir_[1], Flags(1));
  ExchangeGoesOnThenStop(*a, *b);
}

size_t Occurrences(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos;
       at = text.find(what, at + what.size())) {
    n++;
  }
  return n;
}

void FabricTest::ExpectRoguePieceDropped(Daemon& a, const char* what,
                                         const RogueEdit& edit, int nth) {
  SCOPED_TRACE(what);
  constexpr uint32_t kPiece = RoguePiece::kPiece;
  // Node 3's pool: the first piece's bytes (0x11), then bytes no proper
  // piece names (0x22); and a second region of those alone. Registered
  // with node 3's fabric, so psmd's reads of them work.
  std::vector<uint8_t> own(2u << 20, 0x22), other(2u << 20, 0x22);
  std::fill(own.begin(), own.begin() + kPiece, 0x11);
  SendingNode node(kNode3TimeoutMs / 4);
  Node3Receiver receiver;
  uint64_t transfer = 0;
  ASSERT_TRUE(
      RendezvousFromNode3(a, node, RoguePiece::kMessage, &receiver, &transfer));
  hw::RegionId own_id = 0, other_id = 0;
  hw::RemoteRegion own_region, other_region;
  ASSERT_EQ(
      node.fabric->RegisterRegion(own.data(), own.size(), &own_id, &own_region),
      hw::ErrorClass::kOk);
  ASSERT_EQ(node.fabric->RegisterRegion(other.data(), other.size(), &other_id,
                                        &other_region),
            hw::ErrorClass::kOk);
  // The second piece as it should be (the next 256 KiB, from the 0x22
  // bytes), and then as `edit` makes it.
  RoguePiece p;
  p.f = node.To(19, transfer, kPiece);
  p.r = WireRecord{};
  p.r.tag[0] = 2;  // its piece id
  p.r.len = kPiece;
  p.r.x = kPiece;
  p.region[0] = own_region.addr;
  p.region[1] = own_region.key;
  p.region[2] = own_region.length;
  p.other_key = other_region.key;
  edit(p);
  // The first piece, proper: psmd reads it and says so; or it streams.
  if (p.first_streamed) {
    iovec chunk{own.data(), kPiece};
    ASSERT_EQ(node.fabric->PostSend(node.conn, node.To(7, transfer, 0), &chunk,
                                    1, node.cookie++),
              hw::ErrorClass::kOk);
  } else {
    WireRecord first = p.r;
    first.tag[0] = 1;
    first.x = 0;
    first.len = kPiece;
    const uint64_t region[3] = {own_region.addr, own_region.key,
                                own_region.length};
    ASSERT_EQ(node.Send(19, transfer, 0, first, region), hw::ErrorClass::kOk);
    hw::Event e;
    ASSERT_TRUE(node.AwaitOp(20, &e)) << a.Log();
    ASSERT_EQ(e.fields.aux, 1u);
    ASSERT_EQ(node.Received().error, 0) << a.Log();
  }
  const auto sent_at = std::chrono::steady_clock::now();
  ASSERT_EQ(node.Send(p.f, p.r, p.region), hw::ErrorClass::kOk);
  // psmd drops the connection: no read, no kRndvReadDone.
  hw::Event e;
  EXPECT_FALSE(node.AwaitOp(20, &e)) << "the piece was read\n" << a.Log();
  EXPECT_TRUE(node.closed) << a.Log();
  // The receive fails as when any connection ends (every request waiting
  // on that node fails): at once, and its buffer holds the first piece
  // and nothing of the second.
  int error = 0;
  long long ended_ms = 0;
  std::string landed;
  ASSERT_TRUE(Node3ReceiveFailed(receiver, &error, &ended_ms, &landed))
      << a.Log();
  printf("%s: the receive failed with %d after %lld ms\n", what, error,
         ended_ms - MonotonicMs(sent_at));
  EXPECT_EQ(error, 41) << a.Log();  // PSM2_EPID_UNREACHABLE
  EXPECT_LE(ended_ms - MonotonicMs(sent_at), kNode3TimeoutMs) << a.Log();
  EXPECT_EQ(landed, "landed 11x" + std::to_string(kPiece) + " 00x" +
                        std::to_string((64u << 20) - kPiece));
  // Logged once, and counted, per connection dropped.
  EXPECT_EQ(Occurrences(a.Log(),
                        "node 3 sent a frame the engine refuses (RMA piece "
                        "not of its transfer, or out of order)"),
            static_cast<size_t>(nth))
      << a.Log();
  RunResult st = Psmctl(dir_, a, {"stats", "--format", "json"});
  EXPECT_EQ(JsonNumber(st.out, "peer_nodes", "node"), 3) << st.out;
  EXPECT_EQ(JsonNumber(st.out, "peer_nodes", "malformed"), nth) << st.out;
}

void FabricTest::EachRoguePieceDropsItsPeer(
    const std::vector<std::pair<const char*, RogueEdit>>& rogues) {
  auto a = StartNodeForNode3();
  for (size_t i = 0; i < rogues.size(); i++) {
    ExpectRoguePieceDropped(*a, rogues[i].first, rogues[i].second,
                            static_cast<int>(i + 1));
  }
  auto b = std::make_unique<Daemon>(node_dir_[1], Flags(1));
  ExchangeGoesOnThenStop(*a, *b);
}

// A kRndvRead must name the transfer's next bytes (issue 34 item 2:
// nothing from the peer is trusted): a piece after a gap, or at an offset
// already read, drops the connection.
TEST_F(FabricTest, AnRmaPieceOutOfOrderDropsItsPeer) {
  if (OfiProvider() != "tcp;ofi_rxm") GTEST_SKIP() << "over tcp;ofi_rxm only";
  EachRoguePieceDropsItsPeer({
      {"a gap", [](RoguePiece& p) { p.f.offset += RoguePiece::kPiece; }},
      {"the first piece's offset again", [](RoguePiece& p) { p.f.offset = 0; }},
  });
}

// Every piece of a transfer names the region its first piece named.
TEST_F(FabricTest, AnRmaPieceInAnotherRegionThanTheFirstDropsItsPeer) {
  if (OfiProvider() != "tcp;ofi_rxm") GTEST_SKIP() << "over tcp;ofi_rxm only";
  EachRoguePieceDropsItsPeer({
      {"another key", [](RoguePiece& p) { p.region[1] = p.other_key; }},
      {"another address",
       [](RoguePiece& p) { p.region[0] += RoguePiece::kPiece; }},
      {"another length", [](RoguePiece& p) { p.region[2] /= 2; }},
  });
}

// A piece is for the transfer's sending and receiving endpoints, job and
// uid (node 3's other endpoint, or a receiver's epid, job or uid that are
// not the transfer's).
TEST_F(FabricTest, AnRmaPieceForAnotherEndpointJobOrUidDropsItsPeer) {
  if (OfiProvider() != "tcp;ofi_rxm") GTEST_SKIP() << "over tcp;ofi_rxm only";
  EachRoguePieceDropsItsPeer({
      {"another receiving endpoint", [](RoguePiece& p) { p.f.dst++; }},
      {"another job", [](RoguePiece& p) { p.f.job[15] ^= 1; }},
      {"another uid", [](RoguePiece& p) { p.f.uid++; }},
      {"another sending endpoint", [](RoguePiece& p) { p.f.src++; }},
  });
}

// A piece lies within the message: one byte more than what remains of it
// drops the connection.
TEST_F(FabricTest, AnRmaPieceLongerThanTheRestOfTheMessageDropsItsPeer) {
  if (OfiProvider() != "tcp;ofi_rxm") GTEST_SKIP() << "over tcp;ofi_rxm only";
  EachRoguePieceDropsItsPeer({
      {"one byte too long",
       [](RoguePiece& p) {
         p.r.len = RoguePiece::kMessage - RoguePiece::kPiece + 1;
       }},
  });
}

// A transfer whose first bytes streamed takes no piece to read (a chunk
// may still be parked, and would reach the receiver after the reads).
TEST_F(FabricTest, AnRmaPieceAfterAStreamedChunkDropsItsPeer) {
  if (OfiProvider() != "tcp;ofi_rxm") GTEST_SKIP() << "over tcp;ofi_rxm only";
  EachRoguePieceDropsItsPeer({
      {"after a streamed chunk",
       [](RoguePiece& p) { p.first_streamed = true; }},
  });
}

TEST_F(FabricTest, APeerThatFallsSilentIsClosedWithinTheTimeout) {
  // The test's own node 3 connects and then says nothing (no heartbeats),
  // as a hung daemon or a dead link would: psmd closes the connection
  // within about --fabric-timeout-ms, though TCP still acknowledges.
  std::vector<std::string> flags = Flags(0);
  flags.push_back("--fabric-timeout-ms");
  flags.push_back("1000");
  auto a = std::make_unique<Daemon>(node_dir_[0], flags);
  RawNode raw;
  ASSERT_TRUE(raw.Join(munged_.socket(), listen_[0])) << a->Log();
  auto connected_at = std::chrono::steady_clock::now();
  // Read psmd's heartbeats (so our receive sees the close), send none.
  uint8_t buf[64];
  iovec iov{buf, sizeof(buf)};
  bool closed = false;
  while (!closed && std::chrono::steady_clock::now() - connected_at <
                        std::chrono::seconds(5)) {
    raw.fabric->PostRecv(raw.conn, &iov, 1, 1);
    hw::Event ev;
    if (raw.fabric->Wait(&ev, 1, 100) == 1 &&
        ev.type == hw::EventType::kClosed) {
      closed = true;
    }
  }
  auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                std::chrono::steady_clock::now() - connected_at)
                .count();
  EXPECT_TRUE(closed) << a->Log();
  EXPECT_GE(ms, 900);
  EXPECT_LE(ms, 2500) << a->Log();
  printf("a silent peer was closed after %lld ms (timeout 1000 ms)\n",
         static_cast<long long>(ms));
  EXPECT_NE(a->Log().find("node 3 silent"), std::string::npos) << a->Log();
  raw.fabric.reset();
  EXPECT_TRUE(a->Stop());
}

TEST_F(FabricTest, TimeBothDaemonsWereStoppedIsNoPeersSilence) {
  // A host that pauses the VM, or a machine too loaded to run the workers,
  // stops both daemons at once: when they run again, neither may close the
  // connection for a silence nobody was there to hear.
  std::vector<std::string> flags[2] = {Flags(0), Flags(1)};
  for (auto& f : flags) {
    f.push_back("--fabric-timeout-ms");
    f.push_back("1000");
  }
  auto a = std::make_unique<Daemon>(node_dir_[0], flags[0]);
  auto b = std::make_unique<Daemon>(node_dir_[1], flags[1]);
  RunResult before = Exchange(*a, *b, "before", 10, 1000);
  ASSERT_EQ(before.exit_code, 0) << before.err;
  kill(a->pid(), SIGSTOP);
  kill(b->pid(), SIGSTOP);
  std::this_thread::sleep_for(std::chrono::seconds(3));
  kill(a->pid(), SIGCONT);
  kill(b->pid(), SIGCONT);
  std::this_thread::sleep_for(std::chrono::seconds(1));
  RunResult after = Exchange(*a, *b, "after", 10, 1000);
  EXPECT_EQ(after.exit_code, 0) << after.err;
  EXPECT_EQ(a->Log().find("silent"), std::string::npos) << a->Log();
  EXPECT_EQ(b->Log().find("silent"), std::string::npos) << b->Log();
  EXPECT_NE(a->Log().find("not counted against peers"), std::string::npos)
      << a->Log();
  RunResult sa = Psmctl(dir_, *a, {"stats", "--format", "json"});
  EXPECT_EQ(JsonNumber(sa.out, "peer_nodes", "connects"), 1) << sa.out;
  EXPECT_TRUE(a->Stop());
  EXPECT_TRUE(b->Stop());
}

// Random bytes at node 2's fabric port from 16 raw TCP connections instead
// of a handshake: each connection is closed (psmd's challenge may come
// first). Returns how many were.
int SendTcpGarbage(const std::string& host, int port) {
  std::vector<uint8_t> junk(16 << 10);
  uint32_t x = 2463534242u;
  for (uint8_t& byte : junk) {
    x ^= x << 13, x ^= x >> 17, x ^= x << 5;
    byte = static_cast<uint8_t>(x);
  }
  int closed = 0;
  for (int i = 0; i < 16; i++) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in sa{};
    sa.sin_family = AF_INET;
    sa.sin_port = htons(static_cast<uint16_t>(port));
    inet_pton(AF_INET, host.c_str(), &sa.sin_addr);
    timeval limit{5, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &limit, sizeof(limit));
    if (connect(fd, reinterpret_cast<sockaddr*>(&sa), sizeof(sa)) == 0) {
      send(fd, junk.data(), junk.size(), MSG_NOSIGNAL);
      char buf[4096];
      ssize_t n;
      while ((n = recv(fd, buf, sizeof(buf), 0)) > 0) {
      }
      if (n == 0 || (n < 0 && errno == ECONNRESET)) closed++;
    }
    close(fd);
  }
  return closed;
}

TEST_F(FabricTest, GarbageOnTheFabricPortIsDroppedWhileAJobsTrafficGoesOn) {
  auto a = StartNode(0);
  auto b = StartNode(1);
  // While a job exchanges between the nodes, node 2's fabric port gets
  // garbage: over sockets from raw TCP connections, over ofi from a raw
  // libfabric endpoint of the same provider (tests/programs/ofi_garbage:
  // random bytes, a message longer than psmd's buffers, broken prefixes,
  // messages at the wrong endpoint or with a wrong key, at both of the
  // daemon's endpoints, and a contact whose stream is no frame at all).
  const bool ofi = !OfiProvider().empty();
  int closed = 0;
  std::thread tcp;
  Process raw;
  if (ofi) {
    raw = Process::Start(
        {Runfile("tests/programs/ofi_garbage"), "--provider", OfiProvider(),
         "--source", "127.0.0.4", "--target", listen_[1]},
        {}, dir_.path() + "/garbage.out", dir_.path() + "/garbage.err");
  } else {
    const int port = std::stoi(listen_[1].substr(listen_[1].find(':') + 1));
    tcp = std::thread([&] { closed = SendTcpGarbage(addr_[1], port); });
  }
  RunResult r = Exchange(*a, *b, "bystander", 2000, 100000);
  EXPECT_EQ(r.exit_code, 0) << r.err << b->Log();
  // Bad frames of no node (they never authenticated), and psmd is fine.
  long long expected_bad = 16;
  if (ofi) {
    EXPECT_EQ(raw.Wait(30), 0) << ReadFile(dir_.path() + "/garbage.err");
    const std::string out = ReadFile(dir_.path() + "/garbage.out");
    // psmd counted every message it had to drop (those longer than its
    // buffers aside: a provider may lose them, see ofi_garbage), and it
    // answered both proper contacts, the second after all the garbage.
    int garbage = 0, accepted = 0;
    EXPECT_EQ(
        sscanf(out.c_str(), "garbage %d accepted %d", &garbage, &accepted), 2)
        << out;
    printf("raw libfabric endpoint (%s): %s", OfiProvider().c_str(),
           out.c_str());
    EXPECT_EQ(accepted, 2) << out << b->Log();
    EXPECT_GE(garbage, 40) << out;
    expected_bad = garbage;
    // Dropped quietly: one line for all of them (the connection whose
    // stream was garbage has its own).
    const std::string log = b->Log();
    size_t lines = 0;
    for (size_t at = 0;
         (at = log.find("(logged once)", at)) != std::string::npos; at++) {
      lines++;
    }
    EXPECT_EQ(lines, 1u) << log;
  } else {
    tcp.join();
    EXPECT_EQ(closed, 16) << b->Log();
  }
  RunResult sb = Psmctl(dir_, *b, {"stats", "--format", "json"});
  size_t row = sb.out.find("{\"node\": 0,");
  ASSERT_NE(row, std::string::npos) << sb.out;
  EXPECT_GE(JsonNumber(sb.out.substr(row), "", "bad_frames"), expected_bad)
      << sb.out << b->Log();
  RunResult again = Exchange(*b, *a, "after", 200, 100000);
  EXPECT_EQ(again.exit_code, 0) << again.err;
  EXPECT_TRUE(a->Stop());
  EXPECT_TRUE(b->Stop());
}

// Rank 0 of an exchange on `d` whose peer "published" `epid` (no rank 1
// runs): psm2_ep_connect's outcome.
RunResult ConnectTo(const TempDir& dir, const Daemon& d, const std::string& rv,
                    uint64_t epid) {
  std::filesystem::create_directories(rv);
  std::ofstream(rv + "/rank1.epid") << epid << "\n";
  std::ofstream(rv + "/rank11.epid") << 1 << "\n";
  return RunToEnd(dir, ExchangeArgs(dir, rv, 0, kJobA, 1, 10), d.ClientEnv(),
                  30);
}

TEST_F(FabricTest, UnreachableNodesAndStaleEpidsFailToConnectInTime) {
  auto a = StartNode(0);
  const uint64_t node2 = uint64_t{2} << 48, node9 = uint64_t{9} << 48;
  // Node 2 is in the table but its daemon is not running: its addresses
  // are tried again and again (it may be starting) until
  // --fabric-timeout-ms (5 s here), and then the connect fails naming it.
  RunResult down = ConnectTo(dir_, *a, dir_.path() + "/down", node2 | 5);
  EXPECT_EQ(down.exit_code, 3) << down.err;
  EXPECT_NE(down.err.find("node 2"), std::string::npos) << down.err;
  EXPECT_GE(down.seconds, 4.5) << down.err;
  EXPECT_LE(down.seconds, 10) << down.err;
  // Node 9 is not in the table.
  RunResult unknown = ConnectTo(dir_, *a, dir_.path() + "/unknown", node9 | 5);
  EXPECT_EQ(unknown.exit_code, 3) << unknown.err;
  EXPECT_NE(unknown.err.find("not in the node table"), std::string::npos)
      << unknown.err;
  // Node 2 up: an epid of an earlier run of it (another boot nonce) is
  // stale; a live one connects.
  auto b = StartNode(1);
  RunResult stale = ConnectTo(dir_, *a, dir_.path() + "/stale",
                              node2 | (uint64_t{0x7777} << 32) | 1);
  EXPECT_EQ(stale.exit_code, 3) << stale.err;
  EXPECT_NE(stale.err.find("has no endpoint of this job and uid"),
            std::string::npos)
      << stale.err;
  RunResult ok = Exchange(*a, *b, "ok", 10, 100);
  EXPECT_EQ(ok.exit_code, 0) << ok.err;
  EXPECT_TRUE(a->Stop());
  EXPECT_TRUE(b->Stop());
}

TEST_F(FabricTest, ADaemonWithAnotherMungeKeyIsRefused) {
  Munged other(dir_.path() + "/munge-other");
  auto a = StartNode(0);
  std::vector<std::string> flags = Flags(1);
  flags[7] = other.socket();  // --munge-socket
  auto b = std::make_unique<Daemon>(node_dir_[1], flags);
  int exit1 = -1;
  RunResult r = Exchange(*a, *b, "rv", 10, 100, kJobA, kJobA, &exit1);
  EXPECT_EQ(r.exit_code, 3) << r.err << a->Log() << b->Log();
  EXPECT_EQ(exit1, 3) << r.err;
  RunResult sa = Psmctl(dir_, *a, {"stats", "--format", "json"});
  EXPECT_GE(JsonNumber(sa.out, "peer_nodes", "auth_failures"), 1) << sa.out;
  EXPECT_TRUE(a->Stop());
  EXPECT_TRUE(b->Stop());
}

TEST_F(FabricTest, FlagsAreCheckedTogether) {
  auto check = [&](std::vector<std::string> flags) {
    std::vector<std::string> argv = {Runfile("daemon/psmd"), "--config",
                                     "/dev/null", "--check-config"};
    argv.insert(argv.end(), flags.begin(), flags.end());
    return RunToEnd(dir_, argv, {}, 10);
  };
  RunResult ok = check({"--node-id", "3", "--fabric-listen", "127.0.0.2:7000",
                        "--fabric-listen", "[::1]:7000-7010", "--fabric-nodes",
                        "/x", "--fabric-auth", "none"});
  EXPECT_EQ(ok.exit_code, 0) << ok.err;
  EXPECT_NE(ok.out.find("fabric_listen = '127.0.0.2:7000,[::1]:7000-7010'"),
            std::string::npos)
      << ok.out;
  RunResult none = check({"--node-id", "3", "--fabric-listen", "10.1.2.3",
                          "--fabric-nodes", "/x", "--fabric-auth", "none"});
  EXPECT_EQ(none.exit_code, 2);
  EXPECT_NE(none.err.find("not loopback"), std::string::npos) << none.err;
  RunResult no_id =
      check({"--fabric-listen", "127.0.0.2", "--fabric-nodes", "/x"});
  EXPECT_EQ(no_id.exit_code, 2);
  EXPECT_NE(no_id.err.find("non-zero node_id"), std::string::npos) << no_id.err;
  RunResult bad = check({"--fabric-listen", "127.0.0.2:99999"});
  EXPECT_EQ(bad.exit_code, 2) << bad.out;
  // The ofi backend: one listen address; a provider only with it.
  RunResult two = check({"--node-id", "3", "--fabric", "ofi", "--fabric-listen",
                         "127.0.0.2", "--fabric-listen", "127.0.0.3",
                         "--fabric-nodes", "/x"});
  EXPECT_EQ(two.exit_code, 2);
  EXPECT_NE(two.err.find("one address"), std::string::npos) << two.err;
  RunResult stray = check({"--fabric-provider", "tcp;ofi_rxm"});
  EXPECT_EQ(stray.exit_code, 2);
  EXPECT_NE(stray.err.find("needs fabric = ofi"), std::string::npos)
      << stray.err;
  RunResult unknown = check({"--fabric", "verbs"});
  EXPECT_EQ(unknown.exit_code, 2) << unknown.out;
  RunResult ofi =
      check({"--fabric", "ofi", "--fabric-provider", "udp;ofi_rxd"});
  EXPECT_EQ(ofi.exit_code, 0) << ofi.err;
  EXPECT_NE(ofi.out.find("fabric_provider = 'udp;ofi_rxd'"), std::string::npos)
      << ofi.out;
}

}  // namespace
}  // namespace psmd::testing
