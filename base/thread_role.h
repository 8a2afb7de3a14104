// psmd::ThreadRole: a capability Clang's thread-safety analysis knows
// (base/thread_annotations.h) that is not a lock but a thread: state only
// one thread may touch is PSMD_GUARDED_BY its role, functions that run on
// it PSMD_REQUIRES it, and the analysis then rejects code elsewhere that
// reaches for them (a control thread touching the progress worker's engine,
// say), as it rejects touching a Mutex's state without the Mutex.
//
// Nothing acquires a role: the thread's start function says once that it
// plays it (Play), and setup that runs before that thread exists says so
// too (AssertHeld). Each holds the role, for the analysis, to the end of the
// function that says it; a function the analysis cannot follow into (a
// lambda handed to the thread through a queue) is PSMD_REQUIRES the role
// itself.
//
// Thread-safety: Play once, from the thread that plays the role; AssertHeld
// from it, or from any one thread while none plays it yet.
#ifndef PSMD_BASE_THREAD_ROLE_H_
#define PSMD_BASE_THREAD_ROLE_H_

#include <atomic>
#include <cassert>
#include <thread>

#include "base/thread_annotations.h"

namespace psmd {

class PSMD_CAPABILITY("thread role") ThreadRole {
 public:
  // The calling thread plays the role from now on. Builds with assertions
  // check that no other thread took it first.
  void Play() PSMD_ASSERT_CAPABILITY(this) {
    const std::thread::id none;
    std::thread::id expected = none;
    const bool first = player_.compare_exchange_strong(
        expected, std::this_thread::get_id(), std::memory_order_relaxed);
    assert(first || expected == std::this_thread::get_id());
    (void)first;
  }
  // The calling thread may touch what the role guards: it plays the role,
  // or no thread plays it yet (setup before the thread starts). Builds with
  // assertions check that.
  void AssertHeld() const PSMD_ASSERT_CAPABILITY(this) {
    assert(player_.load(std::memory_order_relaxed) == std::thread::id() ||
           player_.load(std::memory_order_relaxed) ==
               std::this_thread::get_id());
  }

 private:
  std::atomic<std::thread::id> player_{};
};

}  // namespace psmd

#endif  // PSMD_BASE_THREAD_ROLE_H_
