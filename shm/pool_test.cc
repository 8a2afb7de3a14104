#include "shm/pool.h"

#include <gtest/gtest.h>

#include <chrono>
#include <random>
#include <string>
#include <thread>
#include <vector>

namespace psmd::shm {
namespace {

class SendArenaTest : public ::testing::Test {
 protected:
  static constexpr uint64_t kRegionOffset = 4096;
  static constexpr uint64_t kRegionBytes = 4096;
  std::vector<uint8_t> pool_ =
      std::vector<uint8_t>(kRegionOffset + kRegionBytes + 4096);
  // Stalled from the second refusal on (kPoolStallNs of waiting in use).
  SendArena arena_{pool_.data(), kRegionOffset, kRegionBytes, /*stall_ns=*/0};
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

// A handover (Save, then Adopt by an arena over the same region) changes
// nothing: random traffic with chunks set aside and lingering gives the
// same offsets, refusals and used bytes as an arena never handed over.
TEST_F(SendArenaTest, AStateAdoptedCarriesOnExactlyAsTheOneSaved) {
  std::vector<uint8_t> twin_pool(pool_.size());
  SendArena twin(twin_pool.data(), kRegionOffset, kRegionBytes, 0);
  std::mt19937 rng(7);
  std::vector<uint64_t> live;
  for (int step = 0; step < 4000; step++) {
    if (step % 97 == 0) {
      SendArena successor(pool_.data(), kRegionOffset, kRegionBytes, 0);
      std::string why;
      ASSERT_TRUE(successor.Adopt(arena_.Save(), &why)) << why;
      arena_ = std::move(successor);
    }
    if (!live.empty() && rng() % 3 == 0) {
      const size_t i = rng() % live.size();
      ReleaseChunk(pool_.data(), live[i]);
      ReleaseChunk(twin_pool.data(), live[i]);
      live.erase(live.begin() + static_cast<long>(i));
      continue;
    }
    const uint64_t bytes = 1 + rng() % 900;
    const ChunkUse use = rng() % 2 ? ChunkUse::kBrief : ChunkUse::kMayLinger;
    auto a = arena_.Allocate(bytes, use);
    auto b = twin.Allocate(bytes, use);
    ASSERT_EQ(a.has_value(), b.has_value()) << step;
    if (a) {
      ASSERT_EQ(*a, *b) << step;
      live.push_back(*a);
    }
    ASSERT_EQ(arena_.used(), twin.used()) << step;
  }
}

TEST_F(SendArenaTest, AForgedStateIsRefusedAndChangesNothing) {
  auto a = arena_.Allocate(1000);
  auto b = arena_.Allocate(200);
  ASSERT_TRUE(a && b);
  const SendArena::State good = arena_.Save();
  std::vector<SendArena::State> bad(8, good);
  bad[0].head = good.tail - 1;                  // reversed
  bad[1].head = good.tail + kRegionBytes + 64;  // more than a region
  bad[2].ring[0].bytes += 1;                    // not whole lines
  bad[3].ring.pop_back();                       // does not reach the head
  bad[4].set_aside.push_back({*a - kRegionOffset, 64, false, false});
  bad[5].set_aside.push_back({kRegionBytes - 64, 128, false, false});
  bad[6].set_aside = {{3000, 128, false, false}, {3064, 64, false, false}};
  bad[7].ring[0].is_padding = bad[7].ring[0].lingers = true;
  for (size_t i = 0; i < bad.size(); i++) {
    SendArena other(pool_.data(), kRegionOffset, kRegionBytes, 0);
    std::string why;
    EXPECT_FALSE(other.Adopt(bad[i], &why)) << i;
    EXPECT_NE(why.find("inbox arena"), std::string::npos) << why;
    EXPECT_TRUE(other.empty()) << i;
  }
  SendArena other(pool_.data(), kRegionOffset, kRegionBytes, 0);
  std::string why;
  ASSERT_TRUE(other.Adopt(good, &why)) << why;
  EXPECT_EQ(other.used(), arena_.used());
}

TEST_F(SendArenaTest, WrapsWithPaddingAndNeverStraddlesTheEnd) {
  // One chunk always live, so that the ring never empties (and rewinds).
  auto live = arena_.Allocate(1500);
  ASSERT_TRUE(live.has_value());
  bool wrapped = false;
  for (int round = 0; round < 100; round++) {
    auto off = arena_.Allocate(1500);
    ASSERT_TRUE(off.has_value()) << round;
    EXPECT_LE(*off + 1500, kRegionOffset + kRegionBytes);
    wrapped |= *off < *live;
    ReleaseChunk(pool_.data(), *live);
    live = off;
  }
  EXPECT_TRUE(wrapped);
}

TEST_F(SendArenaTest, AnEmptiedRingStartsOverAtTheRegionStart) {
  // A ping-pong: each payload released before the next is allocated. Every
  // one reuses the region's first bytes instead of walking the region.
  auto first = arena_.Allocate(700);
  ASSERT_TRUE(first.has_value());
  EXPECT_EQ(*first, kRegionOffset + kChunkHeaderBytes);
  ReleaseChunk(pool_.data(), *first);
  for (int round = 0; round < 20; round++) {
    auto off = arena_.Allocate(700);
    ASSERT_TRUE(off.has_value()) << round;
    EXPECT_EQ(*off, *first) << round;
    ReleaseChunk(pool_.data(), *off);
  }
  // Not while a chunk is live: the next goes after it.
  auto held = arena_.Allocate(700);
  auto next = arena_.Allocate(700);
  ASSERT_TRUE(held && next);
  EXPECT_EQ(*held, *first);
  EXPECT_GT(*next, *held);
}

TEST_F(SendArenaTest, RejectsPayloadLargerThanRegion) {
  EXPECT_FALSE(arena_.Allocate(kRegionBytes).has_value());
  EXPECT_EQ(arena_.MaxPayload(), kRegionBytes - kChunkHeaderBytes);
  EXPECT_TRUE(arena_.Allocate(arena_.MaxPayload()).has_value());
}

TEST_F(SendArenaTest, AChunkNeverReleasedIsSetAsideOnlyWhenAsked) {
  // An unexpected message the receiver takes last, then laps of traffic
  // that drains.
  auto pinned = arena_.Allocate(100);
  ASSERT_TRUE(pinned.has_value());
  const uint64_t pinned_begin = *pinned - kChunkHeaderBytes;
  const uint64_t pinned_end = pinned_begin + SendArena::Footprint(100);
  int refused = 0;
  for (int round = 0; round < 200; round++) {
    auto off = arena_.Allocate(700);
    if (!off) {
      // The ring came round to the pinned chunk: plain back-pressure,
      // until the region has refused long enough and sets it aside.
      refused++;
      off = arena_.Allocate(700);
    }
    ASSERT_TRUE(off.has_value()) << round;
    const uint64_t begin = *off - kChunkHeaderBytes;
    EXPECT_TRUE(begin + SendArena::Footprint(700) <= pinned_begin ||
                begin >= pinned_end)
        << "round " << round << " overlaps the pinned chunk";
    ReleaseChunk(pool_.data(), *off);
  }
  EXPECT_EQ(refused, 1);  // once set aside, the head skips it
  EXPECT_EQ(ChunkOf(pool_.data(), *pinned)->state.load(), kChunkInUse);
  ReleaseChunk(pool_.data(), *pinned);
  // Released, its bytes are usable again: the whole region fits.
  EXPECT_TRUE(arena_.Allocate(arena_.MaxPayload()).has_value());
}

TEST_F(SendArenaTest, RefusesWhenEveryChunkIsHeld) {
  std::vector<uint64_t> offs;
  while (auto off = arena_.Allocate(448)) offs.push_back(*off);
  EXPECT_EQ(offs.size(), kRegionBytes / 512);
  // Refused, then (stalled) all set aside, none free.
  EXPECT_FALSE(arena_.Allocate(1).has_value());
  EXPECT_FALSE(arena_.Allocate(1).has_value());
  ReleaseChunk(pool_.data(), offs[5]);  // one in the middle
  auto again = arena_.Allocate(448);
  ASSERT_TRUE(again.has_value());
  EXPECT_EQ(*again, offs[5]);
  EXPECT_FALSE(arena_.Allocate(1).has_value());
  for (uint64_t off : offs) ReleaseChunk(pool_.data(), off);
  ReleaseChunk(pool_.data(), *again);
  EXPECT_TRUE(arena_.Allocate(arena_.MaxPayload()).has_value());
}

TEST_F(SendArenaTest, LingeringChunksTakeHalfAndBriefOnesTheRest) {
  std::vector<uint64_t> lingering;
  while (auto off = arena_.Allocate(448, ChunkUse::kMayLinger))
    lingering.push_back(*off);
  EXPECT_EQ(lingering.size(), kRegionBytes / 2 / 512);
  EXPECT_TRUE(arena_.ShareFull(448));
  // The region is not full: brief chunks still fit.
  std::vector<uint64_t> brief;
  while (auto off = arena_.Allocate(448)) brief.push_back(*off);
  EXPECT_EQ(brief.size(), kRegionBytes / 2 / 512);
  // Brief chunks come and go while every lingering one stays.
  for (int round = 0; round < 20; round++) {
    ReleaseChunk(pool_.data(), brief[round % brief.size()]);
    auto off = arena_.Allocate(448);
    ASSERT_TRUE(off.has_value()) << round;
    brief[round % brief.size()] = *off;
  }
  // A payload with nowhere else to go may pass the share.
  ReleaseChunk(pool_.data(), brief[0]);
  EXPECT_FALSE(arena_.Allocate(448, ChunkUse::kMayLinger).has_value());
  EXPECT_TRUE(arena_.Allocate(448, ChunkUse::kMayLingerPastShare).has_value());
}

TEST(SendArenaStallTest, AShareRefusedForStallNsStallsTheRegion) {
  std::vector<uint8_t> pool(8192);
  SendArena arena(pool.data(), 0, 4096, /*stall_ns=*/1'000'000);
  std::vector<uint64_t> lingering;
  while (auto off = arena.Allocate(448, ChunkUse::kMayLinger))
    lingering.push_back(*off);
  EXPECT_FALSE(arena.Stalled());  // refused just now
  // Brief chunks succeeding meanwhile do not restart the share's clock.
  auto brief = arena.Allocate(448);
  ASSERT_TRUE(brief.has_value());
  std::this_thread::sleep_for(std::chrono::milliseconds(2));
  EXPECT_FALSE(arena.Allocate(448, ChunkUse::kMayLinger).has_value());
  EXPECT_TRUE(arena.Stalled());
  // Room again for a lingering payload: not stalled any more.
  ReleaseChunk(pool.data(), lingering[0]);
  EXPECT_TRUE(arena.Allocate(448, ChunkUse::kMayLinger).has_value());
  EXPECT_FALSE(arena.Stalled());
}

TEST_F(SendArenaTest, TheShareComesBackAsLingeringChunksAreReleased) {
  std::vector<uint64_t> lingering;
  while (auto off = arena_.Allocate(448, ChunkUse::kMayLinger))
    lingering.push_back(*off);
  // Brief traffic wraps the ring: the lingering chunks are set aside (this
  // region stalls at its second refusal) before they are released.
  for (int round = 0; round < 40; round++) {
    auto off = arena_.Allocate(448);
    if (!off) off = arena_.Allocate(448);
    ASSERT_TRUE(off.has_value()) << round;
    ReleaseChunk(pool_.data(), *off);
  }
  for (uint64_t off : lingering) ReleaseChunk(pool_.data(), off);
  EXPECT_FALSE(arena_.ShareFull(448));
  for (size_t i = 0; i < lingering.size(); i++) {
    EXPECT_TRUE(arena_.Allocate(448, ChunkUse::kMayLinger).has_value()) << i;
  }
}

// Random traffic in which some chunks stay unreleased for long, in a region
// that sets chunks aside from its second refusal: live chunks never overlap,
// never leave the region, and once everything is released the whole region is
// allocatable again.
TEST_F(SendArenaTest, RandomTrafficKeepsLiveChunksApart) {
  std::mt19937 rng(7);
  struct Live {
    uint64_t off, bytes;
    int ttl;
  };
  std::vector<Live> live;
  int allocated = 0;
  for (int step = 0; step < 20000; step++) {
    const uint64_t bytes = 1 + rng() % 900;
    if (auto off = arena_.Allocate(bytes)) {
      allocated++;
      const uint64_t begin = *off - kChunkHeaderBytes;
      const uint64_t end = begin + SendArena::Footprint(bytes);
      ASSERT_GE(begin, kRegionOffset);
      ASSERT_LE(end, kRegionOffset + kRegionBytes);
      for (const Live& l : live) {
        const uint64_t lb = l.off - kChunkHeaderBytes;
        ASSERT_TRUE(end <= lb || begin >= lb + SendArena::Footprint(l.bytes))
            << "step " << step;
      }
      // Most chunks drain soon; one in 200 stays for 300 steps.
      live.push_back({*off, bytes, rng() % 200 == 0 ? 300 : int(rng() % 8)});
    }
    for (size_t i = 0; i < live.size();) {
      if (--live[i].ttl <= 0) {
        ReleaseChunk(pool_.data(), live[i].off);
        live[i] = live.back();
        live.pop_back();
      } else {
        i++;
      }
    }
  }
  EXPECT_GT(allocated, 15000);
  for (const Live& l : live) ReleaseChunk(pool_.data(), l.off);
  EXPECT_TRUE(arena_.Allocate(arena_.MaxPayload()).has_value());
}

TEST(SendArenaLargeTest, ARendezvousSizedChunkDoesNotRewind) {
  // Past 64 KiB a chunk written where its predecessor was just read would
  // take every line back from the reader's cache: large chunks walk on.
  constexpr uint64_t kRegion = 1 << 20;
  std::vector<uint8_t> pool(kRegion + 4096);
  SendArena arena(pool.data(), 4096, kRegion);
  auto big = arena.Allocate(100 << 10);
  ASSERT_TRUE(big.has_value());
  ReleaseChunk(pool.data(), *big);
  auto next = arena.Allocate(100 << 10);
  ASSERT_TRUE(next.has_value());
  EXPECT_GT(*next, *big);
  ReleaseChunk(pool.data(), *next);
  auto small = arena.Allocate(1000);  // an eager payload: back to the start
  ASSERT_TRUE(small.has_value());
  EXPECT_EQ(*small, *big);
}

TEST(SendArenaLargeTest, ManyChunksSetAsideCostABoundedEffortPerCall) {
  constexpr uint64_t kRegion = 1 << 20, kChunks = kRegion / 128;
  std::vector<uint8_t> pool(kRegion + 4096);
  SendArena arena(pool.data(), 4096, kRegion, /*stall_ns=*/0);
  std::vector<uint64_t> offs;
  for (uint64_t i = 0; i < kChunks; i++) {
    auto off = arena.Allocate(1);  // 128 bytes with its header
    ASSERT_TRUE(off.has_value()) << i;
    offs.push_back(*off);
  }
  // The first half stays unreceived; the second half drains.
  for (uint64_t i = kChunks / 2; i < kChunks; i++)
    ReleaseChunk(pool.data(), offs[i]);
  int calls = 2;
  EXPECT_FALSE(arena.Allocate(1000).has_value());  // refused: stalled now
  auto off = arena.Allocate(1000);
  EXPECT_FALSE(off.has_value());  // 4096 chunks to set aside: not in one go
  while (!off && calls < 100) {
    off = arena.Allocate(1000);
    calls++;
  }
  ASSERT_TRUE(off.has_value());
  EXPECT_GE(*off, offs[kChunks / 2]);  // in the drained half
  EXPECT_LT(calls, 100);
}

}  // namespace
}  // namespace psmd::shm
