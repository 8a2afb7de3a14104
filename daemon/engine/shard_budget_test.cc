// A job's unexpected budget with two engine shards charging it at once
// (mq_engine.h, invariants 4 and 11): each shard on its own thread, as in
// psmd, a sender flooding a receiver of the same job on each. The job's
// counter is shared; a check then a charge would let both shards squeeze
// under the budget at once. Real rings on in-memory segments.
#include <gtest/gtest.h>
#include <psm2.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "daemon/engine/crossing.h"
#include "daemon/engine/mq_engine.h"
#include "daemon/engine/test_endpoint.h"
#include "shm/segment.h"

namespace psmd {
namespace {

constexpr uint32_t kRingCapacity = 64;
constexpr uint64_t kRegionBytes = 64 << 10;
// The job's budget, in messages (kUnexpectedOverheadBytes each).
constexpr uint64_t kJobMessages = 16;
// Sends per sender and trial: together more than the budget, so that both
// shards charge the job until it is full and then hold.
constexpr uint32_t kSends = 24;

class ShardBudgetTest : public ::testing::Test {
 protected:
  // Shard 0: sender 2, receiver 4; shard 1: sender 3, receiver 5. Each
  // one's slot 0 is the other of its pair.
  void SetUp() override {
    for (uint32_t s = 0; s < 2; s++) engines_[s].JoinShards(&crossing_, s);
    std::string error;
    shm::Mapping pool;
    ASSERT_TRUE(shm::Mapping::Create("budget-pool", 4 * kRegionBytes, geteuid(),
                                     getegid(), &pool, &error))
        << error;
    job_ = std::make_shared<Job>(JobKey{Uuid{9}, geteuid()}, std::move(pool), 4,
                                 kRegionBytes, std::make_shared<UidAccount>());
    for (uint32_t id : {2u, 3u, 4u, 5u}) {
      auto ep = MakeTestEndpoint(job_, *job_->TakeRegion(), id, 0x9000 + id,
                                 kRingCapacity, 1 << 30);
      rings_.push_back(
          shm::ClientRingsOf(ep->segment().base(), ep->geometry()));
      Engine(id).Add(ep);
      endpoints_.push_back(std::move(ep));
    }
    for (uint32_t sender : {2u, 3u}) {
      const auto& s = endpoints_[sender - 2];
      const auto& r = endpoints_[sender];  // ids 4 and 5: index id - 2
      Engine(sender).SetPeer(sender, 0, PeerLink{r->id(), r->epid()});
      Engine(r->id()).SetPeer(r->id(), 0, PeerLink{s->id(), s->epid()});
    }
    // One message (tag 2) that stays in each receiver's queue: an empty
    // queue admits one message over any budget (invariant 4), which is not
    // what this test is about.
    const uint32_t tag[3] = {2, 0, 0};
    for (uint32_t sender : {2u, 3u}) {
      shm::SubmissionDesc d = shm::PrepSend(0, 1, tag, 1, false);
      ASSERT_TRUE(Rings(sender).msg_sq.TryPush(d));
      Engine(sender).PollAll();
    }
  }

  MqEngine& Engine(uint32_t id) { return engines_[MqEngine::ShardOf(id, 2)]; }
  shm::ClientRings& Rings(uint32_t id) { return rings_[id - 2]; }

  // One shard's part of a trial, on its own thread: its sender's sends
  // arrive at its receiver, which posts no receive, until the budget
  // holds the rest.
  void Flood(uint32_t sender, std::atomic<int>* ready) {
    const uint32_t tag[3] = {1, 0, 0};
    for (uint32_t i = 0; i < kSends; i++) {
      shm::SubmissionDesc d = shm::PrepSend(0, i + 1, tag, 8, false);
      std::memcpy(d.body.inline_data, "12345678", 8);
      ASSERT_TRUE(Rings(sender).msg_sq.TryPush(d));
    }
    // Both threads start their passes together.
    ready->fetch_add(1);
    while (ready->load() < 2) {
    }
    for (int i = 0; i < 4; i++) Engine(sender).PollAll();
  }

  // Back to where it was: each receiver takes every message of the trial
  // (one thread; held sends arrive as the queue drains).
  void Drain() {
    const uint32_t tag[3] = {1, 0, 0};
    const uint32_t all[3] = {~0u, ~0u, ~0u};
    for (uint32_t receiver : {4u, 5u}) {
      // As many receives as sends: none is left posted for the next trial.
      for (uint32_t i = 0; i < kSends; i++) {
        ASSERT_TRUE(
            Rings(receiver).ctl_sq.TryPush(shm::PrepRecv(0, 1, tag, all, 8)));
      }
      uint32_t got = 0;
      for (int pass = 0; pass < 1000 && got < kSends; pass++) {
        Engine(receiver).PollAll();
        shm::CompletionDesc c;
        while (Rings(receiver).cq.PopBatch(&c, 1) == 1) {
          if (c.op == shm::CompleteOp::kRecvDone) got++;
        }
      }
      ASSERT_EQ(got, kSends);
    }
  }

  Crossing crossing_{2};
  MqEngine engines_[2] = {
      MqEngine(1 << 30, kJobMessages* kUnexpectedOverheadBytes, 1 << 30),
      MqEngine(1 << 30, kJobMessages* kUnexpectedOverheadBytes, 1 << 30)};
  std::shared_ptr<Job> job_;
  std::vector<std::shared_ptr<Endpoint>> endpoints_;
  std::vector<shm::ClientRings> rings_;
};

// Each trial both shards fill the job's budget at once; once both stopped,
// what the job's receivers hold is within the budget: the shards reserve
// before they queue, never check then charge (which let both squeeze under
// the budget at once, and the job hold a message more).
TEST_F(ShardBudgetTest, TwoShardsChargingAtOnceStayWithinTheJobsBudget) {
  constexpr int kTrials = 3000;
  int over = 0;
  uint64_t most = 0;
  for (int trial = 0; trial < kTrials; trial++) {
    std::atomic<int> ready{0};
    std::thread a([&] { Flood(2, &ready); });
    std::thread b([&] { Flood(3, &ready); });
    a.join();
    b.join();
    const uint64_t held = EndpointTestPeer(*endpoints_[2]).unexpected_cost() +
                          EndpointTestPeer(*endpoints_[3]).unexpected_cost();
    EXPECT_EQ(held, job_->unexpected_cost.load());
    most = std::max(most, held);
    if (held > kJobMessages * kUnexpectedOverheadBytes) over++;
    Drain();
    if (HasFatalFailure()) return;
  }
  printf(
      "%d trials: the job held at most %llu B (budget %llu B), over it %d "
      "times\n",
      kTrials, static_cast<unsigned long long>(most),
      static_cast<unsigned long long>(kJobMessages * kUnexpectedOverheadBytes),
      over);
  EXPECT_EQ(over, 0);
}

}  // namespace
}  // namespace psmd
