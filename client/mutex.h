// The endpoint mutex, annotated for Clang's thread-safety analysis
// (base/thread_annotations.h; bazel build --config=thread-safety): members
// marked PSMD_GUARDED_BY(mu) may only be touched with the endpoint's mutex
// held, and functions marked PSMD_REQUIRES(mu) only be called so. The analysis
// checks every function body; GCC builds compile the annotations away.
//
// The mutex is recursive: an active-message handler, run from inside
// progress with the mutex held, may call back into the PSM2 API.
//
// It is a spinlock, as Intel's PSM2 uses for its progress lock, because every
// PSM2 call takes it and a polling application makes millions of calls: a
// pthread mutex costs a locked instruction to take and another to release
// (to learn whether a sleeper must be woken), and the release waits for the
// ring stores just made to reach the daemon's core. Here the release is a
// plain store. With ranks on CPUs 0 and 1 and psmd unpinned, the 8-byte
// message rate (bench/msg_rate) rose 5-9% (medians of two batches of
// alternated runs, docs/perf.md). A waiter pauses, then yields: the holder may
// be descheduled on a busy node, and nothing here sleeps with the lock held (a
// client that sleeps for completions releases it first).
//
// Thread-safety: any number of threads; recursive for the thread that holds
// it.
#ifndef PSMD_CLIENT_MUTEX_H_
#define PSMD_CLIENT_MUTEX_H_

#include <pthread.h>
#include <sched.h>

#include <atomic>
#include <cstdint>

#include "base/thread_annotations.h"
#include "shm/spin.h"

namespace psmd::client {

class PSMD_CAPABILITY("mutex") EndpointMutex {
 public:
  void Lock() PSMD_ACQUIRE() {
    const pthread_t me = pthread_self();
    // Only this thread ever stores `me` here, so seeing it means we hold it.
    if (owner_.load(std::memory_order_relaxed) == me) {
      depth_++;
      return;
    }
    // Acquire: what the previous holder wrote is visible to us.
    if (held_.exchange(1, std::memory_order_acquire) != 0) {
      waiters_.fetch_add(1, std::memory_order_relaxed);
      do {
        // Wait on a plain load, so that waiters do not bounce the line.
        for (uint32_t turn = 0; held_.load(std::memory_order_relaxed) != 0;) {
          if (++turn < kPausesBeforeYield) {
            shm::CpuRelax();
          } else {
            sched_yield();
          }
        }
      } while (held_.exchange(1, std::memory_order_acquire) != 0);
      waiters_.fetch_sub(1, std::memory_order_relaxed);
    }
    owner_.store(me, std::memory_order_relaxed);
    depth_ = 1;
  }
  void Unlock() PSMD_RELEASE() {
    if (--depth_ > 0) return;
    owner_.store(kNoOwner, std::memory_order_relaxed);
    // Release: our writes under the lock before the next holder's reads.
    held_.store(0, std::memory_order_release);
  }
  // Whether another thread waits for the lock: a holder that only polls
  // (psm2_mq_wait) gives it up now and then, else the waiter would wait for
  // the whole wait. A hint (relaxed): one poll late costs one poll.
  bool Contended() const {
    return waiters_.load(std::memory_order_relaxed) != 0;
  }

 private:
  static constexpr pthread_t kNoOwner = 0;  // no thread's pthread_self()
  static constexpr uint32_t kPausesBeforeYield = 64;

  std::atomic<uint32_t> held_{0};
  std::atomic<pthread_t> owner_{kNoOwner};
  std::atomic<uint32_t> waiters_{0};  // threads in Lock()'s slow path
  uint32_t depth_ = 0;                // touched only by the holder
};

// Holds an endpoint's mutex for a scope; Unlock/Lock let a waiting caller
// give it up in between (other application threads may use the endpoint).
class PSMD_SCOPED_CAPABILITY EndpointLock {
 public:
  explicit EndpointLock(EndpointMutex* mu) PSMD_ACQUIRE(mu) : mu_(mu) {
    mu_->Lock();
  }
  ~EndpointLock() PSMD_RELEASE() {
    if (held_) mu_->Unlock();
  }
  EndpointLock(const EndpointLock&) = delete;
  EndpointLock& operator=(const EndpointLock&) = delete;

  void Unlock() PSMD_RELEASE() {
    mu_->Unlock();
    held_ = false;
  }
  void Lock() PSMD_ACQUIRE() {
    mu_->Lock();
    held_ = true;
  }

 private:
  EndpointMutex* mu_;
  bool held_ = true;
};

}  // namespace psmd::client

#endif  // PSMD_CLIENT_MUTEX_H_
