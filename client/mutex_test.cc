#include "client/mutex.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

namespace psmd::client {
namespace {

// Recursion, which Clang's analysis does not model (client/mutex.h).
void CountTakingItTwice(EndpointMutex* mu,
                        uint64_t* count) PSMD_NO_THREAD_SAFETY_ANALYSIS {
  EndpointLock outer(mu);
  EndpointLock inner(mu);
  ++*count;
}
void Lock(EndpointMutex* mu) PSMD_NO_THREAD_SAFETY_ANALYSIS { mu->Lock(); }
void Unlock(EndpointMutex* mu) PSMD_NO_THREAD_SAFETY_ANALYSIS { mu->Unlock(); }

// Counts under the lock from several threads, each taking it twice (as an
// AM handler calling back into the API does): no increment is lost.
TEST(EndpointMutexTest, ThreadsTakeTurnsAndNothingIsLost) {
  EndpointMutex mu;
  uint64_t count = 0;
  constexpr int kThreads = 4;
  constexpr int kRounds = 50000;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; t++) {
    threads.emplace_back([&] {
      for (int i = 0; i < kRounds; i++) CountTakingItTwice(&mu, &count);
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(count, uint64_t{kThreads} * kRounds);
}

// Held twice by one thread, the lock is free for another only after both
// releases.
TEST(EndpointMutexTest, ARecursiveHolderReleasesOnlyAtTheOutermostUnlock) {
  EndpointMutex mu;
  std::atomic<bool> entered{false};
  Lock(&mu);
  Lock(&mu);
  std::thread other([&] {
    EndpointLock lock(&mu);
    entered = true;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_FALSE(entered);
  Unlock(&mu);
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_FALSE(entered);
  Unlock(&mu);
  other.join();
  EXPECT_TRUE(entered);
}

// EndpointLock's Unlock/Lock (a waiter that sleeps for completions gives the
// lock up in between) lets another thread in.
TEST(EndpointMutexTest, AScopedLockGivenUpLetsAnotherThreadIn) {
  EndpointMutex mu;
  std::atomic<bool> entered{false};
  EndpointLock lock(&mu);
  std::thread other([&] {
    EndpointLock inner(&mu);
    entered = true;
  });
  lock.Unlock();
  other.join();
  lock.Lock();
  EXPECT_TRUE(entered);
}

// A thread that waits for the lock shows as contention to the holder (what
// psm2_mq_wait checks to give the lock up), and no longer once it has it.
TEST(EndpointMutexTest, AWaitingThreadShowsAsContention) {
  EndpointMutex mu;
  EXPECT_FALSE(mu.Contended());
  Lock(&mu);
  std::atomic<bool> entered{false};
  std::thread other([&] {
    EndpointLock lock(&mu);
    entered = true;
  });
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (!mu.Contended() && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::yield();
  }
  EXPECT_TRUE(mu.Contended());
  EXPECT_FALSE(entered);
  Unlock(&mu);
  other.join();
  EXPECT_TRUE(entered);
  EXPECT_FALSE(mu.Contended());
}

}  // namespace
}  // namespace psmd::client
