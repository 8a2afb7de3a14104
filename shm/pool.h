// Payload chunks in a job pool, and the sender's allocator for its region.
//
// A chunk is a 64-byte ChunkHeader followed by the payload, 64-byte aligned.
// The only shared word is the header's state: the sender writes kInUse before
// publishing the send, the receiver (or the daemon, for a message nobody will
// receive) writes kReleased after copying. Chunk sizes and order live in the
// sender's private memory, so a peer scribbling on the pool cannot make the
// sender's allocator walk off its region.
//
// Thread-safety: SendArena belongs to one sender endpoint and is used under
// that endpoint's lock. ReleaseChunk may be called by any process mapping the
// pool.
#ifndef PSMD_SHM_POOL_H_
#define PSMD_SHM_POOL_H_

#include <atomic>
#include <cstdint>
#include <deque>
#include <optional>

#include "shm/ring.h"

namespace psmd::shm {

enum ChunkState : uint32_t { kChunkReleased = 0, kChunkInUse = 1 };

struct alignas(kCacheLine) ChunkHeader {
  std::atomic<uint32_t> state;
};
static_assert(sizeof(ChunkHeader) == kCacheLine);

inline constexpr uint64_t kChunkHeaderBytes = sizeof(ChunkHeader);

inline ChunkHeader* ChunkOf(uint8_t* pool_base, uint64_t payload_offset) {
  return reinterpret_cast<ChunkHeader*>(pool_base + payload_offset -
                                        kChunkHeaderBytes);
}

// Called once the payload at `payload_offset` has been copied out.
inline void ReleaseChunk(uint8_t* pool_base, uint64_t payload_offset) {
  // Release: our reads of the payload happen before the sender may reuse it.
  ChunkOf(pool_base, payload_offset)
      ->state.store(kChunkReleased, std::memory_order_release);
}

// A byte ring over one send region: chunks are allocated at the head and
// reclaimed at the tail once released, so reclaim is in allocation order.
class SendArena {
 public:
  SendArena() = default;
  SendArena(uint8_t* pool_base, uint64_t region_offset, uint64_t region_bytes)
      : base_(pool_base),
        region_offset_(region_offset),
        region_bytes_(region_bytes) {}

  // The largest payload one chunk can hold.
  uint64_t MaxPayload() const { return region_bytes_ - kChunkHeaderBytes; }

  // Returns the pool offset of a payload area of `bytes`, or nothing when the
  // region is full right now (the caller retries after receivers drain).
  std::optional<uint64_t> Allocate(uint64_t bytes) {
    uint64_t need = RoundUp(bytes + kChunkHeaderBytes);
    if (need > region_bytes_) return std::nullopt;
    Reclaim();
    uint64_t pos = head_ % region_bytes_;
    uint64_t pad = (pos + need > region_bytes_) ? region_bytes_ - pos : 0;
    if (used() + pad + need > region_bytes_) return std::nullopt;
    if (pad > 0) {
      // The tail end is too short: skip it with a chunk nobody will release.
      chunks_.push_back(Chunk{pad, /*is_padding=*/true});
      head_ += pad;
      pos = 0;
    }
    chunks_.push_back(Chunk{need, false});
    head_ += need;
    uint64_t payload_offset = region_offset_ + pos + kChunkHeaderBytes;
    ChunkOf(base_, payload_offset)
        ->state.store(kChunkInUse, std::memory_order_relaxed);
    return payload_offset;
  }

  // Bytes of the region currently allocated (including padding).
  uint64_t used() const { return head_ - tail_; }
  bool empty() const { return head_ == tail_; }

  void Reclaim() {
    while (!chunks_.empty()) {
      const Chunk& c = chunks_.front();
      if (!c.is_padding) {
        uint64_t payload_offset =
            region_offset_ + tail_ % region_bytes_ + kChunkHeaderBytes;
        // Acquire: the receiver finished reading before we overwrite.
        if (ChunkOf(base_, payload_offset)
                ->state.load(std::memory_order_acquire) != kChunkReleased) {
          return;
        }
      }
      tail_ += c.bytes;
      chunks_.pop_front();
    }
  }

 private:
  struct Chunk {
    uint64_t bytes;
    bool is_padding;
  };
  static uint64_t RoundUp(uint64_t n) {
    return (n + kCacheLine - 1) / kCacheLine * kCacheLine;
  }

  uint8_t* base_ = nullptr;
  uint64_t region_offset_ = 0;
  uint64_t region_bytes_ = 0;
  uint64_t head_ = 0;  // free-running byte counters
  uint64_t tail_ = 0;
  std::deque<Chunk> chunks_;
};

}  // namespace psmd::shm

#endif  // PSMD_SHM_POOL_H_
