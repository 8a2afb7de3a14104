#include "shm/ring.h"

#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>
#include <thread>
#include <vector>

namespace psmd::shm {
namespace {

struct Item {
  uint64_t seq;
  uint64_t check;  // derived from seq, catches torn or stale slots
};

Item MakeItem(uint64_t seq) {
  return Item{seq, seq * 0x9e3779b97f4a7c15ull ^ 0xabcdef};
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

TEST(RingTest, FifoAcrossIndexWrapAround) {
  SharedRing r{};
  // Start both indices just below 2^32 to exercise unsigned wrap-around.
  const uint32_t start = 0xfffffff0u;
  r.control.head.value.store(start);
  r.control.tail.value.store(start);
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

TEST(RingTest, ConsumerDetectsScribbledTail) {
  SharedRing r{};
  RingConsumer<Item> c(&r.control, r.slots, 16);
  r.control.tail.value.store(1000);  // more than capacity ahead
  EXPECT_EQ(c.Available(), 0u);
  EXPECT_TRUE(c.corrupt());
  Item out;
  EXPECT_FALSE(c.TryPop(&out));
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
      if (c.corrupt()) return expected;
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
