// Validation of submission descriptors. Everything a client writes into its
// submission ring is checked here, on the daemon's private copy, against
// bounds the daemon keeps in its own memory, before any of it is used.
//
// Thread-safety: pure functions.
#ifndef PSMD_DAEMON_ENGINE_VALIDATE_H_
#define PSMD_DAEMON_ENGINE_VALIDATE_H_

#include <cstdint>

#include "shm/descriptor.h"

namespace psmd {

// The part of the job pool an endpoint may send payloads from.
struct SendRegion {
  uint64_t offset = 0;
  uint64_t bytes = 0;
};

struct SubmissionBounds {
  uint32_t peer_slots = 0;  // connection slots [0, peer_slots) may be named
  SendRegion region;
};

// Every outcome of ValidateSubmission, kNone (0) first: one list, from
// which the enum and kAllRejections (for tests that cover each) follow.
#define PSMD_REJECTIONS(X) \
  X(kNone)                 \
  X(kBadOpcode)            \
  X(kWrongRing)            \
  X(kBadFlags)             \
  X(kBadPeer)              \
  X(kBadLength)            \
  X(kBadPoolOffset)

#define PSMD_REJECTION_ENUMERATOR(name) name,
enum class Rejection { PSMD_REJECTIONS(PSMD_REJECTION_ENUMERATOR) };
#undef PSMD_REJECTION_ENUMERATOR

#define PSMD_REJECTION_VALUE(name) Rejection::name,
inline constexpr Rejection kAllRejections[] = {
    PSMD_REJECTIONS(PSMD_REJECTION_VALUE)};
#undef PSMD_REJECTION_VALUE

// `ring` is the ring the descriptor was taken from; the op table
// (shm/descriptor.h) says which one each op must travel on.
Rejection ValidateSubmission(const shm::SubmissionDesc& d, shm::Ring ring,
                             const SubmissionBounds& bounds);

// A pool payload [off, off + len) inside region `r`, after a chunk header,
// chunk-aligned: what a descriptor's pool payload must be, and what a
// successor checks of every payload offset a handover (issue 33) hands it.
Rejection ValidatePoolRange(uint64_t off, uint32_t len, const SendRegion& r);

// A short, operator-readable name ("bad pool offset").
const char* RejectionName(Rejection r);

}  // namespace psmd

#endif  // PSMD_DAEMON_ENGINE_VALIDATE_H_
