// Fixed-size descriptors carried by the submission ring (client -> daemon)
// and the completion ring (daemon -> client). One descriptor is one cache line.
//
// Thread-safety: plain data. The daemon only ever looks at its own private
// copy of a submission descriptor (copied out of the ring by RingConsumer)
// and validates that copy before use (see daemon/engine/validate.h).
#ifndef PSMD_SHM_DESCRIPTOR_H_
#define PSMD_SHM_DESCRIPTOR_H_

#include <cstddef>
#include <cstdint>
#include <type_traits>

namespace psmd::shm {

// Payloads up to this size travel inside the descriptor, not in the pool.
inline constexpr uint32_t kInlineMax = 24;

// The one rule both sides apply to every payload (eager message, AM
// arguments and payload, claimed message): inline or in the pool.
constexpr bool IsInline(uint64_t len) { return len <= kInlineMax; }

// Connection slot meaning "any source" in a receive.
inline constexpr uint32_t kAnySlot = 0xffffffffu;

// Which submission ring carries an op (shm/layout.h): message submissions
// (kSend, kRndvSend) may be held back by the daemon while their receiver's
// unexpected-message budget is full; everything else travels on the control
// ring, which the daemon always drains, so receives, cancels and rendezvous
// data keep flowing while sends wait (no deadlock between two flooding peers).
enum class SubmitOp : uint8_t {
  kInvalid = 0,
  kSend = 1,    // msg ring: eager message to peer slot; inline or pool payload
  kRecv = 2,    // ctl ring: post a receive (tag, selector, source or kAnySlot)
  kCancel = 3,  // ctl ring: cancel the posted receive body.cancel.target
  kRndvSend =
      4,  // msg ring: rendezvous request-to-send of `len` bytes, no payload
  kRndvData = 5,  // ctl ring: one chunk of a rendezvous transfer (body.rndv)
  kProbe =
      6,  // ctl ring: look for an unexpected message (tag, selector, source)
  kClaimedRecv = 7,  // ctl ring: receive the rendezvous message claimed by
                     // probe `req` into `len` bytes
  kSetOption = 8,    // ctl ring: body.option; answered by kOptionSet
  kAmRequest = 9,    // msg ring: active message to peer slot (AM layout below)
  kAmReply =
      10,       // ctl ring: active-message reply to endpoint `peer` (AM layout)
  kAmAck = 11,  // ctl ring: tell endpoint `peer` that its request's handler ran
                // (body.ack)
};

// Active messages (kAmRequest, kAmReply and the completions of the same
// names) reuse the tag words: tag[0] handler index, tag[1] number of
// arguments, tag[2] the sending endpoint's id (in completions: where a reply
// or ack goes). `len` bytes of arguments (8 each) followed by the payload
// travel inline when len <= kInlineMax, else in the pool at pool_offset.
inline constexpr uint32_t kAmMaxHandlers = 256;
inline constexpr uint32_t kAmMaxArgs = 8;
inline constexpr uint32_t kAmMaxPayload = 8192;
inline constexpr uint32_t kAmArgBytes = 8;

enum SubmitFlags : uint8_t {
  kSendSync = 1u << 0,  // kSend: complete only once the receiver matched it
  kSendFailed =
      1u << 1,  // kSend of 0 bytes standing for a send the library could
                // not carry (a NULL buffer with a length): its receiver
                // completes with PSM2_PARAM_ERR instead of waiting forever
  kProbeRemove =
      1u << 0,           // kProbe: claim the message for kClaimedRecv (improbe)
  kAmNoReply = 1u << 0,  // kAmRequest: the handler must not reply
  kAmWantsAck = 1u << 1,  // kAmRequest/kAmReply: the sender waits for kAmAck
                          // (it has a completion function)
  kSendInPlace =
      1u << 2,  // kRndvSend: body.place.addr is the payload's address in
                // the sender's memory, where psmd may copy it from itself
                // (cross-memory attach, daemon/engine/cross_copy.h)
  kRecvInPlace = 1u << 0,  // kRecv (body.recv.addr), kClaimedRecv
                           // (body.place.addr): the receive buffer's address
                           // in the receiver's memory, where psmd may copy
                           // a rendezvous payload itself
};

// Options a client sets on its endpoint's queue (kSetOption).
enum class QueueOption : uint32_t {
  kUnexpectedBudgetBytes = 1,  // PSM2_MQ_MAX_SYSBUF_MBYTES, in bytes
};

struct SubmissionDesc {
  SubmitOp op;
  uint8_t flags;
  uint16_t ring_seq;  // the ring's publication stamp (shm/ring.h)
  uint32_t
      peer;  // connection slot (send: destination; recv/probe: source filter)
  uint64_t req;     // client's request token, echoed in the completion
  uint32_t tag[3];  // send: message tag; recv/probe: tag to match
  uint32_t
      len;  // send: message length; recv: buffer capacity; data: chunk length
  union {
    uint8_t inline_data[32];  // send, len <= kInlineMax
    struct {
      uint64_t pool_offset;  // send: payload offset in the job pool
    } pool;
    struct {
      uint32_t tagsel[3];  // recv/probe: selector
      uint32_t reserved;
      uint64_t addr;  // recv with kRecvInPlace: the buffer's address
    } recv;
    struct {
      uint64_t addr;  // kRndvSend with kSendInPlace, kClaimedRecv with
                      // kRecvInPlace: the buffer's address in the client
    } place;
    struct {
      uint64_t pool_offset;  // chunk payload offset in the job pool
      uint64_t transfer;     // id from kRndvGo
      uint64_t offset;       // byte offset of this chunk in the message
    } rndv;
    struct {
      uint64_t target;  // cancel: token of the receive to cancel
    } cancel;
    struct {
      uint64_t request;  // the acknowledged request's token at its sender
      int32_t error;     // PSM2_OK, or why the handler did not run
      uint32_t handler;
    } ack;
    struct {
      uint32_t key;  // QueueOption
      uint32_t reserved;
      uint64_t value;
    } option;
  } body;
};
static_assert(sizeof(SubmissionDesc) == 64);
static_assert(std::is_trivially_copyable_v<SubmissionDesc>);
static_assert(offsetof(SubmissionDesc, body) == 32);

// ---- Operation traits: the one place that says how each op travels ----
//
// The client's ring choice, credits and payload placement
// (client/publisher.{h,cc}), the daemon's validator (daemon/engine/validate.cc)
// and the engine's dispatch (daemon/engine/mq_engine.cc) all read this table.
// Adding an operation touches three places: its row here and its builder below,
// and its handler in the engine (docs/design.md, "Adding an operation").

enum class Ring : uint8_t {
  kMessage,  // msg_sq: may be held back for the receiver's budget
  kControl,  // ctl_sq: always drained
};

// What SubmissionDesc::peer names.
enum class PeerField : uint8_t {
  kUnused,      // ignored
  kSlot,        // a connected slot of the sender
  kSlotOrAny,   // a connected slot, or kAnySlot
  kEndpointId,  // a psmd endpoint id (replies and acks go back to a sender
                // that may not be connected to us); the engine checks it
};

enum class PayloadKind : uint8_t {
  kNone,
  kInlineOrPool,  // `len` bytes, inline when IsInline(len), else in the
                  // sender's pool region at body.pool.pool_offset
  kPool,          // always in the pool (rendezvous chunk), len > 0
};

// Whether the submission holds a completion-ring credit until its answer is
// reaped (client/endpoint.h, invariant 2).
enum class CreditRule : uint8_t {
  kNever,
  kAlways,      // round trips: probe, cancel, option
  kIfWantsAck,  // active messages with kAmWantsAck
};

struct OpTraits {
  bool valid;
  Ring ring;
  PeerField peer;
  PayloadKind payload;
  CreditRule credit;
  uint8_t allowed_flags;
};

inline constexpr uint8_t kSubmitOpCount = 12;

// Indexed by SubmitOp.
inline constexpr OpTraits kOpTraits[kSubmitOpCount] = {
    /* kInvalid    */ {false, Ring::kControl, PeerField::kUnused,
                       PayloadKind::kNone, CreditRule::kNever, 0},
    /* kSend       */
    {true, Ring::kMessage, PeerField::kSlot, PayloadKind::kInlineOrPool,
     CreditRule::kNever, kSendSync | kSendFailed},
    /* kRecv       */
    {true, Ring::kControl, PeerField::kSlotOrAny, PayloadKind::kNone,
     CreditRule::kNever, kRecvInPlace},
    /* kCancel     */
    {true, Ring::kControl, PeerField::kUnused, PayloadKind::kNone,
     CreditRule::kAlways, 0},
    /* kRndvSend   */
    {true, Ring::kMessage, PeerField::kSlot, PayloadKind::kNone,
     CreditRule::kNever, kSendInPlace},
    /* kRndvData   */
    {true, Ring::kControl, PeerField::kUnused, PayloadKind::kPool,
     CreditRule::kNever, 0},
    /* kProbe      */
    {true, Ring::kControl, PeerField::kSlotOrAny, PayloadKind::kNone,
     CreditRule::kAlways, kProbeRemove},
    /* kClaimedRecv*/
    {true, Ring::kControl, PeerField::kUnused, PayloadKind::kNone,
     CreditRule::kNever, kRecvInPlace},
    /* kSetOption  */
    {true, Ring::kControl, PeerField::kUnused, PayloadKind::kNone,
     CreditRule::kAlways, 0},
    /* kAmRequest  */
    {true, Ring::kMessage, PeerField::kSlot, PayloadKind::kInlineOrPool,
     CreditRule::kIfWantsAck, kAmNoReply | kAmWantsAck},
    /* kAmReply    */
    {true, Ring::kControl, PeerField::kEndpointId, PayloadKind::kInlineOrPool,
     CreditRule::kIfWantsAck, kAmWantsAck},
    /* kAmAck      */
    {true, Ring::kControl, PeerField::kEndpointId, PayloadKind::kNone,
     CreditRule::kNever, 0},
};
static_assert(static_cast<uint8_t>(SubmitOp::kAmAck) + 1 == kSubmitOpCount,
              "every SubmitOp has a row in kOpTraits");

// The traits of `op`; an unknown op (a value no row has) is the invalid row.
constexpr const OpTraits& TraitsOf(SubmitOp op) {
  const uint8_t i = static_cast<uint8_t>(op);
  return kOpTraits[i < kSubmitOpCount ? i : 0];
}

constexpr bool TakesCredit(const SubmissionDesc& d) {
  switch (TraitsOf(d.op).credit) {
    case CreditRule::kAlways:
      return true;
    case CreditRule::kIfWantsAck:
      return (d.flags & kAmWantsAck) != 0;
    case CreditRule::kNever:
      break;
  }
  return false;
}

// Whether the submission's payload lives in the pool (at
// body.pool.pool_offset, which kRndvData's body.rndv.pool_offset aliases).
constexpr bool PayloadInPool(const SubmissionDesc& d) {
  switch (TraitsOf(d.op).payload) {
    case PayloadKind::kPool:
      return true;
    case PayloadKind::kInlineOrPool:
      return !IsInline(d.len);
    case PayloadKind::kNone:
      break;
  }
  return false;
}
static_assert(offsetof(SubmissionDesc, body.pool.pool_offset) ==
              offsetof(SubmissionDesc, body.rndv.pool_offset));

// ---- Builders, one per op (liburing's io_uring_prep_* are the model) ----
// Each fills a zeroed descriptor; the caller adds payload bytes or a pool
// offset (PayloadInPool) and flags beyond the ones named here.

inline SubmissionDesc PrepSend(uint32_t slot, uint64_t req,
                               const uint32_t tag[3], uint32_t len,
                               bool rendezvous) {
  SubmissionDesc d{};
  d.op = rendezvous ? SubmitOp::kRndvSend : SubmitOp::kSend;
  d.peer = slot;
  d.req = req;
  for (int i = 0; i < 3; i++) d.tag[i] = tag[i];
  d.len = len;
  return d;
}

inline SubmissionDesc PrepRecv(uint32_t slot_or_any, uint64_t req,
                               const uint32_t tag[3], const uint32_t tagsel[3],
                               uint32_t capacity) {
  SubmissionDesc d{};
  d.op = SubmitOp::kRecv;
  d.peer = slot_or_any;
  d.req = req;
  for (int i = 0; i < 3; i++) {
    d.tag[i] = tag[i];
    d.body.recv.tagsel[i] = tagsel[i];
  }
  d.len = capacity;
  return d;
}

inline SubmissionDesc PrepProbe(uint32_t slot_or_any, uint64_t req,
                                const uint32_t tag[3], const uint32_t tagsel[3],
                                bool claim) {
  SubmissionDesc d = PrepRecv(slot_or_any, req, tag, tagsel, 0);
  d.op = SubmitOp::kProbe;
  d.flags = claim ? kProbeRemove : 0;
  return d;
}

inline SubmissionDesc PrepCancel(uint64_t req, uint64_t target) {
  SubmissionDesc d{};
  d.op = SubmitOp::kCancel;
  d.req = req;
  d.body.cancel.target = target;
  return d;
}

// Receive the rendezvous message claimed by probe `req` into `capacity`.
inline SubmissionDesc PrepClaimedRecv(uint64_t req, uint32_t capacity) {
  SubmissionDesc d{};
  d.op = SubmitOp::kClaimedRecv;
  d.req = req;
  d.len = capacity;
  return d;
}

inline SubmissionDesc PrepRndvData(uint64_t req, uint64_t transfer,
                                   uint64_t offset, uint32_t len) {
  SubmissionDesc d{};
  d.op = SubmitOp::kRndvData;
  d.req = req;
  d.len = len;
  d.body.rndv.transfer = transfer;
  d.body.rndv.offset = offset;
  return d;
}

// Names the client buffer of a kRndvSend, kRecv or kClaimedRecv, so that
// psmd may copy a rendezvous payload in place (kSendInPlace, kRecvInPlace).
inline void PlaceInMemory(SubmissionDesc& d, const void* buf) {
  const auto addr = static_cast<uint64_t>(reinterpret_cast<uintptr_t>(buf));
  if (addr == 0) return;
  switch (d.op) {
    case SubmitOp::kRecv:
      d.flags |= kRecvInPlace;
      d.body.recv.addr = addr;
      break;
    case SubmitOp::kRndvSend:
      d.flags |= kSendInPlace;
      d.body.place.addr = addr;
      break;
    case SubmitOp::kClaimedRecv:
      d.flags |= kRecvInPlace;
      d.body.place.addr = addr;
      break;
    default:
      break;
  }
}

inline SubmissionDesc PrepSetOption(uint64_t req, QueueOption key,
                                    uint64_t value) {
  SubmissionDesc d{};
  d.op = SubmitOp::kSetOption;
  d.req = req;
  d.body.option.key = static_cast<uint32_t>(key);
  d.body.option.value = value;
  return d;
}

// An active-message request (to connection slot `peer`) or reply (to
// endpoint id `peer`) of `nargs` arguments and `payload_len` bytes.
inline SubmissionDesc PrepActiveMessage(bool reply, uint32_t peer, uint64_t req,
                                        uint32_t handler, uint32_t nargs,
                                        uint32_t payload_len) {
  SubmissionDesc d{};
  d.op = reply ? SubmitOp::kAmReply : SubmitOp::kAmRequest;
  d.peer = peer;
  d.req = req;
  d.tag[0] = handler;
  d.tag[1] = nargs;
  d.len = nargs * kAmArgBytes + payload_len;
  return d;
}

// Tells endpoint `sender` that the handler of its request `request` ran
// (or why not).
inline SubmissionDesc PrepAmAck(uint32_t sender, uint64_t request,
                                uint32_t handler, int32_t error) {
  SubmissionDesc d{};
  d.op = SubmitOp::kAmAck;
  d.peer = sender;
  d.body.ack.request = request;
  d.body.ack.handler = handler;
  d.body.ack.error = error;
  return d;
}

enum class CompleteOp : uint8_t {
  kInvalid = 0,
  kRecvDone = 1,    // a receive matched an eager message (payload follows)
  kSendDone = 2,    // a send the daemon had to complete (sync)
  kCancelDone = 3,  // answer to kCancel: PSM2_OK (cancelled) or NO_COMPLETIONS
  kError = 4,       // the submission with token `req` was rejected or failed
  kRecvRndv = 5,    // a receive matched a rendezvous message; kRndvChunk follow
  kRndvChunk = 6,   // one chunk of a rendezvous message for receive `req`
  kRndvGo = 7,      // clear-to-send for rendezvous send `req` (body.go)
  kProbeDone =
      8,  // answer to kProbe: error PSM2_OK (status filled) or NO_COMPLETIONS;
          // a claimed eager message comes with its payload (kPayloadClaimed)
  kOptionSet = 9,     // answer to kSetOption
  kAmRequest = 10,    // run a handler (AM layout; req: the sender's token)
  kAmReply = 11,      // run a reply handler (AM layout)
  kAmAcked = 12,      // the handler of request `req` ran (error: or why not;
                      // tag[0]: the handler index)
  kNodeLost = 13,     // no request: the connection to node tag[0] ended, and
                      // msg_len endpoints there that this one had connected
                      // to (src_epid: one of them) are gone with it; error:
                      // PSM2_EPID_UNREACHABLE, PSM2_TIMEOUT if it fell silent;
                      // inline_data: the node table's host name for it, NUL-
                      // terminated (cut to kInlineMax - 1 bytes), or empty
  kBudgetStall = 14,  // no request: sends to this endpoint have waited
                      // kBudgetStallNs for an unexpected budget
                      // (tag[1]: which, a StallBudget; tag[0]: its MiB),
                      // and none of its msg_len unexpected messages was
                      // received meanwhile (daemon/engine/mq_engine.h)
};

// How long sends to an endpoint wait for its budget, with none of its
// unexpected messages received, before psmd says so (kBudgetStall).
inline constexpr uint64_t kBudgetStallNs = 10'000'000'000;
enum class StallBudget : uint32_t { kEndpoint = 0, kJob = 1, kUid = 2 };
// "its own", "its job's", "its uid's" (what a message about the receiver
// calls the budget).
inline const char* StallBudgetName(StallBudget b) {
  switch (b) {
    case StallBudget::kJob:
      return "its job's";
    case StallBudget::kUid:
      return "its uid's";
    default:
      return "its own";
  }
}

enum CompleteFlags : uint8_t {
  kPayloadInline =
      1u << 0,  // kRecvDone: payload in inline_data, else at pool_offset
  kWasUnexpected =
      1u << 1,  // kRecvDone/kRecvRndv: the message waited in the
                // unexpected queue (a system buffer, in PSM2 terms)
  kAmRequestNoReply = 1u << 2,  // kAmRequest: the sender asked for no reply
  kAmRequestWantsAck =
      1u << 3,  // kAmRequest/kAmReply: acknowledge once the handler ran
  kPayloadClaimed =
      1u << 4,  // kProbeDone of a claiming probe of an eager message:
                // the payload is the client's now (kPayloadInline or
                // pool_offset, as kRecvDone); no kClaimedRecv follows
  kPayloadFailed =
      1u << 5,  // kRecvDone/kProbeDone: the message stands for a failed
                // send (kSendFailed); the receive fails with PARAM_ERR
  kPayloadPlaced =
      1u << 6,  // kRndvChunk: psmd copied these bytes into the
                // receive buffer itself (it took the transfer
                // over, daemon/engine/mq_engine.h invariant 10); no pool
                // payload; error says whether the copy failed
  kGoAwaitDone = 1u << 7,  // kRndvGo: psmd may take the transfer over; the send
                           // completes on kSendDone, not when its last chunk is
                           // published
};

struct CompletionDesc {
  CompleteOp op;
  uint8_t flags;
  uint16_t ring_seq;  // the ring's publication stamp (shm/ring.h)
  int32_t error;      // psm2_error_t
  uint64_t req;       // the client's token from the submission
  uint32_t tag[3];    // recv/probe: the sender's tag
  uint32_t msg_len;   // recv/probe: the sender's length
  uint64_t src_epid;
  union {
    uint8_t inline_data[kInlineMax];
    struct {
      uint64_t pool_offset;  // recv: payload offset in the job pool
    } pool;
    struct {
      uint64_t pool_offset;  // chunk payload offset in the job pool
      uint64_t offset;       // byte offset of this chunk in the message
      uint32_t len;
    } chunk;
    struct {
      uint64_t transfer;    // names the transfer in kRndvData
      uint32_t send_bytes;  // how much to send: min(message, receive buffer)
    } go;
  } body;
};
static_assert(sizeof(CompletionDesc) == 64);
static_assert(std::is_trivially_copyable_v<CompletionDesc>);
static_assert(offsetof(CompletionDesc, body) == 40);

}  // namespace psmd::shm

#endif  // PSMD_SHM_DESCRIPTOR_H_
