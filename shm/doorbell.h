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

#include "shm/layout.h"

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

// Clears an eventfd doorbell after the daemon woke up on it; returns how
// many times it was rung since the last drain (0 if it was not).
inline uint64_t DrainEventFd(int fd) {
  uint64_t value = 0;
  if (read(fd, &value, sizeof(value)) != sizeof(value)) return 0;
  return value;
}

// The wake-up protocol on a segment's Doorbells (docs/design.md, "Wake-up").
// A side about to sleep stores its flag, issues a full fence, and re-checks
// for work; the other side publishes work, issues a full fence, and reads the
// flag. Because both fences are full, at least one side sees the other's
// store: either the sleeper finds the work, or the publisher sees the flag
// and wakes it. No wake-up is lost, and no side pays for a syscall while the
// other is awake.
//
//   client publishes submissions   -> DaemonAsleep()        -> ring eventfd
//   daemon about to sleep          -> SetDaemonSleeping(1), WakeupFence(),
//                                     re-check every ring, epoll_wait
//   daemon publishes completions   -> WakeClientIfWaiting()
//   client about to sleep          -> ClientPrepareToSleep(), re-check the
//                                     completion ring, FutexWait, ClientAwake()
//   daemon's completions wait for ring space -> SetCqSpaceWanted(1), and the
//   client, after reaping, DaemonWantsCqSpace() -> ring eventfd

// The full fence both sides put between their own stores and reading the
// other side's flag (a store-load order, which release/acquire cannot give).
inline void WakeupFence() {
  std::atomic_thread_fence(std::memory_order_seq_cst);
}

// Client, after publishing submissions: must it ring the doorbell eventfd?
inline bool DaemonAsleep(const Doorbells& bells) {
  WakeupFence();
  return bells.daemon_sleeping.load(std::memory_order_relaxed) != 0;
}

// Client, after reaping completions: does the daemon wait for ring space
// (so that the space just freed is work for it)?
inline bool DaemonWantsCqSpace(const Doorbells& bells) {
  WakeupFence();
  return bells.cq_space_wanted.load(std::memory_order_relaxed) != 0;
}

// Client: announces that it is about to sleep and returns the futex value
// to sleep on; the caller then re-checks its completion ring.
inline uint32_t ClientPrepareToSleep(Doorbells& bells) {
  uint32_t seen = bells.cq_futex.load(std::memory_order_acquire);
  bells.client_waiting.store(1, std::memory_order_relaxed);
  WakeupFence();
  return seen;
}

inline void ClientAwake(Doorbells& bells) {
  bells.client_waiting.store(0, std::memory_order_relaxed);
}

// Daemon, after publishing completions: wakes the client if it sleeps.
inline void WakeClientIfWaiting(Doorbells& bells) {
  WakeupFence();
  if (bells.client_waiting.load(std::memory_order_relaxed) != 0) {
    bells.cq_futex.fetch_add(1, std::memory_order_release);
    FutexWakeAll(&bells.cq_futex);
  }
}

// Daemon: its sleeping flag (the caller fences once after setting it on
// every endpoint, then re-checks every ring).
inline void SetDaemonSleeping(Doorbells& bells, bool sleeping) {
  bells.daemon_sleeping.store(sleeping ? 1 : 0, std::memory_order_relaxed);
}

// Daemon: completions wait for space in the completion ring.
inline void SetCqSpaceWanted(Doorbells& bells, bool wanted) {
  bells.cq_space_wanted.store(wanted ? 1 : 0, std::memory_order_relaxed);
}

}  // namespace psmd::shm

#endif  // PSMD_SHM_DOORBELL_H_
