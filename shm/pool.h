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

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <iterator>
#include <map>
#include <optional>
#include <string>
#include <vector>

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

// How long allocations in a region may keep failing before it counts as
// stalled: its allocator then sets chunks aside (below), and the library
// sends eager messages by rendezvous. Far above the time a draining
// receiver takes, far below a test's patience.
inline constexpr uint64_t kPoolStallNs = 10'000'000;

// How long a chunk may stay in use, as its allocator is told: kBrief, a
// payload its receiver takes as soon as it can (a rendezvous chunk, an active
// message, a message already matched); kMayLinger, an eager message a
// receiver may take last of all. Lingering chunks may hold at most half of
// a region (kMayLingerPastShare ignores that, for a payload with nowhere
// else to go), so the chunks of a transfer a receiver waits for always find
// room however many messages wait unreceived before it. A lingering payload
// refused for its share waits like one refused for a full region, and
// counts towards Stalled() likewise: a receiver that drains gets its
// messages eager as before.
enum class ChunkUse { kBrief, kMayLinger, kMayLingerPastShare };

// A byte ring over one send region: chunks are allocated at the head and
// reclaimed at the tail once released, so reclaim is in allocation order.
// A region found empty starts over at its start for a small chunk
// (RewindIfEmpty).
//
// A chunk can stay in use for as long as its receiver likes (an unexpected
// message the application receives last). So that it cannot stop the ring
// behind it for good, a region that has refused space for `stall_ns` sets
// the unreleased chunks at its tail aside: the tail moves past them, and the
// head later skips their bytes (as padding) until they are released. The
// clock is read only while the region refuses. Invariants:
//   1. Chunks in chunks_ tile [tail_, head_) (free-running byte counters)
//      and never straddle the end of the region; head_ - tail_ <= region.
//   2. A chunk set aside lies outside [tail_, head_) or under padding: no
//      allocation overlaps a chunk that is not released.
//   3. lingering_ is the footprint of the lingering chunks in chunks_ and
//      set_aside_ (a released one set aside counts until it is forgotten:
//      ShareFull looks at up to kMaxStepsPerCall of them per call).
class SendArena {
 public:
  SendArena() = default;
  SendArena(uint8_t* pool_base, uint64_t region_offset, uint64_t region_bytes,
            uint64_t stall_ns = kPoolStallNs)
      : base_(pool_base),
        region_offset_(region_offset),
        region_bytes_(region_bytes),
        stall_ns_(stall_ns) {}

  // The largest payload one chunk can hold.
  uint64_t MaxPayload() const { return region_bytes_ - kChunkHeaderBytes; }
  // Region bytes a payload of `bytes` takes.
  static uint64_t Footprint(uint64_t bytes) {
    return RoundUp(bytes + kChunkHeaderBytes);
  }

  // Returns the pool offset of a payload area of `bytes`, or nothing when the
  // region is full right now, or for kMayLinger when lingering chunks hold
  // their share (the caller retries after receivers drain; once that has
  // lasted stall_ns, Stalled()).
  std::optional<uint64_t> Allocate(uint64_t bytes,
                                   ChunkUse use = ChunkUse::kBrief) {
    const uint64_t need = Footprint(bytes);
    if (need > region_bytes_) return std::nullopt;
    if (use != ChunkUse::kMayLinger) {
      Reclaim();  // (ShareFull does)
    } else {
      if (ShareFull(bytes)) {
        if (share_refused_since_ns_ == 0) share_refused_since_ns_ = NowNs();
        return std::nullopt;
      }
      share_refused_since_ns_ = 0;
    }
    const bool lingers = use != ChunkUse::kBrief;
    RewindIfEmpty(need);
    auto off = Place(need, /*set_aside=*/false, lingers);
    if (!off) {
      if (refused_since_ns_ == 0) {
        refused_since_ns_ = NowNs();
        return std::nullopt;
      }
      if (!RefusedFor(refused_since_ns_)) return std::nullopt;
      off = Place(need, /*set_aside=*/true, lingers);
      if (!off) return std::nullopt;
    }
    refused_since_ns_ = 0;
    return off;
  }

  // Whether a lingering payload of `bytes` would exceed the lingering
  // chunks' share of the region (half).
  bool ShareFull(uint64_t bytes) {
    Reclaim();
    ForgetReleasedSetAside();
    return lingering_ + Footprint(bytes) > region_bytes_ / 2;
  }

  // Whether the region, or the lingering chunks' share of it, has refused
  // space for stall_ns.
  bool Stalled() const {
    return RefusedFor(refused_since_ns_) || RefusedFor(share_refused_since_ns_);
  }
  // Forgets earlier refusals (nothing waits for space any more).
  void ForgetRefusals() { refused_since_ns_ = share_refused_since_ns_ = 0; }

  // Bytes between tail and head (including padding; not chunks set aside).
  uint64_t used() const { return head_ - tail_; }
  bool empty() const { return head_ == tail_ && set_aside_.empty(); }

  // What the arena keeps beside the region's chunk headers, for a handover
  // (docs/design.md, "Handover"): a successor adopts it with Adopt.
  struct State {
    uint64_t head = 0;
    uint64_t tail = 0;
    struct Piece {
      uint64_t at = 0;  // region offset (set aside), or unused (in the ring)
      uint64_t bytes = 0;
      bool is_padding = false;
      bool lingers = false;
    };
    std::vector<Piece> ring;       // tiling [tail, head), in order
    std::vector<Piece> set_aside;  // by region offset
    // The refusal clocks (CLOCK_MONOTONIC: one clock for the machine) and
    // where the sweep of released chunks set aside resumes.
    uint64_t refused_since_ns = 0;
    uint64_t share_refused_since_ns = 0;
    uint64_t sweep_from = 0;
  };
  State Save() const {
    State s;
    s.head = head_;
    s.tail = tail_;
    s.refused_since_ns = refused_since_ns_;
    s.share_refused_since_ns = share_refused_since_ns_;
    s.sweep_from = sweep_from_;
    for (const Chunk& c : chunks_) {
      s.ring.push_back({0, c.bytes, c.is_padding, c.lingers});
    }
    for (const auto& [at, a] : set_aside_) {
      s.set_aside.push_back({at, a.bytes, false, a.lingers});
    }
    return s;
  }
  // Takes over `s` (of an arena over the same region) when it keeps the
  // invariants above: pieces of cache lines, the ring's tiling [tail, head)
  // without straddling the region's end, set-aside ones inside the region,
  // apart from one another and from the ring. False (*why) changes nothing.
  bool Adopt(const State& s, std::string* why) {
    auto fail = [why](const char* what) {
      *why = std::string("inbox arena: ") + what;
      return false;
    };
    if (s.head < s.tail || s.head - s.tail > region_bytes_ ||
        s.head % kCacheLine != 0 || s.tail % kCacheLine != 0) {
      return fail("head and tail off lines, a region apart or reversed");
    }
    if (s.ring.size() + s.set_aside.size() > region_bytes_ / kCacheLine) {
      return fail("more pieces than the region has lines");
    }
    std::deque<Chunk> chunks;
    uint64_t lingering = 0;
    // The ring's chunks by region offset (none straddles the end), for the
    // set-aside check below.
    std::map<uint64_t, uint64_t> occupied;
    uint64_t at = s.tail;
    for (const State::Piece& p : s.ring) {
      if (p.bytes == 0 || p.bytes % kCacheLine != 0 || p.bytes > s.head - at ||
          at % region_bytes_ + p.bytes > region_bytes_ ||
          (p.is_padding && p.lingers)) {
        return fail("a piece of the ring out of shape");
      }
      chunks.push_back(Chunk{p.bytes, p.is_padding, p.lingers});
      if (!p.is_padding) occupied.emplace(at % region_bytes_, p.bytes);
      if (p.lingers) lingering += p.bytes;
      at += p.bytes;
    }
    if (at != s.head) return fail("the ring does not reach its head");
    std::map<uint64_t, SetAside> set_aside;
    uint64_t end = 0;
    for (const State::Piece& p : s.set_aside) {
      if (p.bytes == 0 || p.bytes % kCacheLine != 0 || p.at % kCacheLine != 0 ||
          p.at < end || p.at > region_bytes_ ||
          p.bytes > region_bytes_ - p.at || p.is_padding) {
        return fail("a piece set aside out of shape or overlapping");
      }
      // Under padding or outside the ring, never under one of its chunks
      // (invariant 2).
      auto next = occupied.lower_bound(p.at);
      if ((next != occupied.end() && next->first < p.at + p.bytes) ||
          (next != occupied.begin() &&
           std::prev(next)->first + std::prev(next)->second > p.at)) {
        return fail("a piece set aside under a chunk of the ring");
      }
      end = p.at + p.bytes;
      set_aside.emplace(p.at, SetAside{p.bytes, p.lingers});
      if (p.lingers) lingering += p.bytes;
    }
    head_ = s.head;
    tail_ = s.tail;
    chunks_ = std::move(chunks);
    set_aside_ = std::move(set_aside);
    lingering_ = lingering;
    refused_since_ns_ = s.refused_since_ns;
    share_refused_since_ns_ = s.share_refused_since_ns;
    sweep_from_ = s.sweep_from;
    return true;
  }

  void Reclaim() {
    while (!chunks_.empty()) {
      const Chunk& c = chunks_.front();
      if (!c.is_padding && !Released(tail_ % region_bytes_)) return;
      if (c.lingers) lingering_ -= c.bytes;
      tail_ += c.bytes;
      chunks_.pop_front();
    }
  }

 private:
  struct Chunk {
    uint64_t bytes;
    bool is_padding;
    bool lingers;  // counted in lingering_
  };
  struct SetAside {
    uint64_t bytes;
    bool lingers;
  };
  static constexpr int kMaxStepsPerCall = 256;
  static uint64_t RoundUp(uint64_t n) {
    return (n + kCacheLine - 1) / kCacheLine * kCacheLine;
  }
  bool RefusedFor(uint64_t since_ns) const {
    return since_ns != 0 && NowNs() - since_ns >= stall_ns_;
  }
  static uint64_t NowNs() {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(
               std::chrono::steady_clock::now().time_since_epoch())
        .count();
  }

  // Allocate's search for `need` bytes; with `set_aside`, unreleased chunks
  // at the tail are set aside when they are in the way.
  // The caller has reclaimed.
  std::optional<uint64_t> Place(uint64_t need, bool set_aside, bool lingers) {
    uint64_t skipped = 0;  // padding laid in this call: at most one lap
    // Each step (a chunk set aside, a skip) persists, so a call may stop
    // early: a region full of chunks set aside costs a bounded effort per
    // try (the daemon's worker tries a job's inbox on every pass).
    for (int steps = 0; steps < kMaxStepsPerCall; steps++) {
      const uint64_t pos = head_ % region_bytes_;
      uint64_t skip = 0;
      if (pos + need > region_bytes_) {
        skip = region_bytes_ - pos;  // the tail end is too short
      } else if (const uint64_t end = SetAsideEndIn(pos, pos + need)) {
        skip = end - pos;  // a chunk set aside is in the way (invariant 2)
      }
      if (used() + (skip > 0 ? skip : need) > region_bytes_) {
        const uint64_t tail = tail_;
        if (set_aside && SetAsideTail()) continue;
        Reclaim();
        if (tail_ != tail) continue;  // padding at the tail went
        return std::nullopt;
      }
      if (skip > 0) {
        skipped += skip;
        if (skipped > region_bytes_) return std::nullopt;
        chunks_.push_back(Chunk{skip, /*is_padding=*/true, false});
        head_ += skip;
        continue;
      }
      chunks_.push_back(Chunk{need, false, lingers});
      if (lingers) lingering_ += need;
      head_ += need;
      uint64_t payload_offset = region_offset_ + pos + kChunkHeaderBytes;
      ChunkOf(base_, payload_offset)
          ->state.store(kChunkInUse, std::memory_order_relaxed);
      return payload_offset;
    }
    return std::nullopt;
  }

  // With nothing in the region (nor set aside: rewinding over those would
  // skip them again at every call), a chunk of at most kRewindMaxBytes goes
  // to the start of the region: a ping-pong, which empties its ring after
  // every message, then reuses the same few pages (hot in cache, mapped
  // long ago) instead of walking the whole region, whose first pass costs
  // a first touch of every page in every process that maps it
  // (docs/perf.md, "The first pass through a region"). Not larger ones: a
  // rendezvous chunk written where its predecessor was just read makes the
  // writer take every line back from the reader's cache (256 KiB ping-pong
  // 33-39 -> 62 us). Keeps invariant 1: both counters move to the next lap.
  static constexpr uint64_t kRewindMaxBytes = 64 << 10;
  void RewindIfEmpty(uint64_t need) {
    if (need > kRewindMaxBytes || !empty() || head_ % region_bytes_ == 0)
      return;
    head_ += region_bytes_ - head_ % region_bytes_;
    tail_ = head_;
  }

  bool Released(uint64_t pos) const {
    // Acquire: the receiver finished reading before we overwrite.
    return ChunkOf(base_, region_offset_ + pos + kChunkHeaderBytes)
               ->state.load(std::memory_order_acquire) == kChunkReleased;
  }

  // Moves the unreleased chunk at the tail aside; false if there is none.
  bool SetAsideTail() {
    Reclaim();
    if (chunks_.empty()) return false;
    const Chunk c = chunks_.front();  // unreleased and not padding (Reclaim)
    set_aside_.insert_or_assign(tail_ % region_bytes_,
                                SetAside{c.bytes, c.lingers});
    tail_ += c.bytes;
    chunks_.pop_front();
    Reclaim();
    return true;
  }

  // The end of the first unreleased chunk set aside that overlaps
  // [begin, end) of the region, or 0; forgets the released ones it meets.
  // Chunks set aside never overlap one another (an allocation over a
  // released one forgets it first), so the candidates are the last one
  // starting before `begin` and those starting in [begin, end).
  uint64_t SetAsideEndIn(uint64_t begin, uint64_t end) {
    auto it = set_aside_.lower_bound(begin);
    if (it != set_aside_.begin()) {
      auto before = std::prev(it);
      if (before->first + before->second.bytes > begin) it = before;
    }
    while (it != set_aside_.end() && it->first < end) {
      if (!Released(it->first)) return it->first + it->second.bytes;
      it = Forget(it);
    }
    return 0;
  }

  std::map<uint64_t, SetAside>::iterator Forget(
      std::map<uint64_t, SetAside>::iterator it) {
    if (it->second.lingers) lingering_ -= it->second.bytes;
    return set_aside_.erase(it);
  }

  // Forgets the released chunks among at most kMaxStepsPerCall set aside,
  // resuming where the last call stopped, so their share comes back.
  void ForgetReleasedSetAside() {
    if (set_aside_.empty()) return;
    auto it = set_aside_.lower_bound(sweep_from_);
    const size_t steps_max =
        std::min<size_t>(kMaxStepsPerCall, set_aside_.size());
    for (size_t steps = 0; steps < steps_max; steps++) {
      if (it == set_aside_.end()) it = set_aside_.begin();
      if (it == set_aside_.end()) break;
      it = Released(it->first) ? Forget(it) : std::next(it);
    }
    sweep_from_ = it == set_aside_.end() ? 0 : it->first;
  }

  uint8_t* base_ = nullptr;
  uint64_t region_offset_ = 0;
  uint64_t region_bytes_ = 0;
  uint64_t stall_ns_ = kPoolStallNs;
  uint64_t head_ = 0;  // free-running byte counters
  uint64_t tail_ = 0;
  uint64_t refused_since_ns_ = 0;        // first refusal since the last success
  uint64_t share_refused_since_ns_ = 0;  // likewise, of the lingering share
  std::deque<Chunk> chunks_;
  std::map<uint64_t, SetAside> set_aside_;  // by region offset
  uint64_t lingering_ = 0;                  // invariant 3
  uint64_t sweep_from_ = 0;  // where ForgetReleasedSetAside resumes
};

}  // namespace psmd::shm

#endif  // PSMD_SHM_POOL_H_
