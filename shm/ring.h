// Lock-free single-producer/single-consumer ring of fixed-size descriptors
// living in shared memory.
//
// Thread-safety: exactly one producer thread (in one process) and one
// consumer thread (in the same or another process) per ring. Each side keeps
// the authoritative copy of its own index in private memory and only stores it
// to shared memory; it never reads its own index back, because the other
// process can write anything it maps (the daemon trusts nothing a client can
// write).
//
// Invariants, with head = consumer index and tail = producer index, both
// free-running uint32 (wrap-around is harmless because capacity is a power of
// two no larger than 2^31):
//   1. 0 <= tail - head <= capacity.
//   2. Slots [head, tail) (mod capacity) hold published descriptors that only
//      the consumer may read; all other slots belong to the producer.
//   3. A peer index that violates (1) means the peer scribbled on the ring;
//      the side that sees it stops using the ring and reports corrupt().
//
// Memory ordering: the producer writes the slot, then stores tail with
// release; the consumer loads tail with acquire before reading slots, so it
// sees the slot contents. The consumer copies slots out, then stores head with
// release; the producer loads head with acquire before overwriting those slots,
// so it never overwrites a slot still being copied.
#ifndef PSMD_SHM_RING_H_
#define PSMD_SHM_RING_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>

namespace psmd::shm {

inline constexpr size_t kCacheLine = 64;

// One index on its own cache line, so the producer's stores to tail do not
// invalidate the line the producer reads head from (no false sharing).
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
  RingIndex tail;  // written by the producer only
};
static_assert(sizeof(RingControl) == 2 * kCacheLine);

inline constexpr bool IsPowerOfTwo(uint64_t x) {
  return x != 0 && (x & (x - 1)) == 0;
}

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
        tail_(start),
        head_cache_(start) {}

  // Publishes one descriptor; false when the ring is full or corrupt.
  bool TryPush(const T& item) {
    if (FreeSlots() == 0) return false;
    std::memcpy(&slots_[tail_ & mask_], &item, sizeof(T));
    tail_++;
    // Release: the slot contents become visible before the new tail.
    control_->tail.value.store(tail_, std::memory_order_release);
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

 private:
  RingControl* control_ = nullptr;
  T* slots_ = nullptr;
  uint32_t mask_ = 0;
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

  // Published, unconsumed descriptors (re-reads the producer's index only
  // when the cached one says the ring is empty).
  uint32_t Available() {
    if (corrupt_) return 0;
    if (tail_cache_ != head_) return tail_cache_ - head_;
    // The next slot is the line we read first if tail moved: fetching it
    // alongside tail overlaps the two misses instead of paying them one
    // after the other (a consumer that polls an idle ring re-fetches a line
    // it already holds; the producer invalidates it when it writes, as it
    // would have to anyway for a line we read a lap ago).
    __builtin_prefetch(&slots_[head_ & mask_]);
    // Acquire: pairs with the producer's release store of tail.
    uint32_t tail = control_->tail.value.load(std::memory_order_acquire);
    if (tail - head_ > mask_ + 1) {  // Invariant 1 broken by the peer.
      corrupt_ = true;
      return 0;
    }
    tail_cache_ = tail;
    return tail_cache_ - head_;
  }

  bool corrupt() const { return corrupt_; }
  uint32_t capacity() const { return mask_ + 1; }

 private:
  RingControl* control_ = nullptr;
  T* slots_ = nullptr;
  uint32_t mask_ = 0;
  uint32_t head_ = 0;        // authoritative, private
  uint32_t tail_cache_ = 0;  // last producer index seen
  bool corrupt_ = false;
};

}  // namespace psmd::shm

#endif  // PSMD_SHM_RING_H_
