// Fixed-size descriptors carried by the submission ring (client -> daemon)
// and the completion ring (daemon -> client). One descriptor is one cache line.
//
// Thread-safety: plain data. The daemon only ever looks at its own private
// copy of a submission descriptor (copied out of the ring by RingConsumer)
// and validates that copy before use (see daemon/validate.h).
#ifndef PSMD_SHM_DESCRIPTOR_H_
#define PSMD_SHM_DESCRIPTOR_H_

#include <cstddef>
#include <cstdint>
#include <type_traits>

namespace psmd::shm {

// Payloads up to this size travel inside the descriptor, not in the pool.
inline constexpr uint32_t kInlineMax = 24;

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
};

// Options a client sets on its endpoint's queue (kSetOption).
enum class QueueOption : uint32_t {
  kUnexpectedBudgetBytes = 1,  // PSM2_MQ_MAX_SYSBUF_MBYTES, in bytes
};

struct SubmissionDesc {
  SubmitOp op;
  uint8_t flags;
  uint16_t reserved;
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
    } recv;
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
  kOptionSet = 9,   // answer to kSetOption
  kAmRequest = 10,  // run a handler (AM layout; req: the sender's token)
  kAmReply = 11,    // run a reply handler (AM layout)
  kAmAcked = 12,    // the handler of request `req` ran (error: or why not;
                    // tag[0]: the handler index)
};

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
};

struct CompletionDesc {
  CompleteOp op;
  uint8_t flags;
  uint16_t reserved;
  int32_t error;     // psm2_error_t
  uint64_t req;      // the client's token from the submission
  uint32_t tag[3];   // recv/probe: the sender's tag
  uint32_t msg_len;  // recv/probe: the sender's length
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
