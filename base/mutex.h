// psmd::Mutex: std::mutex as a capability Clang's thread-safety analysis
// knows (base/thread_annotations.h); MutexLock, which holds one for a
// scope; CondVar, a condition variable waited on with the Mutex held. The
// daemon's locks are these, so that what each guards is written on the member
// (PSMD_GUARDED_BY) and checked by the compiler rather than said in a comment.
// (The client's endpoint lock is a spinlock of its own, client/mutex.h, with
// the same annotations.)
//
// Thread-safety: a mutex.
#ifndef PSMD_BASE_MUTEX_H_
#define PSMD_BASE_MUTEX_H_

#include <chrono>
#include <condition_variable>
#include <mutex>

#include "base/thread_annotations.h"

namespace psmd {

class PSMD_CAPABILITY("mutex") Mutex {
 public:
  void Lock() PSMD_ACQUIRE() { mu_.lock(); }
  void Unlock() PSMD_RELEASE() { mu_.unlock(); }

 private:
  friend class CondVar;
  std::mutex mu_;
};

class PSMD_SCOPED_CAPABILITY MutexLock {
 public:
  explicit MutexLock(Mutex* mu) PSMD_ACQUIRE(mu) : mu_(mu) { mu_->Lock(); }
  ~MutexLock() PSMD_RELEASE() { mu_->Unlock(); }
  MutexLock(const MutexLock&) = delete;
  MutexLock& operator=(const MutexLock&) = delete;

 private:
  Mutex* const mu_;
};

class CondVar {
 public:
  // Releases `mu` while it waits and holds it again on return; as any
  // condition variable, it may return without a notification, so callers
  // wait in a loop on their condition (which the analysis then checks is
  // read under `mu`).
  void Wait(Mutex* mu) PSMD_REQUIRES(mu) {
    std::unique_lock<std::mutex> lock(mu->mu_, std::adopt_lock);
    cv_.wait(lock);
    lock.release();  // still held, by the caller's MutexLock
  }
  // The same, returning by `deadline` at the latest (false: it passed).
  bool WaitUntil(Mutex* mu, std::chrono::steady_clock::time_point deadline)
      PSMD_REQUIRES(mu) {
    std::unique_lock<std::mutex> lock(mu->mu_, std::adopt_lock);
    const bool woken =
        cv_.wait_until(lock, deadline) == std::cv_status::no_timeout;
    lock.release();
    return woken;
  }
  void NotifyAll() { cv_.notify_all(); }

 private:
  std::condition_variable cv_;
};

}  // namespace psmd

#endif  // PSMD_BASE_MUTEX_H_
