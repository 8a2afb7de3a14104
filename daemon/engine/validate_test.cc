#include "daemon/engine/validate.h"

#include <gtest/gtest.h>

#include <iterator>
#include <set>
#include <string>

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

// Validates `d` as taken from the ring its op belongs on.
Rejection Check(const shm::SubmissionDesc& d) {
  return ValidateSubmission(d, shm::TraitsOf(d.op).ring, Bounds());
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
  EXPECT_EQ(Check(Send(8, 0)),
            Rejection::kNone);  // inline
  EXPECT_EQ(Check(Send(1000, kRegionOffset + 64)), Rejection::kNone);
  EXPECT_EQ(Check(Send(kRegionBytes - 64, kRegionOffset + 64)),
            Rejection::kNone);
  shm::SubmissionDesc r{};
  r.op = shm::SubmitOp::kRecv;
  r.peer = shm::kAnySlot;
  EXPECT_EQ(Check(r), Rejection::kNone);
  shm::SubmissionDesc c{};
  c.op = shm::SubmitOp::kCancel;
  EXPECT_EQ(Check(c), Rejection::kNone);
}

TEST(ValidateTest, RejectsUnknownOpcodesAndFlags) {
  shm::SubmissionDesc d{};
  d.op = static_cast<shm::SubmitOp>(200);
  EXPECT_EQ(Check(d), Rejection::kBadOpcode);
  d = Send(8, 0);
  d.flags = 0x80;
  EXPECT_EQ(Check(d), Rejection::kBadFlags);
}

TEST(ValidateTest, RejectsPeersOutsideTheConnectionTable) {
  shm::SubmissionDesc d = Send(8, 0);
  d.peer = 2;
  EXPECT_EQ(Check(d), Rejection::kBadPeer);
  d.peer = shm::kAnySlot;  // "any" is for receives only
  EXPECT_EQ(Check(d), Rejection::kBadPeer);
}

TEST(ValidateTest, RejectsPayloadsOutsideTheSendersRegion) {
  auto check = [](uint32_t len, uint64_t off) { return Check(Send(len, off)); };
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

TEST(ValidateTest, RejectsOpsOnTheWrongRing) {
  // A send on the control ring would escape the receiver's budget hold-back.
  EXPECT_EQ(ValidateSubmission(Send(8, 0), shm::Ring::kControl, Bounds()),
            Rejection::kWrongRing);
  shm::SubmissionDesc r{};
  r.op = shm::SubmitOp::kRecv;
  r.peer = shm::kAnySlot;
  EXPECT_EQ(ValidateSubmission(r, shm::Ring::kMessage, Bounds()),
            Rejection::kWrongRing);
}

TEST(ValidateTest, FailedSendsCarryNothing) {
  shm::SubmissionDesc d = Send(0, 0);
  d.flags = shm::kSendFailed;
  EXPECT_EQ(Check(d), Rejection::kNone);
  d.len = 8;
  EXPECT_EQ(Check(d), Rejection::kBadFlags);
}

TEST(ValidateTest, RendezvousChunksAlwaysUseThePool) {
  shm::SubmissionDesc d =
      shm::PrepRndvData(/*req=*/1, /*transfer=*/1, /*offset=*/0, /*len=*/8);
  d.body.rndv.pool_offset = 0;  // small, yet not inline
  EXPECT_EQ(Check(d), Rejection::kBadPoolOffset);
  d.body.rndv.pool_offset = kRegionOffset + 64;
  EXPECT_EQ(Check(d), Rejection::kNone);
  d.len = 0;
  EXPECT_EQ(Check(d), Rejection::kBadLength);
}

TEST(ValidateTest, ActiveMessagesStayWithinTheirLimits) {
  shm::SubmissionDesc d = shm::PrepActiveMessage(false, 1, 0, 3, 2, 4);
  EXPECT_EQ(Check(d), Rejection::kNone);  // 2 args + 4 bytes: 20, inline
  d.tag[0] = shm::kAmMaxHandlers;
  EXPECT_EQ(Check(d), Rejection::kBadLength);
  d = shm::PrepActiveMessage(false, 1, 0, 3, shm::kAmMaxArgs + 1, 0);
  EXPECT_EQ(Check(d), Rejection::kBadLength);
  d = shm::PrepActiveMessage(true, 12345, 0, 3, 0, shm::kAmMaxPayload + 1);
  EXPECT_EQ(Check(d), Rejection::kBadLength);
}

TEST(ValidateTest, EveryOpHasTraitsAndBuildersMatchThem) {
  for (uint8_t i = 1; i < shm::kSubmitOpCount; i++) {
    EXPECT_TRUE(shm::kOpTraits[i].valid) << "op " << int{i};
  }
  EXPECT_FALSE(shm::TraitsOf(static_cast<shm::SubmitOp>(200)).valid);
  const uint32_t tag[3] = {1, 2, 3}, sel[3] = {~0u, ~0u, ~0u};
  EXPECT_EQ(Check(shm::PrepSend(1, 7, tag, 8, false)), Rejection::kNone);
  EXPECT_EQ(Check(shm::PrepSend(1, 7, tag, 1 << 30, true)), Rejection::kNone);
  EXPECT_EQ(Check(shm::PrepRecv(shm::kAnySlot, 7, tag, sel, 64)),
            Rejection::kNone);
  EXPECT_EQ(Check(shm::PrepProbe(0, 7, tag, sel, true)), Rejection::kNone);
  EXPECT_EQ(Check(shm::PrepCancel(7, 8)), Rejection::kNone);
  EXPECT_EQ(Check(shm::PrepClaimedRecv(7, 64)), Rejection::kNone);
  EXPECT_EQ(Check(shm::PrepSetOption(
                7, shm::QueueOption::kUnexpectedBudgetBytes, 1 << 20)),
            Rejection::kNone);
  EXPECT_EQ(Check(shm::PrepAmAck(5, 7, 1, 0)), Rejection::kNone);
  EXPECT_TRUE(shm::TakesCredit(shm::PrepCancel(7, 8)));
  EXPECT_FALSE(shm::TakesCredit(shm::PrepRecv(0, 7, tag, sel, 64)));
  shm::SubmissionDesc am = shm::PrepActiveMessage(false, 1, 7, 3, 0, 0);
  EXPECT_FALSE(shm::TakesCredit(am));
  am.flags = shm::kAmWantsAck;
  EXPECT_TRUE(shm::TakesCredit(am));
}

// The rejections come from the enum's own list (PSMD_REJECTIONS), so a new
// one is covered without editing this test; their names differ, since an
// operator tells them apart by name.
TEST(ValidateTest, EveryRejectionHasItsOwnName) {
  std::set<std::string> names;
  for (Rejection r : kAllRejections) {
    EXPECT_STRNE(RejectionName(r), "unknown") << static_cast<int>(r);
    names.insert(RejectionName(r));
  }
  EXPECT_EQ(names.size(), std::size(kAllRejections));
  EXPECT_EQ(static_cast<size_t>(kAllRejections[std::size(kAllRejections) - 1]),
            std::size(kAllRejections) - 1);
  // The check can fail: a value outside the list has no name.
  EXPECT_STREQ(RejectionName(static_cast<Rejection>(std::size(kAllRejections))),
               "unknown");
}

}  // namespace
}  // namespace psmd
