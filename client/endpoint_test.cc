// The library's completion handling on an in-memory segment: a psm2_ep
// wired to real rings and a real pool, with the test playing psmd's part
// (it publishes completions through shm/'s daemon-side ring ends). No
// daemon and no control plane are involved: what is tested is what the
// library does with what psmd tells it.
#include "client/endpoint.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <memory>
#include <string>

#include "shm/segment.h"

namespace psmd::client {
namespace {

constexpr uint32_t kRing = 64;
constexpr uint64_t kRegionBytes = 1 << 20;

class EndpointTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string error;
    geometry_ = shm::ComputeGeometry(kRing, kRing);
    shm::Mapping segment, pool;
    ASSERT_TRUE(shm::Mapping::Create("test-seg", geometry_.bytes, geteuid(),
                                     getegid(), &segment, &error));
    ASSERT_TRUE(shm::Mapping::Create("test-pool", 2 * kRegionBytes, geteuid(),
                                     getegid(), &pool, &error));
    uint8_t* segment_base = segment.base();
    ep_ = std::make_unique<psm2_ep>(psm2_ep::Identity{}, std::move(segment),
                                    std::move(pool), -1, -1);
    EndpointLock lock(&ep_->mu);
    shm::ClientRings rings = shm::ClientRingsOf(segment_base, geometry_);
    ep_->UseRings(rings, shm::SendArena(ep_->pool_base(), 0, kRegionBytes),
                  kRing);
    daemon_ = shm::DaemonRingsOf(segment_base, geometry_);
    // A peer's send region, where "its" payloads are.
    peer_arena_ = shm::SendArena(ep_->pool_base(), kRegionBytes, kRegionBytes);
  }

  // A payload in the peer's region, as a sender would have put it.
  uint64_t PeerPayload(const std::string& bytes) {
    auto off = peer_arena_.Allocate(static_cast<uint32_t>(bytes.size()));
    EXPECT_TRUE(off.has_value());
    std::memcpy(ep_->pool_base() + *off, bytes.data(), bytes.size());
    return *off;
  }

  bool Released(uint64_t off) {
    return shm::ChunkOf(ep_->pool_base(), off)->state.load() ==
           shm::kChunkReleased;
  }

  // Posts a receive of `capacity` bytes into buf_.
  psm2_mq_req* PostRecv(uint32_t capacity) {
    EndpointLock lock(&ep_->mu);
    psm2_mq_req* r = ep_->NewRequest(psm2_mq_req::Kind::kRecv, nullptr);
    r->user.buf = buf_;
    r->user.buf_len = capacity;
    const uint32_t tag[3] = {1, 0, 0}, sel[3] = {~0u, ~0u, ~0u};
    ep_->publisher().Submit(
        r, shm::PrepRecv(shm::kAnySlot, TokenOf(r), tag, sel, capacity),
        nullptr);
    return r;
  }

  // psmd's part: publish a completion, then let the library progress.
  void Complete(const shm::CompletionDesc& c) {
    ASSERT_TRUE(daemon_.cq.TryPush(c));
    EndpointLock lock(&ep_->mu);
    ep_->Progress();
  }

  static shm::CompletionDesc RecvDone(uint64_t req, uint64_t off,
                                      uint32_t len) {
    shm::CompletionDesc c{};
    c.op = shm::CompleteOp::kRecvDone;
    c.req = req;
    c.msg_len = len;
    c.src_epid = 0x77;
    c.body.pool.pool_offset = off;
    return c;
  }

  std::unique_ptr<psm2_ep> ep_;
  shm::SegmentGeometry geometry_{};
  shm::DaemonRings daemon_;
  shm::SendArena peer_arena_;
  uint8_t buf_[4096] = {};
};

TEST_F(EndpointTest, AnEagerPayloadIsCopiedReleasedAndTheReceiveCompletes) {
  psm2_mq_req* r = PostRecv(sizeof(buf_));
  const std::string msg(300, 'p');
  uint64_t off = PeerPayload(msg);
  Complete(RecvDone(TokenOf(r), off, 300));
  EXPECT_EQ(std::string(reinterpret_cast<char*>(buf_), 300), msg);
  EXPECT_TRUE(Released(off));
  EXPECT_EQ(r->state, psm2_mq_req::State::kComplete);
  EXPECT_EQ(r->user.recv_msglen, 300u);
  EndpointLock lock(&ep_->mu);
  EXPECT_EQ(ep_->mq().done_head, r);  // on the ipeek list
}

TEST_F(EndpointTest, ATruncatedMessageFillsTheBufferAndSaysSo) {
  psm2_mq_req* r = PostRecv(100);
  uint64_t off = PeerPayload(std::string(300, 't'));
  Complete(RecvDone(TokenOf(r), off, 300));
  EXPECT_EQ(r->user.error_code, PSM2_MQ_TRUNCATION);
  EXPECT_EQ(r->user.recv_msglen, 100u);
  EXPECT_EQ(buf_[100], 0);  // nothing past the buffer's length
  EXPECT_TRUE(Released(off));
}

TEST_F(EndpointTest, AStaleTokenOnlyGivesThePayloadBack) {
  psm2_mq_req* r = PostRecv(sizeof(buf_));
  const uint64_t stale = TokenOf(r) + (uint64_t{1} << 32);  // next generation
  uint64_t off = PeerPayload("late");
  shm::CompletionDesc c = RecvDone(stale, off, 4);
  Complete(c);
  EXPECT_TRUE(Released(off));
  EXPECT_NE(r->state, psm2_mq_req::State::kComplete);
  EndpointLock lock(&ep_->mu);
  EXPECT_EQ(ep_->mq().done_head, nullptr);
}

TEST_F(EndpointTest, AnOutOfOrderRendezvousChunkFailsTheReceive) {
  psm2_mq_req* r = PostRecv(sizeof(buf_));
  shm::CompletionDesc start{};
  start.op = shm::CompleteOp::kRecvRndv;
  start.req = TokenOf(r);
  start.msg_len = 2048;
  Complete(start);
  EXPECT_EQ(r->state, psm2_mq_req::State::kReceiving);
  uint64_t off = PeerPayload(std::string(1024, 'c'));
  shm::CompletionDesc chunk{};
  chunk.op = shm::CompleteOp::kRndvChunk;
  chunk.req = TokenOf(r);
  chunk.body.chunk.pool_offset = off;
  chunk.body.chunk.offset = 1024;  // the first chunk is at 0
  chunk.body.chunk.len = 1024;
  Complete(chunk);
  EXPECT_EQ(r->state, psm2_mq_req::State::kComplete);
  EXPECT_EQ(r->user.error_code, PSM2_INTERNAL_ERR);
  EXPECT_TRUE(Released(off));
}

TEST_F(EndpointTest, AClaimedPayloadNobodyReceivesIsReleasedWithItsRequest) {
  psm2_mq_req* r;
  {
    EndpointLock lock(&ep_->mu);
    r = ep_->NewRequest(psm2_mq_req::Kind::kInternal, nullptr);
    const uint32_t tag[3] = {1, 0, 0}, sel[3] = {~0u, ~0u, ~0u};
    ep_->publisher().Submit(
        r, shm::PrepProbe(shm::kAnySlot, TokenOf(r), tag, sel, true), nullptr);
  }
  uint64_t off = PeerPayload(std::string(500, 'k'));
  shm::CompletionDesc c = RecvDone(TokenOf(r), off, 500);
  c.op = shm::CompleteOp::kProbeDone;
  c.flags = shm::kPayloadClaimed;
  Complete(c);
  EXPECT_FALSE(Released(off));  // the request holds it for psm2_mq_imrecv
  EXPECT_TRUE(r->claimed.present);
  {
    EndpointLock lock(&ep_->mu);
    ep_->FreeRequest(r);
  }
  EXPECT_TRUE(Released(off));
}

TEST_F(EndpointTest, FreeingARequestTwiceNeverHandsItsSlotOutTwice) {
  EndpointLock lock(&ep_->mu);
  psm2_mq_req* r = ep_->NewRequest(psm2_mq_req::Kind::kRecv, nullptr);
  ep_->FreeRequest(r);
  ep_->FreeRequest(r);  // e.g. a wait on a handle already waited on
  psm2_mq_req* a = ep_->NewRequest(psm2_mq_req::Kind::kRecv, nullptr);
  psm2_mq_req* b = ep_->NewRequest(psm2_mq_req::Kind::kRecv, nullptr);
  EXPECT_NE(a, b);
  EXPECT_FALSE(a->freed);
}

}  // namespace
}  // namespace psmd::client
