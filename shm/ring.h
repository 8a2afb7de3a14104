// Lock-free single-producer/single-consumer ring of fixed-size descriptors
// living in shared memory.
//
// Thread-safety: exactly one producer thread (in one process) and one
// consumer thread (in the same or another process) per ring. Each side keeps
// the authoritative copy of its own index in private memory; it never reads
// its own index back, because the other process can write anything it maps
// (the daemon trusts nothing a client can write).
//
// Protocol, with head = consumer index and tail = producer index, both
// free-running uint32 (wrap-around is harmless because capacity is a power of
// two no larger than 2^31):
//   1. 0 <= tail - head <= capacity.
//   2. Slots [head, tail) (mod capacity) hold published descriptors that only
//      the consumer may read; all other slots belong to the producer.
//   3. Publishing is per slot: bytes [2, 4) of every descriptor belong to the
//      ring (T::ring_seq), and the producer writes the rest of the slot, then
//      the slot's first word with ring_seq = SeqOf(index), the slot's lap
//      number + 1 (mod 2^16). The consumer polls the slot at head itself: it
//      is published when its ring_seq is SeqOf(head). A slot written a lap
//      earlier holds SeqOf(head - capacity), which differs; a fresh segment's
//      zeros differ from lap 0's 1. So the consumer waits on one cache line
//      per message, the one that carries the data, and the producer writes
//      only that line (an index beside the slots would be a second line to
//      bounce between the cores on every message).
//   4. The consumer publishes head (the only index in shared memory) after
//      copying slots out; the producer reads it only when its cached copy
//      says the ring is full. A head that violates (1) means the consumer
//      scribbled on the ring; the producer stops using it and reports
//      corrupt(). A producer that scribbles on slots can only publish
//      descriptors, which the consumer validates anyway.
//
// Memory ordering: the producer's store of a slot's first word is a release,
// the consumer's load of it an acquire, so the consumer sees the rest of the
// slot. The consumer copies slots out, then stores head with release; the
// producer loads head with acquire before overwriting those slots, so it
// never overwrites a slot still being copied.
#ifndef PSMD_SHM_RING_H_
#define PSMD_SHM_RING_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>

namespace psmd::shm {

inline constexpr size_t kCacheLine = 64;

// One index on its own cache line, so the consumer's stores to head do not
// invalidate the lines the producer writes (no false sharing).
struct alignas(kCacheLine) RingIndex {
  std::atomic<uint32_t> value;
  char pad[kCacheLine - sizeof(std::atomic<uint32_t>)];
};
static_assert(sizeof(RingIndex) == kCacheLine);
static_assert(std::atomic<uint32_t>::is_always_lock_free,
              "ring indices must be lock-free to work across processes");

// The shared part of a ring's bookkeeping.
struct RingControl {
  RingIndex head;  // written by the consumer only
};
static_assert(sizeof(RingControl) == kCacheLine);

inline constexpr bool IsPowerOfTwo(uint64_t x) {
  return x != 0 && (x & (x - 1)) == 0;
}

namespace ring_internal {

// The lap stamp of index `i` in a ring of 2^shift slots (protocol, 3).
inline uint16_t SeqOf(uint32_t i, uint32_t shift) {
  return static_cast<uint16_t>((i >> shift) + 1);
}

inline uint32_t ShiftOf(uint32_t capacity) {
  return static_cast<uint32_t>(__builtin_ctz(capacity));
}

// A slot's first word: bytes 0-1 of the descriptor, ring_seq in bytes 2-3.
template <typename T>
uint32_t* FirstWord(T* slot) {
  static_assert(offsetof(T, ring_seq) == 2 && sizeof(T::ring_seq) == 2,
                "the ring owns bytes [2, 4) of a descriptor");
  static_assert(alignof(T) >= 4 && sizeof(T) > 4);
  return reinterpret_cast<uint32_t*>(slot);
}

}  // namespace ring_internal

template <typename T>
class RingProducer {
  static_assert(std::is_trivially_copyable_v<T>);

 public:
  RingProducer() = default;
  // `capacity` comes from the caller's own records, never from shared memory.
  // Both sides start at index `start` (0 in a new segment).
  RingProducer(RingControl* control, T* slots, uint32_t capacity,
               uint32_t start = 0)
      : control_(control),
        slots_(slots),
        mask_(capacity - 1),
        shift_(ring_internal::ShiftOf(capacity)),
        tail_(start),
        // Where the consumer is, unknown (a producer resumed by a successor
        // process finds it anywhere up to a ring behind): as if the ring
        // were full, so that the first FreeSlots reads it.
        head_cache_(start - capacity) {}

  // Publishes one descriptor; false when the ring is full or corrupt.
  bool TryPush(const T& item) {
    if (FreeSlots() == 0) return false;
    T* slot = &slots_[tail_ & mask_];
    // Everything but the first word, then the first word (protocol, 3).
    std::memcpy(reinterpret_cast<char*>(slot) + 4,
                reinterpret_cast<const char*>(&item) + 4, sizeof(T) - 4);
    uint32_t first;
    std::memcpy(&first, &item, 2);
    first = (first & 0xffffu) | uint32_t{ring_internal::SeqOf(tail_, shift_)}
                                    << 16;
    // Release: the rest of the slot is visible before its stamp.
    __atomic_store_n(ring_internal::FirstWord(slot), first, __ATOMIC_RELEASE);
    tail_++;
    return true;
  }

  // Slots the producer can fill now (re-reads the consumer's index only when
  // the cached one says the ring is full).
  uint32_t FreeSlots() {
    if (corrupt_) return 0;
    uint32_t capacity = mask_ + 1;
    if (tail_ - head_cache_ < capacity) return capacity - (tail_ - head_cache_);
    // Acquire: pairs with the consumer's release store after copying out.
    uint32_t head = control_->head.value.load(std::memory_order_acquire);
    if (tail_ - head > capacity) {  // Invariant 1 broken by the peer.
      corrupt_ = true;
      return 0;
    }
    head_cache_ = head;
    return capacity - (tail_ - head_cache_);
  }

  // Calls f(item) for every published item the consumer has not taken (for
  // a consumer that is gone). A consumer index that breaks invariant 1
  // visits nothing. The items lie in shared memory: f must check them.
  template <typename F>
  void ForEachUnconsumed(F f) const {
    uint32_t head = control_->head.value.load(std::memory_order_acquire);
    if (tail_ - head > mask_ + 1) return;
    for (uint32_t i = head; i != tail_; i++) {
      T item;
      std::memcpy(&item, &slots_[i & mask_], sizeof(T));
      f(item);
    }
  }

  // True when nothing published is still unconsumed.
  bool Drained() {
    uint32_t head = control_->head.value.load(std::memory_order_acquire);
    return head == tail_;
  }

  bool corrupt() const { return corrupt_; }
  uint32_t capacity() const { return mask_ + 1; }
  // The next index to publish: private to the producer, so a successor
  // process (a handover, issue 33) starts its producer there (`start`).
  uint32_t position() const { return tail_; }

 private:
  RingControl* control_ = nullptr;
  T* slots_ = nullptr;
  uint32_t mask_ = 0;
  uint32_t shift_ = 0;
  uint32_t tail_ = 0;        // authoritative, private
  uint32_t head_cache_ = 0;  // last consumer index seen
  bool corrupt_ = false;
};

template <typename T>
class RingConsumer {
  static_assert(std::is_trivially_copyable_v<T>);

 public:
  RingConsumer() = default;
  RingConsumer(RingControl* control, T* slots, uint32_t capacity,
               uint32_t start = 0)
      : control_(control),
        slots_(slots),
        mask_(capacity - 1),
        shift_(ring_internal::ShiftOf(capacity)),
        head_(start),
        tail_cache_(start) {}

  // Copies out up to `max` descriptors (the copy is what gets validated:
  // a producer cannot change a descriptor after the consumer checked it).
  size_t PopBatch(T* out, size_t max) {
    uint32_t available = Available();
    size_t n = available < max ? available : max;
    for (size_t i = 0; i < n; i++) {
      std::memcpy(&out[i], &slots_[(head_ + i) & mask_], sizeof(T));
    }
    if (n > 0) {
      head_ += static_cast<uint32_t>(n);
      // Release: our copies are complete before the producer may reuse slots.
      control_->head.value.store(head_, std::memory_order_release);
    }
    return n;
  }

  bool TryPop(T* out) { return PopBatch(out, 1) == 1; }

  // Published, unconsumed descriptors: those seen before, else the run of
  // published slots from head (at most kScan of them, so a full ring costs
  // a poll a bounded number of lines).
  uint32_t Available() {
    if (tail_cache_ != head_) return tail_cache_ - head_;
    uint32_t n = 0;
    const uint32_t most = mask_ + 1 < kScan ? mask_ + 1 : kScan;
    while (n < most && Published(head_ + n)) n++;
    tail_cache_ = head_ + n;
    return n;
  }

  // Available() counted on past its cached run, up to the whole ring: how
  // many are published now, for a consumer that leaves them there (psmd
  // holding a sender) and asks whether the producer published more.
  uint32_t Rescan() {
    uint32_t n = tail_cache_ - head_;
    while (n <= mask_ && Published(head_ + n)) n++;
    tail_cache_ = head_ + n;
    return n;
  }

  uint32_t capacity() const { return mask_ + 1; }
  // The next index to consume (published in the control block too, where
  // the producer could overwrite it: a successor starts from this one).
  uint32_t position() const { return head_; }

 private:
  static constexpr uint32_t kScan = 64;

  bool Published(uint32_t i) const {
    // Acquire: pairs with the producer's release store of the first word.
    uint32_t first = __atomic_load_n(
        ring_internal::FirstWord(&slots_[i & mask_]), __ATOMIC_ACQUIRE);
    return (first >> 16) == ring_internal::SeqOf(i, shift_);
  }

  RingControl* control_ = nullptr;
  T* slots_ = nullptr;
  uint32_t mask_ = 0;
  uint32_t shift_ = 0;
  uint32_t head_ = 0;        // authoritative, private
  uint32_t tail_cache_ = 0;  // head_ + the published run seen last
};

}  // namespace psmd::shm

#endif  // PSMD_SHM_RING_H_
