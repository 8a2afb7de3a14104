// Validation of submission descriptors. Everything a client writes into its
// submission ring is checked here, on the daemon's private copy, against
// bounds the daemon keeps in its own memory, before any of it is used.
//
// Thread-safety: pure functions.
#ifndef PSMD_DAEMON_VALIDATE_H_
#define PSMD_DAEMON_VALIDATE_H_

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

enum class Rejection {
  kNone = 0,
  kBadOpcode,
  kWrongRing,
  kBadFlags,
  kBadPeer,
  kBadLength,
  kBadPoolOffset,
};

// `ring` is the ring the descriptor was taken from; the op table
// (shm/descriptor.h) says which one each op must travel on.
Rejection ValidateSubmission(const shm::SubmissionDesc& d, shm::Ring ring,
                             const SubmissionBounds& bounds);

// A short, operator-readable name ("bad pool offset").
const char* RejectionName(Rejection r);

}  // namespace psmd

#endif  // PSMD_DAEMON_VALIDATE_H_
