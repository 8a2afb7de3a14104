#include "daemon/validate.h"

#include "shm/pool.h"

namespace psmd {

namespace {

bool PeerInRange(uint32_t peer, const SubmissionBounds& b, bool any_allowed) {
  return peer < b.peer_slots || (any_allowed && peer == shm::kAnySlot);
}

// A pool payload [off, off + len) must lie inside the sender's own region,
// after a chunk header, chunk-aligned. Written to avoid overflow: every
// quantity is bounded by region.bytes before it is added.
Rejection ValidatePoolRange(uint64_t off, uint32_t len, const SendRegion& r) {
  if (len > r.bytes - shm::kChunkHeaderBytes) return Rejection::kBadLength;
  if (off < r.offset + shm::kChunkHeaderBytes ||
      off - r.offset > r.bytes - len || off % shm::kCacheLine != 0) {
    return Rejection::kBadPoolOffset;
  }
  return Rejection::kNone;
}

Rejection ValidateSend(const shm::SubmissionDesc& d,
                       const SubmissionBounds& b) {
  if ((d.flags & ~(shm::kSendSync | shm::kSendFailed)) != 0)
    return Rejection::kBadFlags;
  if (!PeerInRange(d.peer, b, /*any_allowed=*/false))
    return Rejection::kBadPeer;
  if ((d.flags & shm::kSendFailed) &&
      (d.len != 0 || d.op != shm::SubmitOp::kSend)) {
    return Rejection::kBadFlags;
  }
  if (d.len <= shm::kInlineMax) return Rejection::kNone;
  return ValidatePoolRange(d.body.pool.pool_offset, d.len, b.region);
}

Rejection ValidateMatching(const shm::SubmissionDesc& d,
                           const SubmissionBounds& b, uint8_t allowed_flags) {
  if ((d.flags & ~allowed_flags) != 0) return Rejection::kBadFlags;
  if (!PeerInRange(d.peer, b, /*any_allowed=*/true)) return Rejection::kBadPeer;
  return Rejection::kNone;
}

// An active message: handler index, argument count and payload within the
// limits, and its bytes inline or inside the sender's region.
Rejection ValidateActiveMessage(const shm::SubmissionDesc& d,
                                const SubmissionBounds& b) {
  uint32_t handler = d.tag[0], nargs = d.tag[1];
  if (handler >= shm::kAmMaxHandlers || nargs > shm::kAmMaxArgs)
    return Rejection::kBadLength;
  uint32_t arg_bytes = nargs * shm::kAmArgBytes;
  if (d.len < arg_bytes || d.len - arg_bytes > shm::kAmMaxPayload)
    return Rejection::kBadLength;
  if (d.len <= shm::kInlineMax) return Rejection::kNone;
  return ValidatePoolRange(d.body.pool.pool_offset, d.len, b.region);
}

}  // namespace

Rejection ValidateSubmission(const shm::SubmissionDesc& d,
                             const SubmissionBounds& b) {
  switch (d.op) {
    case shm::SubmitOp::kSend:
      return ValidateSend(d, b);
    case shm::SubmitOp::kRndvSend:
      if (d.flags != 0) return Rejection::kBadFlags;
      if (!PeerInRange(d.peer, b, /*any_allowed=*/false))
        return Rejection::kBadPeer;
      return Rejection::kNone;
    case shm::SubmitOp::kRecv:
      return ValidateMatching(d, b, 0);
    case shm::SubmitOp::kProbe:
      return ValidateMatching(d, b, shm::kProbeRemove);
    case shm::SubmitOp::kRndvData:
      if (d.flags != 0) return Rejection::kBadFlags;
      if (d.len == 0) return Rejection::kBadLength;
      return ValidatePoolRange(d.body.rndv.pool_offset, d.len, b.region);
    case shm::SubmitOp::kAmRequest:
      if ((d.flags & ~(shm::kAmNoReply | shm::kAmWantsAck)) != 0)
        return Rejection::kBadFlags;
      if (!PeerInRange(d.peer, b, /*any_allowed=*/false))
        return Rejection::kBadPeer;
      return ValidateActiveMessage(d, b);
    case shm::SubmitOp::kAmReply:
      if ((d.flags & ~shm::kAmWantsAck) != 0) return Rejection::kBadFlags;
      return ValidateActiveMessage(d, b);
    case shm::SubmitOp::kAmAck:
    case shm::SubmitOp::kCancel:
    case shm::SubmitOp::kClaimedRecv:
    case shm::SubmitOp::kSetOption:
      if (d.flags != 0) return Rejection::kBadFlags;
      return Rejection::kNone;
    default:
      return Rejection::kBadOpcode;
  }
}

const char* RejectionName(Rejection r) {
  switch (r) {
    case Rejection::kNone:
      return "valid";
    case Rejection::kBadOpcode:
      return "unknown opcode";
    case Rejection::kBadFlags:
      return "unknown flags";
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
