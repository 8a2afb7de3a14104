// The endpoint mutex, annotated for Clang's thread-safety analysis
// (bazel build --config=thread-safety): members marked PSMD_GUARDED_BY(mu) may
// only be touched with the endpoint's mutex held, and functions marked
// PSMD_REQUIRES(mu) only be called so. The analysis checks every function body;
// GCC builds compile the annotations away.
//
// The mutex is recursive: an active-message handler, run from inside
// progress with the mutex held, may call back into the PSM2 API.
//
// Thread-safety: that of std::recursive_mutex.
#ifndef PSMD_CLIENT_MUTEX_H_
#define PSMD_CLIENT_MUTEX_H_

#include <mutex>

#if defined(__clang__)
#define PSMD_THREAD_ANNOTATION(x) __attribute__((x))
#else
#define PSMD_THREAD_ANNOTATION(x)
#endif

#define PSMD_CAPABILITY(x) PSMD_THREAD_ANNOTATION(capability(x))
#define PSMD_SCOPED_CAPABILITY PSMD_THREAD_ANNOTATION(scoped_lockable)
#define PSMD_GUARDED_BY(x) PSMD_THREAD_ANNOTATION(guarded_by(x))
#define PSMD_PT_GUARDED_BY(x) PSMD_THREAD_ANNOTATION(pt_guarded_by(x))
#define PSMD_REQUIRES(...) \
  PSMD_THREAD_ANNOTATION(requires_capability(__VA_ARGS__))
#define PSMD_ACQUIRE(...) \
  PSMD_THREAD_ANNOTATION(acquire_capability(__VA_ARGS__))
#define PSMD_RELEASE(...) \
  PSMD_THREAD_ANNOTATION(release_capability(__VA_ARGS__))
#define PSMD_NO_THREAD_SAFETY_ANALYSIS \
  PSMD_THREAD_ANNOTATION(no_thread_safety_analysis)

namespace psmd::client {

class PSMD_CAPABILITY("mutex") EndpointMutex {
 public:
  void Lock() PSMD_ACQUIRE() { m_.lock(); }
  void Unlock() PSMD_RELEASE() { m_.unlock(); }

 private:
  std::recursive_mutex m_;
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
