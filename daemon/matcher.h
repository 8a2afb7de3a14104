// matcher.h: the two matched queues of PSM2 MQ tag matching.
//
//   PostedQueue<RecvT>      receives posted before their message arrived.
//                           An arriving message takes the EARLIEST-POSTED
//                           receive that matches it (MPI ordering).
//   UnexpectedQueue<MsgT>   messages that arrived before a matching receive.
//                           A posted receive or a probe takes/sees the
//                           EARLIEST-ARRIVED message that matches it.
//
// Matching rule: see matches() in tag.h.
//
// Thread safety: NOT thread-safe. Each queue is owned by exactly one progress
// worker and is only touched from that worker's thread; there is no internal
// locking. A remove_first_if() predicate must not touch the queue; a drain()
// callback may (the queue is already empty when it runs).
//
// Design (the PSM2/UCX approach):
//   - Posted: receives whose selector compares all 96 bits ("exact tag") sit
//     in per-tag FIFO buckets found through a hash table, all others in one
//     wildcard array in posting order. A monotonic per-entry sequence stamp
//     picks the earlier of the bucket's and the wildcard array's first match.
//   - Unexpected: every message is in its tag's FIFO bucket and in one
//     arrival log (an array in arrival order; a message's position in it is
//     its arrival stamp). Exact-tag receives look only in the bucket;
//     wildcard receives scan the log.
// So an exact-tag match costs O(1) whatever the queue depth, and wildcards
// cost what they must (a scan), with MPI ordering preserved across both.
//
// Why it is laid out as it is: at depth the cost of an exact match is cache
// misses plus branch mispredictions, and a misprediction that waits on a miss
// also throws away the misses the CPU had started for the next operation.
// So an exact match touches two cache lines that are not already hot (the
// hash table group of its tag and the entry itself), the hash table compares
// a whole group at once rather than branching per probe, and nothing on the
// exact path walks a linked list of other entries. Wildcard scans read arrays
// front to back instead of chasing pointers.
//
// Entries come from chunked pools with free lists and are linked by 32-bit
// indices: steady-state operations do not allocate, and memory is bounded by
// the peak number of live entries (at most 2^30 per queue).
//
// RecvT/MsgT: movable value types with a non-throwing move constructor (small
// structs). Values are moved in on post/push and moved out on removal.

#ifndef PSMD_DAEMON_MATCHER_H_
#define PSMD_DAEMON_MATCHER_H_

#include <emmintrin.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <memory>
#include <new>
#include <optional>
#include <stdexcept>
#include <type_traits>
#include <utility>
#include <vector>

#include "daemon/tag.h"

namespace psmd {
namespace matcher_internal {

// Entries are addressed by 32-bit pool indices rather than pointers: half the
// link size, and indices stay valid when the pool grows.
using Index = uint32_t;
inline constexpr Index kNil = std::numeric_limits<Index>::max();

struct Link {
  Index prev = kNil;
  Index next = kNil;
};

// Hash buckets are FIFO lists of pool nodes known only by their head index,
// so that a hash slot is 4 bytes. To append in O(1) the head's `prev` points
// at the tail (the tail's `next` is still kNil, so forward iteration is
// unchanged). `nodes` is anything indexable by Index whose elements have a
// Link member `chain`.
template <typename Nodes>
void bucket_push_back(Nodes& nodes, Index& head, Index i) {
  Link& l = nodes[i].chain;
  l.next = kNil;
  if (head == kNil) {
    l.prev = i;
    head = i;
    return;
  }
  Link& h = nodes[head].chain;
  l.prev = h.prev;
  nodes[h.prev].chain.next = i;
  h.prev = i;
}

template <typename Nodes>
void bucket_unlink(Nodes& nodes, Index& head, Index i) {
  const Link l = nodes[i].chain;
  if (i == head) {
    head = l.next;
    if (head != kNil) nodes[head].chain.prev = l.prev;  // the tail
    return;
  }
  nodes[l.prev].chain.next = l.next;
  if (l.next == kNil) {
    nodes[head].chain.prev = l.prev;  // i was the tail
  } else {
    nodes[l.next].chain.prev = l.prev;
  }
}

// Raw storage for one T inside a node or array entry. The owner knows which
// slots are live and constructs/destroys values explicitly; std::optional
// would add a flag (and padding) to every entry.
template <typename T>
class ValueSlot {
 public:
  void construct(T&& v) { ::new (static_cast<void*>(buf_)) T(std::move(v)); }
  T& get() { return *std::launder(reinterpret_cast<T*>(buf_)); }
  const T& get() const { return *std::launder(reinterpret_cast<const T*>(buf_)); }
  // Moves the value out and ends its lifetime.
  T take() {
    T v = std::move(get());
    get().~T();
    return v;
  }
  void destroy() { get().~T(); }

 private:
  alignas(T) unsigned char buf_[sizeof(T)];
};

// Fixed-size chunks of nodes plus a free list threaded through
// `Node::chain.next`. Chunks (not one growing vector) so growth never moves
// live nodes: no latency spike from copying a deep queue, and pointers handed
// out by find() stay valid until that node is removed. Memory is bounded by
// the peak number of live nodes and reused afterwards. The pool never touches
// node values: the queue constructs and destroys them.
template <typename Node>
class NodePool {
 public:
  Node& operator[](Index i) { return chunks_[i >> kChunkBits][i & kChunkMask]; }
  const Node& operator[](Index i) const { return chunks_[i >> kChunkBits][i & kChunkMask]; }

  // Returns an unused node; the caller fills in every field.
  Index acquire() {
    if (free_ == kNil) grow();
    const Index i = free_;
    free_ = (*this)[i].chain.next;
    return i;
  }

  // Puts a node (whose value the caller has already destroyed or moved out)
  // back on the free list. LIFO, so a post right after a match reuses the
  // node that is hot in cache.
  void release(Index i) {
    (*this)[i].chain.next = free_;
    free_ = i;
  }

 private:
  static constexpr unsigned kChunkBits = 9;  // 512 nodes per chunk
  static constexpr Index kChunkSize = Index{1} << kChunkBits;
  static constexpr Index kChunkMask = kChunkSize - 1;
  // 2^30 nodes, so that arrival-log positions (up to about twice the live
  // count) fit in 32 bits.
  static constexpr size_t kMaxChunks = (size_t{1} << 30) >> kChunkBits;

  void grow() {
    if (chunks_.size() >= kMaxChunks) throw std::length_error("matcher: node pool full");
    const Index base = static_cast<Index>(chunks_.size()) * kChunkSize;
    chunks_.push_back(std::make_unique<Node[]>(kChunkSize));
    // Thread the new chunk onto the free list in index order so that a
    // freshly filled queue is laid out sequentially in memory.
    for (Index k = kChunkSize; k-- > 0;) {
      (*this)[base + k].chain.next = free_;
      free_ = base + k;
    }
  }

  std::vector<std::unique_ptr<Node[]>> chunks_;
  Index free_ = kNil;
};

// Open-addressing hash table from a tag to the head node of its bucket.
//
// Slots come in groups of 8 that fill one cache line: 8 32-bit fingerprints
// (hash bits of the tag), then the 8 bucket heads. A tag's home group is
// picked by the top bits of its fingerprint; lookups compare all 8
// fingerprints of a group in one SSE2 operation and go on to the next group
// only if the group has no empty slot (Swiss-table probing). At the load
// factors kept here a lookup nearly always ends in its home group, so it
// costs one cache line and branches that go the same way every time. The
// tag itself is read from the head node, which the caller touches anyway; a
// fingerprint false positive (odds ~2^-17 per slot at 64 Ki buckets) costs
// one extra node read.
//
// Invariants:
//   (1) A slot's fingerprint is kEmpty, kDeleted (a tombstone) or >= 2
//       (live: its head is a node of that bucket).
//   (2) Every live slot lies in its home group or in a later group (cyclic
//       order) that it reached by passing only groups without an kEmpty
//       slot: lookups may stop at the first group with an kEmpty slot.
//   (3) A group that has been full since the last rehash has no kEmpty
//       slot: erasing there leaves a tombstone, so (2) survives erasure.
//   (4) used_ (live + tombstones) <= 7/8 of the slots, so some group has an
//       kEmpty slot and every probe loop ends.
//   (5) live_ counts the live slots; the caller links a node into a slot
//       before the next call (no empty buckets), and erases the slot when
//       its bucket empties.
class TagIndex {
 public:
  static constexpr size_t npos = ~size_t{0};

  static uint32_t fingerprint(const Tag96& tag) {
    const auto f = static_cast<uint32_t>(Tag96Hash{}(tag));
    return f < kLive ? f + kLive : f;  // (1): kEmpty and kDeleted are taken
  }

  // Slot position of the bucket for `tag` (whose fingerprint is `fp`), or
  // npos. tag_of(Index) returns the tag of a node.
  template <typename TagOf>
  size_t find(const Tag96& tag, uint32_t fp, TagOf tag_of) const {
    if (live_ == 0) return npos;
    for (size_t g = home(fp);; g = (g + 1) & gmask_) {
      const Group& grp = groups_[g];
      for (unsigned m = grp.match(fp); m != 0; m &= m - 1) {
        const unsigned j = lowest_bit(m);
        if (tag_of(grp.head[j]) == tag) return g * kWidth + j;
      }
      if (grp.match(kEmpty) != 0) return npos;
    }
  }

  // Grows or cleans the table if needed so that the next find_or_insert()
  // neither allocates nor throws. Invalidates earlier positions.
  void reserve_one() {
    if (used_ >= max_used()) rehash();
  }

  // Like find(), but creates the bucket (with head kNil) if absent. The
  // caller must link a node into it before the next call (invariant 5).
  // Call reserve_one() first.
  template <typename TagOf>
  size_t find_or_insert(const Tag96& tag, uint32_t fp, TagOf tag_of) {
    size_t free_pos = npos;
    for (size_t g = home(fp);; g = (g + 1) & gmask_) {
      const Group& grp = groups_[g];
      for (unsigned m = grp.match(fp); m != 0; m &= m - 1) {
        const unsigned j = lowest_bit(m);
        if (tag_of(grp.head[j]) == tag) return g * kWidth + j;
      }
      const unsigned empty = grp.match(kEmpty);
      if (free_pos == npos) {
        // Reuse the first tombstone or empty slot on the probe path: it lies
        // before the first group with an empty slot, so (2) holds.
        const unsigned f = empty | grp.match(kDeleted);
        if (f != 0) free_pos = g * kWidth + lowest_bit(f);
      }
      if (empty != 0) break;
    }
    Group& grp = groups_[free_pos / kWidth];
    if (grp.fp[free_pos % kWidth] == kEmpty) ++used_;
    grp.set_fp(free_pos % kWidth, fp);
    grp.head[free_pos % kWidth] = kNil;
    ++live_;
    return free_pos;
  }

  Index& head_at(size_t pos) { return groups_[pos / kWidth].head[pos % kWidth]; }
  Index head_at(size_t pos) const { return groups_[pos / kWidth].head[pos % kWidth]; }

  // Removes the (now empty) bucket at `pos`.
  void erase_at(size_t pos) {
    Group& grp = groups_[pos / kWidth];
    // (3): a group with an empty slot was never full, so no probe has gone
    // past it and the slot can become empty again; otherwise a probe may
    // have, and a tombstone keeps it going.
    if (grp.match(kEmpty) != 0) {
      grp.set_fp(pos % kWidth, kEmpty);
      --used_;
    } else {
      grp.set_fp(pos % kWidth, kDeleted);
    }
    --live_;
  }

  // Calls f(head) for every bucket.
  template <typename F>
  void for_each_head(F&& f) const {
    if (live_ == 0) return;
    for (const Group& grp : groups_) {
      for (size_t j = 0; j < kWidth; ++j) {
        if (grp.fp[j] >= kLive) f(grp.head[j]);
      }
    }
  }

  void clear() {
    groups_.clear();
    groups_.shrink_to_fit();
    gmask_ = 0;
    live_ = 0;
    used_ = 0;
  }

  // Slots, live buckets and tombstones: for tests of the table itself.
  size_t capacity() const { return groups_.size() * kWidth; }
  size_t buckets() const { return live_; }
  size_t tombstones() const { return used_ - live_; }

 private:
  static constexpr size_t kWidth = 8;
  static constexpr uint32_t kEmpty = 0;
  static constexpr uint32_t kDeleted = 1;
  static constexpr uint32_t kLive = 2;  // live fingerprints are >= kLive

  struct alignas(64) Group {
    uint32_t fp[kWidth];
    Index head[kWidth];

    // Sets fp[j] = x with a 16-byte store, so that the next match() (two
    // 16-byte loads) can take the value straight from the store buffer; a
    // 4-byte store there would stall it until the store reaches the cache.
    void set_fp(size_t j, uint32_t x) {
      __m128i* half = reinterpret_cast<__m128i*>(fp + (j & 4));
      const __m128i lane = _mm_cmpeq_epi32(_mm_set_epi32(3, 2, 1, 0),
                                           _mm_set1_epi32(static_cast<int>(j & 3)));
      const __m128i old = _mm_load_si128(half);
      _mm_store_si128(half, _mm_or_si128(_mm_andnot_si128(lane, old),
                                         _mm_and_si128(lane, _mm_set1_epi32(static_cast<int>(x)))));
    }

    // Bit j set iff fp[j] == x.
    unsigned match(uint32_t x) const {
      const __m128i v = _mm_set1_epi32(static_cast<int>(x));
      const __m128i lo = _mm_cmpeq_epi32(_mm_load_si128(reinterpret_cast<const __m128i*>(fp)), v);
      const __m128i hi =
          _mm_cmpeq_epi32(_mm_load_si128(reinterpret_cast<const __m128i*>(fp + 4)), v);
      // Narrow the eight 32-bit lanes to bytes (values stay 0 or -1), then
      // take one bit per byte.
      const __m128i bytes = _mm_packs_epi16(_mm_packs_epi32(lo, hi), _mm_setzero_si128());
      return static_cast<unsigned>(_mm_movemask_epi8(bytes));
    }
  };
  static_assert(sizeof(Group) == 64, "a group is one cache line");

  static unsigned lowest_bit(unsigned m) { return static_cast<unsigned>(__builtin_ctz(m)); }

  // Home group: the top bits of the fingerprint, so that a rehash needs
  // nothing but the stored fingerprints. The remaining low bits are what
  // tells apart the tags that share a group.
  static size_t home_of(uint32_t fp, size_t ngroups) {
    return static_cast<size_t>((uint64_t{fp} * ngroups) >> 32);
  }
  size_t home(uint32_t fp) const { return home_of(fp, groups_.size()); }

  size_t max_used() const { return capacity() - capacity() / 8; }

  // Rebuilds the table without tombstones at the smallest power-of-two size
  // that is at most half full after one more insertion (so it may shrink).
  void rehash() {
    size_t cap = kWidth;
    while (cap / 2 < live_ + 1) cap *= 2;
    std::vector<Group> fresh(cap / kWidth);  // the only step that can throw
    const size_t gmask = fresh.size() - 1;
    for (const Group& grp : groups_) {
      for (size_t j = 0; j < kWidth; ++j) {
        if (grp.fp[j] < kLive) continue;
        for (size_t g = home_of(grp.fp[j], fresh.size());; g = (g + 1) & gmask) {
          const unsigned empty = fresh[g].match(kEmpty);
          if (empty != 0) {
            const unsigned k = lowest_bit(empty);
            fresh[g].fp[k] = grp.fp[j];
            fresh[g].head[k] = grp.head[j];
            break;
          }
        }
      }
    }
    groups_.swap(fresh);
    gmask_ = gmask;
    used_ = live_;
  }

  std::vector<Group> groups_;  // size is 0 or a power of two
  size_t gmask_ = 0;
  size_t live_ = 0;
  size_t used_ = 0;  // live + tombstones
};

// The posted queue's wildcard receives: an array in posting (= seq) order,
// scanned front to back. Removal leaves a tombstone (the entry's seq gets
// kDead); the array is compacted when tombstones outnumber live entries, so
// a scan costs O(live entries) amortized and memory O(peak live entries).
//
// Invariants:
//   (1) Entries [begin_, end_) are in increasing seq order (ignoring kDead).
//   (2) An entry holds a constructed value iff it is in [begin_, end_) and
//       its seq lacks kDead; live_ counts them.
//   (3) begin_ == end_ or entry begin_ is live.
template <typename T>
class WildArray {
 public:
  static constexpr size_t npos = ~size_t{0};

  WildArray() = default;
  WildArray(const WildArray&) = delete;
  WildArray& operator=(const WildArray&) = delete;
  WildArray(WildArray&& other) noexcept { swap(other); }
  WildArray& operator=(WildArray&& other) noexcept {
    WildArray tmp(std::move(other));
    swap(tmp);
    return *this;
  }
  ~WildArray() {
    for (size_t k = begin_; k < end_; ++k) {
      if (live_at(k)) buf_[k].value.destroy();
    }
  }

  void swap(WildArray& other) noexcept {
    using std::swap;
    swap(buf_, other.buf_);
    swap(cap_, other.cap_);
    swap(begin_, other.begin_);
    swap(end_, other.end_);
    swap(live_, other.live_);
  }

  bool empty() const { return live_ == 0; }

  // Appends; seq must exceed every seq in the array. Strong exception
  // guarantee (only the allocation can throw).
  void push(uint64_t seq, const RecvPattern& p, T&& v) {
    if (end_ == cap_) make_room();
    Entry& e = buf_[end_++];
    e.seq = seq;
    e.pattern = p;
    e.value.construct(std::move(v));
    ++live_;
  }

  // Position of the first live entry with seq < before whose pattern matches
  // key, or npos.
  size_t find_match(const MsgKey& key, uint64_t before) const {
    for (size_t k = begin_; k < end_; ++k) {
      const Entry& e = buf_[k];
      if ((e.seq & ~kDead) >= before) break;
      if ((e.seq & kDead) == 0 && matches(e.pattern, key)) return k;
    }
    return npos;
  }

  // Position of the first live entry whose value satisfies pred, or npos.
  template <typename Pred>
  size_t find_if(Pred& pred) const {
    for (size_t k = begin_; k < end_; ++k) {
      if (live_at(k) && pred(std::as_const(buf_[k].value.get()))) return k;
    }
    return npos;
  }

  uint64_t seq_at(size_t k) const { return buf_[k].seq; }

  // Removes the live entry at k and returns its value. Invalidates positions.
  T take(size_t k) {
    T v = buf_[k].value.take();
    buf_[k].seq |= kDead;
    --live_;
    if (k == begin_) {
      while (begin_ < end_ && !live_at(begin_)) ++begin_;  // (3)
    }
    if (end_ - begin_ > 2 * live_ + kSlack) compact();
    return v;
  }

  // Calls f(seq, T&&) for every live entry in order, leaving the array
  // empty. Entries after one whose f throws are dropped.
  template <typename F>
  void drain(F&& f) {
    size_t k = begin_;
    try {
      for (; k < end_; ++k) {
        if (!live_at(k)) continue;
        buf_[k].seq |= kDead;
        --live_;
        f(buf_[k].seq & ~kDead, buf_[k].value.take());
      }
    } catch (...) {
      begin_ = k + 1;
      throw;  // the destructor or the next drain destroys the rest
    }
    begin_ = end_ = 0;
  }

 private:
  static constexpr uint64_t kDead = uint64_t{1} << 63;  // seqs stay below
  static constexpr size_t kSlack = 16;  // don't compact tiny arrays often

  struct Entry {
    uint64_t seq;
    RecvPattern pattern;
    ValueSlot<T> value;
  };

  bool live_at(size_t k) const { return (buf_[k].seq & kDead) == 0; }

  // Moves the live entries to the front of `to` (possibly buf_ itself).
  void move_live_to(Entry* to) {
    size_t w = 0;
    for (size_t k = begin_; k < end_; ++k) {
      if (!live_at(k)) continue;
      if (&to[w] != &buf_[k]) {
        to[w].seq = buf_[k].seq;
        to[w].pattern = buf_[k].pattern;
        to[w].value.construct(buf_[k].value.take());
      }
      ++w;
    }
    begin_ = 0;
    end_ = w;
  }

  void compact() { move_live_to(buf_.get()); }

  // Frees space at the end: compacts in place if at most half the array is
  // live, else doubles it. Either way the work is paid for by the pushes or
  // removals since the last time.
  void make_room() {
    if (live_ * 2 <= cap_ && cap_ != 0) {
      compact();
      return;
    }
    const size_t cap = std::max<size_t>(kSlack, cap_ * 2);
    std::unique_ptr<Entry[]> fresh(new Entry[cap]);  // the only step that can throw
    move_live_to(fresh.get());
    buf_.swap(fresh);
    cap_ = cap;
  }

  std::unique_ptr<Entry[]> buf_;
  size_t cap_ = 0;
  size_t begin_ = 0;
  size_t end_ = 0;
  size_t live_ = 0;
};

// The unexpected queue's arrival log: node indices in arrival order, scanned
// front to back by wildcard receives. A node records its position; removal
// overwrites that position with kNil (a tombstone), so it touches no other
// node. The log is compacted (and positions rewritten) when tombstones
// outnumber live entries, so scans cost O(live entries) amortized and memory
// is O(peak live entries).
//
// Invariants:
//   (1) log_[begin_, size) holds every live node exactly once, in arrival
//       order, plus tombstones; each live node's position is its index here.
//   (2) log_ is empty or log_[begin_] is live.
class ArrivalLog {
 public:
  // Makes sure the next append() does not allocate (so cannot throw).
  void reserve_one() {
    if (log_.size() == log_.capacity()) log_.reserve(std::max<size_t>(16, 2 * log_.size()));
  }

  // Appends node i and returns its position. Call reserve_one() first.
  uint32_t append(Index i) {
    log_.push_back(i);
    ++live_;
    return static_cast<uint32_t>(log_.size() - 1);
  }

  // Removes the node at `pos`. May compact, calling set_pos(node, new_pos)
  // for every live node that moves.
  template <typename SetPos>
  void erase(uint32_t pos, SetPos set_pos) {
    log_[pos] = kNil;
    --live_;
    if (pos == begin_) {
      while (begin_ < log_.size() && log_[begin_] == kNil) ++begin_;  // (2)
      if (begin_ == log_.size()) {
        log_.clear();
        begin_ = 0;
        return;
      }
    }
    if (log_.size() - begin_ > 2 * live_ + kSlack) {
      size_t w = 0;
      for (size_t k = begin_; k < log_.size(); ++k) {
        if (log_[k] == kNil) continue;
        log_[w] = log_[k];
        set_pos(log_[w], static_cast<uint32_t>(w));
        ++w;
      }
      log_.resize(w);
      begin_ = 0;
    }
  }

  // Calls f(node) for every live node in arrival order until f returns true;
  // returns that node or kNil.
  template <typename F>
  Index find_if(F&& f) const {
    for (size_t k = begin_; k < log_.size(); ++k) {
      const Index i = log_[k];
      if (i != kNil && f(i)) return i;
    }
    return kNil;
  }

  // Calls f(node) for every live node in arrival order.
  template <typename F>
  void for_each(F&& f) const {
    for (size_t k = begin_; k < log_.size(); ++k) {
      if (log_[k] != kNil) f(log_[k]);
    }
  }

  // Moves the log out (for drain), leaving this one empty.
  std::vector<Index> release() {
    std::vector<Index> out = std::move(log_);
    out.erase(out.begin(), out.begin() + static_cast<std::ptrdiff_t>(begin_));
    log_.clear();
    begin_ = 0;
    live_ = 0;
    return out;
  }

  void swap(ArrivalLog& other) noexcept {
    using std::swap;
    swap(log_, other.log_);
    swap(begin_, other.begin_);
    swap(live_, other.live_);
  }

 private:
  static constexpr size_t kSlack = 16;  // don't compact tiny logs often

  std::vector<Index> log_;
  size_t begin_ = 0;
  size_t live_ = 0;
};

}  // namespace matcher_internal

// ---------------------------------------------------------------------------
// PostedQueue: posted receives waiting for a message.
//
// Invariants:
//   (1) Every live receive is in exactly one place: the exact_ bucket of its
//       tag (a node from pool_) if its selector is kTagSelAll, otherwise
//       wild_.
//   (2) Every live receive has a unique seq; a lower seq was posted earlier.
//   (3) Every bucket and wild_ are in posting (= seq) order, because post()
//       appends with a fresh stamp and removal never reorders.
//   (4) exact_ holds no empty bucket.
//   (5) size_ equals the number of live receives; exactly the nodes in
//       exact_ buckets hold a constructed value.
// From (1)-(3): the earliest-posted receive matching a message is the earlier
// of (a) the first entry of its tag's bucket whose source filter accepts it
// and (b) the first matching entry of wild_.
template <typename RecvT>
class PostedQueue {
  static_assert(std::is_nothrow_move_constructible_v<RecvT>,
                "RecvT must be nothrow move constructible");

 public:
  PostedQueue() = default;
  PostedQueue(const PostedQueue&) = delete;
  PostedQueue& operator=(const PostedQueue&) = delete;
  // Moving leaves `other` empty.
  PostedQueue(PostedQueue&& other) noexcept { swap(other); }
  PostedQueue& operator=(PostedQueue&& other) noexcept {
    PostedQueue tmp(std::move(other));
    swap(tmp);
    return *this;
  }
  ~PostedQueue() {
    for_each_exact([&](Index i) { pool_[i].value.destroy(); });
  }

  void swap(PostedQueue& other) noexcept {
    using std::swap;
    swap(pool_, other.pool_);
    swap(exact_, other.exact_);
    wild_.swap(other.wild_);
    swap(next_seq_, other.next_seq_);
    swap(size_, other.size_);
  }

  void post(const RecvPattern& p, RecvT value) {
    if (!is_exact_selector(p.sel)) {
      wild_.push(next_seq_++, p, std::move(value));
      ++size_;
      return;
    }
    // Allocation (the only thing that can throw) happens before any change.
    exact_.reserve_one();
    const Index i = pool_.acquire();
    Node& n = pool_[i];
    n.tag = p.tag;
    n.source = p.source;
    n.seq = next_seq_++;
    n.value.construct(std::move(value));
    const size_t pos = exact_.find_or_insert(p.tag, TagIndex::fingerprint(p.tag), tag_of());
    matcher_internal::bucket_push_back(pool_, exact_.head_at(pos), i);
    ++size_;
  }

  // Removes and returns the earliest-posted receive matching `key`.
  std::optional<RecvT> take_match(const MsgKey& key) {
    Index exact = kNil;
    uint64_t exact_seq = std::numeric_limits<uint64_t>::max();
    const size_t pos = exact_.find(key.tag, TagIndex::fingerprint(key.tag), tag_of());
    if (pos != TagIndex::npos) {
      exact = first_accepting(exact_.head_at(pos), key.source);
      if (exact != kNil) exact_seq = pool_[exact].seq;
    }
    if (!wild_.empty()) {
      // Wildcards posted after the exact candidate cannot win: the scan
      // stops at exact_seq, which keeps exact matches cheap even with many
      // later wildcards.
      const size_t k = wild_.find_match(key, exact_seq);
      if (k != WildArray::npos) {
        --size_;
        return wild_.take(k);
      }
    }
    if (exact == kNil) return std::nullopt;
    unlink_exact(exact, pos);
    return release(exact);
  }

  // Removes the earliest-posted receive whose value satisfies
  // pred(const RecvT&) (cancel). O(n). pred is evaluated on entries in no
  // particular order and must have no side effects.
  template <typename Pred>
  std::optional<RecvT> remove_first_if(Pred pred) {
    const size_t k = wild_.find_if(pred);
    uint64_t best_seq = k == WildArray::npos ? std::numeric_limits<uint64_t>::max()
                                             : wild_.seq_at(k);
    Index best = kNil;
    // Each bucket is seq-ordered: only its first satisfying entry can win,
    // and entries at or past the best so far need not be looked at.
    exact_.for_each_head([&](Index head) {
      for (Index i = head; i != kNil && pool_[i].seq < best_seq; i = pool_[i].chain.next) {
        if (pred(std::as_const(pool_[i].value.get()))) {
          best = i;
          best_seq = pool_[i].seq;
          return;
        }
      }
    });
    if (best == kNil) {
      if (k == WildArray::npos) return std::nullopt;
      --size_;
      return wild_.take(k);
    }
    const Tag96& tag = pool_[best].tag;
    unlink_exact(best, exact_.find(tag, TagIndex::fingerprint(tag), tag_of()));
    return release(best);
  }

  size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }

  // Removes every entry, calling f(RecvT&&) for each in posting order. The
  // queue is already empty when f runs; receives f posts are not drained.
  // Allocates O(n) scratch: drain is for teardown, not the fast path.
  template <typename F>
  void drain(F&& f) {
    std::vector<Index> exact;
    exact.reserve(size_);
    for_each_exact([&](Index i) { exact.push_back(i); });
    std::sort(exact.begin(), exact.end(),
              [&](Index a, Index b) { return pool_[a].seq < pool_[b].seq; });
    WildArray wild = std::move(wild_);
    exact_.clear();
    size_ = 0;

    // Merge the two seq-ordered sequences.
    size_t e = 0;
    auto hand_out_exact_before = [&](uint64_t seq) {
      for (; e < exact.size() && pool_[exact[e]].seq < seq; ++e) {
        RecvT v = pool_[exact[e]].value.take();
        pool_.release(exact[e]);
        f(std::move(v));
      }
    };
    try {
      wild.drain([&](uint64_t seq, RecvT&& v) {
        hand_out_exact_before(seq);
        f(std::move(v));
      });
      hand_out_exact_before(std::numeric_limits<uint64_t>::max());
    } catch (...) {
      // Entries not yet handed to f are dropped (`wild` drops its own).
      for (; e < exact.size(); ++e) {
        pool_[exact[e]].value.destroy();
        pool_.release(exact[e]);
      }
      throw;
    }
  }

 private:
  using Index = matcher_internal::Index;
  using TagIndex = matcher_internal::TagIndex;
  using WildArray = matcher_internal::WildArray<RecvT>;
  static constexpr Index kNil = matcher_internal::kNil;

  // An exact-tag receive. Its selector is kTagSelAll by definition, so only
  // the tag is kept.
  struct Node {
    matcher_internal::Link chain;  // bucket; free list when unused
    Tag96 tag;
    uint64_t source;
    uint64_t seq;
    matcher_internal::ValueSlot<RecvT> value;
  };

  auto tag_of() const {
    return [this](Index i) -> const Tag96& { return pool_[i].tag; };
  }

  // Calls f(index) for every exact node, in no particular order.
  template <typename F>
  void for_each_exact(F&& f) const {
    exact_.for_each_head([&](Index head) {
      for (Index i = head; i != kNil;) {
        const Index next = pool_[i].chain.next;  // f may destroy node i
        f(i);
        i = next;
      }
    });
  }

  Index first_accepting(Index head, uint64_t source) const {
    for (Index i = head; i != kNil; i = pool_[i].chain.next) {
      if (source_matches(pool_[i].source, source)) return i;
    }
    return kNil;
  }

  // Unlinks exact receive i from its bucket, at slot `pos`, dropping the
  // bucket if now empty (invariant 4).
  void unlink_exact(Index i, size_t pos) {
    Index& head = exact_.head_at(pos);
    matcher_internal::bucket_unlink(pool_, head, i);
    if (head == kNil) exact_.erase_at(pos);
  }

  // Returns the value of unlinked node i and frees the node.
  RecvT release(Index i) {
    RecvT v = pool_[i].value.take();
    pool_.release(i);
    --size_;
    return v;
  }

  matcher_internal::NodePool<Node> pool_;
  TagIndex exact_;
  WildArray wild_;
  uint64_t next_seq_ = 0;
  size_t size_ = 0;
};

// ---------------------------------------------------------------------------
// UnexpectedQueue: arrived messages waiting for a receive.
//
// Invariants:
//   (1) Every live message is in log_ and in the by_tag_ bucket of its tag,
//       both in arrival order (push appends to both; removal never
//       reorders); its node's `pos` is its position in log_.
//   (2) by_tag_ holds no empty bucket.
//   (3) size_ equals the number of live messages; exactly the nodes in log_
//       hold a constructed value.
// From (1): an exact-selector receive can only match messages with its own
// tag, so the first source-accepted entry of that bucket is the
// earliest-arrived match; any other receive scans log_ in order.
template <typename MsgT>
class UnexpectedQueue {
  static_assert(std::is_nothrow_move_constructible_v<MsgT>,
                "MsgT must be nothrow move constructible");

 public:
  UnexpectedQueue() = default;
  UnexpectedQueue(const UnexpectedQueue&) = delete;
  UnexpectedQueue& operator=(const UnexpectedQueue&) = delete;
  // Moving leaves `other` empty.
  UnexpectedQueue(UnexpectedQueue&& other) noexcept { swap(other); }
  UnexpectedQueue& operator=(UnexpectedQueue&& other) noexcept {
    UnexpectedQueue tmp(std::move(other));
    swap(tmp);
    return *this;
  }
  ~UnexpectedQueue() {
    log_.for_each([&](Index i) { pool_[i].value.destroy(); });
  }

  void swap(UnexpectedQueue& other) noexcept {
    using std::swap;
    swap(pool_, other.pool_);
    swap(by_tag_, other.by_tag_);
    log_.swap(other.log_);
    swap(size_, other.size_);
  }

  void push(const MsgKey& key, MsgT value) {
    // Allocation (the only thing that can throw) happens before any change.
    by_tag_.reserve_one();
    log_.reserve_one();
    const Index i = pool_.acquire();
    Node& n = pool_[i];
    n.tag = key.tag;
    n.source = key.source;
    n.value.construct(std::move(value));
    n.pos = log_.append(i);
    const size_t pos = by_tag_.find_or_insert(key.tag, TagIndex::fingerprint(key.tag), tag_of());
    matcher_internal::bucket_push_back(pool_, by_tag_.head_at(pos), i);
    ++size_;
  }

  // Earliest-arrived message matching p, left queued (probe/peek); nullptr if
  // none. The pointer is valid until the next mutation of the queue.
  MsgT* find(const RecvPattern& p, MsgKey* key_out = nullptr) {
    const Found f = locate(p);
    if (f.node == kNil) return nullptr;
    if (key_out != nullptr) *key_out = key_of(f.node);
    return &pool_[f.node].value.get();
  }

  // Removes and returns the earliest-arrived message matching p (and its key
  // via key_out).
  std::optional<MsgT> take(const RecvPattern& p, MsgKey* key_out = nullptr) {
    const Found f = locate(p);
    if (f.node == kNil) return std::nullopt;
    if (key_out != nullptr) *key_out = key_of(f.node);
    return remove(f);
  }

  // Removes the earliest-arrived message whose value satisfies
  // pred(const MsgT&). O(n); pred is called in arrival order and no further
  // once it returns true.
  template <typename Pred>
  std::optional<MsgT> remove_first_if(Pred pred) {
    const Index i =
        log_.find_if([&](Index j) { return pred(std::as_const(pool_[j].value.get())); });
    if (i == kNil) return std::nullopt;
    return remove(Found{i, TagIndex::npos});
  }

  size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }

  // Removes every message, calling f(const MsgKey&, MsgT&&) for each in
  // arrival order. The queue is already empty when f runs; messages f pushes
  // are not drained.
  template <typename F>
  void drain(F&& f) {
    const std::vector<Index> order = log_.release();
    by_tag_.clear();
    size_ = 0;
    size_t k = 0;
    try {
      for (; k < order.size(); ++k) {
        const Index i = order[k];
        if (i == kNil) continue;
        const MsgKey key = key_of(i);
        MsgT v = pool_[i].value.take();
        pool_.release(i);
        f(key, std::move(v));
      }
    } catch (...) {
      // Messages not yet handed to f are dropped.
      for (++k; k < order.size(); ++k) {
        const Index i = order[k];
        if (i == kNil) continue;
        pool_[i].value.destroy();
        pool_.release(i);
      }
      throw;
    }
  }

 private:
  using Index = matcher_internal::Index;
  using TagIndex = matcher_internal::TagIndex;
  static constexpr Index kNil = matcher_internal::kNil;

  struct Node {
    matcher_internal::Link chain;  // by_tag_ bucket; free list when unused
    uint32_t pos;                  // in log_
    Tag96 tag;
    uint64_t source;
    matcher_internal::ValueSlot<MsgT> value;
  };

  // A located message and, if known, the slot of its tag's bucket.
  struct Found {
    Index node;
    size_t bucket_pos;
  };

  auto tag_of() const {
    return [this](Index i) -> const Tag96& { return pool_[i].tag; };
  }

  MsgKey key_of(Index i) const { return MsgKey{pool_[i].source, pool_[i].tag}; }

  // Earliest-arrived message matching p (node kNil if none).
  Found locate(const RecvPattern& p) const {
    if (is_exact_selector(p.sel)) {
      const size_t pos = by_tag_.find(p.tag, TagIndex::fingerprint(p.tag), tag_of());
      if (pos == TagIndex::npos) return Found{kNil, pos};
      for (Index i = by_tag_.head_at(pos); i != kNil; i = pool_[i].chain.next) {
        if (source_matches(p.source, pool_[i].source)) return Found{i, pos};
      }
      return Found{kNil, pos};
    }
    const Index i = log_.find_if([&](Index j) {
      const Node& n = pool_[j];
      return source_matches(p.source, n.source) && tag_matches(p.tag, p.sel, n.tag);
    });
    return Found{i, TagIndex::npos};
  }

  // Unlinks the message from log_ and its bucket (dropping the bucket if now
  // empty, invariant 2), frees the node and returns the value.
  MsgT remove(Found f) {
    const Index i = f.node;
    log_.erase(pool_[i].pos, [&](Index j, uint32_t pos) { pool_[j].pos = pos; });
    size_t pos = f.bucket_pos;
    if (pos == TagIndex::npos) {
      const Tag96& tag = pool_[i].tag;
      pos = by_tag_.find(tag, TagIndex::fingerprint(tag), tag_of());
    }
    Index& head = by_tag_.head_at(pos);
    matcher_internal::bucket_unlink(pool_, head, i);
    if (head == kNil) by_tag_.erase_at(pos);
    MsgT v = pool_[i].value.take();
    pool_.release(i);
    --size_;
    return v;
  }

  matcher_internal::NodePool<Node> pool_;
  TagIndex by_tag_;
  matcher_internal::ArrivalLog log_;
  size_t size_ = 0;
};

}  // namespace psmd

#endif  // PSMD_DAEMON_MATCHER_H_
