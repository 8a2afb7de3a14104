#include "daemon/remote/wire.h"

#include <cstring>

#include "shm/epid.h"

namespace psmd::wire {

namespace {

bool IsZero(const uint8_t* p, size_t n) {
  for (size_t i = 0; i < n; i++) {
    if (p[i] != 0) return false;
  }
  return true;
}

// Whether every field `uses` leaves out is zero.
bool OnlyUsed(uint16_t uses, const hw::FrameFields& f) {
  return ((uses & kSrc) || f.src == 0) && ((uses & kDst) || f.dst == 0) &&
         ((uses & kSender) || (f.uid == 0 && IsZero(f.job, sizeof(f.job)))) &&
         ((uses & kAux) || f.aux == 0) && ((uses & kOffset) || f.offset == 0);
}

bool OnlyUsed(uint16_t uses, const Record& r) {
  return ((uses & kTag0) || r.tag[0] == 0) &&
         ((uses & kTag1) || r.tag[1] == 0) &&
         ((uses & kTag2) || r.tag[2] == 0) && ((uses & kLen) || r.len == 0) &&
         ((uses & kFlags) || r.flags == 0) &&
         ((uses & kError) || r.error == 0) && ((uses & kX) || r.x == 0);
}

// What each op's decoder checks beyond its traits row (none for most).
using Check = Error (*)(const Envelope& e);

Error CheckNothing(const Envelope&) { return Error::kOk; }

// A message carries its bytes inline exactly when they fit and it is not
// a request-to-send.
Error CheckInline(const Envelope& e) {
  const bool inl = !(e.r.flags & kFlagRndv) && shm::IsInline(e.r.len);
  return e.inline_len == (inl ? e.r.len : 0) ? Error::kOk : Error::kInline;
}

// The bounds the daemon's validator puts on a client's active message
// (daemon/engine/validate.cc), which the sending daemon applied.
Error CheckActiveMessage(const Envelope& e) {
  const uint32_t handler = e.r.tag[0];
  const uint32_t nargs = e.r.tag[1];
  if (handler >= shm::kAmMaxHandlers || nargs > shm::kAmMaxArgs ||
      e.r.len < nargs * shm::kAmArgBytes ||
      e.r.len - nargs * shm::kAmArgBytes > shm::kAmMaxPayload) {
    return Error::kRange;
  }
  return CheckInline(e);
}

Error CheckAmAck(const Envelope& e) {
  return e.r.tag[0] < shm::kAmMaxHandlers ? Error::kOk : Error::kRange;
}

// Bytes to send come with the transfer that takes them, none without.
Error CheckRndvGo(const Envelope& e) {
  return (e.r.len > 0) == (e.r.x != 0) ? Error::kOk : Error::kRange;
}

// A piece to read lies within the region announced with it (no sum that
// could wrap: every number comes from the peer), and has bytes.
Error CheckRndvRead(const Envelope& e) {
  if (e.inline_len != kRegionBytes) return Error::kInline;
  const Region r = RegionOf(e);
  if (e.r.len == 0 || r.addr > UINT64_MAX - r.length || e.r.x > r.length ||
      e.r.len > r.length - e.r.x) {
    return Error::kRange;
  }
  return Error::kOk;
}

// Indexed by Op, row for row with kOpTraits; data ops have no record.
constexpr Check kChecks[kOpCount] = {
    /* kInvalid  */ nullptr,
    /* kQuery    */ CheckNothing,
    /* kAnswer   */ CheckNothing,
    /* kEnvelope */ CheckInline,
    /* kPayload  */ nullptr,
    /* kSyncAck  */ CheckNothing,
    /* kRndvGo   */ CheckRndvGo,
    /* kRndvData */ nullptr,
    /* kAmRequest*/ CheckActiveMessage,
    /* kAmReply  */ CheckActiveMessage,
    /* kAmAck    */ CheckAmAck,
    /* kError    */ CheckNothing,
    /* kAbort    */ CheckNothing,
    /* kPing     */ CheckNothing,
    /* kGone     */ CheckNothing,
    /* kXoff     */ CheckNothing,
    /* kXon      */ CheckNothing,
    /* kEagerOff */ CheckNothing,
    /* kEagerOn  */ CheckNothing,
    /* kRndvRead */ CheckRndvRead,
    /* kRndvReadDone */ CheckNothing,
};

constexpr bool EveryEnvelopeHasItsCheck() {
  for (uint16_t op = 0; op < kOpCount; op++) {
    if ((kOpTraits[op].shape == Shape::kEnvelope) != (kChecks[op] != nullptr)) {
      return false;
    }
  }
  return true;
}
static_assert(EveryEnvelopeHasItsCheck());

Envelope Addressed(Op op, const Sender& from, uint64_t dst, uint64_t aux) {
  Envelope e;
  e.f.op = static_cast<uint16_t>(op);
  e.f.uid = from.uid;
  e.f.src = from.epid;
  e.f.dst = dst;
  std::memcpy(e.f.job, from.job, sizeof(e.f.job));
  e.f.aux = aux;
  return e;
}

// An addressed envelope whose record carries only `error`.
Envelope Failed(Op op, const Sender& from, uint64_t dst, uint64_t aux,
                int32_t error) {
  Envelope e = Addressed(op, from, dst, aux);
  e.r.error = error;
  return e;
}

void SetInline(Envelope* e, const uint8_t* data) {
  if (e->r.flags & kFlagRndv || !shm::IsInline(e->r.len)) return;
  e->inline_len = e->r.len;
  std::memcpy(e->inline_data, data, e->r.len);
}

}  // namespace

const char* ErrorName(Error error) {
  switch (error) {
    case Error::kOk:
      return "ok";
    case Error::kUnknownOp:
      return "unknown op";
    case Error::kLength:
      return "length out of bounds for its op";
    case Error::kFields:
      return "a field its op does not use is set";
    case Error::kForeign:
      return "sender of another node";
    case Error::kFlags:
      return "flags its op does not carry";
    case Error::kInline:
      return "inline bytes disagree with the message length";
    case Error::kRange:
      return "a size or id out of range";
  }
  return "?";
}

Error CheckHeader(uint16_t from, const hw::FrameFields& f, uint32_t length) {
  const OpTraits& t = TraitsOf(f.op);
  if (t.shape == Shape::kNone) return Error::kUnknownOp;
  if (length < t.min_length || length > t.max_length) return Error::kLength;
  if (!OnlyUsed(t.fields, f)) return Error::kFields;
  if ((t.fields & kSrc) && shm::NodeIdOf(f.src) != from) {
    return Error::kForeign;
  }
  return Error::kOk;
}

Error DecodeEnvelope(uint16_t from, const hw::FrameFields& f, const uint8_t* in,
                     uint32_t length, Envelope* out) {
  const OpTraits& t = TraitsOf(f.op);
  if (t.shape != Shape::kEnvelope) return Error::kUnknownOp;
  if (Error error = CheckHeader(from, f, length); error != Error::kOk) {
    return error;
  }
  Envelope e;
  e.f = f;
  std::memcpy(&e.r, in, sizeof(Record));
  e.inline_len = length - kRecordOnly;
  std::memcpy(e.inline_data, in + sizeof(Record), e.inline_len);
  if (!OnlyUsed(t.fields, e.r)) return Error::kFields;
  if (e.r.flags & ~t.flags) return Error::kFlags;
  if (Error error = kChecks[f.op](e); error != Error::kOk) return error;
  *out = e;
  return Error::kOk;
}

uint32_t Encode(const Envelope& e, uint8_t out[kEnvelopeMax]) {
  std::memcpy(out, &e.r, sizeof(Record));
  std::memcpy(out + sizeof(Record), e.inline_data, e.inline_len);
  return kRecordOnly + e.inline_len;
}

Sender SenderOf(const hw::FrameFields& f) {
  Sender s;
  s.epid = f.src;
  s.uid = f.uid;
  std::memcpy(s.job, f.job, sizeof(s.job));
  return s;
}

Sender ReceiverOf(const hw::FrameFields& f) {
  Sender s = SenderOf(f);
  s.epid = f.dst;
  return s;
}

Envelope PrepQuery(const Sender& from, uint64_t dst, uint64_t query) {
  return Addressed(Op::kQuery, from, dst, query);
}

Envelope PrepAnswer(const Sender& from, uint64_t dst, uint64_t query,
                    int32_t error) {
  return Failed(Op::kAnswer, from, dst, query, error);
}

Envelope PrepMessage(const Sender& from, uint64_t dst, uint64_t req,
                     const uint32_t tag[3], uint32_t len, uint32_t flags,
                     bool rndv, const uint8_t* inline_data) {
  Envelope e = Addressed(Op::kEnvelope, from, dst, req);
  std::memcpy(e.r.tag, tag, sizeof(e.r.tag));
  e.r.len = len;
  e.r.flags = flags | (rndv ? kFlagRndv : 0);
  SetInline(&e, inline_data);
  return e;
}

hw::FrameFields PrepPayload(const Sender& from, uint64_t dst, uint64_t req) {
  return Addressed(Op::kPayload, from, dst, req).f;
}

Envelope PrepSyncAck(const Sender& from, uint64_t dst, uint64_t req) {
  return Addressed(Op::kSyncAck, from, dst, req);
}

Envelope PrepRndvGo(const Sender& from, uint64_t dst, uint64_t req,
                    uint32_t send_bytes, uint64_t transfer) {
  Envelope e = Addressed(Op::kRndvGo, from, dst, req);
  e.r.len = send_bytes;
  e.r.x = transfer;
  return e;
}

hw::FrameFields PrepRndvData(const Sender& from, uint64_t dst,
                             uint64_t transfer, uint64_t offset) {
  hw::FrameFields f = Addressed(Op::kRndvData, from, dst, transfer).f;
  f.offset = offset;
  return f;
}

Envelope PrepActiveMessage(bool reply, const Sender& from, uint64_t dst,
                           uint64_t req, uint32_t handler, uint32_t nargs,
                           uint32_t len, uint32_t flags,
                           const uint8_t* inline_data) {
  Envelope e = Addressed(reply ? Op::kAmReply : Op::kAmRequest, from, dst, req);
  e.r.tag[0] = handler;
  e.r.tag[1] = nargs;
  e.r.len = len;
  e.r.flags = flags;
  SetInline(&e, inline_data);
  return e;
}

Envelope PrepAmAck(const Sender& from, uint64_t dst, uint64_t req,
                   uint32_t handler, int32_t error) {
  Envelope e = Addressed(Op::kAmAck, from, dst, req);
  e.r.tag[0] = handler;
  e.r.error = error;
  return e;
}

Envelope PrepError(const Sender& from, uint64_t dst, uint64_t req,
                   int32_t error) {
  return Failed(Op::kError, from, dst, req, error);
}

Envelope PrepAbort(const Sender& from, uint64_t dst, uint64_t transfer,
                   int32_t error) {
  return Failed(Op::kAbort, from, dst, transfer, error);
}

Envelope PrepPing() { return Addressed(Op::kPing, Sender{}, 0, 0); }

Envelope PrepGone(const Sender& from, int32_t error) {
  return Failed(Op::kGone, from, 0, 0, error);
}

Envelope PrepFlow(Op op, const Sender& from, uint64_t credit) {
  Envelope e = Addressed(op, from, 0, 0);
  if (op == Op::kXon) e.r.x = credit;
  return e;
}

Envelope PrepRndvRead(const Sender& from, uint64_t dst, uint64_t transfer,
                      uint64_t offset, uint64_t piece, uint32_t len,
                      uint64_t region_offset, const Region& region) {
  Envelope e = Addressed(Op::kRndvRead, from, dst, transfer);
  e.f.offset = offset;
  e.r.tag[0] = static_cast<uint32_t>(piece);
  e.r.tag[1] = static_cast<uint32_t>(piece >> 32);
  e.r.len = len;
  e.r.x = region_offset;
  static_assert(sizeof(Region) == kRegionBytes &&
                kRegionBytes <= shm::kInlineMax);
  std::memcpy(e.inline_data, &region, kRegionBytes);
  e.inline_len = kRegionBytes;
  return e;
}

Region RegionOf(const Envelope& e) {
  Region r;
  std::memcpy(&r, e.inline_data, kRegionBytes);
  return r;
}

uint64_t PieceOf(const Envelope& e) {
  return e.r.tag[0] | (uint64_t{e.r.tag[1]} << 32);
}

Envelope PrepRndvReadDone(const Sender& from, uint64_t dst, uint64_t piece,
                          uint32_t len, int32_t error) {
  Envelope e = Failed(Op::kRndvReadDone, from, dst, piece, error);
  e.r.len = len;
  return e;
}

}  // namespace psmd::wire
