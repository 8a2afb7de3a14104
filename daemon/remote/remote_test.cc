// The inter-node engine end to end: two nodes, each an MqEngine with its
// Remote beside it (as ProgressWorker wires them), joined by the in-process
// fabric (hw/loopback_fabric.h) and driven by hand from the test thread.
// Clients are shm/'s own views of in-memory segments, as in
// mq_engine_test.cc, so frames, rings and pools are all the real ones.
#include "daemon/remote/remote.h"

#include <gtest/gtest.h>
#include <psm2.h>
#include <psm2_mq.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "daemon/engine/mq_engine.h"
#include "daemon/engine/test_endpoint.h"
#include "daemon/remote/wire.h"
#include "hw/loopback_fabric.h"
#include "shm/epid.h"
#include "shm/payload.h"
#include "shm/pool.h"
#include "shm/segment.h"

namespace psmd {
namespace {

constexpr uint32_t kRingCapacity = 64;
constexpr uint64_t kRegionBytes = 1 << 20;
constexpr uint32_t kEndpoints = 2;
constexpr uint16_t kNonce = 7;

// One endpoint as its client sees it.
struct ClientSide {
  uint32_t id = 0;
  uint64_t epid = 0;
  shm::ClientRings rings;
  shm::SendArena arena;
  uint64_t next_token = 1;
};

// One node: its engine, its Remote, one job with kEndpoints endpoints.
struct Node {
  uint16_t id = 0;
  std::unique_ptr<MqEngine> engine;
  hw::LoopbackFabric* fabric = nullptr;  // owned by remote
  std::unique_ptr<Remote> remote;
  std::shared_ptr<Job> job;
  std::vector<std::shared_ptr<Endpoint>> endpoints;
  std::vector<ClientSide> clients;
};

class RemoteTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const char* tmp = std::getenv("TEST_TMPDIR");
    nodes_file_ = std::string(tmp != nullptr ? tmp : "/tmp") + "/nodes";
    std::ofstream(nodes_file_) << "1 host1 1@127.0.0.1:1\n"
                               << "2 host2 2@127.0.0.1:2\n";
    for (uint16_t n = 1; n <= 2; n++) MakeNode(n, &nodes_[n - 1]);
  }

  void TearDown() override {
    for (Node& n : nodes_) KillNode(n);
  }

  void MakeNode(uint16_t id, Node* node) {
    node->id = id;
    node->engine = std::make_unique<MqEngine>(1 << 30, 1 << 30, 1 << 30);
    std::unique_ptr<hw::LoopbackFabric> fabric = net_.Create(id);
    node->fabric = fabric.get();
    node->remote =
        std::make_unique<Remote>(node->engine.get(), std::move(fabric), id,
                                 kNonce, nodes_file_, timeout_ms_);
    node->engine->AttachRemote(node->remote.get());
    std::string error;
    shm::Mapping pool;
    ASSERT_TRUE(shm::Mapping::Create("test-pool",
                                     (kEndpoints + 1) * kRegionBytes, geteuid(),
                                     getegid(), &pool, &error))
        << error;
    node->job = std::make_shared<Job>(
        JobKey{Uuid{1}, geteuid()}, std::move(pool), kEndpoints, kRegionBytes,
        std::make_shared<UidAccount>(), /*inbox=*/true);
    for (uint32_t i = 0; i < kEndpoints; i++) AddEndpoint(*node, i + 1);
  }

  // The node dies: its Remote (and fabric) go before its engine, as in
  // ProgressWorker; its peers see the connection close.
  void KillNode(Node& n) {
    n.remote.reset();
    n.fabric = nullptr;
    n.engine.reset();
  }

  void AddEndpoint(Node& n, uint32_t id) {
    auto ep = MakeTestEndpoint(n.job, *n.job->TakeRegion(), id,
                               shm::MakeEpid(n.id, kNonce, id), kRingCapacity,
                               1 << 20);
    ClientSide c;
    c.id = id;
    c.epid = ep->epid();
    c.rings = shm::ClientRingsOf(ep->segment().base(), ep->geometry());
    c.arena = shm::SendArena(n.job->pool().base(), ep->region().offset,
                             ep->region().bytes);
    n.endpoints.push_back(ep);
    n.clients.push_back(c);
    n.engine->Add(ep);
  }

  Node& node(uint16_t id) { return nodes_[id - 1]; }

  // Runs both engines and both Remotes until neither has anything to do.
  void Drain() {
    int idle = 0;
    for (int i = 0; i < 10000 && idle < 3; i++) {
      bool did = false;
      for (Node& n : nodes_) {
        if (!n.engine) continue;
        did |= n.engine->PollAll();
        did |= n.remote->Poll();
      }
      idle = did ? 0 : idle + 1;
    }
  }

  // psm2_ep_connect from endpoint `from` of node `a` to endpoint `to` of
  // node `b`, put in `from`'s slot `slot`.
  void Connect(uint16_t a, uint32_t from, uint16_t b, uint32_t to,
               uint32_t slot) {
    Node& na = node(a);
    const uint64_t epid = node(b).clients[to].epid;
    int result = -1;
    std::string why;
    na.remote->Query(*na.endpoints[from], epid,
                     [&](int error, const std::string& w) {
                       result = error;
                       why = w;
                     });
    Drain();
    ASSERT_EQ(result, PSM2_OK) << why;
    na.engine->SetPeer(na.clients[from].id, slot, PeerLink{kRemotePeer, epid});
  }

  // Endpoints 0 of nodes 1 and 2 connected to each other, each in its
  // slot 0: the pair most cases use.
  void ConnectPair() {
    ASSERT_NO_FATAL_FAILURE(Connect(1, 0, 2, 0, 0));
    ASSERT_NO_FATAL_FAILURE(Connect(2, 0, 1, 0, 0));
  }

  // The one completion a rendezvous sender reaps once the receiver's node
  // matched it: kRndvGo, in (*go)[0].
  void AwaitGo(uint16_t a, uint32_t from,
               std::vector<shm::CompletionDesc>* go) {
    *go = Reap(a, from);
    ASSERT_EQ(go->size(), 1u);
    ASSERT_EQ((*go)[0].op, shm::CompleteOp::kRndvGo);
  }

  void Submit(Node& n, uint32_t from, const shm::SubmissionDesc& d) {
    auto& r = shm::TraitsOf(d.op).ring == shm::Ring::kMessage
                  ? n.clients[from].rings.msg_sq
                  : n.clients[from].rings.ctl_sq;
    ASSERT_TRUE(r.TryPush(d));
  }

  uint64_t Token(Node& n, uint32_t from) {
    return n.clients[from].next_token++;
  }

  // A send of `payload` from endpoint `from` of node `a` to its slot `slot`
  // (eager, or rendezvous with `rndv`); pooled when not inline.
  uint64_t Send(uint16_t a, uint32_t from, uint32_t slot, uint32_t tag0,
                const std::string& payload, uint8_t flags = 0,
                bool rndv = false) {
    Node& n = node(a);
    const uint32_t tag[3] = {tag0, 0, 0};
    const uint64_t token = Token(n, from);
    auto len = static_cast<uint32_t>(payload.size());
    shm::SubmissionDesc d = shm::PrepSend(slot, token, tag, len, rndv);
    d.flags |= flags;
    if (!rndv) {
      if (shm::PayloadInPool(d)) {
        auto off = n.clients[from].arena.Allocate(len);
        EXPECT_TRUE(off.has_value());
        std::memcpy(n.job->pool().base() + *off, payload.data(), len);
        d.body.pool.pool_offset = *off;
      } else {
        std::memcpy(d.body.inline_data, payload.data(), len);
      }
    }
    Submit(n, from, d);
    return token;
  }

  uint64_t Recv(uint16_t a, uint32_t at, uint32_t from_slot, uint32_t tag0,
                uint32_t capacity) {
    Node& n = node(a);
    const uint32_t tag[3] = {tag0, 0, 0};
    const uint32_t sel[3] = {~0u, ~0u, ~0u};
    const uint64_t token = Token(n, at);
    Submit(n, at, shm::PrepRecv(from_slot, token, tag, sel, capacity));
    return token;
  }

  std::vector<shm::CompletionDesc> Reap(uint16_t a, uint32_t at) {
    std::vector<shm::CompletionDesc> out;
    shm::CompletionDesc c;
    while (node(a).clients[at].rings.cq.PopBatch(&c, 1) == 1) {
      out.push_back(c);
    }
    return out;
  }

  // The payload a kRecvDone delivers (its chunk released, as a client).
  std::string PayloadOf(uint16_t a, const shm::CompletionDesc& c) {
    shm::PoolPayload chunk = shm::PayloadOf(node(a).job->pool().base(), c);
    const uint8_t* src = chunk ? chunk.data() : c.body.inline_data;
    return std::string(reinterpret_cast<const char*>(src), c.msg_len);
  }

  // Endpoint 0 of node 2 receives `count` messages of tag 2 and `bytes`
  // from `from_slot`, 32 receives posted at a time, each message's first
  // int its index: they arrive in order, whole and without error (eager,
  // or by rendezvous when node 2 kept the payload: remote.h,
  // back-pressure 3, which a 10 ms stall of the inbox decides).
  void ReceiveInOrder(uint32_t from_slot, int count, uint32_t bytes) {
    std::vector<uint64_t> reqs;
    std::map<uint64_t, std::string> got;
    size_t whole = 0;
    for (int round = 0; round < 400 && whole < size_t(count); round++) {
      for (int k = 0; k < 32 && reqs.size() < size_t(count); k++) {
        reqs.push_back(Recv(2, 0, from_slot, 2, bytes));
      }
      Drain();
      for (const auto& c : Reap(2, 0)) {
        ASSERT_EQ(c.error, PSM2_OK);
        if (c.op == shm::CompleteOp::kRecvDone) {
          got[c.req] = PayloadOf(2, c);
        } else {
          Assemble(2, {c}, &got[c.req]);
        }
      }
      whole = 0;
      for (const auto& [req, payload] : got) whole += payload.size() == bytes;
    }
    ASSERT_EQ(whole, size_t(count));
    for (int i = 0; i < count; i++) {
      const std::string& payload = got[reqs[i]];
      ASSERT_EQ(payload.size(), bytes);
      int index = -1;
      std::memcpy(&index, payload.data(), sizeof(index));
      ASSERT_EQ(index, i);
    }
    EXPECT_EQ(node(2).fabric->frames_waiting(), 0u);
  }

  // One chunk of the transfer `go` names, from `src` + offset through the
  // pool, as the sender's library streams it.
  void Chunk(uint16_t a, uint32_t from, const shm::CompletionDesc& go,
             const std::string& src, uint64_t offset, uint32_t len) {
    Node& n = node(a);
    shm::SubmissionDesc d =
        shm::PrepRndvData(go.req, go.body.go.transfer, offset, len);
    auto off = n.clients[from].arena.Allocate(len);
    ASSERT_TRUE(off.has_value());
    std::memcpy(n.job->pool().base() + *off, src.data() + offset, len);
    d.body.rndv.pool_offset = *off;
    Submit(n, from, d);
  }

  // Puts the kRndvChunk completions' payloads where they belong in *out
  // (released, as a client); returns the bytes placed.
  size_t Assemble(uint16_t a, const std::vector<shm::CompletionDesc>& done,
                  std::string* out) {
    size_t placed = 0;
    for (const auto& c : done) {
      if (c.op != shm::CompleteOp::kRndvChunk || c.error != PSM2_OK) continue;
      shm::PoolPayload chunk = shm::PayloadOf(node(a).job->pool().base(), c);
      if (!chunk) continue;
      if (out->size() < c.body.chunk.offset + c.body.chunk.len) {
        out->resize(c.body.chunk.offset + c.body.chunk.len);
      }
      std::memcpy(out->data() + c.body.chunk.offset, chunk.data(),
                  c.body.chunk.len);
      placed += c.body.chunk.len;
    }
    return placed;
  }

  // This engine's counts for frames from `peer`.
  static Remote::PeerCounts CountsFrom(Node& n, uint64_t peer) {
    for (const Remote::PeerRow& row : n.remote->Stats()) {
      if (row.fabric.node == peer) return row.counts;
    }
    return Remote::PeerCounts{};
  }

  uint32_t timeout_ms_ = 2000;  // the fabric timeout (liveness)
  hw::LoopbackNetwork net_;
  std::string nodes_file_;
  Node nodes_[2];
};

TEST_F(RemoteTest, AnEagerMessageReachesAReceivePostedOnAnotherNode) {
  ConnectPair();
  uint64_t r = Recv(2, 0, 0, 7, 64);
  Drain();
  Send(1, 0, 0, 7, "hello");
  Drain();
  auto done = Reap(2, 0);
  ASSERT_EQ(done.size(), 1u);
  EXPECT_EQ(done[0].op, shm::CompleteOp::kRecvDone);
  EXPECT_EQ(done[0].req, r);
  EXPECT_FALSE(done[0].flags & shm::kWasUnexpected);
  EXPECT_EQ(done[0].src_epid, node(1).clients[0].epid);
  EXPECT_EQ(PayloadOf(2, done[0]), "hello");
}

// An eager message that finds no receive waits at the receiver's node as
// unexpected; a sync send completes only when a receive matches it there.
TEST_F(RemoteTest, AnUnexpectedSyncMessageWaitsAndItsSenderHearsOfTheMatch) {
  ConnectPair();
  const std::string big(5000, 'u');  // pooled: an envelope and a payload
  const uint64_t s = Send(1, 0, 0, 3, big, shm::kSendSync);
  Drain();
  EXPECT_TRUE(Reap(1, 0).empty());
  EXPECT_TRUE(Reap(2, 0).empty());
  const uint64_t r = Recv(2, 0, 0, 3, 8192);
  Drain();
  auto done = Reap(2, 0);
  ASSERT_EQ(done.size(), 1u);
  EXPECT_EQ(done[0].op, shm::CompleteOp::kRecvDone);
  EXPECT_EQ(done[0].req, r);
  EXPECT_TRUE(done[0].flags & shm::kWasUnexpected);
  EXPECT_EQ(PayloadOf(2, done[0]), big);
  auto sent = Reap(1, 0);
  ASSERT_EQ(sent.size(), 1u);
  EXPECT_EQ(sent[0].op, shm::CompleteOp::kSendDone);
  EXPECT_EQ(sent[0].req, s);
  EXPECT_EQ(sent[0].error, PSM2_OK);
}

// Messages from one sender match in the order sent, across the fabric too
// (invariant 1), inline and pooled alike.
TEST_F(RemoteTest, MessagesFromOneRemoteSenderMatchInOrder) {
  ConnectPair();
  for (int i = 0; i < 10; i++) {
    Send(1, 0, 0, 5, std::string(i % 2 ? 3000 : 1, char('a' + i)));
  }
  Drain();
  for (int i = 0; i < 10; i++) Recv(2, 0, shm::kAnySlot, 5, 4096);
  Drain();
  std::string got;
  for (const auto& c : Reap(2, 0)) got += PayloadOf(2, c).substr(0, 1);
  EXPECT_EQ(got, "abcdefghij");
}

TEST_F(RemoteTest, ARendezvousMessageStreamsToAReceiveOnAnotherNode) {
  ConnectPair();
  std::string src(200000, 0);
  for (size_t i = 0; i < src.size(); i++) src[i] = static_cast<char>(i * 7);
  const uint64_t r = Recv(2, 0, 0, 9, src.size());
  Drain();
  const uint64_t s = Send(1, 0, 0, 9, src, 0, /*rndv=*/true);
  Drain();
  std::vector<shm::CompletionDesc> go;
  ASSERT_NO_FATAL_FAILURE(AwaitGo(1, 0, &go));
  EXPECT_EQ(go[0].req, s);
  EXPECT_EQ(go[0].body.go.send_bytes, src.size());
  constexpr uint32_t kChunk = 64 << 10;
  for (uint64_t off = 0; off < src.size(); off += kChunk) {
    const auto len =
        static_cast<uint32_t>(std::min<uint64_t>(kChunk, src.size() - off));
    Chunk(1, 0, go[0], src, off, len);
  }
  Drain();
  auto done = Reap(2, 0);
  ASSERT_GE(done.size(), 2u);
  EXPECT_EQ(done[0].op, shm::CompleteOp::kRecvRndv);
  EXPECT_EQ(done[0].req, r);
  EXPECT_EQ(done[0].msg_len, src.size());
  std::string got;
  EXPECT_EQ(Assemble(2, done, &got), src.size());
  EXPECT_EQ(got, src);
}

// A sync send that finds its receive posted completes once matched there
// (kSyncAck).
TEST_F(RemoteTest, ASyncSendToAPostedRemoteReceiveCompletes) {
  ConnectPair();
  const uint64_t r = Recv(2, 0, 0, 12, 64);
  Drain();
  const uint64_t s = Send(1, 0, 0, 12, "sync", shm::kSendSync);
  Drain();
  auto done = Reap(2, 0);
  ASSERT_EQ(done.size(), 1u);
  EXPECT_EQ(done[0].req, r);
  auto sent = Reap(1, 0);
  ASSERT_EQ(sent.size(), 1u);
  EXPECT_EQ(sent[0].op, shm::CompleteOp::kSendDone);
  EXPECT_EQ(sent[0].req, s);
  EXPECT_EQ(sent[0].error, PSM2_OK);
}

// A rendezvous message that finds no receive waits as unexpected at the
// receiver's node; the receive posted later starts the transfer.
TEST_F(RemoteTest, AnUnexpectedRendezvousMessageStreamsOnceReceived) {
  ConnectPair();
  const std::string src(70000, 'q');
  Send(1, 0, 0, 13, src, 0, /*rndv=*/true);
  Drain();
  EXPECT_TRUE(Reap(1, 0).empty());
  const uint64_t r = Recv(2, 0, 0, 13, src.size());
  Drain();
  std::vector<shm::CompletionDesc> go;
  ASSERT_NO_FATAL_FAILURE(AwaitGo(1, 0, &go));
  Chunk(1, 0, go[0], src, 0, src.size());
  Drain();
  auto done = Reap(2, 0);
  ASSERT_GE(done.size(), 2u);
  EXPECT_EQ(done[0].op, shm::CompleteOp::kRecvRndv);
  EXPECT_EQ(done[0].req, r);
  EXPECT_TRUE(done[0].flags & shm::kWasUnexpected);
  std::string got;
  EXPECT_EQ(Assemble(2, done, &got), src.size());
  EXPECT_EQ(got, src);
}

// A send to a remote slot whose node has no connection (never queried)
// fails at once and gives its payload back.
TEST_F(RemoteTest, ASendToANodeNeverConnectedFails) {
  Node& n1 = node(1);
  n1.engine->SetPeer(n1.clients[0].id, 0,
                     PeerLink{kRemotePeer, node(2).clients[0].epid});
  const uint64_t s = Send(1, 0, 0, 1, std::string(4000, 'x'));
  Drain();
  auto done = Reap(1, 0);
  ASSERT_EQ(done.size(), 1u);
  EXPECT_EQ(done[0].op, shm::CompleteOp::kError);
  EXPECT_EQ(done[0].req, s);
  EXPECT_EQ(done[0].error, PSM2_EPID_UNREACHABLE);
}

// The sender's node dies after the receiver's daemon said go: the
// receive in progress fails at once, it does not wait for chunks.
TEST_F(RemoteTest, APeerLostMidRendezvousFailsTheSurvivorsReceive) {
  ConnectPair();
  const std::string src(200000, 'r');
  const uint64_t r = Recv(2, 0, 0, 9, src.size());
  Drain();
  Send(1, 0, 0, 9, src, 0, /*rndv=*/true);
  Drain();
  std::vector<shm::CompletionDesc> go;
  ASSERT_NO_FATAL_FAILURE(AwaitGo(1, 0, &go));
  Chunk(1, 0, go[0], src, 0, 64 << 10);  // one chunk of four
  Drain();
  KillNode(node(1));
  Drain();
  auto done = Reap(2, 0);
  ASSERT_FALSE(done.empty());
  EXPECT_EQ(done[0].op, shm::CompleteOp::kRecvRndv);
  bool failed = false;
  for (const auto& c : done) {
    if (c.req == r && c.error != PSM2_OK) {
      failed = true;
      EXPECT_EQ(c.error, PSM2_EPID_UNREACHABLE);
    }
  }
  EXPECT_TRUE(failed);
}

// An active message with an ack: the request reaches the handler's
// endpoint on the other node naming its sender by a proxy id, which the
// reply (pooled) and the ack travel back to.
TEST_F(RemoteTest, AnActiveMessageIsAnsweredAndAckedAcrossNodes) {
  Connect(1, 0, 2, 0, 0);
  Node& n1 = node(1);
  Node& n2 = node(2);
  const uint64_t token = Token(n1, 0);
  shm::SubmissionDesc req = shm::PrepActiveMessage(
      false, /*peer=*/0, token, /*handler=*/3, /*nargs=*/1, /*payload=*/4);
  req.flags |= shm::kAmWantsAck;
  const uint64_t arg = 42;
  std::memcpy(req.body.inline_data, &arg, 8);
  std::memcpy(req.body.inline_data + 8, "ping", 4);
  Submit(n1, 0, req);
  Drain();
  auto at_target = Reap(2, 0);
  ASSERT_EQ(at_target.size(), 1u);
  const shm::CompletionDesc& got = at_target[0];
  EXPECT_EQ(got.op, shm::CompleteOp::kAmRequest);
  EXPECT_EQ(got.tag[0], 3u);
  EXPECT_EQ(got.tag[1], 1u);
  EXPECT_TRUE(IsProxy(got.tag[2]));
  EXPECT_EQ(got.src_epid, n1.clients[0].epid);
  EXPECT_EQ(
      std::string(reinterpret_cast<const char*>(got.body.inline_data) + 8, 4),
      "ping");

  // The handler replies with a pooled payload and acks the request.
  const std::string answer(3000, 'p');
  shm::SubmissionDesc reply =
      shm::PrepActiveMessage(true, got.tag[2], Token(n2, 0), /*handler=*/4, 0,
                             static_cast<uint32_t>(answer.size()));
  auto off = n2.clients[0].arena.Allocate(answer.size());
  ASSERT_TRUE(off.has_value());
  std::memcpy(n2.job->pool().base() + *off, answer.data(), answer.size());
  reply.body.pool.pool_offset = *off;
  Submit(n2, 0, reply);
  Submit(n2, 0, shm::PrepAmAck(got.tag[2], got.req, 3, PSM2_OK));
  Drain();
  auto at_sender = Reap(1, 0);
  ASSERT_EQ(at_sender.size(), 2u);
  EXPECT_EQ(at_sender[0].op, shm::CompleteOp::kAmReply);
  EXPECT_EQ(at_sender[0].tag[0], 4u);
  shm::PoolPayload chunk = shm::PayloadOf(n1.job->pool().base(), at_sender[0]);
  ASSERT_TRUE(chunk);
  EXPECT_EQ(
      std::string(reinterpret_cast<const char*>(chunk.data()), answer.size()),
      answer);
  EXPECT_EQ(at_sender[1].op, shm::CompleteOp::kAmAcked);
  EXPECT_EQ(at_sender[1].req, token);
  EXPECT_EQ(at_sender[1].error, PSM2_OK);
  EXPECT_EQ(at_sender[1].tag[0], 3u);
}

// A probe at the receiver sees a message from another node; a claimed
// rendezvous one is then received by kClaimedRecv and streams as usual.
TEST_F(RemoteTest, AProbeClaimsARemoteRendezvousMessage) {
  ConnectPair();
  const std::string src(100000, 'c');
  Send(1, 0, 0, 11, src, 0, /*rndv=*/true);
  Drain();
  Node& n2 = node(2);
  const uint32_t tag[3] = {11, 0, 0};
  const uint32_t sel[3] = {~0u, ~0u, ~0u};
  shm::SubmissionDesc probe =
      shm::PrepProbe(shm::kAnySlot, Token(n2, 0), tag, sel, /*claim=*/true);
  Submit(n2, 0, probe);
  Drain();
  auto probed = Reap(2, 0);
  ASSERT_EQ(probed.size(), 1u);
  EXPECT_EQ(probed[0].op, shm::CompleteOp::kProbeDone);
  EXPECT_EQ(probed[0].error, PSM2_OK);
  EXPECT_EQ(probed[0].msg_len, src.size());
  EXPECT_EQ(probed[0].src_epid, node(1).clients[0].epid);
  Submit(n2, 0, shm::PrepClaimedRecv(probe.req, src.size()));
  Drain();
  std::vector<shm::CompletionDesc> go;
  ASSERT_NO_FATAL_FAILURE(AwaitGo(1, 0, &go));
  Chunk(1, 0, go[0], src, 0, 65536);
  Chunk(1, 0, go[0], src, 65536, src.size() - 65536);
  Drain();
  std::string got;
  EXPECT_EQ(Assemble(2, Reap(2, 0), &got), src.size());
  EXPECT_EQ(got, src);
}

// psm2_ep_connect to an epid its node does not have fails.
TEST_F(RemoteTest, AQueryForAnEndpointTheNodeDoesNotHaveFails) {
  Node& n1 = node(1);
  int result = -1;
  n1.remote->Query(*n1.endpoints[0], shm::MakeEpid(2, kNonce, 99),
                   [&](int error, const std::string&) { result = error; });
  Drain();
  EXPECT_NE(result, PSM2_OK);
  EXPECT_NE(result, -1);
}

// Invariant 8 across nodes: an endpoint removed on node 1 is told to node
// 2 (kGone), where a receive naming it fails at once.
TEST_F(RemoteTest, AReceiveNamingARemovedRemoteEndpointFails) {
  ConnectPair();
  const uint64_t r = Recv(2, 0, 0, 1, 64);
  Drain();
  node(1).engine->Remove(node(1).clients[0].id);
  Drain();
  auto done = Reap(2, 0);
  ASSERT_EQ(done.size(), 1u);
  EXPECT_EQ(done[0].req, r);
  EXPECT_EQ(done[0].error, PSM2_EPID_UNREACHABLE);
}

// A sender's last message, held for its receiver (kXoff: here a handover
// of the receiver's node holding its peers), then its endpoint closed: the
// kGone that tells the receiver's node goes after the message, not before
// it (where it failed a receive naming the sender with
// PSM2_EPID_UNREACHABLE, and the message arrived for nobody).
TEST_F(RemoteTest, AClosedSendersKGoneWaitsForItsMessagesHeldBeforeIt) {
  ConnectPair();
  const uint64_t r = Recv(2, 0, 0, 7, 64);
  Drain();
  node(2).remote->HoldPeers(true);
  Drain();
  Send(1, 0, 0, 7, "last words");
  Drain();
  EXPECT_TRUE(Reap(2, 0).empty()) << "held";
  node(1).engine->Remove(node(1).clients[0].id);
  Drain();
  node(2).remote->HoldPeers(false);
  Drain();
  auto done = Reap(2, 0);
  ASSERT_EQ(done.size(), 1u);
  EXPECT_EQ(done[0].req, r);
  EXPECT_EQ(done[0].error, PSM2_OK);
  EXPECT_EQ(PayloadOf(2, done[0]).substr(0, 10), "last words");
  // And the kGone came after: a receive naming the sender fails now.
  const uint64_t after = Recv(2, 0, 0, 8, 64);
  Drain();
  done = Reap(2, 0);
  ASSERT_EQ(done.size(), 1u);
  EXPECT_EQ(done[0].req, after);
  EXPECT_EQ(done[0].error, PSM2_EPID_UNREACHABLE);
}

// A receiver that leaves while its node holds the sender (kXoff; here a
// handover's hold) is never said "on" again (kXon): its kGone releases what
// waited for it (refused there), else those frames, and a kGone of their
// sender behind them, would wait until the connection ends.
TEST_F(RemoteTest, AReceiverThatLeavesWhileHeldReleasesWhatWaitedForIt) {
  ConnectPair();
  node(2).remote->HoldPeers(true);
  Drain();
  // Eager, from the pool: a frame set aside is carried by a handover,
  // unless its bytes are a pool chunk of an endpoint that left.
  Send(1, 0, 0, 7, std::string(100, 'n'));
  Drain();
  // Its sender closes: its last send is taken and set aside, its kGone
  // behind it.
  node(1).engine->Remove(node(1).clients[0].id);
  Drain();
  std::string why;
  ASSERT_FALSE(node(1).remote->Carriable(&why)) << "frames set aside";
  EXPECT_NE(why.find("an endpoint that left"), std::string::npos) << why;
  node(2).engine->Remove(node(2).clients[0].id);
  Drain();
  EXPECT_TRUE(node(1).remote->Carriable(&why)) << why;
  node(2).remote->HoldPeers(false);
  Drain();
  EXPECT_TRUE(node(1).remote->Carriable(&why)) << why;
  EXPECT_TRUE(node(2).remote->Carriable(&why)) << why;
}

// Back-pressure rules 1 and 2: a receiver over its unexpected budget gets
// what arrives for it parked at its node, whose daemon asks the sender's to
// hold (kXoff); nothing is lost or reordered once receives drain the queue.
TEST_F(RemoteTest, MessagesOverTheReceiversBudgetParkAndTheSenderHolds) {
  ConnectPair();
  // One message at a time.
  EndpointTestPeer(*node(2).endpoints[0]).set_unexpected_budget(0);
  constexpr int kMessages = 20;
  for (int i = 0; i < kMessages; i++) {
    Send(1, 0, 0, 6, std::string(i % 2 ? 2000 : 1, char('A' + i)));
  }
  Drain();
  EXPECT_GE(CountsFrom(node(2), 1).parked, 1u);
  EXPECT_GE(CountsFrom(node(1), 2).xoffs, 1u);
  for (int i = 0; i < kMessages; i++) Recv(2, 0, 0, 6, 4096);
  Drain();
  std::string got;
  for (const auto& c : Reap(2, 0)) {
    EXPECT_EQ(c.op, shm::CompleteOp::kRecvDone);
    got += PayloadOf(2, c).substr(0, 1);
  }
  EXPECT_EQ(got, "ABCDEFGHIJKLMNOPQRST");
}

// The sending endpoint closes mid-transfer while its node lives on: its
// daemon tells the receiver's (kAbort), whose receive fails.
TEST_F(RemoteTest, ASenderThatLeavesMidRendezvousFailsTheReceive) {
  ConnectPair();
  const std::string src(200000, 'a');
  const uint64_t r = Recv(2, 0, 0, 9, src.size());
  Drain();
  Send(1, 0, 0, 9, src, 0, /*rndv=*/true);
  Drain();
  std::vector<shm::CompletionDesc> go;
  ASSERT_NO_FATAL_FAILURE(AwaitGo(1, 0, &go));
  Chunk(1, 0, go[0], src, 0, 64 << 10);
  Drain();
  node(1).engine->Remove(node(1).clients[0].id);
  Drain();
  bool failed = false;
  for (const auto& c : Reap(2, 0)) {
    if (c.req == r && c.error != PSM2_OK) failed = true;
  }
  EXPECT_TRUE(failed);
}

// The receiver's node dies while a rendezvous send waits for its match:
// the sender's request fails at once.
TEST_F(RemoteTest, AReceiversNodeLostFailsAWaitingRendezvousSend) {
  ConnectPair();
  const uint64_t s = Send(1, 0, 0, 9, std::string(100000, 's'), 0, true);
  Drain();
  EXPECT_TRUE(Reap(1, 0).empty());
  KillNode(node(2));
  Drain();
  auto done = Reap(1, 0);
  bool failed = false;
  for (const auto& c : done) {
    if (c.req == s) {
      failed = true;
      EXPECT_EQ(c.error, PSM2_EPID_UNREACHABLE);
    }
  }
  EXPECT_TRUE(failed);
}

// A connection reset (both nodes alive) tells each endpoint that had
// connected to one on the other node (kNodeLost), and a receive naming one
// fails.
TEST_F(RemoteTest, AResetConnectionIsReportedAsTheNodeLost) {
  ConnectPair();
  const uint64_t r = Recv(2, 0, 0, 1, 64);
  Drain();
  node(1).fabric->Sever(2);
  Drain();
  auto done = Reap(2, 0);
  bool lost = false, failed = false;
  for (const auto& c : done) {
    if (c.op == shm::CompleteOp::kNodeLost) {
      lost = true;
      EXPECT_EQ(c.tag[0], 1u);
      EXPECT_EQ(c.error, PSM2_EPID_UNREACHABLE);
    }
    if (c.req == r) {
      failed = true;
      EXPECT_EQ(c.error, PSM2_EPID_UNREACHABLE);
    }
  }
  EXPECT_TRUE(lost);
  EXPECT_TRUE(failed);
}

// Back-pressure rule 3: eager messages nobody receives fill their share of
// the receiving job's inbox; after kPoolStallNs the next payloads are kept
// in daemon memory (kEagerOff to the sender's daemon, which then sends
// envelopes only). Every message still arrives intact and in order.
TEST_F(RemoteTest, EagerMessagesPastTheInboxShareAreKeptAndStillArrive) {
  ConnectPair();
  constexpr int kMessages = 40;
  constexpr uint32_t kBytes = 20000;  // 40 x 20000 > half the 1 MiB inbox
  for (int i = 0; i < kMessages; i++) {
    Send(1, 0, 0, 8, std::string(kBytes, char('A' + i)));
    if (i % 8 == 7) Drain();  // the sender's ring holds 64
  }
  for (int i = 0; i < 50 && CountsFrom(node(2), 1).kept == 0; i++) {
    Drain();
    usleep(5000);
  }
  EXPECT_GE(CountsFrom(node(2), 1).kept, 1u);
  EXPECT_GE(CountsFrom(node(1), 2).eager_offs, 1u);
  std::vector<uint64_t> reqs;
  std::map<uint64_t, std::string> got;
  for (int i = 0; i < kMessages; i++) {
    reqs.push_back(Recv(2, 0, 0, 8, kBytes));
    if (i % 8 == 7) {
      Drain();
      for (const auto& c : Reap(2, 0)) {
        if (c.op == shm::CompleteOp::kRecvDone) {
          got[c.req] = PayloadOf(2, c);
        } else {
          Assemble(2, {c}, &got[c.req]);
        }
      }
    }
  }
  ASSERT_EQ(got.size(), static_cast<size_t>(kMessages));
  for (int i = 0; i < kMessages; i++) {
    EXPECT_EQ(got[reqs[i]], std::string(kBytes, char('A' + i))) << i;
  }
}

// A peer that ignores kXoff and its receivers' windows (psmd's own sends
// stop at kReceiverWindow per receiver: here a rogue node sends raw frames)
// fills node 2's park: past kParkMax node 2 stops reading from it, and
// reads on as the receiver takes its messages; every one arrives, in order.
TEST_F(RemoteTest, PastTheParkCapTheConnectionPausesAndThenResumes) {
  constexpr uint16_t kRogue = 9;
  EndpointTestPeer(*node(2).endpoints[0]).set_unexpected_budget(0);
  constexpr int kMessages = 1100;
  constexpr uint32_t kBytes = 16 << 10;  // 1100 x 16 KiB > kParkMax (16 MiB)
  std::unique_ptr<hw::LoopbackFabric> rogue = net_.Create(kRogue);
  hw::ConnId conn = 0;
  ASSERT_EQ(rogue->Connect("2@127.0.0.1:2", 2, &conn), hw::ErrorClass::kOk);
  Drain();
  wire::Sender from;
  from.epid = shm::MakeEpid(kRogue, kNonce, 1);
  from.uid = geteuid();
  std::memcpy(from.job, node(2).job->key().uuid.data(), sizeof(from.job));
  const uint64_t dst = node(2).clients[0].epid;
  const uint32_t tag[3] = {2, 0, 0};
  for (int i = 0; i < kMessages; i++) {
    const wire::Envelope env =
        wire::PrepMessage(from, dst, i + 1, tag, kBytes, 0, false, nullptr);
    uint8_t bytes[wire::kEnvelopeMax];
    iovec iov{bytes, wire::Encode(env, bytes)};
    ASSERT_EQ(rogue->PostSend(conn, env.f, &iov, 1, 2 * i),
              hw::ErrorClass::kOk);
    std::string payload(kBytes, 0);  // copied by PostSend
    std::memcpy(payload.data(), &i, sizeof(i));
    iov = {payload.data(), payload.size()};
    ASSERT_EQ(rogue->PostSend(conn, wire::PrepPayload(from, dst, i + 1), &iov,
                              1, 2 * i + 1),
              hw::ErrorClass::kOk);
  }
  EXPECT_EQ(node(2).fabric->frames_waiting(), 2u * kMessages);
  Drain();
  // Node 2 parked what fits and stopped reading: frames still wait.
  EXPECT_GT(node(2).fabric->frames_waiting(), 0u);
  ReceiveInOrder(shm::kAnySlot, kMessages, kBytes);
}

// psmd's own sender stops at kReceiverWindow bytes to a receiver whose
// daemon has not consumed them (back-pressure 5): with node 2 not running,
// node 1 posts about 8 MiB and then holds its sender's sends; once node 2
// runs, its credits let the rest through, every message in order.
TEST_F(RemoteTest, ASenderPostsAtMostTheReceiversWindowAheadOfItsCredit) {
  ConnectPair();
  constexpr uint32_t kBytes = 16 << 10;
  Node& n1 = node(1);
  int sent = 0;
  while (EndpointTestPeer(*n1.endpoints[0]).held_sends().empty()) {
    ASSERT_LT(sent, 1000) << "never held";
    for (int k = 0; k < 16; k++, sent++) {
      std::string payload(kBytes, 0);
      std::memcpy(payload.data(), &sent, sizeof(sent));
      Send(1, 0, 0, 2, payload);
    }
    // Only node 1 runs: what it posts waits at node 2 unread (the loopback
    // fabric copied it, so the sender's chunks are free again).
    for (int j = 0; j < 8; j++) {
      n1.engine->PollAll();
      n1.remote->Poll();
    }
  }
  // A payload frame per message counts: the window, and one over.
  const size_t per_message = hw::kFrameHeaderSize + kBytes;
  const size_t waiting = node(2).fabric->frames_waiting() / 2;
  EXPECT_GE(waiting * per_message, 8u << 20);
  EXPECT_LE(waiting * per_message, (8u << 20) + per_message);
  ReceiveInOrder(0, sent, kBytes);
}

// A receive naming a remote sender can be cancelled until a message from
// it matches; one that arrives after goes to the next receive.
TEST_F(RemoteTest, AReceiveFromARemoteSenderCancelsBeforeItsMatch) {
  ConnectPair();
  Node& n2 = node(2);
  const uint64_t r = Recv(2, 0, 0, 4, 64);
  Drain();
  const uint64_t c = Token(n2, 0);
  Submit(n2, 0, shm::PrepCancel(c, r));
  Drain();
  auto done = Reap(2, 0);
  ASSERT_EQ(done.size(), 1u);
  EXPECT_EQ(done[0].op, shm::CompleteOp::kCancelDone);
  EXPECT_EQ(done[0].error, PSM2_OK);
  Send(1, 0, 0, 4, "late");
  Drain();
  EXPECT_TRUE(Reap(2, 0).empty());  // unexpected now
  const uint64_t r2 = Recv(2, 0, 0, 4, 64);
  Drain();
  done = Reap(2, 0);
  ASSERT_EQ(done.size(), 1u);
  EXPECT_EQ(done[0].req, r2);
  EXPECT_EQ(PayloadOf(2, done[0]), "late");
}

// A rendezvous receive smaller than the message asks for what fits only.
TEST_F(RemoteTest, ARendezvousReceiveSmallerThanTheMessageGetsWhatFits) {
  ConnectPair();
  const std::string src(100000, 't');
  Recv(2, 0, 0, 9, 50000);
  Drain();
  Send(1, 0, 0, 9, src, 0, /*rndv=*/true);
  Drain();
  std::vector<shm::CompletionDesc> go;
  ASSERT_NO_FATAL_FAILURE(AwaitGo(1, 0, &go));
  EXPECT_EQ(go[0].body.go.send_bytes, 50000u);
  Chunk(1, 0, go[0], src, 0, 50000);
  Drain();
  auto done = Reap(2, 0);
  ASSERT_GE(done.size(), 2u);
  EXPECT_EQ(done[0].msg_len, src.size());
  std::string got;
  EXPECT_EQ(Assemble(2, done, &got), 50000u);
  EXPECT_EQ(got, src.substr(0, 50000));
}

// A daemon trusts nothing another node sends: a frame of each op that
// wire.h's decoders refuse (or, for the data ops, that nothing announced)
// ends that node's connection and is counted, after a well-formed frame
// from the same node was taken. Node 9 is a bare fabric driven by hand,
// connecting anew for each case.
TEST_F(RemoteTest, AMalformedFrameOfEachOpDropsItsConnection) {
  constexpr uint16_t kRogue = 9;
  struct Case {
    const char* what;
    wire::Error why;       // the decoders' verdict (kOk: the engine's)
    wire::Envelope frame;  // its fields, and its body unless `body` is set
    std::vector<uint8_t> body;
  };
  const uint64_t dst = node(2).clients[0].epid;
  const uint32_t tag[3] = {1, 2, 3};
  const uint8_t bytes[shm::kInlineMax] = {};
  std::vector<Case> cases;
  auto add = [&](const char* what, wire::Error why, const wire::Envelope& e,
                 std::vector<uint8_t> body = {}) {
    cases.push_back(Case{what, why, e, std::move(body)});
  };
  wire::Sender from;
  from.epid = shm::MakeEpid(kRogue, kNonce, 1);
  from.uid = geteuid();
  from.job[0] = 1;
  wire::Envelope e;
  e.f.op = 0;
  add("op 0", wire::Error::kUnknownOp, e);
  e.f.op = wire::kOpCount;
  add("an op past the last", wire::Error::kUnknownOp, e);
  e = wire::PrepQuery(from, dst, 1);
  e.r.tag[0] = 1;
  add("kQuery with a tag", wire::Error::kFields, e);
  e = wire::PrepAnswer(from, dst, 1, 0);
  add("kAnswer one byte long", wire::Error::kLength, e, {1});
  e = wire::PrepMessage(from, dst, 1, tag, 3, 0, false, bytes);
  e.inline_len = 0;
  add("kEnvelope without its inline bytes", wire::Error::kInline, e);
  e.f = wire::PrepPayload(from, dst, 1);
  add("kPayload shorter than inline", wire::Error::kLength, e,
      std::vector<uint8_t>(10));
  e = wire::PrepSyncAck(from, dst, 1);
  e.f.src = shm::MakeEpid(1, kNonce, 1);
  add("kSyncAck from an endpoint of another node", wire::Error::kForeign, e);
  e = wire::PrepRndvGo(from, dst, 1, 4096, 0);
  add("kRndvGo of bytes without a transfer", wire::Error::kRange, e);
  e.f = wire::PrepRndvData(from, dst, 77, 0);
  add("kRndvData of no transfer", wire::Error::kOk, e,
      std::vector<uint8_t>(64));
  e = wire::PrepActiveMessage(false, from, dst, 1, shm::kAmMaxHandlers, 0, 0, 0,
                              bytes);
  add("kAmRequest to a handler out of range", wire::Error::kRange, e);
  e = wire::PrepActiveMessage(true, from, dst, 1, 0, 0, 0,
                              shm::kAmRequestNoReply, bytes);
  add("kAmReply with a request's flag", wire::Error::kFlags, e);
  e = wire::PrepAmAck(from, dst, 1, shm::kAmMaxHandlers, 0);
  add("kAmAck of a handler out of range", wire::Error::kRange, e);
  e = wire::PrepError(from, dst, 1, PSM2_EPID_UNREACHABLE);
  e.r.x = 1;
  add("kError with a transfer id", wire::Error::kFields, e);
  e = wire::PrepAbort(from, dst, 1, PSM2_EPID_UNREACHABLE);
  e.f.offset = 8;
  add("kAbort with an offset", wire::Error::kFields, e);
  e = wire::PrepPing();
  e.f.aux = 1;
  add("kPing with a request", wire::Error::kFields, e);
  e = wire::PrepGone(from, PSM2_EPID_UNREACHABLE);
  e.f.src = shm::MakeEpid(1, kNonce, 1);
  add("kGone of an endpoint of another node", wire::Error::kForeign, e);
  for (wire::Op op : {wire::Op::kXoff, wire::Op::kXon, wire::Op::kEagerOff,
                      wire::Op::kEagerOn}) {
    e = wire::PrepFlow(op, from);
    e.f.dst = dst;
    add("kXoff/kXon/kEagerOff/kEagerOn with a dst", wire::Error::kFields, e);
    if (op == wire::Op::kXon) continue;
    e = wire::PrepFlow(op, from);
    e.r.x = 1 << 20;  // a credit: kXon's only
    add("kXoff/kEagerOff/kEagerOn with a credit", wire::Error::kFields, e);
  }
  wire::Region region;
  region.length = 1 << 20;
  e = wire::PrepRndvRead(from, dst, wire::kRmaOfferBit | 5, 0, 1, 4096,
                         region.length - 4095, region);
  add("kRndvRead off its region", wire::Error::kRange, e);
  // (An id this daemon never gave: one it gave and ended is answered.)
  e = wire::PrepRndvRead(from, dst, wire::kRmaOfferBit | (1ull << 40), 0, 1,
                         4096, 0, region);
  add("kRndvRead of no transfer offered", wire::Error::kOk, e);
  e = wire::PrepRndvReadDone(from, dst, 1, 4096, 0);
  e.r.tag[2] = 1;
  add("kRndvReadDone with a tag", wire::Error::kFields, e);
  std::vector<bool> covered(wire::kOpCount);
  for (size_t i = 0; i < cases.size(); i++) {
    Case& c = cases[i];
    SCOPED_TRACE(c.what);
    if (c.frame.f.op < wire::kOpCount) covered[c.frame.f.op] = true;
    uint8_t out[wire::kEnvelopeMax];
    iovec iov = c.body.empty() ? iovec{out, wire::Encode(c.frame, out)}
                               : iovec{c.body.data(), c.body.size()};
    const auto length = static_cast<uint32_t>(iov.iov_len);
    wire::Envelope decoded;
    EXPECT_EQ(wire::TraitsOf(c.frame.f.op).shape == wire::Shape::kEnvelope
                  ? wire::DecodeEnvelope(kRogue, c.frame.f,
                                         static_cast<uint8_t*>(iov.iov_base),
                                         length, &decoded)
                  : wire::CheckHeader(kRogue, c.frame.f, length),
              c.why);
    std::unique_ptr<hw::LoopbackFabric> rogue = net_.Create(kRogue);
    hw::ConnId conn = 0;
    ASSERT_EQ(rogue->Connect("2@127.0.0.1:2", 2, &conn), hw::ErrorClass::kOk);
    Drain();
    // A well-formed frame goes through.
    const wire::Envelope ping = wire::PrepPing();
    uint8_t ping_bytes[wire::kEnvelopeMax];
    iovec ping_iov{ping_bytes, wire::Encode(ping, ping_bytes)};
    ASSERT_EQ(rogue->PostSend(conn, ping.f, &ping_iov, 1, 1),
              hw::ErrorClass::kOk);
    Drain();
    EXPECT_EQ(CountsFrom(node(2), kRogue).malformed, i);
    ASSERT_EQ(rogue->PostSend(conn, c.frame.f, &iov, 1, 2),
              hw::ErrorClass::kOk);
    Drain();
    EXPECT_EQ(CountsFrom(node(2), kRogue).malformed, i + 1);
    bool closed = false;
    hw::Event events[16];
    for (int n = rogue->Poll(events, 16); n > 0; n = rogue->Poll(events, 16)) {
      for (int k = 0; k < n; k++) {
        closed |= events[k].type == hw::EventType::kClosed;
      }
    }
    EXPECT_TRUE(closed);
  }
  for (uint16_t op = 0; op < wire::kOpCount; op++) {
    EXPECT_TRUE(covered[op]) << "no malformed frame of op " << op;
  }
  // The other node's connection is untouched.
  ConnectPair();
  Recv(2, 0, 0, 5, 64);
  Send(1, 0, 0, 5, "still here");
  Drain();
  auto done = Reap(2, 0);
  ASSERT_EQ(done.size(), 1u);
  EXPECT_EQ(PayloadOf(2, done[0]), "still here");
}

class ShortTimeoutRemoteTest : public RemoteTest {
 protected:
  ShortTimeoutRemoteTest() { timeout_ms_ = 200; }
};

// Liveness: a node whose daemon stops running (no frames, no heartbeats)
// is declared dead after the fabric timeout; receives naming its endpoints
// fail with PSM2_TIMEOUT.
TEST_F(ShortTimeoutRemoteTest, ASilentNodeIsDeclaredDeadAfterTheTimeout) {
  ConnectPair();
  const uint64_t r = Recv(1, 0, 0, 1, 64);
  Drain();
  Node& n1 = node(1);
  bool failed = false;
  // Usually about two timeouts; a loaded machine's late checks are not
  // counted against the peer (Remote::CheckLiveness), so allow more.
  const auto start = std::chrono::steady_clock::now();
  while (!failed && std::chrono::steady_clock::now() - start <
                        std::chrono::milliseconds(15 * timeout_ms_)) {
    n1.engine->PollAll();  // node 1 alone runs
    n1.remote->Poll();
    for (const auto& c : Reap(1, 0)) {
      if (c.req == r) {
        failed = true;
        EXPECT_EQ(c.error, PSM2_TIMEOUT);
      }
    }
    usleep(200);
  }
  EXPECT_TRUE(failed);
}

}  // namespace
}  // namespace psmd
