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
#include "daemon/engine/test_world.h"
#include "daemon/handover/state_codec.h"

namespace psmd {
namespace {

using test_world::kEndpoints;
using test_world::RunScenario;
using test_world::World;

bool SameCompletion(const shm::CompletionDesc& a,
                    const shm::CompletionDesc& b) {
  return std::memcmp(&a, &b, sizeof(a)) == 0;
}

void ExpectSameRecords(World& a, World& b, int cut) {
  for (uint32_t at = 0; at < kEndpoints; at++) {
    const auto& ra = a.record(at);
    const auto& rb = b.record(at);
    ASSERT_EQ(ra.size(), rb.size()) << "endpoint " << at << ", cut " << cut;
    for (size_t i = 0; i < ra.size(); i++) {
      ASSERT_TRUE(SameCompletion(ra[i], rb[i]))
          << "endpoint " << at << " completion " << i << " (op "
          << static_cast<int>(ra[i].op) << " vs " << static_cast<int>(rb[i].op)
          << "), cut " << cut;
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
  ASSERT_TRUE(w.Handover().ok());
  EXPECT_EQ(EndpointTestPeer(w.ep(2)).cq_overflow().size(), 1024u);
  EXPECT_EQ(EndpointTestPeer(w.ep(1)).claimed(), 1u);
  EXPECT_EQ(EndpointTestPeer(w.ep(0)).held_sends().size(), held0);
  EXPECT_EQ(EndpointTestPeer(w.ep(0)).cross_in_flight(), in_flight0);
  EXPECT_EQ(EndpointTestPeer(w.ep(1)).cross_in_flight(), in_flight1);
  EXPECT_TRUE(w.CreditsAgree());
}

TEST_P(EngineStateTest, TwoHandoversInARowChangeNothing) {
  World plain(GetParam());
  RunScenario(plain, -1);
  World handed(GetParam());
  // Cut at step 7 (AMs held, overflow full, a transfer mid-stream), twice.
  RunScenario(handed, 7);
  ASSERT_TRUE(handed.Handover().ok());
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
  ASSERT_TRUE(w.Handover().ok());
  EXPECT_EQ(EndpointTestPeer(w.ep(1)).unexpected_cost(), cost);
  EXPECT_EQ(EndpointTestPeer(w.ep(1)).claimed(), 1u);
  EXPECT_EQ(w.job().unexpected_cost.load(), cost);
  EXPECT_EQ(w.job().account().unexpected_cost.load(), cost);
  EXPECT_EQ(EndpointTestPeer(w.ep(2)).posted().size(), 2u);
  EXPECT_GE(w.job().posted_recvs.load(), 2u);
}

// A send held for its receiver's budget keeps the rest of its batch with
// it, taken off the ring but not yet validated (PollMessages): one may name
// a slot that was never connected. The successor takes the state and,
// when their turn comes, does with them what the first engine would have:
// the held send arrives, the bad one fails at its sender. (The loader once
// refused such a state: engine_fuzz found it.)
TEST_P(EngineStateTest, AHeldBatchWithABadSendBehindTheHeldOneIsCarried) {
  auto run = [](World& w, bool handover) {
    EndpointTestPeer(w.ep(1)).set_unexpected_budget(kUnexpectedOverheadBytes);
    w.Send(0, 1, 1, 8);  // admitted: the queue is empty
    w.Send(0, 1, 2, 8);  // held: the budget is full
    const uint32_t tag[3] = {3, 0, 0};
    w.Submit(0, shm::PrepSend(/*slot=*/7, w.Token(0), tag, 8, false));
    w.Poll();
    // (With two shards the sends cross and wait at the receiver's shard
    // instead: the bad one is refused at once, the state is the ordinary
    // held item's.)
    if (w.shards() == 1) {
      EXPECT_EQ(EndpointTestPeer(w.ep(0)).held_sends().size(), 2u);
    }
    if (handover) {
      Status st = w.Handover();
      ASSERT_TRUE(st.ok()) << st.message;
    }
    w.Recv(1, 0, 1, true, 8);
    w.Recv(1, 0, 2, true, 8);
    w.Poll();
    for (uint32_t at = 0; at < kEndpoints; at++) w.Reap(at);
  };
  World plain(GetParam());
  run(plain, false);
  World handed(GetParam());
  run(handed, true);
  ExpectSameRecords(plain, handed, 0);
  ASSERT_EQ(plain.record(1).size(), 2u);  // both messages received
  ASSERT_EQ(plain.record(0).size(), 1u);  // the bad send failed
  EXPECT_EQ(plain.record(0)[0].op, shm::CompleteOp::kError);
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
