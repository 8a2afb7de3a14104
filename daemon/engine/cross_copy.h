// The cross-memory copier: moves a rendezvous payload straight from the
// sending process's memory into the receiving process's buffer
// (process_vm_readv into a bounce buffer of this thread, then
// process_vm_writev), on a thread of its own, so that a transfer completes
// while both processes compute outside the library (issue 16). The progress
// worker hands it copies and collects their outcomes; it never blocks on one.
//
// Identity: every process is named by a pidfd taken from its attach socket
// (SO_PEERPIDFD), checked before each chunk is read and after it is
// written: a chunk is read only from, and written only to, the process that
// attached. docs/design.md ("Copying between processes") states the
// capability this needs (CAP_SYS_PTRACE) and the remaining window.
//
// Thread-safety: Submit, Cancel, TakeDone and done_pending may be called from
// any thread (the progress worker); the copy thread is internal.
//
// Invariants:
//   1. Copies of different jobs take turns chunk by chunk (one job's
//      64 MiB message delays another job's by at most a chunk per turn);
//      within a job, copies run in submission order.
//   2. Every submitted copy yields exactly one Done, unless cancelled.
//   3. Once Cancel(endpoint) returns, no byte is read from or written to
//      that endpoint's process by a copy submitted before the call.
//   4. A chunk is written only if, after it was read, neither side's
//      `removed` flag was set (checked with its pidfd, before the read,
//      after it and before the write).
#ifndef PSMD_DAEMON_ENGINE_CROSS_COPY_H_
#define PSMD_DAEMON_ENGINE_CROSS_COPY_H_

#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "base/mutex.h"

namespace psmd {

// A process a copy reads from or writes to.
struct CopySide {
  uint32_t endpoint_id;
  pid_t pid;
  int pidfd;  // owned by the endpoint, which outlives the copy (Cancel)
  uint64_t addr;
  // Set when the endpoint is removed, or null. An endpoint of another
  // engine shard than the copy's cannot Cancel it before it goes: a chunk
  // read from its process after this is set is not delivered (Done with
  // ESRCH), as after its process exited (invariant 4).
  const std::atomic<bool>* removed = nullptr;
};

class CrossCopier {
 public:
  struct Copy {
    uint64_t id;
    const void* group;  // copies of one group (a job) run in order
    CopySide from;
    CopySide to;
    uint64_t len;
  };
  struct Done {
    uint64_t id;
    uint64_t copied;  // bytes written to the receiver before it ended
    // 0, or the errno that ended it: EFAULT (a range that is not the
    // process's), ESRCH (a process ended), EPERM (no permission: nothing was
    // written, the caller may move the payload another way).
    int error;
    bool failed_reading;  // the error came from the sender's side
  };

  // `wake` runs on the copy thread after each Done is queued (the worker's
  // wake-up). `chunk_bytes`: the bounce buffer.
  CrossCopier(std::function<void()> wake, size_t chunk_bytes);
  ~CrossCopier();  // stops the thread; pending copies are dropped
  CrossCopier(const CrossCopier&) = delete;
  CrossCopier& operator=(const CrossCopier&) = delete;

  void Submit(const Copy& copy);
  // Drops every copy from or to endpoint `id` and waits for the chunk in
  // flight, if it is one of them (invariant 3). Returns the dropped ids.
  std::vector<uint64_t> Cancel(uint32_t endpoint_id);
  bool done_pending() const {
    return done_pending_.load(std::memory_order_acquire);
  }
  std::vector<Done> TakeDone();

  // Whether this process may read and write other users' processes
  // (CAP_SYS_PTRACE in its effective set).
  static bool Permitted();
  // The pidfd of the process at the other end of unix socket `fd`, or -1.
  static int PeerPidfd(int fd);
  // Copies the byte at `offset` from `from` to `to` on the calling thread,
  // as a copy's chunks are: 0 or an errno, *reading as in Done. A cheap
  // test of permission (EPERM) before a transfer is handed to the copier.
  static int CopyOneByte(const CopySide& from, const CopySide& to,
                         uint64_t offset, bool* reading);

 private:
  struct Active {
    Copy copy;
    uint64_t done = 0;
  };
  void Loop();
  // Copies one chunk of `a` (outside the lock); 0 or an errno.
  int CopyChunk(Active& a, bool* reading);

  // The queue of `group`, made at the back if it has none.
  std::deque<Active>& QueueOf(const void* group) PSMD_REQUIRES(mu_);

  const std::function<void()> wake_;
  // Not zeroed: its pages are touched only by the copies that move through
  // it (a shard that never copies, and the engine fuzz harness, which makes
  // thousands of copiers, pay nothing for its megabyte).
  const size_t bounce_bytes_;
  const std::unique_ptr<uint8_t[]> bounce_;
  Mutex mu_;
  CondVar cv_;  // work arrived, or the chunk in flight ended
  // One queue per group, taking turns (invariant 1).
  std::deque<std::deque<Active>> groups_ PSMD_GUARDED_BY(mu_);
  std::vector<Done> done_ PSMD_GUARDED_BY(mu_);
  // The copy whose chunk is being moved, out of its queue meanwhile, so
  // that Cancel can erase around it.
  Active flight_ PSMD_GUARDED_BY(mu_){};
  bool busy_ PSMD_GUARDED_BY(mu_) = false;
  bool stop_ PSMD_GUARDED_BY(mu_) = false;
  std::atomic<bool> done_pending_{false};
  std::once_flag started_;  // the thread, at the first Submit
  std::thread thread_;
};

}  // namespace psmd

#endif  // PSMD_DAEMON_ENGINE_CROSS_COPY_H_
