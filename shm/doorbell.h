// Futex and eventfd wrappers for the wake-up protocol (docs/design.md,
// "Wake-up"). Futexes here are process-shared (no FUTEX_PRIVATE_FLAG): the
// word lives in a MAP_SHARED segment and the kernel keys it by the backing
// file and offset, so the daemon and the client address the same futex.
#ifndef PSMD_SHM_DOORBELL_H_
#define PSMD_SHM_DOORBELL_H_

#include <linux/futex.h>
#include <sys/eventfd.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdint>

namespace psmd::shm {

// Sleeps while *word == expected, at most timeout_ns (<0: no limit).
// Returns on wake-up, value change, signal or timeout; callers re-check state.
inline void FutexWait(std::atomic<uint32_t>* word, uint32_t expected,
                      int64_t timeout_ns) {
  struct timespec ts;
  struct timespec* tsp = nullptr;
  if (timeout_ns >= 0) {
    ts.tv_sec = timeout_ns / 1000000000;
    ts.tv_nsec = timeout_ns % 1000000000;
    tsp = &ts;
  }
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAIT, expected,
          tsp, nullptr, 0);
}

inline void FutexWakeAll(std::atomic<uint32_t>* word) {
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAKE, INT32_MAX,
          nullptr, nullptr, 0);
}

// Rings an eventfd doorbell. EAGAIN (counter saturated) still means "rung".
inline void RingEventFd(int fd) {
  uint64_t one = 1;
  ssize_t r = write(fd, &one, sizeof(one));
  (void)r;
}

// Clears an eventfd doorbell after the daemon woke up on it.
inline void DrainEventFd(int fd) {
  uint64_t value;
  ssize_t r = read(fd, &value, sizeof(value));
  (void)r;
}

}  // namespace psmd::shm

#endif  // PSMD_SHM_DOORBELL_H_
