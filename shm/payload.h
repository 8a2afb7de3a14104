// Ownership of payload chunks in a job pool (shm/pool.h). A chunk is
// allocated by its sender and must be released exactly once, by whoever
// ends up with it: the receiving client after copying it out, or the daemon
// when a message is dropped. PoolPayload is that obligation as a value: it
// releases its chunk when it goes out of scope, unless Take() passed the
// chunk on (to a completion, or to a request that keeps it).
//
// Which descriptors carry a chunk is part of the wire contract and is
// answered here for both sides: PayloadOf(submission) for what a client
// hands the daemon, PayloadOf(completion) for what the daemon hands a
// client.
//
// Thread-safety: a PoolPayload is used by one thread; releasing is safe
// against the sender's concurrent reclaim (shm/pool.h).
#ifndef PSMD_SHM_PAYLOAD_H_
#define PSMD_SHM_PAYLOAD_H_

#include <cstdint>
#include <utility>

#include "shm/descriptor.h"
#include "shm/pool.h"

namespace psmd::shm {

class PoolPayload {
 public:
  PoolPayload() = default;
  PoolPayload(uint8_t* pool_base, uint64_t offset)
      : base_(pool_base), offset_(offset) {}
  PoolPayload(PoolPayload&& other) noexcept
      : base_(std::exchange(other.base_, nullptr)), offset_(other.offset_) {}
  PoolPayload& operator=(PoolPayload&& other) noexcept {
    if (this != &other) {
      Release();
      base_ = std::exchange(other.base_, nullptr);
      offset_ = other.offset_;
    }
    return *this;
  }
  PoolPayload(const PoolPayload&) = delete;
  PoolPayload& operator=(const PoolPayload&) = delete;
  ~PoolPayload() { Release(); }

  explicit operator bool() const { return base_ != nullptr; }
  const uint8_t* data() const { return base_ + offset_; }

  // Releases the chunk now (after its bytes were copied out).
  void Release() {
    if (base_ != nullptr) ReleaseChunk(base_, offset_);
    base_ = nullptr;
  }

  // Passes the chunk on without releasing it; returns its offset.
  uint64_t Take() {
    base_ = nullptr;
    return offset_;
  }

 private:
  uint8_t* base_ = nullptr;  // null: no chunk (inline, or passed on)
  uint64_t offset_ = 0;
};

// The chunk a validated submission carries (PayloadInPool), if any.
inline PoolPayload PayloadOf(uint8_t* pool_base, const SubmissionDesc& d) {
  if (!PayloadInPool(d)) return {};
  return PoolPayload(pool_base, d.body.pool.pool_offset);
}

// The chunk a completion hands its client, if any: eager and AM payloads
// not inline, a claimed eager message's, and every rendezvous chunk but
// the one psmd copied into place itself (kPayloadPlaced).
// (The offset is as the daemon wrote it; a daemon reading back a completion
// from client-writable memory must bound-check it first.)
inline bool CompletionCarriesChunk(const CompletionDesc& c) {
  switch (c.op) {
    case CompleteOp::kRndvChunk:
      return !(c.flags & kPayloadPlaced);
    case CompleteOp::kProbeDone:
      return (c.flags & kPayloadClaimed) && !(c.flags & kPayloadInline);
    case CompleteOp::kRecvDone:
    case CompleteOp::kAmRequest:
    case CompleteOp::kAmReply:
      return !(c.flags & kPayloadInline);
    default:
      return false;
  }
}

inline uint64_t ChunkOffsetOf(const CompletionDesc& c) {
  return c.op == CompleteOp::kRndvChunk ? c.body.chunk.pool_offset
                                        : c.body.pool.pool_offset;
}

inline PoolPayload PayloadOf(uint8_t* pool_base, const CompletionDesc& c) {
  if (!CompletionCarriesChunk(c)) return {};
  return PoolPayload(pool_base, ChunkOffsetOf(c));
}

}  // namespace psmd::shm

#endif  // PSMD_SHM_PAYLOAD_H_
