#include "shm/ring.h"

#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <thread>
#include <vector>

namespace psmd::shm {
namespace {

struct Item {
  uint16_t low;       // carried like any descriptor bytes
  uint16_t ring_seq;  // the ring's (shm/ring.h)
  uint32_t pad;
  uint64_t seq;
  uint64_t check;  // derived from seq, catches torn or stale slots
};

Item MakeItem(uint64_t seq) {
  return Item{static_cast<uint16_t>(seq), 0, 0, seq,
              seq * 0x9e3779b97f4a7c15ull ^ 0xabcdef};
}

// A ring's shared state laid out as it would be in a segment.
struct SharedRing {
  RingControl control;
  Item slots[1024];
};

TEST(RingTest, StartsEmptyWithFullCapacity) {
  SharedRing r{};
  RingProducer<Item> p(&r.control, r.slots, 1024);
  RingConsumer<Item> c(&r.control, r.slots, 1024);
  EXPECT_EQ(p.FreeSlots(), 1024u);
  EXPECT_EQ(c.Available(), 0u);
  Item out;
  EXPECT_FALSE(c.TryPop(&out));
  EXPECT_TRUE(p.Drained());
}

TEST(RingTest, FillsToCapacityThenRefuses) {
  SharedRing r{};
  RingProducer<Item> p(&r.control, r.slots, 8);
  RingConsumer<Item> c(&r.control, r.slots, 8);
  for (uint64_t i = 0; i < 8; i++) ASSERT_TRUE(p.TryPush(MakeItem(i)));
  EXPECT_FALSE(p.TryPush(MakeItem(8)));
  EXPECT_EQ(c.Available(), 8u);
  Item out;
  ASSERT_TRUE(c.TryPop(&out));
  EXPECT_EQ(out.seq, 0u);
  EXPECT_TRUE(p.TryPush(MakeItem(8)));
  EXPECT_FALSE(p.Drained());
}

TEST(RingTest, RescanSeesWhatWasPublishedPastTheCachedRun) {
  SharedRing r{};
  RingProducer<Item> p(&r.control, r.slots, 1024);
  RingConsumer<Item> c(&r.control, r.slots, 1024);
  for (uint64_t i = 0; i < 3; i++) ASSERT_TRUE(p.TryPush(MakeItem(i)));
  EXPECT_EQ(c.Available(), 3u);
  ASSERT_TRUE(p.TryPush(MakeItem(3)));
  EXPECT_EQ(c.Available(), 3u) << "the cached run, until it is consumed";
  EXPECT_EQ(c.Rescan(), 4u);
  EXPECT_EQ(c.Available(), 4u);
  // Up to the whole ring, past Available()'s scan of 64.
  for (uint64_t i = 4; i < 1024; i++) ASSERT_TRUE(p.TryPush(MakeItem(i)));
  EXPECT_EQ(c.Rescan(), 1024u);
  Item out;
  for (uint64_t i = 0; i < 1024; i++) {
    ASSERT_TRUE(c.TryPop(&out));
    ASSERT_EQ(out.seq, i);
  }
  EXPECT_EQ(c.Rescan(), 0u);
}

TEST(RingTest, FifoAcrossIndexWrapAround) {
  SharedRing r{};
  // Start both indices just below 2^32 to exercise unsigned wrap-around.
  const uint32_t start = 0xfffffff0u;
  r.control.head.value.store(start);
  RingProducer<Item> p(&r.control, r.slots, 16, start);
  RingConsumer<Item> c(&r.control, r.slots, 16, start);
  uint64_t next_out = 0;
  for (uint64_t i = 0; i < 100000; i++) {
    while (!p.TryPush(MakeItem(i))) {
      Item out;
      ASSERT_TRUE(c.TryPop(&out));
      ASSERT_EQ(out.seq, next_out++);
    }
  }
  Item batch[7];
  size_t n;
  while ((n = c.PopBatch(batch, 7)) > 0) {
    for (size_t k = 0; k < n; k++) ASSERT_EQ(batch[k].seq, next_out++);
  }
  EXPECT_EQ(next_out, 100000u);
}

TEST(RingTest, ASlotOfTheLastLapIsNotPublished) {
  SharedRing r{};
  RingProducer<Item> p(&r.control, r.slots, 4);
  RingConsumer<Item> c(&r.control, r.slots, 4);
  Item out;
  for (uint64_t i = 0; i < 4; i++) ASSERT_TRUE(p.TryPush(MakeItem(i)));
  for (uint64_t i = 0; i < 4; i++) ASSERT_TRUE(c.TryPop(&out));
  // Every slot still holds lap 0's descriptor: nothing is new.
  EXPECT_EQ(c.Available(), 0u);
  ASSERT_TRUE(p.TryPush(MakeItem(4)));
  EXPECT_EQ(c.Available(), 1u);
  ASSERT_TRUE(c.TryPop(&out));
  EXPECT_EQ(out.seq, 4u);
  EXPECT_EQ(out.low, 4u);  // the bytes beside the stamp travel too
  EXPECT_EQ(c.Available(), 0u);
}

TEST(RingTest, ScribbledSlotsOnlyPublishDescriptorsInOrder) {
  SharedRing r{};
  RingConsumer<Item> c(&r.control, r.slots, 16);
  // A hostile producer stamps slot 1 for lap 0 but not slot 0: nothing is
  // published until slot 0 is, and then the run of two.
  r.slots[1] = MakeItem(1);
  r.slots[1].ring_seq = 1;
  EXPECT_EQ(c.Available(), 0u);
  r.slots[0] = MakeItem(0);
  r.slots[0].ring_seq = 1;
  EXPECT_EQ(c.Available(), 2u);
  // Garbage everywhere: at most a ring's worth, never past the slots.
  for (uint32_t i = 0; i < 1024; i++) {
    std::memset(&r.slots[i], static_cast<int>(i * 37), sizeof(Item));
    r.slots[i].ring_seq = 1;
  }
  Item out[64];
  size_t taken = 0, n;
  while ((n = c.PopBatch(out, 64)) > 0 && taken < 1000) taken += n;
  EXPECT_LE(taken, 16u);
}

TEST(RingTest, ProducerDetectsScribbledHead) {
  SharedRing r{};
  RingProducer<Item> p(&r.control, r.slots, 4);
  for (uint64_t i = 0; i < 4; i++) ASSERT_TRUE(p.TryPush(MakeItem(i)));
  r.control.head.value.store(77);  // ahead of the producer's tail
  EXPECT_EQ(p.FreeSlots(), 0u);
  EXPECT_TRUE(p.corrupt());
  EXPECT_FALSE(p.TryPush(MakeItem(4)));
}

constexpr uint64_t kStressCount = 10'000'000;

// Producer and consumer loops shared by the thread and the process stress.
void ProduceAll(RingProducer<Item>& p) {
  for (uint64_t i = 0; i < kStressCount;) {
    if (p.TryPush(MakeItem(i))) {
      i++;
    } else {
      std::this_thread::yield();
    }
  }
}

// Returns the number of items received in order with intact contents.
uint64_t ConsumeAll(RingConsumer<Item>& c) {
  uint64_t expected = 0;
  Item batch[64];
  while (expected < kStressCount) {
    size_t n = c.PopBatch(batch, 64);
    if (n == 0) {
      std::this_thread::yield();
      continue;
    }
    for (size_t k = 0; k < n; k++) {
      Item want = MakeItem(expected);
      if (batch[k].seq != want.seq || batch[k].check != want.check)
        return expected;
      expected++;
    }
  }
  return expected;
}

TEST(RingStressTest, TwoThreadsTenMillionInOrder) {
  auto* r = new SharedRing{};
  RingProducer<Item> p(&r->control, r->slots, 1024);
  RingConsumer<Item> c(&r->control, r->slots, 1024);
  uint64_t received = 0;
  std::thread consumer([&] { received = ConsumeAll(c); });
  ProduceAll(p);
  consumer.join();
  EXPECT_EQ(received, kStressCount);
  EXPECT_TRUE(p.Drained());
  delete r;
}

TEST(RingStressTest, TwoProcessesTenMillionInOrder) {
  void* mem = mmap(nullptr, sizeof(SharedRing), PROT_READ | PROT_WRITE,
                   MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(mem, MAP_FAILED);
  auto* r = new (mem) SharedRing{};
  pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    RingConsumer<Item> c(&r->control, r->slots, 1024);
    _exit(ConsumeAll(c) == kStressCount ? 0 : 1);
  }
  RingProducer<Item> p(&r->control, r->slots, 1024);
  ProduceAll(p);
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0)
      << "consumer process saw loss, reorder or corruption";
  munmap(mem, sizeof(SharedRing));
}

}  // namespace
}  // namespace psmd::shm
