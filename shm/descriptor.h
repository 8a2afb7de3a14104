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

enum class SubmitOp : uint8_t {
  kInvalid = 0,
  kSend = 1,    // tagged message to peer slot; inline or pool payload
  kRecv = 2,    // post a receive (tag, selector, source slot or kAnySlot)
  kCancel = 3,  // cancel the posted receive whose token is `req`
};

enum SubmitFlags : uint8_t {
  kSendSync = 1u << 0,  // complete the send only once the receiver matched it
};

struct SubmissionDesc {
  SubmitOp op;
  uint8_t flags;
  uint16_t reserved;
  uint32_t peer;    // connection slot (send: destination; recv: source filter)
  uint64_t req;     // client's request token, echoed in the completion
  uint32_t tag[3];  // send: message tag; recv: tag to match
  uint32_t len;     // send: message length; recv: buffer capacity
  union {
    uint8_t inline_data[32];  // send, len <= kInlineMax
    struct {
      uint64_t pool_offset;   // send: payload offset in the job pool
    } pool;
    struct {
      uint32_t tagsel[3];     // recv: selector
    } recv;
  } body;
};
static_assert(sizeof(SubmissionDesc) == 64);
static_assert(std::is_trivially_copyable_v<SubmissionDesc>);
static_assert(offsetof(SubmissionDesc, body) == 32);

enum class CompleteOp : uint8_t {
  kInvalid = 0,
  kRecvDone = 1,    // a posted receive matched a message (payload follows)
  kSendDone = 2,    // a send the daemon had to complete (sync)
  kCancelDone = 3,  // answer to kCancel; error tells whether it was cancelled
  kError = 4,       // the submission with token `req` was rejected
};

enum CompleteFlags : uint8_t {
  kPayloadInline = 1u << 0,  // payload in inline_data, else at pool_offset
};

struct CompletionDesc {
  CompleteOp op;
  uint8_t flags;
  uint16_t reserved;
  int32_t error;    // psm2_error_t
  uint64_t req;     // the client's token from the submission
  uint32_t tag[3];  // recv: the sender's tag
  uint32_t msg_len; // recv: the sender's length
  uint64_t src_epid;
  union {
    uint8_t inline_data[kInlineMax];
    struct {
      uint64_t pool_offset;  // recv: payload offset in the job pool
    } pool;
  } body;
};
static_assert(sizeof(CompletionDesc) == 64);
static_assert(std::is_trivially_copyable_v<CompletionDesc>);
static_assert(offsetof(CompletionDesc, body) == 40);

}  // namespace psmd::shm

#endif  // PSMD_SHM_DESCRIPTOR_H_
