#include "shm/pool.h"

#include <gtest/gtest.h>

#include <vector>

namespace psmd::shm {
namespace {

class SendArenaTest : public ::testing::Test {
 protected:
  static constexpr uint64_t kRegionOffset = 4096;
  static constexpr uint64_t kRegionBytes = 4096;
  std::vector<uint8_t> pool_ =
      std::vector<uint8_t>(kRegionOffset + kRegionBytes + 4096);
  SendArena arena_{pool_.data(), kRegionOffset, kRegionBytes};
};

TEST_F(SendArenaTest, AllocatesInsideItsRegionAfterAHeader) {
  auto off = arena_.Allocate(100);
  ASSERT_TRUE(off.has_value());
  EXPECT_GE(*off, kRegionOffset + kChunkHeaderBytes);
  EXPECT_LE(*off + 100, kRegionOffset + kRegionBytes);
  EXPECT_EQ(ChunkOf(pool_.data(), *off)->state.load(), kChunkInUse);
}

TEST_F(SendArenaTest, RefusesWhenFullAndRecoversAfterRelease) {
  std::vector<uint64_t> offs;
  while (auto off = arena_.Allocate(448))
    offs.push_back(*off);  // 512-byte chunks
  EXPECT_EQ(offs.size(), kRegionBytes / 512);
  EXPECT_FALSE(arena_.Allocate(1).has_value());
  ReleaseChunk(pool_.data(), offs[0]);
  EXPECT_TRUE(arena_.Allocate(448).has_value());
}

TEST_F(SendArenaTest, ReclaimsOnlyInAllocationOrder) {
  auto a = arena_.Allocate(1000);
  auto b = arena_.Allocate(1000);
  ASSERT_TRUE(a && b);
  uint64_t used = arena_.used();
  ReleaseChunk(pool_.data(),
               *b);  // released out of order: a still holds the tail
  arena_.Reclaim();
  EXPECT_EQ(arena_.used(), used);
  ReleaseChunk(pool_.data(), *a);
  arena_.Reclaim();
  EXPECT_TRUE(arena_.empty());
}

TEST_F(SendArenaTest, WrapsWithPaddingAndNeverStraddlesTheEnd) {
  for (int round = 0; round < 100; round++) {
    auto off = arena_.Allocate(1500);
    ASSERT_TRUE(off.has_value()) << round;
    EXPECT_LE(*off + 1500, kRegionOffset + kRegionBytes);
    ReleaseChunk(pool_.data(), *off);
  }
}

TEST_F(SendArenaTest, RejectsPayloadLargerThanRegion) {
  EXPECT_FALSE(arena_.Allocate(kRegionBytes).has_value());
  EXPECT_EQ(arena_.MaxPayload(), kRegionBytes - kChunkHeaderBytes);
  EXPECT_TRUE(arena_.Allocate(arena_.MaxPayload()).has_value());
}

}  // namespace
}  // namespace psmd::shm
