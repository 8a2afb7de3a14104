// MqEngine's handover (issue 33; mq_engine.h, "Handover to a successor
// process"): the state an engine writes, read back into a fresh engine over
// the same shared memory, continues exactly where the first one stopped.
//
// Each scenario runs twice on identical worlds (a job, endpoints on real
// segments and a real pool, one engine or two shards): one world never
// stops, the other is quiesced, saved, destroyed and loaded into fresh
// engines, endpoints and job objects at a cut point. Every completion each
// client reaps, in order, must be the same in both: nothing lost, nothing
// duplicated, the same match order, the same transfer ids and pool offsets.
// A scenario is tried with the cut after each of its steps.
#include <gtest/gtest.h>
#include <psm2.h>

#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "daemon/engine/mq_engine.h"
#include "daemon/engine/test_endpoint.h"
#include "daemon/handover/state_codec.h"
#include "shm/payload.h"
#include "shm/pool.h"
#include "shm/segment.h"

namespace psmd {
namespace {

constexpr uint32_t kRingCapacity = 64;
constexpr uint64_t kRegionBytes = 1 << 20;
constexpr uint32_t kEndpoints = 3;
constexpr uint64_t kBudget = 1 << 20;

bool SameCompletion(const shm::CompletionDesc& a, const shm::CompletionDesc& b) {
  return std::memcmp(&a, &b, sizeof(a)) == 0;
}

// A node with one job of kEndpoints endpoints (ids 1..kEndpoints, each
// connected to all at slot = index), on `shards` engines.
class World {
 public:
  explicit World(uint32_t shards) : shards_(shards) {
    std::string error;
    shm::Mapping pool;
    if (!shm::Mapping::Create("state-pool", kEndpoints * kRegionBytes,
                              geteuid(), getegid(), &pool, &error)) {
      ADD_FAILURE() << error;
      return;
    }
    client_job_ = std::make_shared<Job>(JobKey{Uuid{7}, geteuid()},
                                        std::move(pool), kEndpoints,
                                        kRegionBytes,
                                        std::make_shared<UidAccount>());
    job_ = client_job_;
    MakeEngines();
    for (uint32_t i = 0; i < kEndpoints; i++) {
      auto ep = MakeTestEndpoint(job_, *job_->TakeRegion(), i + 1, 0x1000 + i + 1,
                                 kRingCapacity, kBudget);
      Client c;
      c.segment = DupMapping(ep->segment());  // the client's own mapping
      c.rings = shm::ClientRingsOf(c.segment.base(), ep->geometry());
      c.arena = shm::SendArena(client_job_->pool().base(), ep->region().offset,
                               ep->region().bytes);
      clients_.push_back(std::move(c));
      EngineOf(ep->id()).Add(ep);
      endpoints_.push_back(ep);
    }
    for (uint32_t i = 0; i < kEndpoints; i++) {
      for (uint32_t j = 0; j < kEndpoints; j++) {
        EngineOf(i + 1).SetPeer(i + 1, j, PeerLink{j + 1, 0x1000 + j + 1});
      }
    }
  }

  ~World() {
    for (auto& ep : endpoints_) EngineOf(ep->id()).Remove(ep->id());
    Poll();
  }

  MqEngine& EngineOf(uint32_t id) {
    return *engines_[MqEngine::ShardOf(id, shards_)];
  }
  Endpoint& ep(uint32_t i) { return *endpoints_[i]; }
  Job& job() { return *job_; }

  void Submit(uint32_t from, const shm::SubmissionDesc& d) {
    auto& r = shm::TraitsOf(d.op).ring == shm::Ring::kMessage
                  ? clients_[from].rings.msg_sq
                  : clients_[from].rings.ctl_sq;
    ASSERT_TRUE(r.TryPush(d));
  }
  uint64_t Token(uint32_t from) { return (uint64_t{from} << 32) | next_++; }

  void Send(uint32_t from, uint32_t to, uint32_t tag0, uint32_t len,
            uint8_t flags = 0, bool rndv = false) {
    const uint32_t tag[3] = {tag0, 0, 0};
    shm::SubmissionDesc d = shm::PrepSend(to, Token(from), tag, len, rndv);
    d.flags |= flags;
    if (shm::PayloadInPool(d)) {
      auto off = clients_[from].arena.Allocate(len);
      ASSERT_TRUE(off.has_value());
      std::memset(client_job_->pool().base() + *off, 'a' + tag0 % 26, len);
      d.body.pool.pool_offset = *off;
    } else if (!rndv) {
      std::memset(d.body.inline_data, 'a' + tag0 % 26, len);
    }
    Submit(from, d);
  }
  void Recv(uint32_t at, uint32_t slot, uint32_t tag0, bool exact,
            uint32_t capacity) {
    const uint32_t tag[3] = {tag0, 0, 0};
    const uint32_t all[3] = {~0u, ~0u, ~0u};
    const uint32_t none[3] = {0, 0, 0};
    Submit(at, shm::PrepRecv(slot, Token(at), tag, exact ? all : none,
                             capacity));
  }
  void Probe(uint32_t at, uint32_t slot, uint32_t tag0, uint64_t token) {
    const uint32_t tag[3] = {tag0, 0, 0};
    const uint32_t all[3] = {~0u, ~0u, ~0u};
    Submit(at, shm::PrepProbe(slot, token, tag, all, /*claim=*/true));
  }
  void RndvData(uint32_t from, uint64_t transfer, uint64_t offset,
                uint32_t len) {
    shm::SubmissionDesc d =
        shm::PrepRndvData(Token(from), transfer, offset, len);
    auto off = clients_[from].arena.Allocate(len);
    ASSERT_TRUE(off.has_value());
    d.body.pool.pool_offset = *off;
    Submit(from, d);
  }
  void Am(uint32_t from, uint32_t slot) {
    Submit(from, shm::PrepActiveMessage(false, slot, Token(from), 1, 1, 8));
  }

  // Turns every shard until none has work (bounded).
  void Poll() {
    for (int i = 0; i < 200; i++) {
      bool did = false;
      for (auto& e : engines_) did |= e->PollAll();
      for (auto& e : engines_) e->NotifyClients();
      if (!did) break;
    }
  }

  // What endpoint `at`'s client reaps, in order (releasing chunks as a
  // client does), appended to its record.
  std::vector<shm::CompletionDesc> Reap(uint32_t at, size_t max = SIZE_MAX) {
    std::vector<shm::CompletionDesc> out;
    shm::CompletionDesc c;
    while (out.size() < max && clients_[at].rings.cq.TryPop(&c)) {
      shm::PayloadOf(client_job_->pool().base(), c).Release();
      out.push_back(c);
      record_[at].push_back(c);
    }
    return out;
  }
  const std::vector<shm::CompletionDesc>& record(uint32_t at) {
    return record_[at];
  }

  // The handover: quiesce, save, destroy, re-create over the same shared
  // memory, load. Returns the states written.
  std::vector<std::string> Handover() {
    for (int round = 0;; round++) {
      EXPECT_LT(round, 1000) << "never quiesced";
      if (round >= 1000) break;
      bool did = false;
      for (auto& e : engines_) did |= e->DrainPass();
      bool quiet = !did;
      for (auto& e : engines_) quiet &= e->Quiesced();
      if (quiet) break;
    }
    std::vector<std::string> states;
    for (auto& e : engines_) {
      handover::StateWriter w;
      e->SaveState(w);
      states.push_back(w.Take());
    }
    // The successor: a job object for the same pool, charged nothing,
    // regions handed out as before; endpoints re-made over their segments.
    auto job = std::make_shared<Job>(job_->key(), DupMapping(job_->pool()),
                                     kEndpoints, kRegionBytes,
                                     std::make_shared<UidAccount>());
    for (uint32_t i = 0; i < kEndpoints; i++) job->TakeRegion();
    std::vector<std::shared_ptr<Endpoint>> fresh;
    for (auto& ep : endpoints_) fresh.push_back(RemakeTestEndpoint(*ep, job, kBudget));
    endpoints_.clear();
    engines_.clear();  // the old engines and endpoints go
    crossing_.reset();
    job_ = job;
    MakeEngines();
    endpoints_ = fresh;
    for (auto& ep : endpoints_) EngineOf(ep->id()).Add(ep);
    std::vector<MqEngine*> shards;
    for (uint32_t s = 0; s < shards_; s++) {
      handover::StateReader r(states[s].data(), states[s].size());
      Status st = engines_[s]->LoadState(r);
      EXPECT_TRUE(st.ok()) << st.message;
      shards.push_back(engines_[s].get());
    }
    MqEngine::RecountCredits(shards);
    return states;
  }

  uint32_t shards() const { return shards_; }

 private:
  void MakeEngines() {
    crossing_ = std::make_unique<Crossing>(shards_);
    for (uint32_t s = 0; s < shards_; s++) {
      engines_.push_back(std::make_unique<MqEngine>(1 << 30, 1 << 30, 1 << 30));
      if (shards_ > 1) engines_.back()->JoinShards(crossing_.get(), s);
    }
  }

  struct Client {
    shm::Mapping segment;
    shm::ClientRings rings;
    shm::SendArena arena;
  };
  const uint32_t shards_;
  std::shared_ptr<Job> client_job_;  // the clients' view of the pool
  std::shared_ptr<Job> job_;         // the engines' (a new one per handover)
  std::unique_ptr<Crossing> crossing_;
  std::vector<std::unique_ptr<MqEngine>> engines_;
  std::vector<std::shared_ptr<Endpoint>> endpoints_;
  std::vector<Client> clients_;
  std::vector<shm::CompletionDesc> record_[kEndpoints];
  uint32_t next_ = 1;
};

// The transfer a kRndvGo among `cs` names, or 0.
uint64_t GoOf(const std::vector<shm::CompletionDesc>& cs, uint32_t* bytes) {
  for (const auto& c : cs) {
    if (c.op == shm::CompleteOp::kRndvGo) {
      *bytes = c.body.go.send_bytes;
      return c.body.go.transfer;
    }
  }
  return 0;
}

// One scenario's steps; `cut` is the step after which the world is handed
// over (-1: never). Endpoint 0 and 1 talk; 2 receives and is flooded.
// `stop_after`: the step after which it returns, without the end.
void RunScenario(World& w, int cut, int stop_after = -1) {
  uint64_t transfer = 0;
  uint32_t go_bytes = 0;
  // Endpoint 0 streams every rendezvous it is cleared for, whole.
  auto stream = [&](const std::vector<shm::CompletionDesc>& cs) {
    for (const auto& c : cs) {
      if (c.op == shm::CompleteOp::kRndvGo && c.body.go.send_bytes > 0)
        w.RndvData(0, c.body.go.transfer, 0, c.body.go.send_bytes);
    }
  };
  std::vector<std::function<void()>> steps = {
      // Posted receives: wildcard, specific, any source exact.
      [&] {
        w.Recv(2, shm::kAnySlot, 0, /*exact=*/false, 4096);
        w.Recv(2, 0, 7, true, 4096);
        w.Recv(2, shm::kAnySlot, 9, true, 4096);
        w.Recv(2, 1, 7, true, 4096);
      },
      // Unexpected eager (inline, pool, sync) and rendezvous at 1.
      [&] {
        w.Send(0, 1, 1, 5);
        w.Send(0, 1, 1, 3000);
        w.Send(0, 1, 2, 10, shm::kSendSync);
        w.Send(0, 1, 3, 100000, 0, /*rndv=*/true);
        w.Send(0, 1, 3, 30000, 0, /*rndv=*/true);
      },
      // A claiming probe takes the first rendezvous message.
      [&] { w.Probe(1, 0, 3, 0xc1a1); },
      // Sends matching the posted receives at 2.
      [&] {
        w.Send(1, 2, 7, 100);  // the wildcard takes it (posted first)
        w.Send(0, 2, 7, 100);
        w.Send(0, 2, 9, 2000);
      },
      // Budget: 1 takes 4 unexpected messages more; further sends are held.
      [&] {
        EndpointTestPeer(w.ep(1)).set_unexpected_budget(9 * 128);
        for (int i = 0; i < 10; i++) w.Send(0, 1, 20 + i, 40);
      },
      // A rendezvous to 2, matched, cleared: a transfer mid-stream.
      [&] {
        w.Recv(2, 1, 4, true, 100000);
        w.Send(1, 2, 4, 50000, 0, true);
      },
      [&] {
        transfer = GoOf(w.Reap(1), &go_bytes);
        ASSERT_NE(transfer, 0u);
        w.RndvData(1, transfer, 0, 20000);
      },
      // Completions to 2 that overflow its ring (it does not reap): active
      // messages, up to the hold (kAmOverflowLimit) and beyond.
      [&] {
        for (int round = 0; round < 37; round++) {
          for (int i = 0; i < 30; i++) w.Am(1, 2);
          w.Poll();
        }
      },
      // The claimed message received; 1 drains its unexpected messages.
      [&] {
        w.Reap(1);
        w.Submit(1, shm::PrepClaimedRecv(0xc1a1, 100000));
        for (int i = 0; i < 6; i++) w.Recv(1, 0, 0, false, 4096);
      },
      [&] { stream(w.Reap(0)); },
  };
  for (size_t i = 0; i < steps.size(); i++) {
    steps[i]();
    w.Poll();
    if (static_cast<int>(i) == cut) w.Handover();
    if (static_cast<int>(i) == stop_after) return;
  }
  // The end: everything reaped and drained, the budget back, the rest of
  // each stream sent.
  EndpointTestPeer(w.ep(1)).set_unexpected_budget(kBudget);
  for (int round = 0; round < 200; round++) {
    for (uint32_t at = 0; at < kEndpoints; at++) {
      auto cs = w.Reap(at);
      if (at == 0) stream(cs);
    }
    for (int i = 0; i < 8; i++) w.Recv(1, shm::kAnySlot, 0, false, 100000);
    w.Poll();
  }
  if (transfer != 0) {
    w.RndvData(1, transfer, 20000, go_bytes - 20000);
    w.Poll();
  }
  for (uint32_t at = 0; at < kEndpoints; at++) w.Reap(at);
}

void ExpectSameRecords(World& a, World& b, int cut) {
  for (uint32_t at = 0; at < kEndpoints; at++) {
    const auto& ra = a.record(at);
    const auto& rb = b.record(at);
    ASSERT_EQ(ra.size(), rb.size()) << "endpoint " << at << ", cut " << cut;
    for (size_t i = 0; i < ra.size(); i++) {
      ASSERT_TRUE(SameCompletion(ra[i], rb[i]))
          << "endpoint " << at << " completion " << i << " (op "
          << static_cast<int>(ra[i].op) << " vs "
          << static_cast<int>(rb[i].op) << "), cut " << cut;
    }
  }
}

class EngineStateTest : public ::testing::TestWithParam<uint32_t> {};

TEST_P(EngineStateTest, AHandoverAtAnyStepChangesNoCompletion) {
  World plain(GetParam());
  RunScenario(plain, -1);
  // The scenario does what it says (else the comparison proves little).
  EXPECT_GE(plain.record(0).size(), 3u);
  EXPECT_GE(plain.record(1).size(), 15u);
  EXPECT_GT(plain.record(2).size(), 1100u);
  for (int cut = 0; cut < 10; cut++) {
    World handed(GetParam());
    RunScenario(handed, cut);
    ExpectSameRecords(plain, handed, cut);
    if (HasFatalFailure()) return;
  }
}

// The fullest cut holds what it is meant to: completions overflowing up to
// the active-message hold, active messages held beyond it (in the sender's
// held sends, or with shards in the target shard's held items, credited),
// sends held for a budget, a claimed message, a transfer mid-stream.
TEST_P(EngineStateTest, TheFullestCutHoldsEveryKindOfState) {
  World w(GetParam());
  RunScenario(w, -1, /*stop_after=*/7);
  EXPECT_EQ(EndpointTestPeer(w.ep(2)).cq_overflow().size(), 1024u);
  EXPECT_EQ(EndpointTestPeer(w.ep(1)).claimed(), 1u);
  // Sends held at their sender (one shard), or their items at the
  // receiver's shard (two: each sender has credits out).
  const uint32_t in_flight0 = EndpointTestPeer(w.ep(0)).cross_in_flight();
  const uint32_t in_flight1 = EndpointTestPeer(w.ep(1)).cross_in_flight();
  if (GetParam() == 1) {
    EXPECT_FALSE(EndpointTestPeer(w.ep(0)).held_sends().empty());
    EXPECT_FALSE(EndpointTestPeer(w.ep(1)).held_sends().empty());
  } else {
    EXPECT_GT(in_flight0, 0u);
    EXPECT_GT(in_flight1, 0u);
  }
  const size_t held0 = EndpointTestPeer(w.ep(0)).held_sends().size();
  w.Handover();
  EXPECT_EQ(EndpointTestPeer(w.ep(2)).cq_overflow().size(), 1024u);
  EXPECT_EQ(EndpointTestPeer(w.ep(1)).claimed(), 1u);
  EXPECT_EQ(EndpointTestPeer(w.ep(0)).held_sends().size(), held0);
  // Recounted (RecountCredits), not carried.
  EXPECT_EQ(EndpointTestPeer(w.ep(0)).cross_in_flight(), in_flight0);
  EXPECT_EQ(EndpointTestPeer(w.ep(1)).cross_in_flight(), in_flight1);
}

TEST_P(EngineStateTest, TwoHandoversInARowChangeNothing) {
  World plain(GetParam());
  RunScenario(plain, -1);
  World handed(GetParam());
  // Cut at step 7 (AMs held, overflow full, a transfer mid-stream), twice.
  RunScenario(handed, 7);
  handed.Handover();
  ExpectSameRecords(plain, handed, 7);
}

// What the save holds at its fullest point, checked after the load: the
// charges against the job's budgets recomputed from the queues.
TEST_P(EngineStateTest, ChargesAreRecomputedFromTheLoadedQueues) {
  World w(GetParam());
  w.Send(0, 1, 1, 5);
  w.Send(0, 1, 1, 3000);
  w.Send(0, 1, 3, 100000, 0, true);
  w.Recv(2, shm::kAnySlot, 5, true, 100);
  w.Recv(2, shm::kAnySlot, 6, true, 100);
  w.Poll();
  w.Probe(1, 0, 3, 0x77);
  w.Poll();
  const uint64_t cost = EndpointTestPeer(w.ep(1)).unexpected_cost();
  EXPECT_EQ(cost, 3 * kUnexpectedOverheadBytes);
  w.Handover();
  EXPECT_EQ(EndpointTestPeer(w.ep(1)).unexpected_cost(), cost);
  EXPECT_EQ(EndpointTestPeer(w.ep(1)).claimed(), 1u);
  EXPECT_EQ(w.job().unexpected_cost.load(), cost);
  EXPECT_EQ(w.job().account().unexpected_cost.load(), cost);
  EXPECT_EQ(EndpointTestPeer(w.ep(2)).posted().size(), 2u);
  EXPECT_GE(w.job().posted_recvs.load(), 2u);
}

INSTANTIATE_TEST_SUITE_P(Shards, EngineStateTest, ::testing::Values(1u, 2u),
                         [](const auto& info) {
                           return std::to_string(info.param) + "_shards";
                         });

// ---- The loader refuses what it cannot trust, and changes nothing ----

class EngineStateRefusalTest : public ::testing::Test {
 protected:
  // A state with something of every kind in it.
  std::string Saved(World& w) {
    w.Send(0, 1, 1, 5);
    w.Send(0, 1, 1, 3000);
    w.Send(0, 1, 3, 100000, 0, true);
    w.Recv(2, shm::kAnySlot, 5, true, 100);
    w.Poll();
    handover::StateWriter out;
    w.EngineOf(1).SaveState(out);
    return out.Take();
  }
};

TEST_F(EngineStateRefusalTest, EveryTruncationIsRefusedNamingAField) {
  World w(1);
  const std::string state = Saved(w);
  for (size_t len = 0; len < state.size(); len += 7) {
    World fresh(1);
    // Remove the fresh world's endpoints' match state: it has none yet.
    handover::StateReader r(state.data(), len);
    Status st = fresh.EngineOf(1).LoadState(r);
    EXPECT_FALSE(st.ok()) << len;
    EXPECT_NE(st.message.find("(byte "), std::string::npos) << st.message;
  }
}

TEST_F(EngineStateRefusalTest, ForgedFieldsAreRefusedAndNothingIsLoaded) {
  World w(1);
  const std::string state = Saved(w);
  {
    World fresh(1);
    handover::StateReader r(state.data(), state.size());
    EXPECT_TRUE(fresh.EngineOf(1).LoadState(r).ok());
  }
  // Flip every byte in turn: a refusal leaves the engine as it was (the
  // world's destructor removes its endpoints), a load must run clean.
  size_t refused = 0;
  for (size_t at = 0; at < state.size(); at++) {
    std::string forged = state;
    forged[at] = static_cast<char>(forged[at] ^ 0x81);
    World fresh(1);
    handover::StateReader r(forged.data(), forged.size());
    Status st = fresh.EngineOf(1).LoadState(r);
    if (!st.ok()) {
      refused++;
      EXPECT_EQ(fresh.job().unexpected_cost.load(), 0u);
      EXPECT_EQ(fresh.job().posted_recvs.load(), 0u);
      EXPECT_EQ(EndpointTestPeer(fresh.ep(1)).unexpected().size(), 0u);
    }
    fresh.Poll();
  }
  EXPECT_GT(refused, state.size() / 4);
}

TEST_F(EngineStateRefusalTest, AnotherShardCountIsRefused) {
  World w(1);
  const std::string state = Saved(w);
  World two(2);
  handover::StateReader r(state.data(), state.size());
  Status st = two.EngineOf(1).LoadState(r);
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.message.find("as many workers"), std::string::npos)
      << st.message;
}

}  // namespace
}  // namespace psmd
