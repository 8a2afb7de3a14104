// An endpoint segment as each side of the wire sees it: the daemon writes
// its header once (WriteSegmentHeader) and builds its ring ends
// (DaemonRingsOf); the client checks the header once at attach time
// (ReadSegmentHeader) and builds the opposite ends (ClientRingsOf). Both
// sides derive the geometry from shm/layout.h, so a segment can only be
// read the way it was written.
//
// Thread-safety: plain functions; the ring ends they return follow
// shm/ring.h (one producer thread, one consumer thread per ring).
#ifndef PSMD_SHM_SEGMENT_H_
#define PSMD_SHM_SEGMENT_H_

#include <cstdint>
#include <string>

#include "shm/descriptor.h"
#include "shm/layout.h"
#include "shm/ring.h"

namespace psmd::shm {

// What the header tells the client, besides the layout itself.
struct SegmentParams {
  uint32_t endpoint_id = 0;
  uint64_t epid = 0;
  SegmentGeometry geometry{};
  uint64_t pool_bytes = 0;
  uint64_t region_offset = 0;  // this endpoint's send region in the pool
  uint64_t region_bytes = 0;
  uint64_t unexpected_budget = 0;      // initial, in bytes
  uint64_t max_unexpected_budget = 0;  // the most the client may set
};

// Daemon: writes the header of a fresh segment, before the client can map
// it. The daemon never reads it back.
void WriteSegmentHeader(void* base, const SegmentParams& params);

// Client: copies the header out of a segment of `segment_bytes` mapped next
// to a pool of `pool_bytes` (both sizes from the daemon's reply) and checks
// it describes the layout this library was built for. Returns false with
// the reason otherwise (psmd and the library from different versions).
bool ReadSegmentHeader(const void* base, uint64_t segment_bytes,
                       uint64_t pool_bytes, SegmentParams* out,
                       std::string* why);

// The client's ends: it produces submissions and consumes completions.
struct ClientRings {
  SegmentControl* control = nullptr;
  RingProducer<SubmissionDesc> msg_sq;
  RingProducer<SubmissionDesc> ctl_sq;
  RingConsumer<CompletionDesc> cq;
};
ClientRings ClientRingsOf(void* base, const SegmentGeometry& g);

// The daemon's ends: it consumes submissions and produces completions.
struct DaemonRings {
  SegmentControl* control = nullptr;
  RingConsumer<SubmissionDesc> msg_sq;
  RingConsumer<SubmissionDesc> ctl_sq;
  RingProducer<CompletionDesc> cq;
};
// A successor process (a handover, issue 33) resumes each ring at the
// position its predecessor had reached (RingConsumer/RingProducer::position).
struct RingPositions {
  uint32_t msg_sq = 0;
  uint32_t ctl_sq = 0;
  uint32_t cq = 0;
};
DaemonRings DaemonRingsOf(void* base, const SegmentGeometry& g,
                          const RingPositions& at = {});

}  // namespace psmd::shm

#endif  // PSMD_SHM_SEGMENT_H_
