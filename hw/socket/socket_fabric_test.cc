// The socket fabric over real loopback sockets (127.0.0.x), without
// authentication (munge_fabric_test.cc covers MUNGE). The same bodies run
// over the ofi backend's providers (hw/ofi/BUILD.bazel); the tests that
// drive raw TCP sockets or several listen addresses are the socket
// backend's alone and skip there.
#include "hw/socket/socket_fabric.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <deque>
#include <map>
#include <numeric>
#include <string>
#include <vector>

#include "hw/socket/cut_proxy.h"
#include "hw/socket/fabric_test_util.h"

namespace psmd::hw {
namespace {

using testing::CutProxy;
using testing::Expect;
using testing::FirstAddress;
using testing::Link;
using testing::Node;
using testing::OpenNode;
using testing::PumpUntil;
using testing::RawPeer;

// For the tests that only the socket backend can run.
#define SKIP_UNLESS_SOCKET(why) \
  if (!testing::OfiProvider().empty()) GTEST_SKIP() << "ofi: " << why

FabricOptions NoAuth() {
  FabricOptions o;
  o.auth = AuthMode::kNone;
  o.timeout_ms = 2000;
  return o;
}

FabricOptions WithSessions() {
  FabricOptions o = NoAuth();
  o.sessions = true;
  return o;
}

std::string Pattern(size_t n, uint32_t seed) {
  std::string s(n, '\0');
  for (size_t i = 0; i < n; i++) s[i] = static_cast<char>((i * 131 + seed));
  return s;
}

TEST(SocketFabric, FramesWithIovecsBothWays) {
  auto a = OpenNode(1, {"127.0.0.2"}, NoAuth());
  auto b = OpenNode(2, {"127.0.0.3"}, NoAuth());
  ConnId ab, ba;
  Link(a.get(), b.get(), &ab, &ba);

  std::string p1 = "hello ", p2 = "fabric", p3(1000, 'x');
  iovec out[3] = {
      {p1.data(), p1.size()}, {p2.data(), p2.size()}, {p3.data(), p3.size()}};
  FrameFields f;
  f.op = 7;
  f.uid = 1000;
  f.src = 0x1111;
  f.dst = 0x2222;
  std::memset(f.job, 0xab, sizeof f.job);
  f.offset = 4096;
  f.aux = 99;
  ASSERT_EQ(a->fabric->PostSend(ab, f, out, 3, 5), ErrorClass::kOk);
  std::string r1(10, '\0'), r2(2000, '\0');
  iovec in[2] = {{r1.data(), r1.size()}, {r2.data(), r2.size()}};
  ASSERT_EQ(b->fabric->PostRecv(ba, in, 2, 6), ErrorClass::kOk);

  Event e;
  ASSERT_TRUE(Expect({a.get(), b.get()}, b.get(), EventType::kRecvDone, &e));
  EXPECT_EQ(e.error, ErrorClass::kOk);
  EXPECT_EQ(e.cookie, 6u);
  EXPECT_EQ(e.length, p1.size() + p2.size() + p3.size());
  EXPECT_EQ(e.fields.op, 7);
  EXPECT_EQ(e.fields.uid, 1000u);
  EXPECT_EQ(e.fields.src, 0x1111u);
  EXPECT_EQ(e.fields.dst, 0x2222u);
  EXPECT_EQ(e.fields.job[15], 0xab);
  EXPECT_EQ(e.fields.offset, 4096u);
  EXPECT_EQ(e.fields.aux, 99u);
  EXPECT_EQ(r1 + r2.substr(0, e.length - 10), p1 + p2 + p3);
  ASSERT_TRUE(Expect({a.get(), b.get()}, a.get(), EventType::kSendDone, &e));
  EXPECT_EQ(e.cookie, 5u);
  EXPECT_EQ(e.error, ErrorClass::kOk);

  // And back, with an empty frame (header only).
  ASSERT_EQ(b->fabric->PostSend(ba, f, nullptr, 0, 8), ErrorClass::kOk);
  ASSERT_EQ(a->fabric->PostRecv(ab, in, 1, 9), ErrorClass::kOk);
  ASSERT_TRUE(Expect({a.get(), b.get()}, a.get(), EventType::kRecvDone, &e));
  EXPECT_EQ(e.length, 0u);
  EXPECT_EQ(e.cookie, 9u);

  // Per-peer counters on both sides.
  std::vector<PeerStats> at_a = a->fabric->Stats(), at_b = b->fabric->Stats();
  ASSERT_EQ(at_a.size(), 1u);
  EXPECT_EQ(at_a[0].node, 2u);
  EXPECT_EQ(at_a[0].connects, 1u);
  EXPECT_EQ(at_a[0].frames_sent, 1u);
  EXPECT_EQ(at_a[0].bytes_sent, p1.size() + p2.size() + p3.size());
  EXPECT_EQ(at_a[0].frames_received, 1u);
  EXPECT_EQ(at_a[0].bytes_received, 0u);
  ASSERT_EQ(at_b.size(), 1u);
  EXPECT_EQ(at_b[0].node, 1u);
  EXPECT_EQ(at_b[0].frames_received, 1u);
  EXPECT_EQ(at_b[0].bytes_received, p1.size() + p2.size() + p3.size());

  // A second Connect to the same node is the same connection.
  ConnId again;
  EXPECT_EQ(a->fabric->Connect(b->fabric->HostDescription(), 0, &again),
            ErrorClass::kAlreadyConnected);
  EXPECT_EQ(again, ab);
}

TEST(SocketFabric, Ipv6) {
  auto a = OpenNode(1, {"[::1]"}, NoAuth());
  auto b = OpenNode(2, {"[::1]:0"}, NoAuth());
  EXPECT_EQ(b->fabric->HostDescription().rfind("2@[::1]:", 0), 0u)
      << b->fabric->HostDescription();
  ConnId ab, ba;
  Link(a.get(), b.get(), &ab, &ba);
  uint64_t token = 77, got = 0;
  iovec out{&token, 8}, in{&got, 8};
  ASSERT_EQ(b->fabric->PostRecv(ba, &in, 1, 0), ErrorClass::kOk);
  ASSERT_EQ(a->fabric->PostSend(ab, {}, &out, 1, 0), ErrorClass::kOk);
  Event e;
  ASSERT_TRUE(Expect({a.get(), b.get()}, b.get(), EventType::kRecvDone, &e));
  EXPECT_EQ(got, 77u);
}

// Header-first receiving: the receiver reads each header, then places the
// payload where the header's offset says (as a rendezvous chunk lands in
// its pool region), with ordinary receives mixed in.
TEST(SocketFabric, HeaderFirstReceivesLandWhereTheHeaderSays) {
  auto a = OpenNode(1, {"127.0.0.2"}, NoAuth());
  auto b = OpenNode(2, {"127.0.0.3"}, NoAuth());
  std::vector<Node*> both = {a.get(), b.get()};
  ConnId ab, ba;
  Link(a.get(), b.get(), &ab, &ba);
  std::string region(3u << 20, '\0');
  std::string big = Pattern(2u << 20, 5), small = Pattern(100, 6);
  struct Chunk {
    const std::string* data;
    uint64_t offset;
  };
  std::vector<Chunk> chunks = {{&big, 1u << 20}, {&small, 7}, {nullptr, 0}};
  for (size_t i = 0; i < chunks.size(); i++) {
    FrameFields f;
    f.offset = chunks[i].offset;
    iovec v{
        chunks[i].data ? const_cast<char*>(chunks[i].data->data()) : nullptr,
        chunks[i].data ? chunks[i].data->size() : 0};
    ASSERT_EQ(a->fabric->PostSend(ab, f, &v, chunks[i].data ? 1 : 0, i),
              ErrorClass::kOk);
  }
  std::string tail = "ordinary";
  iovec tv{tail.data(), tail.size()};
  ASSERT_EQ(a->fabric->PostSend(ab, {}, &tv, 1, 9), ErrorClass::kOk);

  iovec nowhere{region.data(), 1};
  EXPECT_EQ(b->fabric->PostPayload(ba, &nowhere, 1, 0), ErrorClass::kBadArg);
  for (size_t i = 0; i < chunks.size(); i++) {
    ASSERT_EQ(b->fabric->PostRecvHeader(ba, 100 + i), ErrorClass::kOk);
    Event e;
    ASSERT_TRUE(Expect(both, b.get(), EventType::kHeader, &e));
    EXPECT_EQ(e.error, ErrorClass::kOk);
    EXPECT_EQ(e.cookie, 100 + i);
    EXPECT_EQ(e.fields.offset, chunks[i].offset);
    if (chunks[i].data == nullptr) {
      EXPECT_EQ(e.length, 0u);
      continue;
    }
    ASSERT_EQ(e.length, chunks[i].data->size());
    iovec dest{region.data() + e.fields.offset, e.length};
    ASSERT_EQ(b->fabric->PostPayload(ba, &dest, 1, 200 + i), ErrorClass::kOk);
    ASSERT_TRUE(Expect(both, b.get(), EventType::kRecvDone, &e));
    EXPECT_EQ(e.error, ErrorClass::kOk);
    EXPECT_EQ(e.cookie, 200 + i);
    EXPECT_EQ(e.length, chunks[i].data->size());
  }
  EXPECT_EQ(region.substr(1u << 20, big.size()), big);
  EXPECT_EQ(region.substr(7, small.size()), small);
  std::string got(20, '\0');
  iovec gv{got.data(), got.size()};
  ASSERT_EQ(b->fabric->PostRecv(ba, &gv, 1, 300), ErrorClass::kOk);
  Event e;
  ASSERT_TRUE(Expect(both, b.get(), EventType::kRecvDone, &e));
  EXPECT_EQ(got.substr(0, e.length), tail);
  // A header-only receive pending at close ends as a kHeader with the error.
  ASSERT_EQ(b->fabric->PostRecvHeader(ba, 400), ErrorClass::kOk);
  ASSERT_EQ(b->fabric->Close(ba), ErrorClass::kOk);
  ASSERT_TRUE(Expect(both, b.get(), EventType::kHeader, &e));
  EXPECT_EQ(e.cookie, 400u);
  EXPECT_EQ(e.error, ErrorClass::kCanceled);
}

TEST(SocketFabric, TruncatedFrameKeepsTheConnection) {
  auto a = OpenNode(1, {"127.0.0.2"}, NoAuth());
  auto b = OpenNode(2, {"127.0.0.3"}, NoAuth());
  ConnId ab, ba;
  Link(a.get(), b.get(), &ab, &ba);
  std::string big = Pattern(100000, 1), small = "after";
  iovec o1{big.data(), big.size()}, o2{small.data(), small.size()};
  ASSERT_EQ(a->fabric->PostSend(ab, {}, &o1, 1, 1), ErrorClass::kOk);
  ASSERT_EQ(a->fabric->PostSend(ab, {}, &o2, 1, 2), ErrorClass::kOk);
  std::string r1(100, '\0'), r2(100, '\0');
  iovec i1{r1.data(), r1.size()}, i2{r2.data(), r2.size()};
  ASSERT_EQ(b->fabric->PostRecv(ba, &i1, 1, 1), ErrorClass::kOk);
  ASSERT_EQ(b->fabric->PostRecv(ba, &i2, 1, 2), ErrorClass::kOk);
  Event e;
  ASSERT_TRUE(Expect({a.get(), b.get()}, b.get(), EventType::kRecvDone, &e));
  EXPECT_EQ(e.error, ErrorClass::kTruncated);
  EXPECT_EQ(e.length, 100u);
  EXPECT_EQ(r1, big.substr(0, 100));
  ASSERT_TRUE(Expect({a.get(), b.get()}, b.get(), EventType::kRecvDone, &e));
  EXPECT_EQ(e.error, ErrorClass::kOk);
  EXPECT_EQ(r2.substr(0, e.length), small);
}

// A receiver that posts no receives holds the sender back: the sender's
// queue fills to its bound and PostSend says kBusy; nothing is lost, and
// once receives are posted every frame arrives, in order.
TEST(SocketFabric, BackPressureAndOrderWithLargeFrames) {
  FabricOptions o = NoAuth();
  o.max_send_frames = 16;
  o.max_send_bytes = 8u << 20;
  auto a = OpenNode(1, {"127.0.0.2"}, o);
  auto b = OpenNode(2, {"127.0.0.3"}, o);
  ConnId ab, ba;
  Link(a.get(), b.get(), &ab, &ba);

  constexpr int kFrames = 48;
  std::vector<std::string> payloads;
  for (int i = 0; i < kFrames; i++) {
    // 1 MiB frames, one of 4 MiB (the default limit) among them.
    payloads.push_back(Pattern(i == 20 ? (4u << 20) - 64 : (1u << 20), i));
  }
  int posted = 0, done = 0;
  bool saw_busy = false;
  auto post_more = [&] {
    while (posted < kFrames) {
      FrameFields f;
      f.aux = posted;
      iovec v{payloads[posted].data(), payloads[posted].size()};
      ErrorClass r = a->fabric->PostSend(ab, f, &v, 1, posted);
      if (r == ErrorClass::kBusy) {
        saw_busy = true;
        return;
      }
      ASSERT_EQ(r, ErrorClass::kOk);
      posted++;
    }
  };
  auto count_done = [&] {
    Event e;
    while (a->Take(EventType::kSendDone, &e)) {
      ASSERT_EQ(e.error, ErrorClass::kOk);
      ASSERT_EQ(e.cookie, static_cast<uint64_t>(done));
      done++;
    }
  };
  // Phase 1: b reads nothing for 300 ms.
  auto until =
      std::chrono::steady_clock::now() + std::chrono::milliseconds(300);
  while (std::chrono::steady_clock::now() < until) {
    post_more();
    a->Pump(1);
    b->Pump(1);
    count_done();
  }
  EXPECT_TRUE(saw_busy);
  EXPECT_LT(done, kFrames / 2) << "the sender was not held back";
  EXPECT_LE(posted - done, 16);

  // Phase 2: b receives; every frame arrives whole and in order.
  std::vector<char> buf(4u << 20);
  int received = 0;
  bool receiving = false;
  ASSERT_TRUE(PumpUntil(
      {a.get(), b.get()},
      [&] {
        post_more();
        count_done();
        if (!receiving) {
          iovec v{buf.data(), buf.size()};
          EXPECT_EQ(b->fabric->PostRecv(ba, &v, 1, received), ErrorClass::kOk);
          receiving = true;
        }
        Event e;
        if (b->Take(EventType::kRecvDone, &e)) {
          EXPECT_EQ(e.error, ErrorClass::kOk);
          EXPECT_EQ(e.fields.aux, static_cast<uint64_t>(received));
          EXPECT_EQ(e.length, payloads[received].size());
          EXPECT_EQ(
              std::memcmp(buf.data(), payloads[received].data(), e.length), 0)
              << "frame " << received;
          received++;
          receiving = false;
        }
        return received == kFrames && done == kFrames;
      },
      20000));
}

TEST(SocketFabric, ManySmallFramesKeepOrder) {
  auto a = OpenNode(1, {"127.0.0.2"}, NoAuth());
  auto b = OpenNode(2, {"127.0.0.3"}, NoAuth());
  ConnId ab, ba;
  Link(a.get(), b.get(), &ab, &ba);
  constexpr int kFrames = 20000;
  std::vector<uint64_t> values(kFrames);
  std::iota(values.begin(), values.end(), 0);
  std::vector<uint64_t> slots(64);
  int posted = 0, done = 0, received = 0, recv_posted = 0;
  ASSERT_TRUE(PumpUntil(
      {a.get(), b.get()},
      [&] {
        while (posted < kFrames) {
          iovec v{&values[posted], 8};
          if (a->fabric->PostSend(ab, {}, &v, 1, posted) != ErrorClass::kOk) {
            break;
          }
          posted++;
        }
        while (recv_posted - received < 64 && recv_posted < kFrames) {
          iovec v{&slots[recv_posted % 64], 8};
          EXPECT_EQ(b->fabric->PostRecv(ba, &v, 1, recv_posted),
                    ErrorClass::kOk);
          recv_posted++;
        }
        Event e;
        while (a->Take(EventType::kSendDone, &e)) done++;
        while (b->Take(EventType::kRecvDone, &e)) {
          EXPECT_EQ(e.cookie, static_cast<uint64_t>(received));
          EXPECT_EQ(slots[e.cookie % 64], e.cookie);
          received++;
        }
        return received == kFrames && done == kFrames;
      },
      30000));
}

// Three nodes, every pair connected once: a and c connect to b, and b and
// c connect to each other at the same time (one connection survives and
// both handles are bound to it).
TEST(SocketFabric, ThreeNodesAndSimultaneousConnect) {
  auto a = OpenNode(1, {"127.0.0.2"}, NoAuth());
  auto b = OpenNode(2, {"127.0.0.3"}, NoAuth());
  auto c = OpenNode(3, {"127.0.0.4"}, NoAuth());
  std::vector<Node*> all = {a.get(), b.get(), c.get()};
  ConnId ab, ba;
  Link(a.get(), b.get(), &ab, &ba);
  ConnId ac, ca;
  Link(a.get(), c.get(), &ac, &ca);

  ConnId bc, cb;
  ASSERT_EQ(b->fabric->Connect(c->fabric->HostDescription(), 1, &bc),
            ErrorClass::kOk);
  ASSERT_EQ(c->fabric->Connect(b->fabric->HostDescription(), 2, &cb),
            ErrorClass::kOk);
  Event e;
  ASSERT_TRUE(Expect(all, b.get(), EventType::kConnected, &e));
  EXPECT_EQ(e.error, ErrorClass::kOk) << ErrorClassName(e.error);
  EXPECT_EQ(e.conn, bc);
  ASSERT_TRUE(Expect(all, c.get(), EventType::kConnected, &e));
  EXPECT_EQ(e.error, ErrorClass::kOk) << ErrorClassName(e.error);
  EXPECT_EQ(e.conn, cb);
  PumpUntil(
      all, [] { return false; }, 200);
  EXPECT_EQ(b->Count(EventType::kAccepted), 0u);
  EXPECT_EQ(c->Count(EventType::kAccepted), 0u);
  EXPECT_EQ(b->Count(EventType::kClosed), 0u);
  EXPECT_EQ(c->Count(EventType::kClosed), 0u);

  // Every pair exchanges a frame each way; the frame names its sender.
  struct Pair {
    Node* from;
    ConnId conn;
    Node* to;
    ConnId back;
  };
  std::vector<Pair> pairs = {
      {a.get(), ab, b.get(), ba}, {b.get(), ba, a.get(), ab},
      {a.get(), ac, c.get(), ca}, {c.get(), ca, a.get(), ac},
      {b.get(), bc, c.get(), cb}, {c.get(), cb, b.get(), bc}};
  uint64_t tokens[6];
  uint64_t got[6];
  for (int i = 0; i < 6; i++) {
    tokens[i] = 1000 + i;
    iovec out{&tokens[i], 8};
    iovec in{&got[i], 8};
    ASSERT_EQ(pairs[i].to->fabric->PostRecv(pairs[i].back, &in, 1, i),
              ErrorClass::kOk);
    ASSERT_EQ(pairs[i].from->fabric->PostSend(pairs[i].conn, {}, &out, 1, i),
              ErrorClass::kOk);
    ASSERT_TRUE(Expect(all, pairs[i].to, EventType::kRecvDone, &e));
    EXPECT_EQ(e.error, ErrorClass::kOk);
    EXPECT_EQ(got[i], tokens[i]);
  }
}

TEST(SocketFabric, ListenRangesAndAddressFallback) {
  SKIP_UNLESS_SOCKET("one listen address per endpoint");
  auto first = OpenNode(9, {"127.0.0.6"}, NoAuth());
  uint16_t taken = FirstAddress(*first->fabric).port;
  std::string range =
      "127.0.0.6:" + std::to_string(taken) + "-" + std::to_string(taken + 20);
  // b listens on two addresses; on the first, the range's first port is
  // taken, so the next free one is used.
  auto b = OpenNode(2, {range, "127.0.0.3"}, NoAuth());
  HostDescription d;
  std::string error;
  ASSERT_TRUE(ParseHostDescription(b->fabric->HostDescription(), &d, &error));
  ASSERT_EQ(d.addresses.size(), 2u);
  EXPECT_EQ(d.addresses[0].host, "127.0.0.6");
  EXPECT_GT(d.addresses[0].port, taken);
  EXPECT_LE(d.addresses[0].port, taken + 20);
  EXPECT_EQ(d.addresses[1].host, "127.0.0.3");

  // A range with no free port is a clear error.
  FabricOptions o = NoAuth();
  o.node_id = 5;
  o.listen = {"127.0.0.6:" + std::to_string(taken)};
  EXPECT_EQ(testing::OpenFabric(o, &error), nullptr);
  EXPECT_NE(error.find("cannot listen"), std::string::npos) << error;

  // The first address listed is dead (nothing listens there): the second
  // is tried and works.
  auto a = OpenNode(1, {"127.0.0.2"}, NoAuth());
  std::string desc = "2@127.0.0.7:" + std::to_string(taken) +
                     ",127.0.0.3:" + std::to_string(d.addresses[1].port);
  ConnId ab;
  ASSERT_EQ(a->fabric->Connect(desc, 0, &ab), ErrorClass::kOk);
  Event e;
  ASSERT_TRUE(Expect({a.get(), b.get()}, a.get(), EventType::kConnected, &e));
  EXPECT_EQ(e.error, ErrorClass::kOk) << ErrorClassName(e.error);

  // Every address dead: they are all tried again every kRedialNs until
  // timeout_ms, then the connect fails with kConnFailed (not kTimeout:
  // nothing is there).
  FabricOptions quick = NoAuth();
  quick.timeout_ms = 400;
  auto q = OpenNode(4, {"127.0.0.4"}, quick);
  auto start = std::chrono::steady_clock::now();
  ConnId qc;
  ASSERT_EQ(q->fabric->Connect("3@127.0.0.7:" + std::to_string(taken) +
                                   ",127.0.0.8:" + std::to_string(taken),
                               7, &qc),
            ErrorClass::kOk);
  ASSERT_TRUE(Expect({q.get()}, q.get(), EventType::kConnected, &e));
  auto took = std::chrono::steady_clock::now() - start;
  EXPECT_EQ(e.conn, qc);
  EXPECT_EQ(e.cookie, 7u);
  EXPECT_EQ(e.error, ErrorClass::kConnFailed) << ErrorClassName(e.error);
  EXPECT_GE(took, std::chrono::milliseconds(300));
  EXPECT_LT(took, std::chrono::milliseconds(1500));
  std::vector<PeerStats> rows = q->fabric->Stats();
  ASSERT_EQ(rows.size(), 1u);
  EXPECT_EQ(rows[0].node, 3u);
  EXPECT_EQ(rows[0].connect_failures, 1u);
}

// A peer daemon that is not there yet (starting, or restarting by hand) is
// reached once it listens, within timeout_ms: a connect tries every
// address again every kRedialNs, and over ofi waits longer for a contact's
// answer each round. A connect that gave up at the first refusal made
// three daemons started at once under load fail every connection between
// them.
TEST(SocketFabric, APeerThatStartsLaterIsReachedWithinTheTimeout) {
  // A port nothing listens on yet (bound a moment by a socket of the
  // backend's kind), for the peer to take 1.3 s later: past the first
  // round of attempts of either backend (connect_attempt_ms is 1 s).
  const bool udp = testing::OfiProvider().rfind("udp", 0) == 0;
  int probe =
      socket(AF_INET, (udp ? SOCK_DGRAM : SOCK_STREAM) | SOCK_CLOEXEC, 0);
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  inet_pton(AF_INET, "127.0.0.3", &sa.sin_addr);
  ASSERT_EQ(bind(probe, reinterpret_cast<sockaddr*>(&sa), sizeof sa), 0);
  socklen_t len = sizeof sa;
  getsockname(probe, reinterpret_cast<sockaddr*>(&sa), &len);
  const uint16_t port = ntohs(sa.sin_port);
  close(probe);
  auto a = OpenNode(1, {"127.0.0.2"}, NoAuth());
  ConnId ab;
  ASSERT_EQ(a->fabric->Connect("2@127.0.0.3:" + std::to_string(port), 5, &ab),
            ErrorClass::kOk);
  auto start = std::chrono::steady_clock::now();
  while (std::chrono::steady_clock::now() - start <
         std::chrono::milliseconds(1300)) {
    a->Pump(10);
  }
  EXPECT_EQ(a->Count(EventType::kConnected), 0u);
  auto b = OpenNode(2, {"127.0.0.3:" + std::to_string(port)}, NoAuth());
  Event e;
  ASSERT_TRUE(Expect({a.get(), b.get()}, a.get(), EventType::kConnected, &e));
  EXPECT_EQ(e.conn, ab);
  EXPECT_EQ(e.error, ErrorClass::kOk) << ErrorClassName(e.error);
  ASSERT_TRUE(Expect({a.get(), b.get()}, b.get(), EventType::kAccepted, &e));
  // And the connection carries frames.
  uint64_t token = 0x5eed, got = 0;
  iovec out{&token, 8};
  iovec in{&got, 8};
  ASSERT_EQ(b->fabric->PostRecv(e.conn, &in, 1, 1), ErrorClass::kOk);
  ASSERT_EQ(a->fabric->PostSend(ab, {}, &out, 1, 1), ErrorClass::kOk);
  ASSERT_TRUE(Expect({a.get(), b.get()}, b.get(), EventType::kRecvDone, &e));
  EXPECT_EQ(got, token);
  std::vector<PeerStats> rows = a->fabric->Stats();
  ASSERT_EQ(rows.size(), 1u);
  EXPECT_EQ(rows[0].connect_failures, 0u);
}

// An address that never answers (a listener whose backlog is full drops
// SYNs) costs one connect_attempt_ms, then the next address is tried.
TEST(SocketFabric, SilentAddressTimesOutThenTheNextIsTried) {
  SKIP_UNLESS_SOCKET("drives a raw TCP listener");
  int silent = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  inet_pton(AF_INET, "127.0.0.9", &sa.sin_addr);
  ASSERT_EQ(bind(silent, reinterpret_cast<sockaddr*>(&sa), sizeof sa), 0);
  ASSERT_EQ(listen(silent, 0), 0);
  socklen_t len = sizeof sa;
  getsockname(silent, reinterpret_cast<sockaddr*>(&sa), &len);
  uint16_t port = ntohs(sa.sin_port);
  RawPeer filler;  // takes the only backlog slot
  ASSERT_TRUE(filler.Connect("127.0.0.9", port));

  FabricOptions o = NoAuth();
  o.connect_attempt_ms = 300;
  auto a = OpenNode(1, {"127.0.0.2"}, o);
  auto b = OpenNode(2, {"127.0.0.3"}, o);
  std::string desc = "2@127.0.0.9:" + std::to_string(port) + ",127.0.0.3:" +
                     std::to_string(FirstAddress(*b->fabric).port);
  auto start = std::chrono::steady_clock::now();
  ConnId ab;
  ASSERT_EQ(a->fabric->Connect(desc, 0, &ab), ErrorClass::kOk);
  Event e;
  ASSERT_TRUE(Expect({a.get(), b.get()}, a.get(), EventType::kConnected, &e));
  EXPECT_EQ(e.error, ErrorClass::kOk) << ErrorClassName(e.error);
  auto took = std::chrono::steady_clock::now() - start;
  EXPECT_GE(took, std::chrono::milliseconds(250));
  EXPECT_LT(took, std::chrono::milliseconds(1500));
  close(silent);
}

// A listener that completes TCP connections but never speaks (the kernel
// accepts into the backlog): the connect ends with kTimeout after
// timeout_ms, not later and not never.
TEST(SocketFabric, MuteAcceptorTimesOut) {
  SKIP_UNLESS_SOCKET("drives a raw TCP listener");
  int mute = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  inet_pton(AF_INET, "127.0.0.9", &sa.sin_addr);
  ASSERT_EQ(bind(mute, reinterpret_cast<sockaddr*>(&sa), sizeof sa), 0);
  ASSERT_EQ(listen(mute, 16), 0);
  socklen_t len = sizeof sa;
  getsockname(mute, reinterpret_cast<sockaddr*>(&sa), &len);

  FabricOptions o = NoAuth();
  o.timeout_ms = 400;
  auto a = OpenNode(1, {"127.0.0.2"}, o);
  auto start = std::chrono::steady_clock::now();
  ConnId ab;
  ASSERT_EQ(a->fabric->Connect(
                "2@127.0.0.9:" + std::to_string(ntohs(sa.sin_port)), 0, &ab),
            ErrorClass::kOk);
  Event e;
  ASSERT_TRUE(Expect({a.get()}, a.get(), EventType::kConnected, &e));
  EXPECT_EQ(e.error, ErrorClass::kTimeout) << ErrorClassName(e.error);
  auto took = std::chrono::steady_clock::now() - start;
  EXPECT_GE(took, std::chrono::milliseconds(380));
  EXPECT_LT(took, std::chrono::milliseconds(1500));
  close(mute);
}

TEST(SocketFabric, RefusesUnauthenticatedNonLoopback) {
  FabricOptions o = NoAuth();
  o.node_id = 1;
  o.listen = {"0.0.0.0"};
  std::string error;
  EXPECT_EQ(testing::OpenFabric(o, &error), nullptr);
  EXPECT_NE(error.find("loopback"), std::string::npos) << error;
  o.auth = AuthMode::kMunge;
  EXPECT_EQ(testing::OpenFabric(o, &error), nullptr);
  EXPECT_NE(error.find("wildcard"), std::string::npos) << error;
  auto a = OpenNode(1, {"127.0.0.2"}, NoAuth());
  ConnId c;
  EXPECT_EQ(a->fabric->Connect("2@10.1.2.3:5000", 0, &c), ErrorClass::kBadHost);
  EXPECT_EQ(a->fabric->Connect("nonsense", 0, &c), ErrorClass::kBadHost);
  EXPECT_EQ(a->fabric->Connect(a->fabric->HostDescription(), 0, &c),
            ErrorClass::kBadHost);
}

TEST(SocketFabric, LocalCloseCancelsPendingOperations) {
  auto a = OpenNode(1, {"127.0.0.2"}, NoAuth());
  auto b = OpenNode(2, {"127.0.0.3"}, NoAuth());
  ConnId ab, ba;
  Link(a.get(), b.get(), &ab, &ba);
  uint64_t slot;
  iovec in{&slot, 8};
  ASSERT_EQ(a->fabric->PostRecv(ab, &in, 1, 3), ErrorClass::kOk);
  a->Pump(1);
  ASSERT_EQ(a->fabric->Close(ab), ErrorClass::kOk);
  EXPECT_EQ(a->fabric->Close(ab), ErrorClass::kBadConn);
  EXPECT_EQ(a->fabric->PostRecv(ab, &in, 1, 4), ErrorClass::kBadConn);
  Event e;
  ASSERT_TRUE(Expect({a.get(), b.get()}, a.get(), EventType::kRecvDone, &e));
  EXPECT_EQ(e.error, ErrorClass::kCanceled);
  ASSERT_TRUE(Expect({a.get(), b.get()}, a.get(), EventType::kClosed, &e));
  EXPECT_EQ(e.error, ErrorClass::kOk);
  // The peer sees the close on its next receive.
  ASSERT_EQ(b->fabric->PostRecv(ba, &in, 1, 5), ErrorClass::kOk);
  ASSERT_TRUE(Expect({a.get(), b.get()}, b.get(), EventType::kClosed, &e));
  EXPECT_EQ(e.error, ErrorClass::kPeerClosed);
  // And a new connection between the two works.
  Link(a.get(), b.get(), &ab, &ba);
}

// A peer process killed with SIGKILL: the survivor's pending receive and
// the connection end with an error well within the timeout.
// Kills the peer, a child process, under an open connection; returns
// a's kClosed and how long after the kill it came.
void KillPeer(bool sessions, Event* closed,
              std::chrono::steady_clock::duration* after) {
  int pipefd[2];
  ASSERT_EQ(pipe(pipefd), 0);
  pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    close(pipefd[0]);
    FabricOptions o = NoAuth();
    o.sessions = sessions;
    o.node_id = 2;
    o.listen = {"127.0.0.3"};
    std::string error;
    auto f = testing::OpenFabric(o, &error);
    if (f == nullptr) _exit(1);
    std::string desc = f->HostDescription() + "\n";
    if (write(pipefd[1], desc.data(), desc.size()) < 0) _exit(1);
    Event ev[16];
    while (true) f->Wait(ev, 16, 100);
  }
  close(pipefd[1]);
  std::string desc;
  char ch;
  while (read(pipefd[0], &ch, 1) == 1 && ch != '\n') desc += ch;
  close(pipefd[0]);

  FabricOptions o = NoAuth();
  o.sessions = sessions;
  auto a = OpenNode(1, {"127.0.0.2"}, o);
  ConnId ab;
  ASSERT_EQ(a->fabric->Connect(desc, 0, &ab), ErrorClass::kOk);
  Event e;
  ASSERT_TRUE(Expect({a.get()}, a.get(), EventType::kConnected, &e));
  ASSERT_EQ(e.error, ErrorClass::kOk) << ErrorClassName(e.error);
  uint64_t slot;
  iovec in{&slot, 8};
  ASSERT_EQ(a->fabric->PostRecv(ab, &in, 1, 1), ErrorClass::kOk);
  a->Pump(10);
  auto start = std::chrono::steady_clock::now();
  kill(child, SIGKILL);
  int status;
  waitpid(child, &status, 0);
  ASSERT_TRUE(Expect({a.get()}, a.get(), EventType::kRecvDone, &e, 4000));
  EXPECT_NE(e.error, ErrorClass::kOk);
  ASSERT_TRUE(Expect({a.get()}, a.get(), EventType::kClosed, closed, 3000));
  *after = std::chrono::steady_clock::now() - start;
}

TEST(SocketFabric, KilledPeerGivesAnErrorInBoundedTime) {
  Event e;
  std::chrono::steady_clock::duration after;
  KillPeer(false, &e, &after);
  // Over ofi a provider that never learns of the death (UDP) leaves it to
  // the keepalive timeout (2 s here).
  const bool ofi = !testing::OfiProvider().empty();
  EXPECT_TRUE(e.error == ErrorClass::kPeerClosed ||
              e.error == ErrorClass::kConnReset ||
              (ofi && e.error == ErrorClass::kTimeout))
      << ErrorClassName(e.error);
  EXPECT_LT(after, std::chrono::seconds(ofi ? 3 : 2));
}

// With sessions a dead peer and a broken connection look alike: the
// session waits for the peer to come back (its dialler, a, tries again and
// again) and ends at the timeout (2 s here).
TEST(SocketFabric, WithSessionsAKilledPeerEndsTheSessionAtTheTimeout) {
  Event e;
  std::chrono::steady_clock::duration after;
  KillPeer(true, &e, &after);
  EXPECT_EQ(e.error, ErrorClass::kTimeout) << ErrorClassName(e.error);
  EXPECT_LT(after, std::chrono::seconds(4));
}

// Connects a to b (node 2) through the relay; a's and b's ids.
void LinkThrough(const CutProxy& proxy, Node* a, Node* b, ConnId* at_a,
                 ConnId* at_b) {
  ASSERT_TRUE(proxy.ok());
  ASSERT_EQ(a->fabric->Connect("2@127.0.0.4:" + std::to_string(proxy.port()), 7,
                               at_a),
            ErrorClass::kOk);
  Event e;
  ASSERT_TRUE(Expect({a, b}, a, EventType::kConnected, &e));
  ASSERT_EQ(e.error, ErrorClass::kOk) << ErrorClassName(e.error);
  ASSERT_TRUE(Expect({a, b}, b, EventType::kAccepted, &e));
  *at_b = e.conn;
}

// Every node must agree on sessions: a connector that differs is refused,
// and says why.
TEST(SocketFabric, NodesThatDisagreeOnSessionsAreRefused) {
  auto a = OpenNode(1, {"127.0.0.2"}, WithSessions());
  auto b = OpenNode(2, {"127.0.0.3"}, NoAuth());
  ConnId ab;
  ASSERT_EQ(a->fabric->Connect(b->fabric->HostDescription(), 1, &ab),
            ErrorClass::kOk);
  Event e;
  ASSERT_TRUE(Expect({a.get(), b.get()}, a.get(), EventType::kConnected, &e));
  EXPECT_EQ(e.error, ErrorClass::kConnFailed) << ErrorClassName(e.error);
  EXPECT_EQ(b->Count(EventType::kAccepted), 0u);
}

// Sessions, point 5: the connection is cut after a header-only receive
// took a frame's header and before its payload was asked for. The frame
// comes again after the resume; its header is not delivered twice, and the
// payload lands where PostPayload then says.
TEST(SocketFabric, AHeaderTakenBeforeACutIsNotDeliveredTwice) {
  SKIP_UNLESS_SOCKET("the relay cuts TCP connections");
  auto a = OpenNode(1, {"127.0.0.2"}, WithSessions());
  auto b = OpenNode(2, {"127.0.0.3"}, WithSessions());
  std::vector<Node*> both = {a.get(), b.get()};
  const HostAddress at_b = FirstAddress(*b->fabric);
  CutProxy proxy("127.0.0.4", at_b.host, at_b.port);
  ConnId ab, ba;
  LinkThrough(proxy, a.get(), b.get(), &ab, &ba);
  if (HasFatalFailure()) return;
  Event e;
  const std::string big = Pattern(1u << 20, 3), tail = "after";
  FrameFields f;
  f.aux = 1;
  iovec v{const_cast<char*>(big.data()), big.size()};
  ASSERT_EQ(a->fabric->PostSend(ab, f, &v, 1, 1), ErrorClass::kOk);
  f.aux = 2;
  iovec tv{const_cast<char*>(tail.data()), tail.size()};
  ASSERT_EQ(a->fabric->PostSend(ab, f, &tv, 1, 2), ErrorClass::kOk);
  ASSERT_EQ(b->fabric->PostRecvHeader(ba, 10), ErrorClass::kOk);
  ASSERT_TRUE(Expect(both, b.get(), EventType::kHeader, &e));
  EXPECT_EQ(e.fields.aux, 1u);
  ASSERT_EQ(e.length, big.size());
  proxy.Cut();
  ASSERT_TRUE(PumpUntil(both, [&] {
    uint64_t resumes = 0;
    for (Node* n : both) {
      for (const PeerStats& p : n->fabric->Stats()) resumes += p.resumes;
    }
    return resumes == 2;
  })) << "the session did not resume";
  std::string dest(big.size(), '\0');
  iovec dv{dest.data(), dest.size()};
  ASSERT_EQ(b->fabric->PostPayload(ba, &dv, 1, 11), ErrorClass::kOk);
  ASSERT_TRUE(Expect(both, b.get(), EventType::kRecvDone, &e));
  EXPECT_EQ(e.error, ErrorClass::kOk);
  EXPECT_EQ(e.cookie, 11u);
  EXPECT_TRUE(dest == big) << "the payload differs";
  std::string got(16, '\0');
  iovec gv{got.data(), got.size()};
  ASSERT_EQ(b->fabric->PostRecv(ba, &gv, 1, 12), ErrorClass::kOk);
  ASSERT_TRUE(Expect(both, b.get(), EventType::kRecvDone, &e));
  EXPECT_EQ(e.fields.aux, 2u) << "a frame delivered twice or lost";
  EXPECT_EQ(got.substr(0, e.length), tail);
  for (uint64_t cookie : {1, 2}) {
    ASSERT_TRUE(Expect(both, a.get(), EventType::kSendDone, &e));
    EXPECT_EQ(e.cookie, cookie);
    EXPECT_EQ(e.error, ErrorClass::kOk);
  }
  EXPECT_EQ(a->Count(EventType::kClosed) + b->Count(EventType::kClosed), 0u);
}

// A node whose peer closed the connection on purpose (its user's Close)
// learns it at once: the session ends with it, nothing waits to resume.
TEST(SocketFabric, ACloseEndsTheSessionAtOnce) {
  auto a = OpenNode(1, {"127.0.0.2"}, WithSessions());
  auto b = OpenNode(2, {"127.0.0.3"}, WithSessions());
  std::vector<Node*> both = {a.get(), b.get()};
  ConnId ab, ba;
  Link(a.get(), b.get(), &ab, &ba);
  uint64_t slot;
  iovec in{&slot, 8};
  ASSERT_EQ(b->fabric->PostRecv(ba, &in, 1, 1), ErrorClass::kOk);
  auto start = std::chrono::steady_clock::now();
  ASSERT_EQ(a->fabric->Close(ab), ErrorClass::kOk);
  Event e;
  ASSERT_TRUE(Expect(both, b.get(), EventType::kClosed, &e));
  EXPECT_EQ(e.error, ErrorClass::kPeerClosed) << ErrorClassName(e.error);
  EXPECT_LT(std::chrono::steady_clock::now() - start,
            std::chrono::milliseconds(500));
}

// Sessions (hw/link_fabric.h): a relay between the two nodes cuts their
// connection again and again, by reset and by end of file, while both
// stream frames of every size to each other, the receiver taking its
// frames header first (payloads where the header says). Every frame
// arrives once, in order and intact, every send completes without error,
// and the connection is never reported closed: each cut is a pause.
TEST(SocketFabric, SessionsResumeAcrossCutConnectionsLosingNothing) {
  SKIP_UNLESS_SOCKET("the relay cuts TCP connections");
  FabricOptions o = WithSessions();
  o.timeout_ms = 5000;
  auto a = OpenNode(1, {"127.0.0.2"}, o);
  auto b = OpenNode(2, {"127.0.0.3"}, o);
  std::vector<Node*> both = {a.get(), b.get()};
  const HostAddress at_b = FirstAddress(*b->fabric);
  CutProxy proxy("127.0.0.4", at_b.host, at_b.port);
  ConnId ab, ba;
  LinkThrough(proxy, a.get(), b.get(), &ab, &ba);
  if (HasFatalFailure()) return;

  // Frame i carries payloads[i % size] (a pattern seeded by its size);
  // aux names i.
  const std::vector<size_t> sizes = {8, 100, 5000, 70000, 300000, 0};
  std::vector<std::string> payloads;
  for (size_t n : sizes)
    payloads.push_back(Pattern(n, static_cast<uint32_t>(n)));
  constexpr int kFrames = 3000, kBack = 3000, kCuts = 8;
  int posted = 0, done = 0, received = 0;
  int back_posted = 0, back_done = 0, back_received = 0;
  std::vector<uint64_t> back_values(kBack), back_slots(64);
  std::iota(back_values.begin(), back_values.end(), 0);
  std::string dest(300000, '\0');
  bool header_posted = false, payload_posted = false;
  int back_recv_posted = 0;
  auto next_cut = std::chrono::steady_clock::now();
  bool failed = false;
  ASSERT_TRUE(PumpUntil(
      both,
      [&] {
        while (posted < kFrames) {
          const std::string& p = payloads[posted % payloads.size()];
          FrameFields f;
          f.aux = static_cast<uint64_t>(posted);
          f.offset = p.size();
          iovec v{const_cast<char*>(p.data()), p.size()};
          if (a->fabric->PostSend(ab, f, &v, p.empty() ? 0 : 1, posted) !=
              ErrorClass::kOk) {
            break;
          }
          posted++;
        }
        while (back_posted < kBack) {
          iovec v{&back_values[back_posted], 8};
          if (b->fabric->PostSend(ba, {}, &v, 1, back_posted) !=
              ErrorClass::kOk) {
            break;
          }
          back_posted++;
        }
        while (back_recv_posted - back_received < 64 &&
               back_recv_posted < kBack) {
          iovec v{&back_slots[back_recv_posted % 64], 8};
          EXPECT_EQ(a->fabric->PostRecv(ab, &v, 1, back_recv_posted),
                    ErrorClass::kOk);
          back_recv_posted++;
        }
        if (!header_posted && received < kFrames) {
          EXPECT_EQ(b->fabric->PostRecvHeader(ba, received), ErrorClass::kOk);
          header_posted = true;
        }
        Event ev;
        while (a->Take(EventType::kSendDone, &ev)) {
          if (ev.error != ErrorClass::kOk || ev.cookie != uint64_t(done)) {
            ADD_FAILURE() << "send " << ev.cookie << ": "
                          << ErrorClassName(ev.error) << " (expected " << done
                          << ")";
            failed = true;
          }
          done++;
        }
        while (b->Take(EventType::kSendDone, &ev)) {
          failed |= ev.error != ErrorClass::kOk;
          back_done++;
        }
        while (a->Take(EventType::kRecvDone, &ev)) {
          if (ev.error != ErrorClass::kOk ||
              back_slots[ev.cookie % 64] != uint64_t(back_received)) {
            ADD_FAILURE() << "back frame " << back_received << ": "
                          << ErrorClassName(ev.error) << ", holds "
                          << back_slots[ev.cookie % 64];
            failed = true;
          }
          back_received++;
        }
        if (b->Take(EventType::kHeader, &ev)) {
          const std::string& want = payloads[received % payloads.size()];
          if (ev.error != ErrorClass::kOk ||
              ev.fields.aux != uint64_t(received) || ev.length != want.size()) {
            ADD_FAILURE() << "frame " << received << ": header "
                          << ErrorClassName(ev.error) << ", aux "
                          << ev.fields.aux << ", length " << ev.length;
            failed = true;
          }
          if (ev.length == 0) {
            received++;
            header_posted = false;
          } else {
            iovec v{dest.data(), ev.length};
            EXPECT_EQ(b->fabric->PostPayload(ba, &v, 1, received),
                      ErrorClass::kOk);
            payload_posted = true;
          }
        }
        if (payload_posted && b->Take(EventType::kRecvDone, &ev)) {
          const std::string& want = payloads[received % payloads.size()];
          if (ev.error != ErrorClass::kOk ||
              dest.compare(0, want.size(), want) != 0) {
            ADD_FAILURE() << "frame " << received << ": payload "
                          << ErrorClassName(ev.error) << " or bytes differ";
            failed = true;
          }
          received++;
          payload_posted = header_posted = false;
        }
        if (a->Count(EventType::kClosed) + b->Count(EventType::kClosed) > 0) {
          ADD_FAILURE() << "a cut closed the connection";
          return true;
        }
        const auto now = std::chrono::steady_clock::now();
        if (proxy.cuts() < kCuts && now >= next_cut && received > 0) {
          proxy.Cut();
          next_cut = now + std::chrono::milliseconds(40);
        }
        return failed || (received == kFrames && done == kFrames &&
                          back_received == kBack && back_done == kBack);
      },
      60000))
      << "received " << received << "/" << kFrames << ", done " << done
      << ", back " << back_received << "/" << back_done << ", cuts "
      << proxy.cuts();
  EXPECT_FALSE(failed);
  EXPECT_GE(proxy.cuts(), 2) << "the stream ended before the cuts";
  uint64_t resumes = 0, replayed = 0;
  for (Node* n : both) {
    for (const PeerStats& p : n->fabric->Stats()) {
      resumes += p.resumes;
      replayed += p.frames_replayed;
    }
  }
  EXPECT_GE(resumes, 2u);
  printf("%d cuts, %llu resumes, %llu frames sent again\n", proxy.cuts(),
         static_cast<unsigned long long>(resumes),
         static_cast<unsigned long long>(replayed));
}

// Garbage, bad frames and half handshakes from raw sockets drop that
// connection only; the good connection goes on.
TEST(SocketFabric, BadPeersAreDroppedOthersContinue) {
  SKIP_UNLESS_SOCKET("drives raw TCP peers");
  FabricOptions o = NoAuth();
  o.timeout_ms = 500;  // the silent peer below is dropped after this
  auto a = OpenNode(1, {"127.0.0.2"}, o);
  auto b = OpenNode(2, {"127.0.0.3"}, o);
  std::vector<Node*> both = {a.get(), b.get()};
  ConnId ab, ba;
  Link(a.get(), b.get(), &ab, &ba);
  HostAddress at = FirstAddress(*b->fabric);

  auto exchange = [&](uint64_t token) {
    uint64_t got = 0;
    iovec out{&token, 8}, in{&got, 8};
    ASSERT_EQ(b->fabric->PostRecv(ba, &in, 1, 0), ErrorClass::kOk);
    ASSERT_EQ(a->fabric->PostSend(ab, {}, &out, 1, 0), ErrorClass::kOk);
    Event e;
    ASSERT_TRUE(Expect(both, b.get(), EventType::kRecvDone, &e));
    EXPECT_EQ(e.error, ErrorClass::kOk);
    EXPECT_EQ(got, token);
  };

  auto challenge = [&](RawPeer* raw) {
    ASSERT_TRUE(raw->Connect(at.host, at.port));
    FrameHeader h;
    std::string payload;
    bool read = false;
    testing::WhilePumping(both, [&] { read = raw->ReadFrame(&h, &payload); });
    ASSERT_TRUE(read);
    EXPECT_EQ(h.type, FrameType::kChallenge);
  };
  auto expect_dropped = [&](RawPeer* raw) {
    bool closed = false;
    testing::WhilePumping(both, [&] { closed = raw->ClosedByPeer(); });
    EXPECT_TRUE(closed);
  };

  {  // Random bytes instead of a hello.
    RawPeer raw;
    challenge(&raw);
    std::string junk = Pattern(200, 3);
    ASSERT_TRUE(raw.Send(junk.data(), junk.size()));
    expect_dropped(&raw);
  }
  exchange(1);
  {  // A hello whose length is beyond any handshake frame.
    RawPeer raw;
    challenge(&raw);
    ASSERT_TRUE(raw.SendFrame(FrameType::kHello, std::string(5000, 'a')));
    expect_dropped(&raw);
  }
  {  // A data frame before the handshake.
    RawPeer raw;
    challenge(&raw);
    ASSERT_TRUE(raw.SendFrame(FrameType::kData, "early"));
    expect_dropped(&raw);
  }
  {  // Says nothing at all: dropped after the timeout.
    RawPeer raw;
    challenge(&raw);
    expect_dropped(&raw);
  }
  exchange(2);
  {  // A proper handshake, then a frame longer than the limit.
    RawPeer raw;
    challenge(&raw);
    ASSERT_TRUE(raw.SendFrame(FrameType::kHello,
                              EncodeHello({7, 77, 2, AuthMode::kNone, ""})));
    Event e;
    ASSERT_TRUE(Expect(both, b.get(), EventType::kAccepted, &e));
    EXPECT_EQ(e.peer_node, 7u);
    ConnId raw_conn = e.conn;
    uint64_t slot;
    iovec in{&slot, 8};
    ASSERT_EQ(b->fabric->PostRecv(raw_conn, &in, 1, 0), ErrorClass::kOk);
    uint8_t bytes[kFrameHeaderSize];
    FrameHeader h;
    h.length = (4u << 20) + 1;
    EncodeFrameHeader(h, bytes);
    ASSERT_TRUE(raw.Send(bytes, sizeof bytes));
    ASSERT_TRUE(Expect(both, b.get(), EventType::kClosed, &e));
    EXPECT_EQ(e.conn, raw_conn);
    EXPECT_EQ(e.error, ErrorClass::kBadFrame);
    ASSERT_TRUE(b->Take(EventType::kRecvDone, &e));  // came before kClosed
    EXPECT_EQ(e.conn, raw_conn);
    EXPECT_EQ(e.error, ErrorClass::kBadFrame);
    expect_dropped(&raw);
  }
  exchange(3);
  // Bad frames before authentication count under node 0, after it under
  // the node; the good link was never dropped.
  std::vector<PeerStats> rows = b->fabric->Stats();
  ASSERT_EQ(rows.size(), 3u);
  EXPECT_EQ(rows[0].node, 0u);
  EXPECT_EQ(rows[0].bad_frames, 3u);
  EXPECT_EQ(rows[1].node, 1u);
  EXPECT_EQ(rows[1].disconnects, 0u);
  EXPECT_EQ(rows[1].frames_received, 3u);
  EXPECT_EQ(rows[2].node, 7u);
  EXPECT_EQ(rows[2].bad_frames, 1u);
  EXPECT_EQ(rows[2].disconnects, 1u);
}

// ---- handover (hw/fabric.h: ExportSessions, AdoptSessions) ----

// Frames whose aux is their token and whose payload derives from it, and
// their receives; the buffers live as long as the test.
class Tokens {
 public:
  void Send(Node* n, ConnId c, uint32_t first, uint32_t count) {
    for (uint32_t t = first; t < first + count; t++) {
      std::string& p = bufs_.emplace_back(Pattern(100 + t * 37, t));
      FrameFields f;
      f.aux = t;
      iovec v{p.data(), p.size()};
      ASSERT_EQ(n->fabric->PostSend(c, f, &v, 1, t), ErrorClass::kOk);
    }
  }
  void Recv(Node* n, ConnId c, uint32_t count) {
    for (uint32_t i = 0; i < count; i++) {
      std::string& p = bufs_.emplace_back(4096, '\0');
      iovec v{p.data(), p.size()};
      ASSERT_EQ(n->fabric->PostRecv(c, &v, 1, 1000 + bufs_.size()),
                ErrorClass::kOk);
      posted_[1000 + bufs_.size()] = &p;
    }
  }
  // Takes n's receives of tokens first.. first + count - 1, in order and
  // intact, and the kSendDone of each on `sender`.
  void Expect(const std::vector<Node*>& all, Node* n, Node* sender,
              uint32_t first, uint32_t count) {
    ASSERT_TRUE(PumpUntil(all,
                          [&] {
                            return n->Count(EventType::kRecvDone) >= count &&
                                   sender->Count(EventType::kSendDone) >= count;
                          }))
        << "tokens from " << first << " did not all arrive";
    Event e;
    for (uint32_t t = first; t < first + count; t++) {
      ASSERT_TRUE(n->Take(EventType::kRecvDone, &e));
      EXPECT_EQ(e.error, ErrorClass::kOk) << ErrorClassName(e.error);
      EXPECT_EQ(e.fields.aux, t) << "a token lost, repeated or reordered";
      const std::string want = Pattern(100 + t * 37, t);
      ASSERT_EQ(e.length, want.size());
      EXPECT_TRUE(posted_.at(e.cookie)->compare(0, want.size(), want) == 0)
          << "token " << t << " arrived damaged";
      ASSERT_TRUE(sender->Take(EventType::kSendDone, &e));
      EXPECT_EQ(e.error, ErrorClass::kOk) << ErrorClassName(e.error);
      EXPECT_EQ(e.cookie, t);
    }
  }

 private:
  std::deque<std::string> bufs_;
  std::map<uint64_t, std::string*> posted_;
};

// Pumps until `from` exports (everything acknowledged); the carried sessions.
// Each try runs on a thread of its own while the others are pumped, as
// daemons run apart: the ofi export returns once its peers' providers took
// the message that tells them of the break (over ofi_rxd, acknowledged it).
std::vector<CarriedSession> ExportWhenQuiet(const std::vector<Node*>& all,
                                            Node* from) {
  std::vector<Node*> others;
  for (Node* n : all) {
    if (n != from) others.push_back(n);
  }
  std::vector<CarriedSession> carried;
  std::string why;
  EXPECT_TRUE(PumpUntil(all,
                        [&] {
                          bool exported = false;
                          testing::WhilePumping(others, [&] {
                            exported =
                                from->fabric->ExportSessions(&carried, &why);
                          });
                          return exported;
                        }))
      << "export still refused: " << why;
  return carried;
}

// The successor of node `id` at its predecessor's address and port, under
// `incarnation`.
std::unique_ptr<Node> Successor(uint64_t id, const HostAddress& at,
                                uint64_t incarnation) {
  FabricOptions o = WithSessions();
  o.incarnation = incarnation;
  return OpenNode(id, {at.host + ":" + std::to_string(at.port)}, o);
}

// Node 1 (a, the exporter) and node 2 (b) linked with sessions on; the
// exporter dialled, or its peer did.
struct HandoverPair {
  std::unique_ptr<Node> a, b;
  ConnId ab = 0, ba = 0;
};
HandoverPair LinkForHandover(bool exporter_dials) {
  HandoverPair p;
  p.a = OpenNode(1, {"127.0.0.2"}, WithSessions());
  p.b = OpenNode(2, {"127.0.0.3"}, WithSessions());
  if (exporter_dials) {
    Link(p.a.get(), p.b.get(), &p.ab, &p.ba);
  } else {
    Link(p.b.get(), p.a.get(), &p.ba, &p.ab);
  }
  return p;
}

// A (node 1) hands its session with B over to A2 while B keeps sending:
// A2 gets B's later frames once, in order, and B gets A2's; nobody sees
// the session close.
void HandOverMidTraffic(bool exporter_dials) {
  auto [a, b, ab, ba] = LinkForHandover(exporter_dials);
  if (::testing::Test::HasFatalFailure()) return;
  Tokens tok;
  tok.Recv(b.get(), ba, 4);
  tok.Recv(a.get(), ab, 4);
  tok.Send(a.get(), ab, 1, 4);
  tok.Send(b.get(), ba, 101, 4);
  tok.Expect({a.get(), b.get()}, b.get(), a.get(), 1, 4);
  tok.Expect({a.get(), b.get()}, a.get(), b.get(), 101, 4);
  if (::testing::Test::HasFatalFailure()) return;

  std::vector<CarriedSession> carried =
      ExportWhenQuiet({a.get(), b.get()}, a.get());
  ASSERT_EQ(carried.size(), 1u);
  EXPECT_EQ(carried[0].id, ab);
  EXPECT_EQ(carried[0].node, 2u);
  EXPECT_EQ(carried[0].outgoing, exporter_dials);
  EXPECT_EQ(carried[0].tx_seq, 4u);
  EXPECT_EQ(carried[0].rx_delivered, 4u);
  EXPECT_EQ(a->fabric->PostSend(ab, {}, nullptr, 0, 0), ErrorClass::kBadConn);
  const HostAddress at_a = FirstAddress(*a->fabric);
  const uint64_t incarnation = a->fabric->Incarnation();
  a.reset();  // as the exec would

  tok.Send(b.get(), ba, 105, 2);
  PumpUntil(
      {b.get()}, [] { return false; }, 100);  // B sees the break
  tok.Send(b.get(), ba, 107, 2);
  auto a2 = Successor(1, at_a, incarnation);
  ASSERT_NE(a2->fabric, nullptr);
  std::string why;
  ASSERT_TRUE(a2->fabric->AdoptSessions(carried, &why)) << why;
  std::vector<Node*> both = {a2.get(), b.get()};
  tok.Recv(a2.get(), ab, 4);
  tok.Expect(both, a2.get(), b.get(), 105, 4);
  tok.Recv(b.get(), ba, 2);
  tok.Send(a2.get(), ab, 5, 2);
  tok.Expect(both, b.get(), a2.get(), 5, 2);
  // One more receive: nothing delivered twice fills it.
  tok.Recv(a2.get(), ab, 1);
  PumpUntil(
      both, [] { return false; }, 200);
  EXPECT_EQ(a2->Count(EventType::kRecvDone), 0u) << "a frame came twice";
  uint64_t resumes = 0;
  for (const PeerStats& p : b->fabric->Stats()) resumes += p.resumes;
  EXPECT_EQ(resumes, 1u);
  EXPECT_EQ(a2->Count(EventType::kClosed) + b->Count(EventType::kClosed), 0u);
}

TEST(SocketFabric, HandoverCarriesASessionTheExporterDialled) {
  HandOverMidTraffic(true);
}

TEST(SocketFabric, HandoverCarriesASessionThePeerDialled) {
  HandOverMidTraffic(false);
}

// A peer that sends nothing learns of the break too, from the exporter
// itself: over ofi nothing else would tell it (no end of file) before its
// silence deadline, which ends the session. So the session it dialled
// resumes, and the successor's frame arrives, well within the timeout.
TEST(SocketFabric, AnIdlePeerResumesAtOnce) {
  auto [a, b, ab, ba] = LinkForHandover(/*exporter_dials=*/false);
  if (HasFatalFailure()) return;
  std::vector<CarriedSession> carried =
      ExportWhenQuiet({a.get(), b.get()}, a.get());
  ASSERT_EQ(carried.size(), 1u);
  const HostAddress at_a = FirstAddress(*a->fabric);
  const uint64_t incarnation = a->fabric->Incarnation();
  a.reset();
  const auto broke = std::chrono::steady_clock::now();
  auto a2 = Successor(1, at_a, incarnation);
  ASSERT_NE(a2->fabric, nullptr);
  std::string why;
  ASSERT_TRUE(a2->fabric->AdoptSessions(carried, &why)) << why;
  Tokens tok;
  tok.Recv(b.get(), ba, 1);
  tok.Send(a2.get(), ab, 1, 1);
  tok.Expect({a2.get(), b.get()}, b.get(), a2.get(), 1, 1);
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                      std::chrono::steady_clock::now() - broke)
                      .count();
  EXPECT_LT(ms, WithSessions().timeout_ms / 2)
      << "the peer learnt of the break only at its silence deadline";
}

TEST(SocketFabric, ExportWaitsForTheLastAck) {
  auto a = OpenNode(1, {"127.0.0.2"}, WithSessions());
  auto b = OpenNode(2, {"127.0.0.3"}, WithSessions());
  std::vector<Node*> both = {a.get(), b.get()};
  ConnId ab, ba;
  Link(a.get(), b.get(), &ab, &ba);
  if (HasFatalFailure()) return;
  Tokens tok;
  tok.Send(a.get(), ab, 1, 1);
  std::vector<CarriedSession> carried;
  std::string why;
  EXPECT_FALSE(a->fabric->ExportSessions(&carried, &why));
  EXPECT_EQ(why, "node 2: 1 frames queued");
  // B posts no receive, so the frame, sent, waits for its ack.
  PumpUntil(
      both, [] { return false; }, 100);
  EXPECT_FALSE(a->fabric->ExportSessions(&carried, &why));
  EXPECT_EQ(why, "node 2: 1 frames sent and not yet acknowledged");
  EXPECT_TRUE(carried.empty());
  tok.Recv(b.get(), ba, 2);
  tok.Expect(both, b.get(), a.get(), 1, 1);
  tok.Send(a.get(), ab, 2, 1);
  tok.Expect(both, b.get(), a.get(), 2, 1);
  carried = ExportWhenQuiet(both, a.get());
  ASSERT_EQ(carried.size(), 1u);
  EXPECT_EQ(carried[0].tx_seq, 2u);
}

TEST(SocketFabric, AdoptRefusesBadSessionsAndAdoptsNothing) {
  auto a = Successor(1, {"127.0.0.2", 0}, 77);
  ASSERT_NE(a->fabric, nullptr);
  CarriedSession good;
  good.id = 5;
  good.node = 2;
  good.peer_incarnation = 99;
  CarriedSession other = good;
  other.id = 6;
  other.node = 3;
  auto refused = [&](std::vector<CarriedSession> v, const char* what) {
    std::string why;
    EXPECT_FALSE(a->fabric->AdoptSessions(v, &why)) << what;
    EXPECT_FALSE(why.empty()) << what;
  };
  CarriedSession dup = other;
  dup.id = good.id;
  refused({good, dup}, "a duplicate id");
  CarriedSession self = other;
  self.node = 1;
  refused({good, self}, "our own node");
  CarriedSession zero = other;
  zero.id = 0;
  refused({good, zero}, "a zero id");
  CarriedSession no_address = other;
  no_address.outgoing = true;
  refused({good, no_address}, "nowhere to dial");
  std::string why;
  auto plain = OpenNode(1, {"127.0.0.2"}, WithSessions());
  EXPECT_FALSE(plain->fabric->AdoptSessions({good}, &why));
  EXPECT_NE(why.find("incarnation"), std::string::npos) << why;
  // Nothing of the refused lists was adopted: adopting needs a fabric
  // with no connection.
  ASSERT_TRUE(a->fabric->AdoptSessions({good, other}, &why)) << why;
  EXPECT_FALSE(a->fabric->AdoptSessions({good}, &why));
  EXPECT_EQ(a->fabric->Connect("2@127.0.0.3:1", 0, &good.id),
            ErrorClass::kAlreadyConnected);
  EXPECT_EQ(good.id, 5u);
}

// A successor under another incarnation cannot resume: the session ends
// on both sides, with an error, within the timeout.
void CarryUnderAnotherIncarnation(bool exporter_dials) {
  auto [a, b, ab, ba] = LinkForHandover(exporter_dials);
  if (::testing::Test::HasFatalFailure()) return;
  std::vector<CarriedSession> carried =
      ExportWhenQuiet({a.get(), b.get()}, a.get());
  const HostAddress at_a = FirstAddress(*a->fabric);
  const uint64_t incarnation = a->fabric->Incarnation();
  a.reset();
  auto a2 = Successor(1, at_a, incarnation ^ 2);
  ASSERT_NE(a2->fabric, nullptr);
  std::string why;
  ASSERT_TRUE(a2->fabric->AdoptSessions(carried, &why)) << why;
  std::vector<Node*> both = {a2.get(), b.get()};
  Event e;
  ASSERT_TRUE(Expect(both, b.get(), EventType::kClosed, &e, 4000));
  EXPECT_NE(e.error, ErrorClass::kOk);
  EXPECT_EQ(e.conn, ba);
  ASSERT_TRUE(Expect(both, a2.get(), EventType::kClosed, &e, 4000));
  EXPECT_NE(e.error, ErrorClass::kOk);
  EXPECT_EQ(e.conn, ab);
}

TEST(SocketFabric, HandoverToAnotherIncarnationEndsTheSessionItDialled) {
  CarryUnderAnotherIncarnation(true);
}

TEST(SocketFabric, HandoverToAnotherIncarnationEndsTheSessionThePeerDialled) {
  CarryUnderAnotherIncarnation(false);
}

// Without sessions a peer's frames in flight die with the connection, so
// nothing may be carried: both ends of a handover refuse, and the fabric
// serves on.
TEST(SocketFabric, WithoutSessionsNothingIsHandedOver) {
  auto a = OpenNode(1, {"127.0.0.2"}, NoAuth());
  auto b = OpenNode(2, {"127.0.0.3"}, NoAuth());
  ConnId ab, ba;
  Link(a.get(), b.get(), &ab, &ba);
  if (HasFatalFailure()) return;
  std::vector<CarriedSession> carried;
  std::string why;
  EXPECT_FALSE(a->fabric->ExportSessions(&carried, &why));
  EXPECT_NE(why.find("sessions are off"), std::string::npos) << why;
  EXPECT_TRUE(carried.empty());
  FabricOptions o = NoAuth();
  o.incarnation = 77;
  auto successor = OpenNode(3, {"127.0.0.4"}, o);
  CarriedSession s;
  s.id = 1;
  s.node = 2;
  s.peer_incarnation = 99;
  EXPECT_FALSE(successor->fabric->AdoptSessions({s}, &why));
  EXPECT_NE(why.find("sessions are off"), std::string::npos) << why;
  // Still serving: a frame goes through.
  Tokens tok;
  tok.Recv(b.get(), ba, 1);
  tok.Send(a.get(), ab, 1, 1);
  tok.Expect({a.get(), b.get()}, b.get(), a.get(), 1, 1);
}

}  // namespace
}  // namespace psmd::hw
