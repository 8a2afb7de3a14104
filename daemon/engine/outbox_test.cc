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

// Active-message acks take no credit (they come off the control ring and
// answer requests): endpoint 2 floods acks at endpoint 3 on shard 1, which
// does not run. Shard 0's lane to it fills (Crossing::kLaneItems), then its
// outbox holds at most kOutboxPerEndpoint of endpoint 2's items and a
// batch, because endpoint 2's control ring waits while they do; endpoint 4
// on the same shard is served meanwhile. Once shard 1 runs, every ack
// arrives, in order: nothing was dropped.
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
  // The lane is full and endpoint 2's control ring is no longer read.
  EXPECT_LT(submitted, kAcks);
  EXPECT_GT(Engine(2).outbox_items(), 0u);
  EXPECT_LE(peak, MqEngine::kOutboxPerEndpoint + 32)
      << "outbox grew to " << peak;
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
  EXPECT_LE(peak, MqEngine::kOutboxPerEndpoint + 32);
}

}  // namespace
}  // namespace psmd
