// MqEngine on in-memory segments: real rings, a real job pool, the engine
// driven by hand from the test thread (its single-threaded design allows
// it). The client side of each endpoint is shm/'s own view of a segment
// (ClientRingsOf), so these tests exercise the wire contract as well.
#include "daemon/engine/mq_engine.h"
#include "daemon/engine/test_endpoint.h"

#include <gtest/gtest.h>
#include <psm2.h>
#include <psm2_mq.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstring>
#include <string>
#include <vector>

#include "shm/payload.h"
#include "shm/pool.h"
#include "shm/segment.h"

namespace psmd {
namespace {

constexpr uint32_t kRingCapacity = 64;
constexpr uint64_t kRegionBytes = 1 << 20;
constexpr uint32_t kEndpoints = 3;
constexpr uint64_t kBudget = 1 << 20;

// One endpoint as its client sees it.
struct ClientSide {
  uint32_t id = 0;
  uint64_t epid = 0;
  shm::ClientRings rings;
  shm::SendArena arena;
  uint64_t next_token = 1;
};

class MqEngineTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string error;
    shm::Mapping pool;
    ASSERT_TRUE(shm::Mapping::Create("test-pool", kEndpoints * kRegionBytes,
                                     geteuid(), getegid(), &pool, &error))
        << error;
    job_ = std::make_shared<Job>(JobKey{Uuid{1}, geteuid()}, std::move(pool),
                                 kEndpoints, kRegionBytes,
                                 std::make_shared<UidAccount>());
    for (uint32_t i = 0; i < kEndpoints; i++) AddEndpoint(i + 1);
    // Every endpoint is connected to every endpoint (itself included) at
    // slot = the peer's index.
    for (uint32_t i = 0; i < kEndpoints; i++) {
      for (uint32_t j = 0; j < kEndpoints; j++) {
        engine_.SetPeer(clients_[i].id, j,
                        PeerLink{clients_[j].id, clients_[j].epid});
      }
    }
  }

  void AddEndpoint(uint32_t id) { AddEndpoint(id, job_); }
  void AddEndpoint(uint32_t id, const std::shared_ptr<Job>& job) {
    auto ep = MakeTestEndpoint(job, *job->TakeRegion(), id, 0x1000 + id,
                               kRingCapacity, kBudget);
    ClientSide c;
    c.id = id;
    c.epid = ep->epid();
    c.rings = shm::ClientRingsOf(ep->segment().base(), ep->geometry());
    c.arena = shm::SendArena(job->pool().base(), ep->region().offset,
                             ep->region().bytes);
    endpoints_.push_back(ep);
    clients_.push_back(c);
    engine_.Add(ep);
  }

  // Publishes `d` on the ring its op belongs on (or on `ring` if given).
  void Submit(uint32_t from, shm::SubmissionDesc d) {
    Submit(from, d, shm::TraitsOf(d.op).ring);
  }
  void Submit(uint32_t from, shm::SubmissionDesc d, shm::Ring ring) {
    auto& r = ring == shm::Ring::kMessage ? clients_[from].rings.msg_sq
                                          : clients_[from].rings.ctl_sq;
    ASSERT_TRUE(r.TryPush(d));
  }

  uint64_t Token(uint32_t from) { return clients_[from].next_token++; }

  // An eager send of `payload` from endpoint `from` to `to`; pooled when
  // the payload is not inline. Returns the token.
  uint64_t Send(uint32_t from, uint32_t to, uint32_t tag0,
                const std::string& payload, uint8_t flags = 0) {
    const uint32_t tag[3] = {tag0, 0, 0};
    const uint64_t token = Token(from);
    auto len = static_cast<uint32_t>(payload.size());
    shm::SubmissionDesc d = shm::PrepSend(to, token, tag, len, false);
    d.flags = flags;
    if (shm::PayloadInPool(d)) {
      auto off = clients_[from].arena.Allocate(len);
      EXPECT_TRUE(off.has_value());
      std::memcpy(job_->pool().base() + *off, payload.data(), len);
      d.body.pool.pool_offset = *off;
    } else {
      std::memcpy(d.body.inline_data, payload.data(), len);
    }
    Submit(from, d);
    return token;
  }

  uint64_t Recv(uint32_t at, uint32_t from_slot, uint32_t tag0,
                uint32_t capacity) {
    const uint32_t tag[3] = {tag0, 0, 0};
    const uint32_t sel[3] = {~0u, ~0u, ~0u};
    const uint64_t token = Token(at);
    Submit(at, shm::PrepRecv(from_slot, token, tag, sel, capacity));
    return token;
  }

  // An eager message from endpoint `from`, its payload inline, and its key:
  // what a transport beside the engine hands to Arrive.
  UnexpectedMsg InlineMsg(uint32_t from, const std::string& payload) {
    UnexpectedMsg m{};
    m.sender_id = clients_[from].id;
    m.len = static_cast<uint32_t>(payload.size());
    std::memcpy(m.inline_data, payload.data(), payload.size());
    return m;
  }
  MsgKey KeyFrom(uint32_t from, uint32_t tag0) {
    const uint32_t tag[3] = {tag0, 0, 0};
    return KeyOf(clients_[from].epid, tag);
  }

  // Runs the engine until it has nothing left to do.
  void Drain() {
    for (int i = 0; i < 100 && engine_.PollAll(); i++) {
    }
  }

  std::vector<shm::CompletionDesc> Reap(uint32_t at) {
    std::vector<shm::CompletionDesc> out;
    shm::CompletionDesc c;
    while (clients_[at].rings.cq.PopBatch(&c, 1) == 1) out.push_back(c);
    return out;
  }

  // The payload a kRecvDone delivers (and releases its chunk, as a client).
  std::string PayloadOf(const shm::CompletionDesc& c) {
    shm::PoolPayload chunk = shm::PayloadOf(job_->pool().base(), c);
    const uint8_t* src = chunk ? chunk.data() : c.body.inline_data;
    return std::string(reinterpret_cast<const char*>(src), c.msg_len);
  }

  // Posts receives (tag 1) at `at` from slot `from` one at a time until
  // `count` messages of `payload` arrived (at most 2 * count rounds);
  // returns how many did.
  int ReceiveEach(uint32_t at, uint32_t from, int count,
                  const std::string& payload) {
    int received = 0;
    for (int round = 0; round < 2 * count && received < count; round++) {
      Recv(at, from, 1, static_cast<uint32_t>(payload.size()));
      Drain();
      for (const auto& c : Reap(at)) {
        EXPECT_EQ(PayloadOf(c), payload);
        received++;
      }
    }
    return received;
  }

  MqEngine engine_{/*max_unexpected_budget=*/1 << 30,
                   /*job_unexpected_budget=*/1 << 30,
                   /*uid_unexpected_budget=*/1 << 30};
  std::shared_ptr<Job> job_;
  std::vector<std::shared_ptr<Endpoint>> endpoints_;
  std::vector<ClientSide> clients_;
};

TEST_F(MqEngineTest, UnexpectedAndExpectedMessagesArriveIntact) {
  Send(0, 1, 7, "inline");           // unexpected at endpoint 1
  const std::string big(5000, 'x');  // pooled
  Drain();
  uint64_t r1 = Recv(1, 0, 7, 64);
  uint64_t r2 = Recv(1, 0, 8, 8192);  // expected: posted first
  Drain();
  Send(0, 1, 8, big);
  Drain();
  auto done = Reap(1);
  ASSERT_EQ(done.size(), 2u);
  EXPECT_EQ(done[0].op, shm::CompleteOp::kRecvDone);
  EXPECT_EQ(done[0].req, r1);
  EXPECT_TRUE(done[0].flags & shm::kWasUnexpected);
  EXPECT_EQ(PayloadOf(done[0]), "inline");
  EXPECT_EQ(done[1].req, r2);
  EXPECT_FALSE(done[1].flags & shm::kWasUnexpected);
  EXPECT_EQ(PayloadOf(done[1]), big);
  EXPECT_EQ(done[1].src_epid, clients_[0].epid);
  // Released chunks are reclaimed: the sender's region is empty again.
  clients_[0].arena.Allocate(1);
  EXPECT_LT(clients_[0].arena.used(), 4096u);
}

TEST_F(MqEngineTest, MessagesFromOneSenderMatchInOrder) {
  for (int i = 0; i < 10; i++) Send(0, 1, 5, std::string(1, char('a' + i)));
  Drain();
  std::string got;
  for (int i = 0; i < 10; i++) Recv(1, shm::kAnySlot, 5, 1);
  Drain();
  for (const auto& c : Reap(1)) got += PayloadOf(c);
  EXPECT_EQ(got, "abcdefghij");  // invariant 1
}

TEST_F(MqEngineTest, SyncSendCompletesOnlyOnceMatched) {
  uint64_t s = Send(0, 1, 3, "sync", shm::kSendSync);
  Drain();
  EXPECT_TRUE(Reap(0).empty());
  Recv(1, 0, 3, 16);
  Drain();
  auto done = Reap(0);
  ASSERT_EQ(done.size(), 1u);
  EXPECT_EQ(done[0].op, shm::CompleteOp::kSendDone);
  EXPECT_EQ(done[0].req, s);
}

// Invariant 2: a send to oneself that the receive matches ends first in the
// one completion ring, whether the receive was posted before or after it, or
// claims it (improbe): mpi4py's testManyISendAndRecv tests the sends right
// after the receives.
TEST_F(MqEngineTest, ASyncSendToOneselfCompletesBeforeItsReceive) {
  uint64_t r = Recv(0, 0, 4, 16);
  Drain();
  uint64_t s = Send(0, 0, 4, "posted", shm::kSendSync);
  uint64_t s2 = Send(0, 0, 5, "unexpected", shm::kSendSync);
  Drain();
  uint64_t r2 = Recv(0, 0, 5, 16);
  Drain();
  uint64_t s3 = Send(0, 0, 6, "claimed", shm::kSendSync);
  Drain();
  const uint32_t tag[3] = {6, 0, 0};
  const uint32_t sel[3] = {~0u, ~0u, ~0u};
  shm::SubmissionDesc probe = shm::PrepProbe(0, Token(0), tag, sel, true);
  Submit(0, probe);
  Drain();
  auto done = Reap(0);
  ASSERT_EQ(done.size(), 6u);
  const std::pair<shm::CompleteOp, uint64_t> want[] = {
      {shm::CompleteOp::kSendDone, s},
      {shm::CompleteOp::kRecvDone, r},
      {shm::CompleteOp::kSendDone, s2},
      {shm::CompleteOp::kRecvDone, r2},
      {shm::CompleteOp::kSendDone, s3},
      {shm::CompleteOp::kProbeDone, probe.req}};
  for (size_t i = 0; i < 6; i++) {
    EXPECT_EQ(done[i].op, want[i].first) << i;
    EXPECT_EQ(done[i].req, want[i].second) << i;
  }
  EXPECT_EQ(PayloadOf(done[3]), "unexpected");
}

TEST_F(MqEngineTest, CancelSucceedsOnlyBeforeTheMatch) {
  uint64_t r = Recv(1, 0, 9, 16);
  Drain();
  uint64_t c = Token(1);
  Submit(1, shm::PrepCancel(c, r));
  Drain();
  auto done = Reap(1);
  ASSERT_EQ(done.size(), 1u);
  EXPECT_EQ(done[0].op, shm::CompleteOp::kCancelDone);
  EXPECT_EQ(done[0].error, PSM2_OK);
  // The cancelled receive is gone: a message now waits as unexpected.
  Send(0, 1, 9, "late");
  Drain();
  EXPECT_TRUE(Reap(1).empty());
  Submit(1, shm::PrepCancel(Token(1), r));  // nothing left to cancel
  Drain();
  done = Reap(1);
  ASSERT_EQ(done.size(), 1u);
  EXPECT_EQ(done[0].error, PSM2_MQ_NO_COMPLETIONS);
}

TEST_F(MqEngineTest, MalformedSubmissionsGetOneErrorEach) {
  // A send on the control ring (it would escape the budget hold-back), a
  // send to an unconnected slot, an unknown op.
  const uint32_t tag[3] = {1, 0, 0};
  Submit(0, shm::PrepSend(1, 11, tag, 4, false), shm::Ring::kControl);
  Submit(0, shm::PrepSend(kEndpoints + 5, 12, tag, 4, false));
  shm::SubmissionDesc bad{};
  bad.op = static_cast<shm::SubmitOp>(77);
  bad.req = 13;
  Submit(0, bad, shm::Ring::kControl);
  Drain();
  auto done = Reap(0);
  ASSERT_EQ(done.size(), 3u);  // invariant 2
  for (const auto& c : done) EXPECT_EQ(c.op, shm::CompleteOp::kError);
  EXPECT_EQ(endpoints_[0]->counters.bad_descriptors.Get(), 3u);
  EXPECT_TRUE(Reap(1).empty());  // nothing reached the receiver
}

TEST_F(MqEngineTest, SendToADisconnectedSlotGivesItsPayloadBack) {
  // Published before the slot was disconnected, consumed after: rejected,
  // and its pooled payload released (the sender saw the send complete).
  Send(0, 1, 1, std::string(3000, 'd'));
  engine_.ClearPeer(clients_[0].id, 1);
  Drain();
  auto done = Reap(0);
  ASSERT_EQ(done.size(), 1u);
  EXPECT_EQ(done[0].op, shm::CompleteOp::kError);
  EXPECT_EQ(done[0].error, PSM2_EPID_UNKNOWN);
  EXPECT_TRUE(Reap(1).empty());
  clients_[0].arena.Reclaim();
  EXPECT_TRUE(clients_[0].arena.empty());
}

TEST_F(MqEngineTest, SendsBeyondTheReceiversBudgetWaitAndNothingIsLost) {
  // Room for 8 messages, whatever their size: a pooled payload stays in its
  // sender's region, so only psmd's entry is charged (invariant 4).
  constexpr uint64_t kRoom = 8 * kUnexpectedOverheadBytes;
  EndpointTestPeer(*endpoints_[1]).set_unexpected_budget(kRoom);
  const std::string chunk(4000, 'm');
  for (int i = 0; i < 20; i++) Send(0, 1, 1, chunk);
  Drain();
  EXPECT_GT(endpoints_[0]->counters.sends_held.Get(), 0u);
  EXPECT_EQ(EndpointTestPeer(*endpoints_[1]).unexpected_cost(), kRoom);
  EXPECT_EQ(ReceiveEach(1, 0, 20, chunk), 20);
}

TEST_F(MqEngineTest, AHeldSenderThatPublishesRingsForSomething) {
  // Held for its receiver's budget, a sender goes on publishing, and rings
  // for each send while psmd sleeps: not idle rings (the doorbell defense
  // muted such senders and logged them as ringing for nothing). A ring with
  // nothing published since the last look is idle, held or not.
  EndpointTestPeer(*endpoints_[1])
      .set_unexpected_budget(2 * kUnexpectedOverheadBytes);
  const std::string chunk(100, 'h');
  for (int i = 0; i < 4; i++) Send(0, 1, 1, chunk);
  Drain();
  ASSERT_GT(endpoints_[0]->counters.sends_held.Get(), 0u);
  Endpoint& sender = *endpoints_[0];
  EXPECT_FALSE(engine_.SubmissionPending(sender));
  Send(0, 1, 1, chunk);
  EXPECT_FALSE(engine_.DoorbellIdle(sender)) << "a send was published";
  EXPECT_TRUE(engine_.DoorbellIdle(sender)) << "nothing since";
  for (int i = 0; i < 40; i++) Send(0, 1, 1, chunk);
  EXPECT_FALSE(engine_.DoorbellIdle(sender));
  EXPECT_TRUE(engine_.DoorbellIdle(sender));
  EXPECT_TRUE(engine_.DoorbellIdle(*endpoints_[1])) << "not held, empty";
  EXPECT_EQ(ReceiveEach(1, 0, 45, chunk), 45);
}

TEST_F(MqEngineTest, AJobsOwnBudgetHoldsSendersBelowTheEnginesBudget) {
  // A Slurm step's share of its memory (Registry::RegisterSlurmStep): room
  // for 5 messages in the whole job, though the endpoint and the engine's
  // job budget have room for far more.
  constexpr uint64_t kRoom = 5 * kUnexpectedOverheadBytes;
  job_->set_unexpected_budget(kRoom);
  const std::string chunk(4000, 'j');
  for (int i = 0; i < 12; i++) Send(0, 1, 1, chunk);
  Drain();
  EXPECT_GT(endpoints_[0]->counters.sends_held.Get(), 0u);
  EXPECT_EQ(job_->unexpected_cost.load(), kRoom);
  EXPECT_EQ(ReceiveEach(1, 0, 12, chunk), 12);
}

using Arrival = MqEngine::Arrival;
using Part = MqEngine::Part;

TEST_F(MqEngineTest, AnArrivalIsMatchedOrQueuedOrHeldUntilTheBudgetFrees) {
  Endpoint& r = *endpoints_[1];
  EndpointTestPeer peer(r);
  peer.set_unexpected_budget(2 * kUnexpectedOverheadBytes);
  const uint64_t posted = Recv(1, 0, 5, 64);
  Drain();
  EXPECT_EQ(engine_.Arrive(r, KeyFrom(0, 5), InlineMsg(0, "one")),
            Arrival::kMatched);
  auto done = Reap(1);
  ASSERT_EQ(done.size(), 1u);
  EXPECT_EQ(done[0].req, posted);
  EXPECT_EQ(PayloadOf(done[0]), "one");
  EXPECT_EQ(done[0].flags & shm::kWasUnexpected, 0);
  EXPECT_EQ(peer.unexpected_cost(), 0u);

  // Charged once each, up to the budget; then held with nothing changed.
  EXPECT_EQ(engine_.Arrive(r, KeyFrom(0, 6), InlineMsg(0, "two")),
            Arrival::kQueued);
  EXPECT_EQ(engine_.Arrive(r, KeyFrom(0, 6), InlineMsg(0, "three")),
            Arrival::kQueued);
  EXPECT_EQ(peer.unexpected_cost(), 2 * kUnexpectedOverheadBytes);
  EXPECT_EQ(job_->unexpected_cost, 2 * kUnexpectedOverheadBytes);
  EXPECT_EQ(engine_.Arrive(r, KeyFrom(0, 6), InlineMsg(0, "four")),
            Arrival::kHeld);
  EXPECT_EQ(engine_.Arrive(r, KeyFrom(0, 6), InlineMsg(0, "four")),
            Arrival::kHeld);
  EXPECT_EQ(peer.unexpected().size(), 2u);
  EXPECT_EQ(peer.unexpected_cost(), 2 * kUnexpectedOverheadBytes);
  EXPECT_EQ(r.counters.unexpected_msgs.Get(), 2u);

  // A receive takes the first; the held one fits again, in its order.
  Recv(1, 0, 6, 64);
  Drain();
  done = Reap(1);
  ASSERT_EQ(done.size(), 1u);
  EXPECT_EQ(PayloadOf(done[0]), "two");
  EXPECT_NE(done[0].flags & shm::kWasUnexpected, 0);
  EXPECT_EQ(engine_.Arrive(r, KeyFrom(0, 6), InlineMsg(0, "four")),
            Arrival::kQueued);
  for (const char* expected : {"three", "four"}) {
    Recv(1, 0, 6, 64);
    Drain();
    done = Reap(1);
    ASSERT_EQ(done.size(), 1u);
    EXPECT_EQ(PayloadOf(done[0]), expected);
  }
  EXPECT_EQ(peer.unexpected_cost(), 0u);
  EXPECT_EQ(job_->unexpected_cost, 0u);
}

TEST_F(MqEngineTest, AMessageArrivingInTwoPartsIsDecidedAtItsEnvelope) {
  Endpoint& r = *endpoints_[1];
  EndpointTestPeer peer(r);
  peer.set_unexpected_budget(kUnexpectedOverheadBytes);
  // A receive posted before the envelope is claimed by it, and gets the
  // payload only when that arrives.
  const uint64_t posted = Recv(1, 0, 5, 64);
  Drain();
  PostedRecv claim{};
  EXPECT_EQ(engine_.Arrive(r, KeyFrom(0, 5), InlineMsg(0, ""), Part::kEnvelope,
                           &claim),
            Arrival::kMatched);
  EXPECT_EQ(claim.req, posted);
  EXPECT_EQ(peer.posted().size(), 0u);
  EXPECT_TRUE(Reap(1).empty());
  EXPECT_EQ(engine_.Arrive(r, KeyFrom(0, 5), InlineMsg(0, "one"),
                           Part::kPayload, &claim),
            Arrival::kMatched);
  auto done = Reap(1);
  ASSERT_EQ(done.size(), 1u);
  EXPECT_EQ(done[0].req, posted);
  EXPECT_EQ(PayloadOf(done[0]), "one");

  // Admitted at its envelope with nothing queued or charged yet; a receive
  // posted before its payload takes it.
  EXPECT_EQ(engine_.Arrive(r, KeyFrom(0, 6), InlineMsg(0, ""), Part::kEnvelope,
                           &claim),
            Arrival::kQueued);
  EXPECT_EQ(peer.unexpected().size(), 0u);
  EXPECT_EQ(peer.unexpected_cost(), 0u);
  const uint64_t later = Recv(1, 0, 6, 64);
  Drain();
  EXPECT_EQ(engine_.Arrive(r, KeyFrom(0, 6), InlineMsg(0, "two"),
                           Part::kPayload, nullptr),
            Arrival::kMatched);
  done = Reap(1);
  ASSERT_EQ(done.size(), 1u);
  EXPECT_EQ(done[0].req, later);
  EXPECT_EQ(PayloadOf(done[0]), "two");

  // Admitted, then the budget fills before the payload comes: the payload
  // is queued and charged all the same (once); the next envelope is held.
  EXPECT_EQ(engine_.Arrive(r, KeyFrom(0, 7), InlineMsg(0, ""), Part::kEnvelope,
                           &claim),
            Arrival::kQueued);
  EXPECT_EQ(engine_.Arrive(r, KeyFrom(0, 8), InlineMsg(0, "fills")),
            Arrival::kQueued);
  EXPECT_EQ(engine_.Arrive(r, KeyFrom(0, 7), InlineMsg(0, "three"),
                           Part::kPayload, nullptr),
            Arrival::kQueued);
  EXPECT_EQ(peer.unexpected_cost(), 2 * kUnexpectedOverheadBytes);
  EXPECT_EQ(engine_.Arrive(r, KeyFrom(0, 9), InlineMsg(0, ""), Part::kEnvelope,
                           &claim),
            Arrival::kHeld);
  EXPECT_EQ(peer.unexpected().size(), 2u);
  EXPECT_EQ(peer.unexpected_cost(), 2 * kUnexpectedOverheadBytes);
}

TEST_F(MqEngineTest, RemovingAReceiverReleasesWhatWaitedForIt) {
  const std::string big(3000, 'q');
  for (int i = 0; i < 5; i++) Send(0, 1, 2, big);
  uint64_t sync = Send(0, 1, 2, "s", shm::kSendSync);
  Drain();
  EXPECT_GT(clients_[0].arena.used(), 5 * 3000u);
  engine_.Remove(clients_[1].id);
  Drain();
  // The sync sender hears of it; the pooled payloads are released.
  auto done = Reap(0);
  ASSERT_EQ(done.size(), 1u);
  EXPECT_EQ(done[0].req, sync);
  EXPECT_EQ(done[0].error, PSM2_EPID_UNREACHABLE);
  clients_[0].arena.Allocate(1);
  EXPECT_LT(clients_[0].arena.used(), 4096u);
}

TEST_F(MqEngineTest, ReceivesNamingARemovedSenderFailButQueuedOnesMatch) {
  // Endpoint 1 posts receives from 0 (one exact, one with a wildcard tag)
  // and from 2, and 0 has a message queued at 1 when it goes.
  uint64_t exact = Recv(1, 0, 1, 64);
  const uint32_t tag[3] = {9, 0, 0}, first_word[3] = {~0u, 0, 0};
  const uint64_t wild = Token(1);
  Submit(1, shm::PrepRecv(0, wild, tag, first_word, 64));
  uint64_t other = Recv(1, 2, 1, 64);
  Send(0, 1, 5, "left behind");
  Drain();
  engine_.Remove(clients_[0].id);
  Drain();
  auto failed = Reap(1);
  ASSERT_EQ(failed.size(), 2u);
  for (const shm::CompletionDesc& c : failed) {
    EXPECT_TRUE(c.req == exact || c.req == wild) << c.req;
    EXPECT_EQ(c.op, shm::CompleteOp::kError);
    EXPECT_EQ(c.error, PSM2_EPID_UNREACHABLE);
  }
  // What 0 sent before it went is still received; a new receive naming it
  // that nothing queued matches fails at once.
  uint64_t queued = Recv(1, 0, 5, 64);
  uint64_t late = Recv(1, 0, 6, 64);
  Drain();
  auto after = Reap(1);
  ASSERT_EQ(after.size(), 2u);
  EXPECT_EQ(after[0].req, queued);
  EXPECT_EQ(after[0].op, shm::CompleteOp::kRecvDone);
  EXPECT_EQ(PayloadOf(after[0]), "left behind");
  EXPECT_EQ(after[1].req, late);
  EXPECT_EQ(after[1].error, PSM2_EPID_UNREACHABLE);
  // The receive from a live peer still waits, and matches.
  Send(2, 1, 1, "alive");
  Drain();
  auto last = Reap(1);
  ASSERT_EQ(last.size(), 1u);
  EXPECT_EQ(last[0].req, other);
}

TEST_F(MqEngineTest, PostedReceivesOfAJobAreBoundedAndMatchesMakeRoom) {
  engine_.SetPostedLimits(/*per_job=*/4, /*per_uid=*/100);
  std::vector<uint64_t> posted;
  for (uint32_t t = 0; t < 4; t++) posted.push_back(Recv(1, 0, 10 + t, 64));
  uint64_t over = Recv(1, 0, 20, 64);
  uint64_t other_endpoint = Recv(2, 0, 21, 64);  // same job: same limit
  Drain();
  auto refused = Reap(1);
  ASSERT_EQ(refused.size(), 1u);
  EXPECT_EQ(refused[0].req, over);
  EXPECT_EQ(refused[0].error, PSM2_NO_MEMORY);
  auto refused2 = Reap(2);
  ASSERT_EQ(refused2.size(), 1u);
  EXPECT_EQ(refused2[0].req, other_endpoint);
  EXPECT_EQ(endpoints_[1]->counters.recvs_refused.Get(), 1u);
  // A match frees a place (counted lazily, recounted at the limit).
  Send(0, 1, 10, "x");
  Drain();
  ASSERT_EQ(Reap(1).size(), 1u);
  uint64_t fits = Recv(2, 0, 22, 64);
  Drain();
  EXPECT_TRUE(Reap(2).empty()) << "the receive was refused";
  // Removing an endpoint gives its receives' places back.
  engine_.Remove(clients_[1].id);
  for (uint32_t t = 0; t < 3; t++) Recv(2, 0, 30 + t, 64);
  Drain();
  EXPECT_TRUE(Reap(2).empty());
  EXPECT_EQ(job_->posted_recvs, 4u);
  (void)fits;
}

TEST_F(MqEngineTest, AFullCompletionRingHoldsBackSubmissions) {
  // More completions than the ring holds: the rest wait in the overflow
  // queue, the receiver's submissions are not read meanwhile, and every
  // completion arrives once the client reaps (invariant 3).
  const int n = kRingCapacity + 10;
  for (int i = 0; i < n; i++) {
    Send(0, 1, 4, "x");
    if (i % 32 == 31) Drain();  // keep the sender's ring from filling
  }
  Drain();
  for (int i = 0; i < n; i++) {
    Recv(1, 0, 4, 1);
    if (i % 32 == 31) Drain();  // keep the receiver's ring from filling
  }
  Drain();
  int got = static_cast<int>(Reap(1).size());
  EXPECT_EQ(got, static_cast<int>(kRingCapacity));
  EXPECT_FALSE(EndpointTestPeer(*endpoints_[1]).cq_overflow().empty());
  Drain();
  got += static_cast<int>(Reap(1).size());
  Drain();
  got += static_cast<int>(Reap(1).size());
  EXPECT_EQ(got, n);
}

}  // namespace
}  // namespace psmd

namespace psmd {
namespace {

// Invariant 7: another job with a backlog on many endpoints (receives that
// never match, as a hostile tenant would post) gets a bounded slice of each
// pass; the bystander's operation is served in the same pass.
TEST_F(MqEngineTest, AJobsBacklogCostsOthersOneBoundedSlicePerPass) {
  constexpr uint32_t kHostile = 8;
  std::string error;
  shm::Mapping pool;
  ASSERT_TRUE(shm::Mapping::Create("test-pool-2", kHostile * kRegionBytes,
                                   geteuid(), getegid(), &pool, &error))
      << error;
  auto hostile = std::make_shared<Job>(JobKey{Uuid{2}, geteuid()},
                                       std::move(pool), kHostile, kRegionBytes,
                                       std::make_shared<UidAccount>());
  const size_t first = clients_.size();
  for (uint32_t i = 0; i < kHostile; i++) AddEndpoint(100 + i, hostile);
  // Fills every hostile control ring with 64-bit receives nobody sends to.
  auto fill = [&] {
    for (size_t e = first; e < clients_.size(); e++) {
      for (;;) {
        const uint32_t tag[3] = {static_cast<uint32_t>(Token(e)), 1, 0};
        const uint32_t sel[3] = {~0u, ~0u, 0};  // psm2_mq_irecv's 64-bit
        if (!clients_[e].rings.ctl_sq.TryPush(
                shm::PrepRecv(shm::kAnySlot, Token(e), tag, sel, 8)))
          break;
      }
    }
  };
  auto posted = [&](size_t e) {
    return EndpointTestPeer(*endpoints_[e]).posted().size();
  };
  std::vector<size_t> progress(kHostile, 0);
  for (int pass = 0; pass < 50; pass++) {
    fill();
    std::vector<size_t> before;
    for (size_t e = first; e < clients_.size(); e++)
      before.push_back(posted(e));
    const uint64_t r = Recv(0, 1, 5, 16);
    Send(1, 0, 5, "hi");
    engine_.PollAll();
    // The bystander's receive and send were served in this pass...
    auto done = Reap(0);
    ASSERT_EQ(done.size(), 1u) << "pass " << pass;
    EXPECT_EQ(done[0].req, r);
    EXPECT_EQ(PayloadOf(done[0]), "hi");
    // ...while the hostile job got at most its budget, however many of its
    // endpoints had work (8 x 32 before invariant 7).
    size_t consumed = 0;
    for (size_t e = first; e < clients_.size(); e++) {
      consumed += posted(e) - before[e - first];
      if (posted(e) > before[e - first]) progress[e - first]++;
    }
    EXPECT_LE(consumed, 4u * 32u) << "pass " << pass;
    EXPECT_GT(consumed, 0u) << "pass " << pass;
  }
  // Its endpoints take turns going first, and the first is always served
  // (a slice bounded in time still holds one submission): none starves.
  for (uint32_t i = 0; i < kHostile; i++)
    EXPECT_GE(progress[i], 50u / kHostile) << i;
}

// Cancels and 64-bit receives cost O(1) whatever the number of receives
// posted (they used to scan them all).
TEST_F(MqEngineTest, CancelAndSixtyFourBitMatchDoNotScanPostedReceives) {
  constexpr int kPosted = 50'000;
  std::vector<uint64_t> reqs;
  for (int i = 0; i < kPosted; i++) {
    const uint32_t tag[3] = {static_cast<uint32_t>(i), 0x10000, 0};
    const uint32_t sel[3] = {~0u, ~0u, 0};
    reqs.push_back(Token(1));
    Submit(1, shm::PrepRecv(shm::kAnySlot, reqs.back(), tag, sel, 8));
    if (i % 32 == 31) Drain();
  }
  Drain();
  Reap(1);
  const EndpointTestPeer receiver(*endpoints_[1]);
  ASSERT_EQ(receiver.posted().size(), static_cast<size_t>(kPosted));
  const uint64_t before = receiver.posted().work();
  Submit(1, shm::PrepCancel(Token(1), reqs[kPosted / 2]));
  Drain();
  auto done = Reap(1);
  ASSERT_EQ(done.size(), 1u);
  EXPECT_EQ(done[0].op, shm::CompleteOp::kCancelDone);
  EXPECT_EQ(done[0].error, PSM2_OK);
  // A 64-bit message (tag2 0) for the last receive.
  const uint32_t tag[3] = {kPosted - 1, 0x10000, 0};
  shm::SubmissionDesc d = shm::PrepSend(1, Token(0), tag, 2, false);
  std::memcpy(d.body.inline_data, "ok", 2);
  Submit(0, d);
  Drain();
  done = Reap(1);
  ASSERT_EQ(done.size(), 1u);
  EXPECT_EQ(done[0].req, reqs[kPosted - 1]);
  EXPECT_LE(receiver.posted().work() - before, 64u);
  EXPECT_EQ(receiver.posted().size(), static_cast<size_t>(kPosted - 2));
}

// Copies in place (invariant 10). Every endpoint here is this process, so
// psmd's copier reads and writes the test's own buffers.
class CopyInPlaceEngineTest : public MqEngineTest {
 protected:
  void SetUp() override {
    MqEngineTest::SetUp();
    for (auto& ep : endpoints_) AttachThisProcess(*ep);
    engine_.EnableCrossCopy([] {}, kMinBytes, kAfterNs);
  }

  // A rendezvous send of `len` bytes at `addr` (0: not named) from `from`.
  uint64_t RndvSend(uint32_t from, uint32_t to, uint32_t tag0, const void* addr,
                    uint32_t len) {
    const uint32_t tag[3] = {tag0, 0, 0};
    const uint64_t token = Token(from);
    shm::SubmissionDesc d = shm::PrepSend(to, token, tag, len, true);
    shm::PlaceInMemory(d, addr);
    Submit(from, d);
    return token;
  }
  uint64_t PlacedRecv(uint32_t at, uint32_t from_slot, uint32_t tag0,
                      void* addr, uint32_t capacity) {
    const uint32_t tag[3] = {tag0, 0, 0};
    const uint32_t sel[3] = {~0u, ~0u, ~0u};
    const uint64_t token = Token(at);
    shm::SubmissionDesc d = shm::PrepRecv(from_slot, token, tag, sel, capacity);
    shm::PlaceInMemory(d, addr);
    Submit(at, d);
    return token;
  }
  // One chunk of transfer `go` from `src` + offset, through the pool, as
  // the sender's library streams it.
  void Chunk(uint32_t from, const shm::CompletionDesc& go, const uint8_t* src,
             uint64_t offset, uint32_t len) {
    shm::SubmissionDesc d =
        shm::PrepRndvData(go.req, go.body.go.transfer, offset, len);
    auto off = clients_[from].arena.Allocate(len);
    ASSERT_TRUE(off.has_value());
    std::memcpy(job_->pool().base() + *off, src + offset, len);
    d.body.rndv.pool_offset = *off;
    Submit(from, d);
  }
  // Runs the engine until `n` completions reached `at` (or 10 s passed).
  std::vector<shm::CompletionDesc> AwaitCompletions(uint32_t at, size_t n) {
    std::vector<shm::CompletionDesc> got;
    for (int i = 0; i < 10000 && got.size() < n; i++) {
      engine_.PollAll();
      for (auto& c : Reap(at)) got.push_back(c);
      if (got.size() < n) usleep(1000);
    }
    return got;
  }

  static constexpr uint64_t kMinBytes = 64 << 10;
  // Long enough that the test thread is never that late between two steps.
  static constexpr uint64_t kAfterNs = 200'000'000;
};

TEST_F(CopyInPlaceEngineTest, AStalledTransferIsCopiedAndBothSidesComplete) {
  std::vector<uint8_t> src(3 << 20), dst(3 << 20, 0);
  for (size_t i = 0; i < src.size(); i++) src[i] = static_cast<uint8_t>(i * 7);
  const uint64_t r = PlacedRecv(1, 0, 9, dst.data(), dst.size());
  Drain();
  const uint64_t s = RndvSend(0, 1, 9, src.data(), src.size());
  // The sender never streams (it computes): psmd takes over.
  auto at_receiver = AwaitCompletions(1, 2);
  auto at_sender = AwaitCompletions(0, 2);
  ASSERT_EQ(at_receiver.size(), 2u);
  EXPECT_EQ(at_receiver[0].op, shm::CompleteOp::kRecvRndv);
  EXPECT_EQ(at_receiver[0].req, r);
  EXPECT_EQ(at_receiver[1].op, shm::CompleteOp::kRndvChunk);
  EXPECT_TRUE(at_receiver[1].flags & shm::kPayloadPlaced);
  EXPECT_EQ(at_receiver[1].error, PSM2_OK);
  EXPECT_EQ(at_receiver[1].body.chunk.offset, 0u);
  EXPECT_EQ(at_receiver[1].body.chunk.len, src.size());
  ASSERT_EQ(at_sender.size(), 2u);
  EXPECT_EQ(at_sender[0].op, shm::CompleteOp::kRndvGo);
  EXPECT_TRUE(at_sender[0].flags & shm::kGoAwaitDone);
  EXPECT_EQ(at_sender[1].op, shm::CompleteOp::kSendDone);
  EXPECT_EQ(at_sender[1].req, s);
  EXPECT_EQ(at_sender[1].error, PSM2_OK);
  EXPECT_EQ(src, dst);
  EXPECT_EQ(endpoints_[0]->counters.rndv_msgs_copied.Get(), 1u);
  EXPECT_EQ(endpoints_[0]->counters.rndv_bytes_copied.Get(), src.size());
}

TEST_F(CopyInPlaceEngineTest, AStreamThatStallsIsTakenOverWhereItStopped) {
  constexpr uint32_t kChunk = 256 << 10;
  std::vector<uint8_t> src(2 << 20), dst(2 << 20, 0);
  for (size_t i = 0; i < src.size(); i++) src[i] = static_cast<uint8_t>(i * 3);
  PlacedRecv(1, 0, 9, dst.data(), dst.size());
  Drain();
  RndvSend(0, 1, 9, src.data(), src.size());
  Drain();
  auto go = Reap(0);
  ASSERT_EQ(go.size(), 1u);
  Chunk(0, go[0], src.data(), 0, kChunk);
  Chunk(0, go[0], src.data(), kChunk, kChunk);
  auto at_receiver = AwaitCompletions(1, 4);  // match, 2 chunks, the rest
  ASSERT_EQ(at_receiver.size(), 4u);
  EXPECT_FALSE(at_receiver[1].flags & shm::kPayloadPlaced);
  EXPECT_FALSE(at_receiver[2].flags & shm::kPayloadPlaced);
  EXPECT_TRUE(at_receiver[3].flags & shm::kPayloadPlaced);
  EXPECT_EQ(at_receiver[3].body.chunk.offset, 2 * kChunk);
  EXPECT_EQ(at_receiver[3].body.chunk.len, src.size() - 2 * kChunk);
  EXPECT_EQ(memcmp(dst.data() + 2 * kChunk, src.data() + 2 * kChunk,
                   src.size() - 2 * kChunk),
            0);
  EXPECT_EQ(dst[2 * kChunk - 1], 0) << "psmd copied what the stream carried";
  // A chunk the sender published before it learnt is released unread, and
  // is no error.
  Chunk(0, go[0], src.data(), 2 * kChunk, kChunk);
  auto at_sender = AwaitCompletions(0, 1);
  ASSERT_EQ(at_sender.size(), 1u);
  EXPECT_EQ(at_sender[0].op, shm::CompleteOp::kSendDone);
  Drain();
  EXPECT_TRUE(Reap(0).empty());
  EXPECT_EQ(endpoints_[0]->counters.bad_descriptors.Get(), 0u);
}

TEST_F(CopyInPlaceEngineTest, AStreamThatKeepsMovingStaysAStream) {
  constexpr uint32_t kChunk = 256 << 10;
  // Two chunks: the test's region (1 MiB) holds them both.
  std::vector<uint8_t> src(512 << 10, 9), dst(512 << 10);
  PlacedRecv(1, 0, 9, dst.data(), dst.size());
  Drain();
  const uint64_t s = RndvSend(0, 1, 9, src.data(), src.size());
  Drain();
  auto go = Reap(0);
  ASSERT_EQ(go.size(), 1u);
  EXPECT_TRUE(go[0].flags & shm::kGoAwaitDone);
  for (uint32_t off = 0; off < src.size(); off += kChunk) {
    Chunk(0, go[0], src.data(), off, kChunk);
  }
  Drain();
  auto at_sender = Reap(0);
  ASSERT_EQ(at_sender.size(), 1u);
  EXPECT_EQ(at_sender[0].op, shm::CompleteOp::kSendDone);  // after the last
  EXPECT_EQ(at_sender[0].req, s);
  auto at_receiver = Reap(1);
  ASSERT_EQ(at_receiver.size(), 3u);
  for (size_t i = 1; i < 3; i++) {
    EXPECT_FALSE(at_receiver[i].flags & shm::kPayloadPlaced);
  }
  EXPECT_EQ(endpoints_[0]->counters.rndv_msgs_copied.Get(), 0u);
}

TEST_F(CopyInPlaceEngineTest, ASenderStreamingAnotherMessageIsNotStalled) {
  // Two messages to one receiver; the sender streams the second, a chunk
  // every 50 ms, for twice copy_after, while the first waits its turn (as
  // with many sends outstanding and the pool full): the first is not
  // taken over. Once the sender stops, it is.
  constexpr uint32_t kChunk = 64 << 10;
  std::vector<uint8_t> first(2 << 20, 1), second(8 * kChunk, 2);
  std::vector<uint8_t> dst1(first.size()), dst2(second.size());
  PlacedRecv(1, 0, 9, dst1.data(), dst1.size());
  PlacedRecv(1, 0, 10, dst2.data(), dst2.size());
  Drain();
  RndvSend(0, 1, 9, first.data(), first.size());
  RndvSend(0, 1, 10, second.data(), second.size());
  Drain();
  auto go = Reap(0);
  ASSERT_EQ(go.size(), 2u);
  for (uint32_t k = 0; k < 8; k++) {
    Chunk(0, go[1], second.data(), k * kChunk, kChunk);
    for (int i = 0; i < 50; i++) {
      engine_.PollAll();
      usleep(1000);
    }
  }
  for (const auto& c : Reap(1)) {
    EXPECT_FALSE(c.flags & shm::kPayloadPlaced) << "taken over while busy";
  }
  EXPECT_EQ(endpoints_[0]->counters.rndv_msgs_copied.Get(), 0u);
  auto at_receiver = AwaitCompletions(1, 1);
  ASSERT_EQ(at_receiver.size(), 1u);
  EXPECT_TRUE(at_receiver[0].flags & shm::kPayloadPlaced);
  EXPECT_EQ(first, dst1);
}

TEST_F(CopyInPlaceEngineTest, ATruncatingReceiveGetsOnlyWhatFits) {
  std::vector<uint8_t> src(1 << 20, 0x77), dst((512 << 10) + 4096, 0);
  PlacedRecv(1, 0, 9, dst.data(), 512 << 10);
  Drain();
  RndvSend(0, 1, 9, src.data(), src.size());
  auto at_receiver = AwaitCompletions(1, 2);
  ASSERT_EQ(at_receiver.size(), 2u);
  EXPECT_EQ(at_receiver[0].msg_len, src.size());  // the client reports it
  EXPECT_EQ(at_receiver[1].body.chunk.len, 512u << 10);
  EXPECT_EQ(dst[(512 << 10) - 1], 0x77);
  EXPECT_EQ(dst[512 << 10], 0) << "written past the receive buffer";
}

TEST_F(CopyInPlaceEngineTest, BelowTheThresholdOrUnnamedTheMessageOnlyStreams) {
  std::vector<uint8_t> src(kMinBytes - 1, 1), dst(1 << 20);
  PlacedRecv(1, 0, 9, dst.data(), dst.size());
  PlacedRecv(1, 0, 10, dst.data(), dst.size());
  Drain();
  RndvSend(0, 1, 9, src.data(), src.size());  // too small
  RndvSend(0, 1, 10, nullptr, 1 << 20);       // no address
  Drain();
  auto at_sender = Reap(0);
  ASSERT_EQ(at_sender.size(), 2u);
  for (const auto& go : at_sender) {
    EXPECT_EQ(go.op, shm::CompleteOp::kRndvGo);
    EXPECT_FALSE(go.flags & shm::kGoAwaitDone);
  }
}

TEST_F(CopyInPlaceEngineTest, AnUnmappedReceiveBufferFailsTheReceiveOnly) {
  std::vector<uint8_t> src(1 << 20, 3);
  void* gone = mmap(nullptr, 1 << 20, PROT_READ | PROT_WRITE,
                    MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  munmap(gone, 1 << 20);
  PlacedRecv(1, 0, 9, gone, 1 << 20);
  Drain();
  RndvSend(0, 1, 9, src.data(), src.size());
  auto at_receiver = AwaitCompletions(1, 2);
  auto at_sender = AwaitCompletions(0, 2);
  ASSERT_EQ(at_receiver.size(), 2u);
  EXPECT_EQ(at_receiver[1].error, PSM2_PARAM_ERR);
  ASSERT_EQ(at_sender.size(), 2u);
  EXPECT_EQ(at_sender[1].op, shm::CompleteOp::kSendDone);
  EXPECT_EQ(at_sender[1].error, PSM2_OK);
  EXPECT_EQ(endpoints_[0]->counters.rndv_msgs_copied.Get(), 0u);
}

TEST_F(CopyInPlaceEngineTest, RemovingTheReceiverMidCopyEndsTheSendOnce) {
  // 64 MiB: the copy is still running when the receiver goes, most of the
  // time; either way the sender gets exactly one answer and nothing is
  // written to the receiver's buffer once Remove returned.
  std::vector<uint8_t> src(64 << 20, 5), dst(64 << 20, 0);
  PlacedRecv(1, 0, 9, dst.data(), dst.size());
  Drain();
  const uint64_t s = RndvSend(0, 1, 9, src.data(), src.size());
  Drain();
  ASSERT_EQ(Reap(0).size(), 1u);  // kRndvGo
  // Until psmd took it over (the first chunk arrived).
  for (int i = 0; i < 10000 && dst[0] == 0; i++) {
    engine_.PollAll();
    usleep(100);
  }
  engine_.Remove(clients_[1].id);
  std::vector<uint8_t> after = dst;
  auto at_sender = AwaitCompletions(0, 1);
  usleep(200'000);  // time for a second answer, were there one
  engine_.PollAll();
  for (auto& c : Reap(0)) at_sender.push_back(c);
  ASSERT_EQ(at_sender.size(), 1u);
  EXPECT_EQ(at_sender[0].req, s);
  EXPECT_TRUE((at_sender[0].op == shm::CompleteOp::kError &&
               at_sender[0].error == PSM2_EPID_UNREACHABLE) ||
              (at_sender[0].op == shm::CompleteOp::kSendDone &&
               at_sender[0].error == PSM2_OK))
      << static_cast<int>(at_sender[0].op) << " " << at_sender[0].error;
  EXPECT_EQ(after, dst);
}

}  // namespace
}  // namespace psmd
