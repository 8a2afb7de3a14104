#include "daemon/validate.h"

#include <gtest/gtest.h>

#include "shm/pool.h"

namespace psmd {
namespace {

constexpr uint64_t kRegionOffset = 1 << 20;
constexpr uint64_t kRegionBytes = 1 << 20;

SubmissionBounds Bounds() {
  SubmissionBounds b;
  b.peer_slots = 2;
  b.region = SendRegion{kRegionOffset, kRegionBytes};
  return b;
}

shm::SubmissionDesc Send(uint32_t len, uint64_t offset) {
  shm::SubmissionDesc d{};
  d.op = shm::SubmitOp::kSend;
  d.peer = 1;
  d.len = len;
  d.body.pool.pool_offset = offset;
  return d;
}

TEST(ValidateTest, AcceptsWellFormedDescriptors) {
  EXPECT_EQ(ValidateSubmission(Send(8, 0), Bounds()),
            Rejection::kNone);  // inline
  EXPECT_EQ(ValidateSubmission(Send(1000, kRegionOffset + 64), Bounds()),
            Rejection::kNone);
  EXPECT_EQ(
      ValidateSubmission(Send(kRegionBytes - 64, kRegionOffset + 64), Bounds()),
      Rejection::kNone);
  shm::SubmissionDesc r{};
  r.op = shm::SubmitOp::kRecv;
  r.peer = shm::kAnySlot;
  EXPECT_EQ(ValidateSubmission(r, Bounds()), Rejection::kNone);
  shm::SubmissionDesc c{};
  c.op = shm::SubmitOp::kCancel;
  EXPECT_EQ(ValidateSubmission(c, Bounds()), Rejection::kNone);
}

TEST(ValidateTest, RejectsUnknownOpcodesAndFlags) {
  shm::SubmissionDesc d{};
  d.op = static_cast<shm::SubmitOp>(200);
  EXPECT_EQ(ValidateSubmission(d, Bounds()), Rejection::kBadOpcode);
  d = Send(8, 0);
  d.flags = 0x80;
  EXPECT_EQ(ValidateSubmission(d, Bounds()), Rejection::kBadFlags);
}

TEST(ValidateTest, RejectsPeersOutsideTheConnectionTable) {
  shm::SubmissionDesc d = Send(8, 0);
  d.peer = 2;
  EXPECT_EQ(ValidateSubmission(d, Bounds()), Rejection::kBadPeer);
  d.peer = shm::kAnySlot;  // "any" is for receives only
  EXPECT_EQ(ValidateSubmission(d, Bounds()), Rejection::kBadPeer);
}

TEST(ValidateTest, RejectsPayloadsOutsideTheSendersRegion) {
  auto check = [](uint32_t len, uint64_t off) {
    return ValidateSubmission(Send(len, off), Bounds());
  };
  EXPECT_EQ(check(1000, kRegionOffset),
            Rejection::kBadPoolOffset);  // no room for header
  EXPECT_EQ(check(1000, kRegionOffset - 4096),
            Rejection::kBadPoolOffset);  // before region
  EXPECT_EQ(check(1000, kRegionOffset + kRegionBytes - 512),
            Rejection::kBadPoolOffset);  // past end
  EXPECT_EQ(check(1000, kRegionOffset + 100),
            Rejection::kBadPoolOffset);  // misaligned
  EXPECT_EQ(check(1000, ~uint64_t{0} - 63),
            Rejection::kBadPoolOffset);  // would overflow
  EXPECT_EQ(check(kRegionBytes, kRegionOffset + 64), Rejection::kBadLength);
  EXPECT_EQ(check(0xffffffffu, kRegionOffset + 64), Rejection::kBadLength);
}

TEST(ValidateTest, EveryRejectionHasAName) {
  for (Rejection r : {Rejection::kNone, Rejection::kBadOpcode,
                      Rejection::kBadFlags, Rejection::kBadPeer,
                      Rejection::kBadLength, Rejection::kBadPoolOffset}) {
    EXPECT_STRNE(RejectionName(r), "unknown");
  }
}

}  // namespace
}  // namespace psmd
