// The inter-node wire contract: what one node's inter-node engine
// (daemon/remote/remote.h) sends another's inside the fabric's data frames,
// as shm/descriptor.h is for the rings between a client and its daemon. The
// frame format is the fabric's (hw/frame.h): a header whose `op`, `uid`,
// `src`, `dst`, `job`, `offset` and `aux` belong to this engine, followed by
// `length` bytes. This header says, per op: its traits row (kOpTraits), a
// builder (Prep...), and what its decoder checks (CheckHeader,
// DecodeEnvelope); both ends include it, so neither re-derives the format.
//
// Two shapes of frame (docs/design.md, "Between nodes"):
//   - an *envelope*: a 32-byte Record plus at most shm::kInlineMax inline
//     payload bytes, read into a fixed buffer and decoded here;
//   - *data*: kPayload (the payload of the message envelope before it) and
//     kRndvData (a rendezvous chunk), whose bytes land where the receiving
//     engine put them; CheckHeader checks their header, the engine checks
//     them against its own state (the envelope before, the transfer).
//
// The decoders trust nothing another node writes: a frame whose op is
// unknown, whose length is outside its op's bounds, which sets a field its
// op does not use, names a sending endpoint of another node, carries flags
// its op does not have, or whose inline bytes or active-message sizes
// disagree with its lengths is refused; the engine then drops the
// connection. They never read outside what they are handed (the fuzzer,
// wire_fuzz.cc, drives them).
//
// Records are little-endian on the wire, as the frame header is; psmd runs
// on little-endian hosts only (the static_assert below).
//
// Thread-safety: constants and pure functions; any thread.
#ifndef PSMD_DAEMON_REMOTE_WIRE_H_
#define PSMD_DAEMON_REMOTE_WIRE_H_

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "hw/frame.h"
#include "shm/descriptor.h"

namespace psmd::wire {

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "records are copied to the wire as they are in memory");

enum class Op : uint16_t {
  kInvalid = 0,
  kQuery = 1,      // is dst an endpoint of this job and uid? aux: query
  kAnswer = 2,     // aux: query, error
  kEnvelope = 3,   // an MQ send; aux: sender's request
  kPayload = 4,    // the payload of the envelope before it
  kSyncAck = 5,    // dst's sync send matched; aux: its request
  kRndvGo = 6,     // send `len` bytes; aux: request, x: transfer
  kRndvData = 7,   // a chunk; aux: transfer, offset: where
  kAmRequest = 8,  // aux: request
  kAmReply = 9,
  kAmAck = 10,         // aux: the request acknowledged, tag[0]: handler
  kError = 11,         // dst's request `aux` failed with `error`
  kAbort = 12,         // rendezvous transfer `aux` to dst ends: its sender left
  kPing = 13,          // nothing: a heartbeat (liveness, remote.h)
  kGone = 14,          // endpoint src (of the sending node) was removed
  kXoff = 15,          // hold messages to endpoint src (of the sending node)
  kXon = 16,           // send to src again; x: a credit (remote.h, 5)
  kEagerOff = 17,      // eager MQ messages to src as envelopes only
  kEagerOn = 18,       // eager MQ messages to src as before
  kRndvRead = 19,      // read a piece of transfer `aux` from the sender's
                       // registered region (RMA rendezvous)
  kRndvReadDone = 20,  // the piece `aux` of dst's was read (or not: error)
};
inline constexpr uint16_t kOpCount = 21;

// The record every envelope starts with.
struct Record {
  uint32_t tag[3];
  uint32_t len;    // message bytes
  uint32_t flags;  // SubmitFlags (sends), completion flags (AM)
  int32_t error;
  uint64_t x;  // kRndvGo: the receiver's transfer id; kXon: a credit
};
static_assert(sizeof(Record) == 32);
static_assert(std::is_trivially_copyable_v<Record>);

// In Record::flags of a kEnvelope: a rendezvous request-to-send.
inline constexpr uint32_t kFlagRndv = 1u << 31;
// In a request field (aux): the sending daemon's id of a send it converted
// to a rendezvous (remote.h, back-pressure 3), not a client's request token
// (those stay below 2^63, client/endpoint.h).
inline constexpr uint64_t kConvertedBit = 1ull << 63;
inline constexpr uint32_t kEnvelopeMax = sizeof(Record) + shm::kInlineMax;

// The RMA rendezvous (docs/design.md, "Rendezvous by RMA read"). How the
// two daemons agree on it without a new handshake: a receiving daemon that
// can read (hw::Fabric::CanRead, its receiver's pool registered) sets this
// bit in the transfer id its kRndvGo carries (Record::x). The id is the
// receiver's own name for the transfer, which a sender only echoes, so a
// daemon built before the RMA rendezvous streams kRndvData under it as
// always; a sending daemon that can serve reads sends kRndvRead pieces
// instead, and only for a transfer whose id has the bit. So kRndvRead goes
// only to a daemon that offered it, and kRndvReadDone only to one that
// sent kRndvRead: neither reaches a daemon whose decoder would refuse it.
inline constexpr uint64_t kRmaOfferBit = 1ull << 62;
// What a kRndvRead carries after its record: the sender's region as
// hw::RemoteRegion names it (address, key, length; little-endian u64s).
inline constexpr uint32_t kRegionBytes = 24;
struct Region {
  uint64_t addr = 0;
  uint64_t key = 0;
  uint64_t length = 0;
};

// ---- Operation traits: the one place that says how each op travels ----

enum class Shape : uint8_t {
  kNone,      // no such op: refused
  kEnvelope,  // a Record (+ inline bytes), decoded by DecodeEnvelope
  kData,      // bytes placed by the receiving engine
};

enum class Payload : uint8_t {
  kNone,
  kInlineOrFrame,  // `len` bytes: inline after the record when shm::IsInline
                   // (and not a rendezvous), else a kPayload frame follows
  kFrame,          // the bytes of the message envelope just before it
  kChunk,          // the bytes of a rendezvous transfer, at `offset`
  kRegion,         // exactly kRegionBytes after the record: a Region
};

// The fields an op uses: frame fields and record fields. Every other one is
// zero on the wire, and a frame where it is not is refused.
enum Field : uint16_t {
  kSrc = 1u << 0,     // an endpoint of the sending node (checked here)
  kDst = 1u << 1,     // the endpoint it is for (the engine checks it is
                      // one of its own, of that job and uid)
  kSender = 1u << 2,  // uid and job: the sending endpoint's, or those of
                      // the frame answered
  kAux = 1u << 3,
  kOffset = 1u << 4,
  kTag0 = 1u << 5,
  kTag1 = 1u << 6,
  kTag2 = 1u << 7,
  kLen = 1u << 8,
  kFlags = 1u << 9,
  kError = 1u << 10,
  kX = 1u << 11,
};

struct OpTraits {
  Shape shape;
  Payload payload;
  uint16_t fields;      // Field bits
  uint32_t flags;       // the Record::flags it may carry
  uint32_t min_length;  // the frame's length (bytes after the header)
  uint32_t max_length;
};

inline constexpr uint16_t kAddressed = kSrc | kDst | kSender | kAux;
inline constexpr uint32_t kRecordOnly = sizeof(Record);

// Indexed by Op.
inline constexpr OpTraits kOpTraits[kOpCount] = {
    /* kInvalid  */ {Shape::kNone, Payload::kNone, 0, 0, 0, 0},
    /* kQuery    */
    {Shape::kEnvelope, Payload::kNone, kAddressed, 0, kRecordOnly, kRecordOnly},
    /* kAnswer   */
    {Shape::kEnvelope, Payload::kNone, kAddressed | kError, 0, kRecordOnly,
     kRecordOnly},
    /* kEnvelope */
    {Shape::kEnvelope, Payload::kInlineOrFrame,
     kAddressed | kTag0 | kTag1 | kTag2 | kLen | kFlags,
     shm::kSendSync | shm::kSendFailed | shm::kSendInPlace | kFlagRndv,
     kRecordOnly, kEnvelopeMax},
    /* kPayload  */
    {Shape::kData, Payload::kFrame, kAddressed, 0, shm::kInlineMax + 1,
     UINT32_MAX},
    /* kSyncAck  */
    {Shape::kEnvelope, Payload::kNone, kAddressed, 0, kRecordOnly, kRecordOnly},
    /* kRndvGo   */
    {Shape::kEnvelope, Payload::kNone, kAddressed | kLen | kX, 0, kRecordOnly,
     kRecordOnly},
    /* kRndvData */
    {Shape::kData, Payload::kChunk, kAddressed | kOffset, 0, 1, UINT32_MAX},
    /* kAmRequest*/
    {Shape::kEnvelope, Payload::kInlineOrFrame,
     kAddressed | kTag0 | kTag1 | kLen | kFlags,
     shm::kAmRequestNoReply | shm::kAmRequestWantsAck, kRecordOnly,
     kEnvelopeMax},
    /* kAmReply  */
    {Shape::kEnvelope, Payload::kInlineOrFrame,
     kAddressed | kTag0 | kTag1 | kLen | kFlags, shm::kAmRequestWantsAck,
     kRecordOnly, kEnvelopeMax},
    /* kAmAck    */
    {Shape::kEnvelope, Payload::kNone, kAddressed | kTag0 | kError, 0,
     kRecordOnly, kRecordOnly},
    /* kError    */
    {Shape::kEnvelope, Payload::kNone, kAddressed | kError, 0, kRecordOnly,
     kRecordOnly},
    /* kAbort    */
    {Shape::kEnvelope, Payload::kNone, kAddressed | kError, 0, kRecordOnly,
     kRecordOnly},
    /* kPing     */
    {Shape::kEnvelope, Payload::kNone, 0, 0, kRecordOnly, kRecordOnly},
    /* kGone     */
    {Shape::kEnvelope, Payload::kNone, kSrc | kSender | kError, 0, kRecordOnly,
     kRecordOnly},
    /* kXoff     */
    {Shape::kEnvelope, Payload::kNone, kSrc | kSender, 0, kRecordOnly,
     kRecordOnly},
    /* kXon      */
    {Shape::kEnvelope, Payload::kNone, kSrc | kSender | kX, 0, kRecordOnly,
     kRecordOnly},
    /* kEagerOff */
    {Shape::kEnvelope, Payload::kNone, kSrc | kSender, 0, kRecordOnly,
     kRecordOnly},
    /* kEagerOn  */
    {Shape::kEnvelope, Payload::kNone, kSrc | kSender, 0, kRecordOnly,
     kRecordOnly},
    /* kRndvRead */
    {Shape::kEnvelope, Payload::kRegion,
     kAddressed | kOffset | kTag0 | kTag1 | kLen | kX, 0,
     kRecordOnly + kRegionBytes, kRecordOnly + kRegionBytes},
    /* kRndvReadDone */
    {Shape::kEnvelope, Payload::kNone, kAddressed | kLen | kError, 0,
     kRecordOnly, kRecordOnly},
};
static_assert(static_cast<uint16_t>(Op::kRndvReadDone) + 1 == kOpCount,
              "every Op has a row in kOpTraits");

// The traits of `op`; an unknown op (a value no row has) is the invalid row.
constexpr const OpTraits& TraitsOf(uint16_t op) {
  return kOpTraits[op < kOpCount ? op : 0];
}
constexpr Op OpOf(const hw::FrameFields& f) { return static_cast<Op>(f.op); }

// A whole envelope: the frame fields, the record, the inline bytes.
struct Envelope {
  hw::FrameFields f;
  Record r{};
  uint8_t inline_data[shm::kInlineMax] = {};
  uint32_t inline_len = 0;
  Op op() const { return OpOf(f); }
};

// A message envelope (Payload::kInlineOrFrame) whose payload is a kPayload
// frame after it.
constexpr bool PayloadFollows(const Envelope& e) {
  return TraitsOf(e.f.op).payload == Payload::kInlineOrFrame &&
         !(e.r.flags & kFlagRndv) && !shm::IsInline(e.r.len);
}

// ---- Decoders ----

enum class Error : uint8_t {
  kOk = 0,
  kUnknownOp,  // no row, or not the shape the caller expects
  kLength,     // the frame's length outside its op's bounds
  kFields,     // a field the op does not use is not zero
  kForeign,    // src names an endpoint of another node than the sender
  kFlags,      // flags the op does not carry
  kInline,     // inline bytes disagree with the message's length
  kRange,      // an active message's handler, arguments or payload out of
               // range; a kRndvGo's transfer id without bytes or vice versa;
               // a kRndvRead's range off its region, or of no bytes
};
const char* ErrorName(Error error);

// The header of any frame from node `from` (the fabric authenticated it):
// op, length bounds, frame fields.
Error CheckHeader(uint16_t from, const hw::FrameFields& f, uint32_t length);
// An envelope of `length` bytes at `in`, under header `f` from node `from`:
// CheckHeader, then the record and inline bytes.
Error DecodeEnvelope(uint16_t from, const hw::FrameFields& f, const uint8_t* in,
                     uint32_t length, Envelope* out);
// The bytes DecodeEnvelope reads back as `e`; returns how many.
uint32_t Encode(const Envelope& e, uint8_t out[kEnvelopeMax]);

// ---- Builders, one per op ----

// The endpoint a frame speaks for.
struct Sender {
  uint64_t epid = 0;
  uint32_t uid = 0;
  uint8_t job[16] = {};
};
// The sender of a frame, and the endpoint it was for (who answers it).
Sender SenderOf(const hw::FrameFields& f);
Sender ReceiverOf(const hw::FrameFields& f);

Envelope PrepQuery(const Sender& from, uint64_t dst, uint64_t query);
Envelope PrepAnswer(const Sender& from, uint64_t dst, uint64_t query,
                    int32_t error);
// An MQ send of `len` bytes (eager, or a request-to-send with `rndv`);
// `inline_data` holds them when they travel inline (shm::IsInline, eager).
Envelope PrepMessage(const Sender& from, uint64_t dst, uint64_t req,
                     const uint32_t tag[3], uint32_t len, uint32_t flags,
                     bool rndv, const uint8_t* inline_data);
hw::FrameFields PrepPayload(const Sender& from, uint64_t dst, uint64_t req);
Envelope PrepSyncAck(const Sender& from, uint64_t dst, uint64_t req);
Envelope PrepRndvGo(const Sender& from, uint64_t dst, uint64_t req,
                    uint32_t send_bytes, uint64_t transfer);
hw::FrameFields PrepRndvData(const Sender& from, uint64_t dst,
                             uint64_t transfer, uint64_t offset);
// An active-message request or reply (completion flags `flags`) of `len`
// bytes (arguments, then payload); inline as PrepMessage.
Envelope PrepActiveMessage(bool reply, const Sender& from, uint64_t dst,
                           uint64_t req, uint32_t handler, uint32_t nargs,
                           uint32_t len, uint32_t flags,
                           const uint8_t* inline_data);
Envelope PrepAmAck(const Sender& from, uint64_t dst, uint64_t req,
                   uint32_t handler, int32_t error);
Envelope PrepError(const Sender& from, uint64_t dst, uint64_t req,
                   int32_t error);
Envelope PrepAbort(const Sender& from, uint64_t dst, uint64_t transfer,
                   int32_t error);
Envelope PrepPing();
Envelope PrepGone(const Sender& from, int32_t error);
// kXoff, kXon, kEagerOff or kEagerOn about endpoint `from` (back-pressure);
// a kXon also returns `credit` bytes of the receiver's window (remote.h,
// back-pressure 5; zero for the other ops).
Envelope PrepFlow(Op op, const Sender& from, uint64_t credit = 0);
// A piece of rendezvous transfer `transfer` (the receiver's id, with
// kRmaOfferBit): `len` bytes at `offset` in the message, to be read at
// `region_offset` in the sender's `region`; `piece` is the sender's name
// for it, which kRndvReadDone gives back (in tag[0] and tag[1]).
Envelope PrepRndvRead(const Sender& from, uint64_t dst, uint64_t transfer,
                      uint64_t offset, uint64_t piece, uint32_t len,
                      uint64_t region_offset, const Region& region);
// The region a kRndvRead names, and its piece id.
Region RegionOf(const Envelope& e);
uint64_t PieceOf(const Envelope& e);
// The receiver of piece `piece` of dst's is done with it: `len` bytes read,
// or `error` (a PSM2 error; the piece is released either way).
Envelope PrepRndvReadDone(const Sender& from, uint64_t dst, uint64_t piece,
                          uint32_t len, int32_t error);

}  // namespace psmd::wire

#endif  // PSMD_DAEMON_REMOTE_WIRE_H_
