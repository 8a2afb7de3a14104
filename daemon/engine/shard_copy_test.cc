// Copies in place across engine shards (mq_engine.h, invariants 10 and 11):
// a rendezvous transfer whose sender and receiver live on different shards
// is taken over once it stalls, as within one shard. Two engines driven by
// hand from the test thread, a real Crossing, real rings on in-memory
// segments; every endpoint is this process, so each shard's copier reads
// and writes the test's own buffers.
#include <gtest/gtest.h>
#include <psm2.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "daemon/engine/crossing.h"
#include "daemon/engine/mq_engine.h"
#include "daemon/engine/test_endpoint.h"
#include "shm/payload.h"
#include "shm/pool.h"
#include "shm/segment.h"

namespace psmd {
namespace {

constexpr uint32_t kRingCapacity = 64;
constexpr uint64_t kRegionBytes = 1 << 20;
constexpr uint64_t kMinBytes = 64 << 10;
// Long enough that the test thread is never that late between two steps.
constexpr uint64_t kAfterNs = 200'000'000;
constexpr uint32_t kChunk = 256 << 10;

// Endpoints 2 and 4 on shard 0, 3 on shard 1 (ShardOf: id % 2), one job,
// each connected to every one at slot = its index here (2 -> 0, 3 -> 1,
// 4 -> 2).
class ShardCopyTest : public ::testing::Test {
 protected:
  void SetUp() override {
    for (uint32_t s = 0; s < 2; s++) {
      engines_[s].JoinShards(&crossing_, s);
      engines_[s].EnableCrossCopy([] {}, kMinBytes, kAfterNs);
    }
    std::string error;
    shm::Mapping pool;
    ASSERT_TRUE(shm::Mapping::Create("shardcopy-pool", 3 * kRegionBytes,
                                     geteuid(), getegid(), &pool, &error))
        << error;
    job_ = std::make_shared<Job>(JobKey{Uuid{7}, geteuid()}, std::move(pool), 3,
                                 kRegionBytes, std::make_shared<UidAccount>());
    for (uint32_t id : {2u, 3u, 4u}) {
      auto ep = MakeTestEndpoint(job_, *job_->TakeRegion(), id, 0x7000 + id,
                                 kRingCapacity, 1 << 20);
      AttachThisProcess(*ep);
      rings_.push_back(
          shm::ClientRingsOf(ep->segment().base(), ep->geometry()));
      arenas_.emplace_back(job_->pool().base(), ep->region().offset,
                           ep->region().bytes);
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
  shm::ClientRings& Rings(uint32_t id) { return rings_[id - 2]; }
  shm::SendArena& Arena(uint32_t id) { return arenas_[id - 2]; }
  Endpoint& Ep(uint32_t id) { return *endpoints_[id - 2]; }
  static uint32_t Slot(uint32_t id) { return id - 2; }

  void Submit(uint32_t id, const shm::SubmissionDesc& d) {
    auto& r = shm::TraitsOf(d.op).ring == shm::Ring::kMessage
                  ? Rings(id).msg_sq
                  : Rings(id).ctl_sq;
    ASSERT_TRUE(r.TryPush(d));
  }
  // Both shards, a few passes each.
  void Turn() {
    for (int i = 0; i < 4; i++) {
      engines_[0].PollAll();
      engines_[1].PollAll();
    }
  }
  std::vector<shm::CompletionDesc> Reap(uint32_t id) {
    std::vector<shm::CompletionDesc> out;
    shm::CompletionDesc c;
    while (Rings(id).cq.PopBatch(&c, 1) == 1) out.push_back(c);
    return out;
  }
  // Turns both shards until `n` completions reached `id` (or 10 s passed).
  std::vector<shm::CompletionDesc> Await(uint32_t id, size_t n) {
    std::vector<shm::CompletionDesc> got;
    for (int i = 0; i < 10000 && got.size() < n; i++) {
      Turn();
      for (auto& c : Reap(id)) got.push_back(c);
      if (got.size() < n) usleep(1000);
    }
    return got;
  }

  uint64_t RndvSend(uint32_t from, uint32_t to, uint32_t tag0, const void* addr,
                    uint32_t len) {
    const uint32_t tag[3] = {tag0, 0, 0};
    shm::SubmissionDesc d = shm::PrepSend(Slot(to), ++token_, tag, len, true);
    shm::PlaceInMemory(d, addr);
    Submit(from, d);
    return token_;
  }
  uint64_t PlacedRecv(uint32_t at, uint32_t from, uint32_t tag0, void* addr,
                      uint32_t capacity) {
    const uint32_t tag[3] = {tag0, 0, 0};
    const uint32_t sel[3] = {~0u, ~0u, ~0u};
    shm::SubmissionDesc d =
        shm::PrepRecv(Slot(from), ++token_, tag, sel, capacity);
    shm::PlaceInMemory(d, addr);
    Submit(at, d);
    return token_;
  }
  // One chunk of transfer `go` through the pool, as the sender's library
  // streams it.
  void Chunk(uint32_t from, const shm::CompletionDesc& go, const uint8_t* src,
             uint64_t offset, uint32_t len) {
    shm::SubmissionDesc d =
        shm::PrepRndvData(go.req, go.body.go.transfer, offset, len);
    auto off = Arena(from).Allocate(len);
    ASSERT_TRUE(off.has_value());
    std::memcpy(job_->pool().base() + *off, src + offset, len);
    d.body.rndv.pool_offset = *off;
    Submit(from, d);
  }
  // The receiver's library: copies a streamed chunk into place and
  // releases it.
  void Consume(const shm::CompletionDesc& c, uint8_t* dst) {
    if (c.op != shm::CompleteOp::kRndvChunk ||
        (c.flags & shm::kPayloadPlaced)) {
      return;
    }
    shm::PoolPayload chunk(job_->pool().base(), c.body.chunk.pool_offset);
    std::memcpy(dst + c.body.chunk.offset, chunk.data(), c.body.chunk.len);
    chunk.Release();
  }
  // Every chunk the sender published went back to its region.
  bool AllReleased(uint32_t id) {
    Arena(id).Reclaim();
    return Arena(id).empty();
  }

  Crossing crossing_{2};
  MqEngine engines_[2] = {MqEngine(1 << 30, 1 << 30, 1 << 30),
                          MqEngine(1 << 30, 1 << 30, 1 << 30)};
  std::shared_ptr<Job> job_;
  std::vector<std::shared_ptr<Endpoint>> endpoints_;
  std::vector<shm::ClientRings> rings_;
  std::vector<shm::SendArena> arenas_;
  uint64_t token_ = 0;
};

// Sender on shard 0, receiver on shard 1, and the other way: the sender
// never streams (it computes), the shard that keeps the transfer (the
// receiver's) takes it over and copies all of it; the sender's shard counts
// the copy.
TEST_F(ShardCopyTest, AStalledTransferAcrossShardsIsCopiedBothWays) {
  for (auto [from, to] : {std::pair{2u, 3u}, std::pair{3u, 4u}}) {
    SCOPED_TRACE("from " + std::to_string(from) + " to " + std::to_string(to));
    std::vector<uint8_t> src(3 << 20), dst(3 << 20, 0);
    for (size_t i = 0; i < src.size(); i++)
      src[i] = static_cast<uint8_t>(i * 7 + from);
    const uint64_t r = PlacedRecv(to, from, 9, dst.data(), dst.size());
    Turn();
    const uint64_t s = RndvSend(from, to, 9, src.data(), src.size());
    auto at_receiver = Await(to, 2);
    auto at_sender = Await(from, 2);
    ASSERT_EQ(at_receiver.size(), 2u);
    EXPECT_EQ(at_receiver[0].op, shm::CompleteOp::kRecvRndv);
    EXPECT_EQ(at_receiver[0].req, r);
    EXPECT_EQ(at_receiver[1].op, shm::CompleteOp::kRndvChunk);
    EXPECT_TRUE(at_receiver[1].flags & shm::kPayloadPlaced);
    EXPECT_EQ(at_receiver[1].error, PSM2_OK);
    EXPECT_EQ(at_receiver[1].body.chunk.len, src.size());
    ASSERT_EQ(at_sender.size(), 2u);
    EXPECT_EQ(at_sender[0].op, shm::CompleteOp::kRndvGo);
    EXPECT_TRUE(at_sender[0].flags & shm::kGoAwaitDone);
    EXPECT_EQ(at_sender[1].op, shm::CompleteOp::kSendDone);
    EXPECT_EQ(at_sender[1].req, s);
    EXPECT_EQ(at_sender[1].error, PSM2_OK);
    EXPECT_EQ(src, dst);
    EXPECT_EQ(Ep(from).counters.rndv_msgs_copied.Get(), 1u);
    EXPECT_EQ(Ep(from).counters.rndv_bytes_copied.Get(), src.size());
  }
}

// A stream that stalls half way is taken over where it stopped; a chunk the
// sender publishes after the takeover crosses to the keeping shard, goes
// back unread and is no error; every chunk is released exactly once (the
// sender's region is whole again, and a second release would have failed
// the pool's check).
TEST_F(ShardCopyTest, AStreamThatStallsIsTakenOverWhereItStopped) {
  std::vector<uint8_t> src(2 << 20), dst(2 << 20, 0);
  for (size_t i = 0; i < src.size(); i++) src[i] = static_cast<uint8_t>(i * 3);
  PlacedRecv(3, 2, 9, dst.data(), dst.size());
  Turn();
  RndvSend(2, 3, 9, src.data(), src.size());
  Turn();
  auto go = Reap(2);
  ASSERT_EQ(go.size(), 1u);
  EXPECT_TRUE(go[0].flags & shm::kGoAwaitDone);
  Chunk(2, go[0], src.data(), 0, kChunk);
  Chunk(2, go[0], src.data(), kChunk, kChunk);
  auto at_receiver = Await(3, 4);  // match, 2 chunks, the rest
  ASSERT_EQ(at_receiver.size(), 4u);
  for (const auto& c : at_receiver) Consume(c, dst.data());
  EXPECT_FALSE(at_receiver[1].flags & shm::kPayloadPlaced);
  EXPECT_FALSE(at_receiver[2].flags & shm::kPayloadPlaced);
  EXPECT_TRUE(at_receiver[3].flags & shm::kPayloadPlaced);
  EXPECT_EQ(at_receiver[3].body.chunk.offset, 2 * kChunk);
  EXPECT_EQ(at_receiver[3].body.chunk.len, src.size() - 2 * kChunk);
  EXPECT_EQ(src, dst);
  Chunk(2, go[0], src.data(), 2 * kChunk, kChunk);
  auto at_sender = Await(2, 1);
  ASSERT_EQ(at_sender.size(), 1u);
  EXPECT_EQ(at_sender[0].op, shm::CompleteOp::kSendDone);
  EXPECT_EQ(at_sender[0].error, PSM2_OK);
  Turn();
  EXPECT_TRUE(Reap(2).empty());
  EXPECT_EQ(Ep(2).counters.bad_descriptors.Get(), 0u);
  EXPECT_EQ(Ep(2).counters.rndv_bytes_copied.Get(), src.size() - 2 * kChunk);
  EXPECT_TRUE(AllReleased(2));
}

// A stream both sides keep moving stays a stream across shards too; the
// sender, told to await kSendDone, gets it from the keeping shard with the
// last chunk.
TEST_F(ShardCopyTest, AStreamThatKeepsMovingStaysAStream) {
  std::vector<uint8_t> src(512 << 10, 9), dst(512 << 10);
  PlacedRecv(3, 2, 9, dst.data(), dst.size());
  Turn();
  const uint64_t s = RndvSend(2, 3, 9, src.data(), src.size());
  Turn();
  auto go = Reap(2);
  ASSERT_EQ(go.size(), 1u);
  EXPECT_TRUE(go[0].flags & shm::kGoAwaitDone);
  for (uint32_t off = 0; off < src.size(); off += kChunk) {
    Chunk(2, go[0], src.data(), off, kChunk);
  }
  auto at_sender = Await(2, 1);
  ASSERT_EQ(at_sender.size(), 1u);
  EXPECT_EQ(at_sender[0].op, shm::CompleteOp::kSendDone);
  EXPECT_EQ(at_sender[0].req, s);
  for (const auto& c : Reap(3)) Consume(c, dst.data());
  EXPECT_EQ(src, dst);
  EXPECT_EQ(Ep(2).counters.rndv_msgs_copied.Get(), 0u);
  EXPECT_TRUE(AllReleased(2));
}

// The sender's shard decides its part: a sender psmd may not copy (no
// pidfd here) gets its go without kGoAwaitDone and completes with its last
// chunk; its transfer is never taken over, though it stalls.
TEST_F(ShardCopyTest, ASenderThatMayNotBeCopiedStreams) {
  close(Ep(2).pidfd.exchange(-1));
  std::vector<uint8_t> src(512 << 10, 5), dst(512 << 10);
  PlacedRecv(3, 2, 9, dst.data(), dst.size());
  Turn();
  RndvSend(2, 3, 9, src.data(), src.size());
  Turn();
  auto go = Reap(2);
  ASSERT_EQ(go.size(), 1u);
  EXPECT_FALSE(go[0].flags & shm::kGoAwaitDone);
  usleep(2 * kAfterNs / 1000);
  Turn();
  for (const auto& c : Reap(3)) {
    EXPECT_FALSE(c.op == shm::CompleteOp::kRndvChunk &&
                 (c.flags & shm::kPayloadPlaced))
        << "taken over";
  }
  for (uint32_t off = 0; off < src.size(); off += kChunk) {
    Chunk(2, go[0], src.data(), off, kChunk);
  }
  Turn();
  for (const auto& c : Reap(3)) Consume(c, dst.data());
  EXPECT_EQ(src, dst);
  EXPECT_TRUE(Reap(2).empty()) << "no kSendDone without kGoAwaitDone";
  EXPECT_TRUE(AllReleased(2));
}

// The sender leaves (its client died) before its stalled transfer is taken
// over: the receive fails with PSM2_EPID_UNREACHABLE, nothing is copied
// from a process whose endpoint is gone, and the keeping shard's kGoneAck
// (after it cancelled any copy from it) lets the sender's shard free it.
TEST_F(ShardCopyTest, ASenderThatLeavesFailsTheReceiveAndIsNotCopied) {
  std::vector<uint8_t> src(3 << 20, 1), dst(3 << 20, 0);
  const uint64_t r = PlacedRecv(3, 2, 9, dst.data(), dst.size());
  Turn();
  RndvSend(2, 3, 9, src.data(), src.size());
  Turn();
  ASSERT_EQ(Reap(2).size(), 1u);  // the go
  std::weak_ptr<Endpoint> gone = endpoints_[0];
  Engine(2).Remove(2);
  endpoints_[0].reset();
  auto at_receiver = Await(3, 2);
  ASSERT_EQ(at_receiver.size(), 2u);
  EXPECT_EQ(at_receiver[1].req, r);
  EXPECT_EQ(at_receiver[1].error, PSM2_EPID_UNREACHABLE);
  EXPECT_EQ(std::count(dst.begin(), dst.end(), 1), 0) << "copied";
  usleep(2 * kAfterNs / 1000);
  Turn();
  EXPECT_TRUE(Reap(3).empty());
  EXPECT_TRUE(gone.expired()) << "the sender's shard still keeps it";
}

// The receiver leaves mid-copy (or before it): its own shard keeps the
// transfer and the copier, cancels the copy first, and the sender on the
// other shard is told.
TEST_F(ShardCopyTest, AReceiverThatLeavesEndsTheSendersTransfer) {
  std::vector<uint8_t> src(3 << 20, 1), dst(3 << 20, 0);
  PlacedRecv(3, 2, 9, dst.data(), dst.size());
  Turn();
  const uint64_t s = RndvSend(2, 3, 9, src.data(), src.size());
  Turn();
  ASSERT_EQ(Reap(2).size(), 1u);  // the go
  Engine(3).Remove(3);
  auto at_sender = Await(2, 1);
  ASSERT_EQ(at_sender.size(), 1u);
  EXPECT_EQ(at_sender[0].req, s);
  EXPECT_EQ(at_sender[0].error, PSM2_EPID_UNREACHABLE);
  usleep(2 * kAfterNs / 1000);
  Turn();
  EXPECT_TRUE(Reap(2).empty());
  EXPECT_EQ(Ep(2).counters.rndv_msgs_copied.Get(), 0u);
}

// Mid-copy deaths. A copy of kBig bytes runs tens of milliseconds (1 MiB
// per chunk, read then written): long enough to remove an endpoint while
// the keeping shard's copier moves it.
constexpr size_t kBig = 128 << 20;

// Turns both shards until the copier wrote the first chunk into `dst`
// (the transfer was taken over and the copy runs), at most 10 s.
bool AwaitCopyStarted(const std::vector<uint8_t>& dst,
                      const std::function<void()>& turn) {
  for (int i = 0; i < 10000; i++) {
    turn();
    if (dst[0] != 0) return true;
    usleep(1000);
  }
  return false;
}

// The sender's client dies mid-copy: its shard removes it (it cannot Cancel
// the other shard's copier), the copier delivers nothing it read after
// that (at most the chunk it had read), even before the keeping shard
// learns (kGone), the receive fails with PSM2_EPID_UNREACHABLE, and the
// sender is freed only after the keeping shard cancelled the copy
// (kGoneAck).
TEST_F(ShardCopyTest, ASenderThatDiesMidCopyFailsTheReceive) {
  std::vector<uint8_t> src(kBig, 1), dst(kBig, 0);
  const uint64_t r = PlacedRecv(3, 2, 9, dst.data(), dst.size());
  Turn();
  RndvSend(2, 3, 9, src.data(), src.size());
  Turn();
  ASSERT_EQ(Reap(2).size(), 1u);  // the go
  // Only the keeping shard turns until the copy runs.
  ASSERT_TRUE(AwaitCopyStarted(dst, [&] { Engine(3).PollAll(); }));
  std::weak_ptr<Endpoint> gone = endpoints_[0];
  Engine(2).Remove(2);
  endpoints_[0].reset();
  const size_t written = std::count(dst.begin(), dst.end(), 1);
  if (written == kBig) GTEST_SKIP() << "the copy ended before the removal";
  // The keeping shard does not turn: its copier alone must stop.
  usleep(200'000);
  EXPECT_LE(static_cast<size_t>(std::count(dst.begin(), dst.end(), 1)),
            written + (1 << 20))
      << "read from the sender after its endpoint was removed";
  auto at_receiver = Await(3, 2);
  ASSERT_EQ(at_receiver.size(), 2u);
  EXPECT_EQ(at_receiver[1].req, r);
  EXPECT_EQ(at_receiver[1].error, PSM2_EPID_UNREACHABLE);
  Turn();
  EXPECT_TRUE(gone.expired()) << "the sender's shard still keeps it";
}

// The receiver's client dies mid-copy: its shard keeps the transfer and the
// copier, so its Remove cancels the copy first: not a byte is written into
// the receiver after it returns; the sender on the other shard is told.
TEST_F(ShardCopyTest, AReceiverThatDiesMidCopyIsWrittenNoMore) {
  std::vector<uint8_t> src(kBig, 1), dst(kBig, 0);
  PlacedRecv(3, 2, 9, dst.data(), dst.size());
  Turn();
  const uint64_t s = RndvSend(2, 3, 9, src.data(), src.size());
  Turn();
  ASSERT_EQ(Reap(2).size(), 1u);  // the go
  ASSERT_TRUE(AwaitCopyStarted(dst, [&] { Engine(3).PollAll(); }));
  Engine(3).Remove(3);
  const size_t written = std::count(dst.begin(), dst.end(), 1);
  auto at_sender = Await(2, 1);
  ASSERT_EQ(at_sender.size(), 1u);
  EXPECT_EQ(at_sender[0].req, s);
  if (written == kBig) GTEST_SKIP() << "the copy ended before the removal";
  EXPECT_EQ(at_sender[0].error, PSM2_EPID_UNREACHABLE);
  usleep(100'000);
  Turn();
  EXPECT_EQ(static_cast<size_t>(std::count(dst.begin(), dst.end(), 1)), written)
      << "written after the receiver was removed";
  EXPECT_EQ(Ep(2).counters.rndv_msgs_copied.Get(), 0u);
}

}  // namespace
}  // namespace psmd
