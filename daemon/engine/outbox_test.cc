// Two engine shards driven by hand from the test thread (mq_engine.h,
// invariant 11), one of them slow: what a flooding sender can make its
// shard keep for the other. Real rings on in-memory segments, a real
// Crossing between the engines, as engine_fuzz builds them.
#include <gtest/gtest.h>
#include <psm2.h>
#include <unistd.h>

#include <memory>
#include <string>
#include <vector>

#include "daemon/engine/crossing.h"
#include "daemon/engine/mq_engine.h"
#include "daemon/engine/test_endpoint.h"
#include "shm/segment.h"

namespace psmd {
namespace {

constexpr uint32_t kRingCapacity = 64;
constexpr uint64_t kRegionBytes = 1 << 20;
constexpr uint64_t kBudget = 1 << 20;

class OutboxTest : public ::testing::Test {
 protected:
  // Endpoints 2 and 4 on shard 0, 3 on shard 1 (ShardOf: id % 2), all of
  // one job, each connected to every one at slot = its index here.
  void SetUp() override {
    for (uint32_t s = 0; s < 2; s++) engines_[s].JoinShards(&crossing_, s);
    std::string error;
    shm::Mapping pool;
    ASSERT_TRUE(shm::Mapping::Create("outbox-pool", 3 * kRegionBytes, geteuid(),
                                     getegid(), &pool, &error))
        << error;
    job_ = std::make_shared<Job>(JobKey{Uuid{7}, geteuid()}, std::move(pool), 3,
                                 kRegionBytes, std::make_shared<UidAccount>());
    for (uint32_t id : {2u, 3u, 4u}) {
      auto ep = MakeTestEndpoint(job_, *job_->TakeRegion(), id, 0x7000 + id,
                                 kRingCapacity, kBudget);
      rings_.push_back(
          shm::ClientRingsOf(ep->segment().base(), ep->geometry()));
      Engine(id).Add(ep);
      endpoints_.push_back(std::move(ep));
    }
    for (const auto& ep : endpoints_) {
      for (uint32_t slot = 0; slot < endpoints_.size(); slot++) {
        Engine(ep->id()).SetPeer(
            ep->id(), slot,
            PeerLink{endpoints_[slot]->id(), endpoints_[slot]->epid()});
      }
    }
  }

  MqEngine& Engine(uint32_t id) { return engines_[MqEngine::ShardOf(id, 2)]; }
  shm::ClientRings& Rings(uint32_t id) { return rings_[(id - 2)]; }

  std::vector<shm::CompletionDesc> Reap(uint32_t id) {
    std::vector<shm::CompletionDesc> out;
    shm::CompletionDesc c;
    while (Rings(id).cq.PopBatch(&c, 1) == 1) out.push_back(c);
    return out;
  }

  Crossing crossing_{2};
  MqEngine engines_[2] = {MqEngine(1 << 30, 1 << 30, 1 << 30),
                          MqEngine(1 << 30, 1 << 30, 1 << 30)};
  std::shared_ptr<Job> job_;
  std::vector<std::shared_ptr<Endpoint>> endpoints_;
  std::vector<shm::ClientRings> rings_;
};

// Active-message acks come off the control ring and answer requests: they
// take no send credit, but their endpoint's control credit. Endpoint 2
// floods acks at endpoint 3 on shard 1, which does not run: endpoint 2's
// control ring is read until kControlCredit of its items (and at most a
// batch more) are in flight, then waits, so shard 0's lane and outbox hold
// no more of them (before this credit, the lane filled and the outbox held
// 64 and a batch: 8,160 without any bound); endpoint 4 on the same shard is
// served meanwhile. Once shard 1 runs, every ack arrives, in order: nothing
// was dropped.
TEST_F(OutboxTest, AFloodingSenderCannotGrowTheOutboxPastItsBound) {
  constexpr uint64_t kAcks = 3 * Crossing::kLaneItems;
  uint64_t submitted = 0;
  size_t peak = 0;
  for (int pass = 0; pass < 4000 && submitted < kAcks; pass++) {
    while (submitted < kAcks &&
           Rings(2).ctl_sq.TryPush(
               shm::PrepAmAck(3, submitted + 1, /*handler=*/5, PSM2_OK))) {
      submitted++;
    }
    Engine(2).PollAll();
    peak = std::max(peak, Engine(2).outbox_items());
  }
  // Endpoint 2's control ring is no longer read: what it handed shard 1 is
  // its credit and a batch at most (the rest waits in its ring).
  EXPECT_LT(submitted, kAcks);
  EXPECT_LE(submitted, MqEngine::kControlCredit + 32 + kRingCapacity);
  EXPECT_LE(peak, MqEngine::kControlCredit + 32) << "outbox grew to " << peak;
  printf("outbox: at most %zu items while %llu acks were submitted\n", peak,
         static_cast<unsigned long long>(submitted));
  // Endpoint 4, on the same shard, is still served: a message to itself.
  const uint32_t tag[3] = {9, 0, 0};
  const uint32_t sel[3] = {~0u, ~0u, ~0u};
  ASSERT_TRUE(Rings(4).ctl_sq.TryPush(shm::PrepRecv(2, 100, tag, sel, 8)));
  shm::SubmissionDesc send = shm::PrepSend(2, 101, tag, 4, false);
  std::memcpy(send.body.inline_data, "ping", 4);
  ASSERT_TRUE(Rings(4).msg_sq.TryPush(send));
  for (int i = 0; i < 10; i++) Engine(4).PollAll();
  auto got = Reap(4);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].op, shm::CompleteOp::kRecvDone);
  EXPECT_EQ(got[0].req, 100u);
  // Shard 1 runs: the rest of the flood goes through, in order.
  uint64_t next = 1;
  for (int pass = 0; pass < 100000 && next <= kAcks; pass++) {
    while (submitted < kAcks &&
           Rings(2).ctl_sq.TryPush(
               shm::PrepAmAck(3, submitted + 1, /*handler=*/5, PSM2_OK))) {
      submitted++;
    }
    Engine(2).PollAll();
    Engine(3).PollAll();
    peak = std::max(peak, Engine(2).outbox_items());
    for (const shm::CompletionDesc& c : Reap(3)) {
      ASSERT_EQ(c.op, shm::CompleteOp::kAmAcked);
      ASSERT_EQ(c.req, next) << "acks out of order or lost";
      next++;
    }
  }
  EXPECT_EQ(next, kAcks + 1);
  EXPECT_EQ(Engine(2).outbox_items(), 0u);
  EXPECT_LE(peak, MqEngine::kControlCredit + 32);
}

// What one shard's answers can make it hold for another (invariant 11):
// kSenders endpoints of shard 0 flood active-message acks at an endpoint
// id of shard 1 that does not exist, so shard 1 answers each with a
// refusal. Shard 0 takes at most a lane batch (256) of those answers per
// pass while its endpoints hand shard 1 up to a ring batch (32) each, more
// than 256 together: without a bound, shard 1's outbox to shard 0 would
// grow by the difference every pass. Each item of a control submission
// takes its endpoint's control credit until shard 1 took it, and shard 1
// gives the credit back behind its answer, so the answers to one endpoint's
// items waiting anywhere are at most its credit and a batch.
class AnswersTest : public ::testing::Test {
 protected:
  static constexpr uint32_t kSenders = 16;
  static constexpr uint64_t kSmallRegion = 64 << 10;
  void SetUp() override {
    for (uint32_t s = 0; s < 2; s++) engines_[s].JoinShards(&crossing_, s);
    // Ids 2, 4, ... on shard 0; 3 on shard 1. A job each: one job's share
    // of a pass is 4 ring batches (invariant 7).
    for (uint32_t i = 0; i <= kSenders; i++) {
      const uint32_t id = i < kSenders ? 2 + 2 * i : 3;
      std::string error;
      shm::Mapping pool;
      ASSERT_TRUE(shm::Mapping::Create("answers-pool", kSmallRegion, geteuid(),
                                       getegid(), &pool, &error))
          << error;
      auto job = std::make_shared<Job>(
          JobKey{Uuid{static_cast<uint8_t>(100 + i)}, geteuid()},
          std::move(pool), 1, kSmallRegion, std::make_shared<UidAccount>());
      auto ep = MakeTestEndpoint(job, *job->TakeRegion(), id, 0x8000 + id,
                                 kRingCapacity, kBudget);
      rings_.push_back(
          shm::ClientRingsOf(ep->segment().base(), ep->geometry()));
      engines_[MqEngine::ShardOf(id, 2)].Add(ep);
      endpoints_.push_back(std::move(ep));
      jobs_.push_back(std::move(job));
    }
  }
  // Fills every sender's control ring with acks for endpoint 1001 (shard
  // 1's by its id; nobody). Returns how many were submitted.
  uint64_t Flood() {
    uint64_t n = 0;
    for (uint32_t i = 0; i < kSenders; i++) {
      while (rings_[i].ctl_sq.TryPush(
          shm::PrepAmAck(1001, ++acks_, /*handler=*/5, PSM2_OK))) {
        n++;
      }
    }
    return n;
  }

  Crossing crossing_{2};
  MqEngine engines_[2] = {MqEngine(1 << 30, 1 << 30, 1 << 30),
                          MqEngine(1 << 30, 1 << 30, 1 << 30)};
  std::vector<std::shared_ptr<Job>> jobs_;
  std::vector<std::shared_ptr<Endpoint>> endpoints_;
  std::vector<shm::ClientRings> rings_;
  uint64_t acks_ = 0;
};

TEST_F(AnswersTest, AShardsAnswersToAFloodStayBounded) {
  size_t peak = 0;
  uint64_t submitted = 0;
  // Shard 1 runs faster than shard 0 (it has nothing else to do): it takes
  // everything shard 0 handed it each round.
  for (int round = 0; round < 400; round++) {
    submitted += Flood();
    engines_[0].PollAll();
    for (int i = 0; i < 20; i++) {
      engines_[1].PollAll();
      peak = std::max(peak, engines_[1].outbox_items());
    }
  }
  printf("shard 1's outbox: at most %zu answers while %llu acks came\n", peak,
         static_cast<unsigned long long>(submitted));
  // Every item in flight of a sender has at most one answer and one credit
  // run behind it.
  EXPECT_LE(peak, 2 * kSenders * (MqEngine::kControlCredit + 32))
      << "shard 1's outbox grew to " << peak;
  // Both shards run: everything drains, nothing is left in flight.
  for (int i = 0; i < 1000; i++) {
    engines_[0].PollAll();
    engines_[1].PollAll();
  }
  EXPECT_EQ(engines_[0].outbox_items(), 0u);
  EXPECT_EQ(engines_[1].outbox_items(), 0u);
  EXPECT_FALSE(engines_[0].CrossingPending());
  EXPECT_FALSE(engines_[1].CrossingPending());
}

}  // namespace
}  // namespace psmd
