#include "daemon/engine/validate.h"

#include "shm/pool.h"

namespace psmd {

namespace {

bool PeerInRange(uint32_t peer, const SubmissionBounds& b, bool any_allowed) {
  return peer < b.peer_slots || (any_allowed && peer == shm::kAnySlot);
}

// An active message: handler index, argument count and payload within the
// limits.
Rejection ValidateActiveMessage(const shm::SubmissionDesc& d) {
  uint32_t handler = d.tag[0], nargs = d.tag[1];
  if (handler >= shm::kAmMaxHandlers || nargs > shm::kAmMaxArgs)
    return Rejection::kBadLength;
  uint32_t arg_bytes = nargs * shm::kAmArgBytes;
  if (d.len < arg_bytes || d.len - arg_bytes > shm::kAmMaxPayload)
    return Rejection::kBadLength;
  return Rejection::kNone;
}

}  // namespace

// Written to avoid overflow: every quantity is bounded by region.bytes
// before it is added.
Rejection ValidatePoolRange(uint64_t off, uint32_t len, const SendRegion& r) {
  if (r.bytes < shm::kChunkHeaderBytes) return Rejection::kBadLength;
  if (len > r.bytes - shm::kChunkHeaderBytes) return Rejection::kBadLength;
  if (off < r.offset + shm::kChunkHeaderBytes ||
      off - r.offset > r.bytes - len || off % shm::kCacheLine != 0) {
    return Rejection::kBadPoolOffset;
  }
  return Rejection::kNone;
}

Rejection ValidateSubmission(const shm::SubmissionDesc& d, shm::Ring ring,
                             const SubmissionBounds& b) {
  // What the op table says (shm/descriptor.h) ...
  const shm::OpTraits& t = shm::TraitsOf(d.op);
  if (!t.valid) return Rejection::kBadOpcode;
  if (t.ring != ring) return Rejection::kWrongRing;
  if ((d.flags & ~t.allowed_flags) != 0) return Rejection::kBadFlags;
  if (t.peer == shm::PeerField::kSlot &&
      !PeerInRange(d.peer, b, /*any_allowed=*/false)) {
    return Rejection::kBadPeer;
  }
  if (t.peer == shm::PeerField::kSlotOrAny &&
      !PeerInRange(d.peer, b, /*any_allowed=*/true)) {
    return Rejection::kBadPeer;
  }
  // ... the rules of single ops ...
  Rejection r = Rejection::kNone;
  switch (d.op) {
    case shm::SubmitOp::kSend:
      // A failed send stands for a message that carries nothing.
      if ((d.flags & shm::kSendFailed) && d.len != 0) r = Rejection::kBadFlags;
      break;
    case shm::SubmitOp::kRndvData:
      if (d.len == 0) r = Rejection::kBadLength;
      break;
    case shm::SubmitOp::kAmRequest:
    case shm::SubmitOp::kAmReply:
      r = ValidateActiveMessage(d);
      break;
    default:
      break;
  }
  if (r != Rejection::kNone) return r;
  // ... and where the payload is.
  if (shm::PayloadInPool(d))
    return ValidatePoolRange(d.body.pool.pool_offset, d.len, b.region);
  return Rejection::kNone;
}

const char* RejectionName(Rejection r) {
  switch (r) {
    case Rejection::kNone:
      return "valid";
    case Rejection::kBadOpcode:
      return "unknown opcode";
    case Rejection::kBadFlags:
      return "unknown flags";
    case Rejection::kWrongRing:
      return "operation on the wrong submission ring";
    case Rejection::kBadPeer:
      return "peer slot not connected";
    case Rejection::kBadLength:
      return "length, handler index or argument count out of range";
    case Rejection::kBadPoolOffset:
      return "payload offset outside the sender's pool region";
  }
  return "unknown";
}

}  // namespace psmd
