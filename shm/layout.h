// Layout of an endpoint's shared-memory segment and of the per-job payload
// pool. Both are memfds created by the daemon, owned by the client's uid with
// mode 0600, sealed against resizing, and handed to the client over
// SCM_RIGHTS: they have no name, so nothing can be left in /dev/shm.
//
// Endpoint segment:
//   [0, 4 KiB)          SegmentHeader: written once by the daemon before the
//                       client maps it. The daemon never reads it back.
//   [4 KiB, 8 KiB)      Doorbells, SpinHints, then the RingControl of the two
//                       submission rings and of the completion ring, each word
//                       on its own line.
//   [8 KiB, ...)        message-submission slots (SubmissionDesc x
//   sq_capacity),
//                       control-submission slots (SubmissionDesc x
//                       sq_capacity), then completion slots (CompletionDesc x
//                       cq_capacity).
//
// Two submission rings: sends (which the daemon may hold back while their
// receiver's unexpected budget is full) and everything else (which it always
// drains); see SubmitOp in shm/descriptor.h.
//
// Job pool: `regions` send regions of `region_bytes` each; region i belongs
// to one endpoint of the job, which allocates its outgoing payloads there
// (shm/pool.h). Every endpoint of the job maps the whole pool read-write,
// because the receiver marks a payload chunk released after copying it.
#ifndef PSMD_SHM_LAYOUT_H_
#define PSMD_SHM_LAYOUT_H_

#include <atomic>
#include <cstdint>

#include "shm/descriptor.h"
#include "shm/ring.h"

namespace psmd::shm {

inline constexpr uint64_t kSegmentMagic = 0x31474553444d5350ull;  // "PSMDSEG1"
inline constexpr uint32_t kLayoutVersion =
    5;  // 5: buffers named for copies in place
inline constexpr uint64_t kPageSize = 4096;

struct SegmentHeader {
  uint64_t magic;
  uint32_t version;
  uint32_t endpoint_id;
  uint64_t epid;
  uint64_t segment_bytes;
  uint32_t sq_capacity;
  uint32_t cq_capacity;
  uint64_t msg_sq_offset;
  uint64_t ctl_sq_offset;
  uint64_t cq_offset;
  uint64_t pool_bytes;
  uint64_t region_offset;  // this endpoint's send region inside the pool
  uint64_t region_bytes;
  uint32_t inline_max;
  uint32_t reserved;
  uint64_t unexpected_budget;  // initial PSM2_MQ_MAX_SYSBUF_MBYTES, in bytes
  uint64_t max_unexpected_budget;  // the most a client may set
};
static_assert(sizeof(SegmentHeader) <= kPageSize);

// Wake-up words. Each is written by exactly one side.
struct Doorbells {
  // Daemon writes 1 before it sleeps, 0 when it wakes. A client that sees 1
  // after publishing a submission writes the endpoint's eventfd.
  alignas(kCacheLine) std::atomic<uint32_t> daemon_sleeping;
  // Client writes 1 before it sleeps on cq_futex, 0 after.
  alignas(kCacheLine) std::atomic<uint32_t> client_waiting;
  // Daemon increments after publishing completions and, when client_waiting
  // is 1, FUTEX_WAKEs it. The client FUTEX_WAITs on it.
  alignas(kCacheLine) std::atomic<uint32_t> cq_futex;
  // Daemon writes 1 while completions wait for space in a full completion
  // ring, 0 once they are in. A client that sees 1 after reaping rings the
  // doorbell: freeing ring space is then work for a sleeping daemon.
  alignas(kCacheLine) std::atomic<uint32_t> cq_space_wanted;
};
static_assert(sizeof(Doorbells) == 4 * kCacheLine);

// Where the pollers are (shm/spin.h). Each word is written by one side.
struct SpinHints {
  // Client: 1 + the CPU it last polled on while it waited for psmd, 0 while
  // it sleeps (and in a fresh segment). The daemon bounds-checks it.
  alignas(kCacheLine) std::atomic<uint32_t> client_cpu;
  // Client: 1 while its idle polls wait with submissions queued for ring
  // space, a credit or pool space (it has work the moment psmd makes
  // room), else 0. Beside client_cpu: same writer, and the worker reads
  // both only for a client on its own core.
  std::atomic<uint32_t> client_blocked;
  // Daemon: 1 while another poller (psmd's worker or another endpoint's
  // client) was last seen on client_cpu, so an idle poll should yield the
  // core; 0 when a pause costs less than the syscall.
  alignas(kCacheLine) std::atomic<uint32_t> core_shared;
};
static_assert(sizeof(SpinHints) == 2 * kCacheLine);

struct SegmentControl {
  Doorbells doorbells;
  SpinHints spin;
  RingControl msg_sq;  // message submissions: client produces, daemon consumes
  RingControl ctl_sq;  // control submissions: client produces, daemon consumes
  RingControl cq;      // completions: daemon produces, client consumes
};
static_assert(sizeof(SegmentControl) <= kPageSize);

inline constexpr uint64_t kControlOffset = kPageSize;
inline constexpr uint64_t kSlotsOffset = 2 * kPageSize;

struct SegmentGeometry {
  uint32_t sq_capacity;
  uint32_t cq_capacity;
  uint64_t msg_sq_offset;
  uint64_t ctl_sq_offset;
  uint64_t cq_offset;
  uint64_t bytes;  // rounded up to a page
};

inline SegmentGeometry ComputeGeometry(uint32_t sq_capacity,
                                       uint32_t cq_capacity) {
  SegmentGeometry g{};
  g.sq_capacity = sq_capacity;
  g.cq_capacity = cq_capacity;
  g.msg_sq_offset = kSlotsOffset;
  g.ctl_sq_offset =
      g.msg_sq_offset + uint64_t{sq_capacity} * sizeof(SubmissionDesc);
  g.cq_offset =
      g.ctl_sq_offset + uint64_t{sq_capacity} * sizeof(SubmissionDesc);
  uint64_t end = g.cq_offset + uint64_t{cq_capacity} * sizeof(CompletionDesc);
  g.bytes = (end + kPageSize - 1) / kPageSize * kPageSize;
  return g;
}

// Typed views of a mapped segment. Whoever builds them supplies geometry from
// its own records (the daemon from its config, the client from the header it
// checked once at attach time).
inline SegmentHeader* HeaderOf(void* base) {
  return static_cast<SegmentHeader*>(base);
}
inline SegmentControl* ControlOf(void* base) {
  return reinterpret_cast<SegmentControl*>(static_cast<uint8_t*>(base) +
                                           kControlOffset);
}
inline SubmissionDesc* MessageSlotsOf(void* base, const SegmentGeometry& g) {
  return reinterpret_cast<SubmissionDesc*>(static_cast<uint8_t*>(base) +
                                           g.msg_sq_offset);
}
inline SubmissionDesc* ControlSlotsOf(void* base, const SegmentGeometry& g) {
  return reinterpret_cast<SubmissionDesc*>(static_cast<uint8_t*>(base) +
                                           g.ctl_sq_offset);
}
inline CompletionDesc* CompletionSlotsOf(void* base, const SegmentGeometry& g) {
  return reinterpret_cast<CompletionDesc*>(static_cast<uint8_t*>(base) +
                                           g.cq_offset);
}

}  // namespace psmd::shm

#endif  // PSMD_SHM_LAYOUT_H_
