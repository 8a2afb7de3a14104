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
//   - Unexpected: every message is on its tag's bucket and has an entry in
//     an arrival-ordered log. Exact-tag receives look only in the bucket;
//     wildcard receives scan the log.
// So an exact-tag match costs O(1) whatever the queue depth, and wildcards
// cost what they must (a scan), with MPI ordering preserved across both.
//
// Why it is laid out as it is: at depth an exact match costs what its cache
// misses cost, so the exact path touches as few cold cache lines as it can
// (the hash slot of its tag, then the entry itself) and entries are compact:
// links are 32-bit indices and an exact receive keeps no selector. Order
// for wildcards is kept in arrays rather than linked lists: scans read
// memory front to back instead of chasing pointers, and removing an entry
// writes nothing into its neighbours.
//
// Those misses cannot be avoided one match at a time, but they can overlap:
// prefetch_slot() and prefetch_entry() start loading what a later match will
// read without changing the queue, and the daemon calls them for every
// descriptor of a ring batch before matching any of them, so a batch pays a
// few miss latencies instead of two per message (bench/match_bench, *Batch).
//
// Entries come from chunked pools with free lists and are linked by 32-bit
// indices: steady-state operations do not allocate, and memory is bounded by
// the peak number of live entries (at most 2^32 - 1 per queue).
//
// RecvT/MsgT: movable value types with a non-throwing move constructor (small
// structs). Values are moved in on post/push and moved out on removal.

#ifndef PSMD_DAEMON_MATCHER_H_
#define PSMD_DAEMON_MATCHER_H_

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <memory>
#include <new>
#include <optional>
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

// Hash buckets are FIFO lists known only by their head index, so that a hash
// slot is 8 bytes. To append in O(1) the head's `prev` points at the tail
// (the tail's `next` is still kNil, so forward iteration is unchanged).
template <auto kLink, typename Nodes>
void bucket_push_back(Nodes& nodes, Index& head, Index i) {
  Link& l = nodes[i].*kLink;
  l.next = kNil;
  if (head == kNil) {
    l.prev = i;
    head = i;
    return;
  }
  Link& h = nodes[head].*kLink;
  l.prev = h.prev;
  (nodes[h.prev].*kLink).next = i;
  h.prev = i;
}

template <auto kLink, typename Nodes>
void bucket_unlink(Nodes& nodes, Index& head, Index i) {
  const Link l = nodes[i].*kLink;
  if (i == head) {
    head = l.next;
    if (head != kNil) (nodes[head].*kLink).prev = l.prev;  // the tail
    return;
  }
  (nodes[l.prev].*kLink).next = l.next;
  if (l.next == kNil) {
    (nodes[head].*kLink).prev = l.prev;  // i was the tail
  } else {
    (nodes[l.next].*kLink).prev = l.prev;
  }
}

// Asks for the cache line holding `p` without waiting for it.
//
// The empty volatile asm hides where `p` came from: GCC 12 otherwise deletes
// a __builtin_prefetch whose address is computed from a load (as a node's is,
// from its hash slot) — checked with g++ -O2 -S, which emitted no prefetcht0.
inline void prefetch_address(const void* p) {
  asm volatile("" : "+r"(p));
  __builtin_prefetch(p);
}

// Asks for the cache lines of `node`, which may straddle two.
template <typename Node>
inline void prefetch_node(const Node& node) {
  const char* p = reinterpret_cast<const char*>(&node);
  prefetch_address(p);
  prefetch_address(p + sizeof(Node) - 1);
}

// Raw storage for one T inside a node or array entry. The owner knows which
// slots are live and constructs/destroys values explicitly; std::optional
// would add a flag (and padding) to every entry.
template <typename T>
class ValueSlot {
 public:
  void construct(T&& v) { ::new (static_cast<void*>(buf_)) T(std::move(v)); }
  T& get() { return *std::launder(reinterpret_cast<T*>(buf_)); }
  const T& get() const {
    return *std::launder(reinterpret_cast<const T*>(buf_));
  }
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
  const Node& operator[](Index i) const {
    return chunks_[i >> kChunkBits][i & kChunkMask];
  }

  // Number of nodes allocated so far: every index handed out is below it.
  Index capacity() const {
    return static_cast<Index>(chunks_.size()) * kChunkSize;
  }

  size_t memory_bytes() const {
    return capacity() * sizeof(Node) + chunks_.capacity() * sizeof(chunks_[0]);
  }

  // Allocates if needed so that the next acquire() does not allocate (only
  // allocation can throw: std::bad_alloc).
  void reserve_one() {
    if (free_ == kNil) grow();
  }

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
  void grow() {
    if (chunks_.size() >= (kNil >> kChunkBits)) {
      // 2^32 queued entries: the per-uid memory budgets end a tenant long
      // before this. Reaching it means those bounds are broken, and no
      // caller could recover a consistent queue: stop loudly.
      std::fprintf(stderr, "psmd: matcher node pool exhausted (%u nodes)\n",
                   static_cast<unsigned>(kNil));
      std::abort();
    }
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

// Open-addressing hash table from a tag to the head of its bucket list.
// Linear probing with backward-shift deletion: no tombstones, so lookups stay
// short however many buckets have come and gone. A slot is 8 bytes (32 bits
// of the tag's hash + the head index) so the table stays cache-resident at
// depth; the tag itself is read from the head node, which the caller is about
// to touch anyway. A slot is empty iff its head is kNil, and a bucket is
// erased as soon as its last node leaves, so the table holds one slot per
// distinct live tag at load <= 1/4. At load 1/2, probe runs and backward
// shifts were long enough that their unpredictable branches cost more than
// the larger table does (docs/perf.md, "Matching engine").
class TagIndex {
 public:
  static constexpr size_t npos = ~size_t{0};

  static uint32_t hash(const Tag96& tag) {
    return static_cast<uint32_t>(Tag96Hash{}(tag));
  }

  // Slot position of the bucket for `tag` (whose hash is `h`), or npos.
  // tag_of(Index) returns the tag of a node.
  template <typename TagOf>
  size_t find(const Tag96& tag, uint32_t h, TagOf tag_of) const {
    if (count_ == 0) return npos;
    for (size_t pos = h & mask_;; pos = (pos + 1) & mask_) {
      const Slot& s = slots_[pos];
      if (s.head == kNil) return npos;
      if (s.hash == h && tag_of(s.head) == tag) return pos;
    }
  }

  // Asks for the slot where a lookup of hash `h` starts, without waiting.
  void prefetch_slot(uint32_t h) const {
    if (count_ != 0) prefetch_address(&slots_[h & mask_]);
  }

  // Head of the first bucket in `h`'s probe run whose slot holds hash `h`,
  // or kNil: the bucket find() would return unless two live tags share all
  // 32 hash bits, found without reading any node. For prefetch_entry(): it
  // reads the slots, so ask for them first (prefetch_slot).
  Index head_by_hash(uint32_t h) const {
    if (count_ == 0) return kNil;
    for (size_t pos = h & mask_; slots_[pos].head != kNil;
         pos = (pos + 1) & mask_) {
      if (slots_[pos].hash == h) return slots_[pos].head;
    }
    return kNil;
  }

  // Grows the table if needed so that the next find_or_insert() neither
  // allocates nor throws. Invalidates earlier positions.
  void reserve_one() {
    if ((count_ + 1) * 4 > slots_.size())
      rehash(std::max<size_t>(16, slots_.size() * 2));
  }

  // Like find(), but creates the bucket (with head kNil) if absent. The
  // caller must link a node into it before the next call (no empty buckets).
  // Call reserve_one() first.
  template <typename TagOf>
  size_t find_or_insert(const Tag96& tag, uint32_t h, TagOf tag_of) {
    size_t pos = h & mask_;
    for (; slots_[pos].head != kNil; pos = (pos + 1) & mask_) {
      if (slots_[pos].hash == h && tag_of(slots_[pos].head) == tag) return pos;
    }
    ++count_;
    slots_[pos].hash = h;
    return pos;
  }

  size_t memory_bytes() const { return slots_.capacity() * sizeof(Slot); }

  Index& head_at(size_t pos) { return slots_[pos].head; }
  Index head_at(size_t pos) const { return slots_[pos].head; }

  // Removes the (now empty) bucket at `pos`, shifting later members of its
  // probe run back so that no lookup crosses a hole it should not.
  void erase_at(size_t pos) {
    size_t hole = pos;
    for (size_t j = (hole + 1) & mask_; slots_[j].head != kNil;
         j = (j + 1) & mask_) {
      // Slot j may fill the hole iff the hole lies on j's probe path, i.e.
      // j is at least as far from its home slot as from the hole.
      if (((j - slots_[j].hash) & mask_) >= ((j - hole) & mask_)) {
        slots_[hole] = slots_[j];
        hole = j;
      }
    }
    slots_[hole].head = kNil;
    --count_;
  }

  // Calls f(head) for every bucket.
  template <typename F>
  void for_each_head(F&& f) const {
    if (count_ == 0) return;
    for (const Slot& s : slots_) {
      if (s.head != kNil) f(s.head);
    }
  }

  void clear() {
    slots_.clear();
    slots_.shrink_to_fit();
    mask_ = 0;
    count_ = 0;
  }

 private:
  struct Slot {
    uint32_t hash = 0;  // low bits are the home position
    Index head = kNil;
  };

  void rehash(size_t capacity) {
    std::vector<Slot> fresh(capacity);  // the only step that can throw
    const size_t mask = capacity - 1;
    for (const Slot& s : slots_) {
      if (s.head == kNil) continue;
      size_t pos = s.hash & mask;
      while (fresh[pos].head != kNil) pos = (pos + 1) & mask;
      fresh[pos] = s;
    }
    slots_.swap(fresh);
    mask_ = mask;
  }

  std::vector<Slot> slots_;  // size is 0 or a power of two
  size_t mask_ = 0;
  size_t count_ = 0;  // non-empty slots
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

  // Removes every live entry whose value satisfies pred(const T&), calling
  // f(T&&) for each, in order, in one pass. Invalidates positions.
  template <typename Pred, typename F>
  void remove_all_if(Pred& pred, F& f) {
    for (size_t k = begin_; k < end_; ++k) {
      if (!live_at(k) || !pred(std::as_const(buf_[k].value.get()))) continue;
      buf_[k].seq |= kDead;
      --live_;
      f(buf_[k].value.take());
    }
    while (begin_ < end_ && !live_at(begin_)) ++begin_;  // (3)
    if (end_ - begin_ > 2 * live_ + kSlack) compact();
  }

  // Calls f(seq, T&&) for every live entry in order, leaving the array
  // empty. If f throws, the entries not yet handed to it stay in the array.
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
      begin_ = k + 1;  // entries past k keep their values
      throw;
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
    std::unique_ptr<Entry[]> fresh(
        new Entry[cap]);  // the only step that can throw
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
    const size_t pos =
        exact_.find_or_insert(p.tag, TagIndex::hash(p.tag), tag_of());
    matcher_internal::bucket_push_back<&Node::chain>(pool_, exact_.head_at(pos),
                                                     i);
    ++size_;
  }

  // Start loading the memory take_match(key) will read, without changing the
  // queue. At depth a match waits for main memory twice (~130 ns each here):
  // for its tag's hash slot, then for the node the slot names. A caller
  // holding a batch of messages calls prefetch_slot() for all of them, then
  // prefetch_entry() for all of them, then matches: the first pass only
  // computes addresses, so all the slot misses are in flight at once; the
  // second reads the slots (mostly arrived by then) and does the same for
  // the nodes.
  void prefetch_slot(const MsgKey& key) const {
    exact_.prefetch_slot(TagIndex::hash(key.tag));
  }
  void prefetch_entry(const MsgKey& key) const {
    const Index head = exact_.head_by_hash(TagIndex::hash(key.tag));
    if (head != kNil) matcher_internal::prefetch_node(pool_[head]);
  }

  // Removes and returns the earliest-posted receive matching `key`.
  std::optional<RecvT> take_match(const MsgKey& key) {
    Index exact = kNil;
    uint64_t exact_seq = std::numeric_limits<uint64_t>::max();
    const size_t pos = exact_.find(key.tag, TagIndex::hash(key.tag), tag_of());
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
    uint64_t best_seq = k == WildArray::npos
                            ? std::numeric_limits<uint64_t>::max()
                            : wild_.seq_at(k);
    Index best = kNil;
    // Each bucket is seq-ordered: only its first satisfying entry can win,
    // and entries at or past the best so far need not be looked at.
    exact_.for_each_head([&](Index head) {
      for (Index i = head; i != kNil && pool_[i].seq < best_seq;
           i = pool_[i].chain.next) {
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
    unlink_exact(best, exact_.find(tag, TagIndex::hash(tag), tag_of()));
    return release(best);
  }

  // Removes every receive whose value satisfies pred(const RecvT&), calling
  // f(RecvT&&) for each (in no particular order). O(n) in one pass, however
  // many are removed (a peer's death removes all receives naming it).
  template <typename Pred, typename F>
  void remove_all_if(Pred pred, F f) {
    auto from_wild = [&](RecvT&& v) {
      --size_;
      f(std::move(v));
    };
    wild_.remove_all_if(pred, from_wild);
    std::vector<Index> doomed;
    for_each_exact([&](Index i) {
      if (pred(std::as_const(pool_[i].value.get()))) doomed.push_back(i);
    });
    for (Index i : doomed) {
      const Tag96& tag = pool_[i].tag;
      unlink_exact(i, exact_.find(tag, TagIndex::hash(tag), tag_of()));
      f(release(i));
    }
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
      while (e < exact.size() && pool_[exact[e]].seq < seq) {
        const Index i = exact[e++];  // handed out even if f throws
        RecvT v = pool_[i].value.take();
        pool_.release(i);
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
    matcher_internal::bucket_unlink<&Node::chain>(pool_, head, i);
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
// Messages live in pool nodes threaded onto their tag's bucket. Arrival order
// is kept apart from the nodes, in arrivals_: a log of (node, generation)
// entries appended on push. Removing a message only bumps its node's
// generation in gens_, which makes its entry stale; nothing else is written.
// (A doubly linked arrival list, the obvious alternative, makes every removal
// write into the two messages that arrived next to it: two more cold cache
// lines per match at depth.) Stale entries are skipped by scans, dropped from
// the front as soon as they reach it, and squeezed out when the log is full.
//
// Invariants:
//   (1) An entry e of arrivals_ is current iff gens_[e.node] == e.gen.
//       Every live message has exactly one current entry in
//       arrivals_[begin_, end); entries are in arrival order.
//   (2) A node's generation is bumped each time the node is released, so a
//       removed message's entry is stale until it is dropped. (It could only
//       turn current again after 2^32 more releases of its node; every
//       release follows a push, every push appends an entry, and a squeeze,
//       which drops every stale entry, comes before the log would exceed
//       kMaxArrivals = 2^31 entries.)
//   (3) Every live message is on the by_tag_ bucket of its tag, in arrival
//       order; by_tag_ holds no empty bucket.
//   (4) begin_ == arrivals_.size() or arrivals_[begin_] is current.
//   (5) size_ equals the number of live messages; exactly the live nodes
//       hold a constructed value.
// From (1) and (3): an exact-selector receive can only match messages with
// its own tag, so the first source-accepted entry of that bucket is the
// earliest-arrived match; any other receive scans arrivals_ in order.
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
    for_each_live([&](Index i) { pool_[i].value.destroy(); });
  }

  void swap(UnexpectedQueue& other) noexcept {
    using std::swap;
    swap(pool_, other.pool_);
    swap(gens_, other.gens_);
    swap(by_tag_, other.by_tag_);
    swap(arrivals_, other.arrivals_);
    swap(begin_, other.begin_);
    swap(size_, other.size_);
  }

  void push(const MsgKey& key, MsgT value) {
    // Allocation (the only thing that can throw) happens before any change.
    by_tag_.reserve_one();
    pool_.reserve_one();
    if (gens_.size() < pool_.capacity()) gens_.resize(pool_.capacity());
    reserve_arrival();
    const Index i = pool_.acquire();
    Node& n = pool_[i];
    n.key = key;
    n.value.construct(std::move(value));
    arrivals_.push_back(Arrival{i, gens_[i]});
    const size_t pos =
        by_tag_.find_or_insert(key.tag, TagIndex::hash(key.tag), tag_of());
    matcher_internal::bucket_push_back<&Node::chain>(pool_,
                                                     by_tag_.head_at(pos), i);
    ++size_;
  }

  // As PostedQueue's, for a later take(p) or find(p). Only exact patterns
  // have a bucket to prefetch; a wildcard scans arrivals_.
  void prefetch_slot(const RecvPattern& p) const {
    if (is_exact_selector(p.sel)) by_tag_.prefetch_slot(TagIndex::hash(p.tag));
  }
  void prefetch_entry(const RecvPattern& p) const {
    if (!is_exact_selector(p.sel)) return;
    const Index head = by_tag_.head_by_hash(TagIndex::hash(p.tag));
    if (head == kNil) return;
    matcher_internal::prefetch_node(pool_[head]);
    matcher_internal::prefetch_address(&gens_[head]);  // take() bumps it
  }

  // Earliest-arrived message matching p, left queued (probe/peek); nullptr if
  // none. The pointer is valid until the next mutation of the queue.
  MsgT* find(const RecvPattern& p, MsgKey* key_out = nullptr) {
    const Found f = locate(p);
    if (f.node == kNil) return nullptr;
    if (key_out != nullptr) *key_out = pool_[f.node].key;
    return &pool_[f.node].value.get();
  }

  // Removes and returns the earliest-arrived message matching p (and its key
  // via key_out).
  std::optional<MsgT> take(const RecvPattern& p, MsgKey* key_out = nullptr) {
    const Found f = locate(p);
    if (f.node == kNil) return std::nullopt;
    if (key_out != nullptr) *key_out = pool_[f.node].key;
    return remove(f);
  }

  // Removes the earliest-arrived message whose value satisfies
  // pred(const MsgT&). O(n); pred is called in arrival order and no further
  // once it returns true.
  template <typename Pred>
  std::optional<MsgT> remove_first_if(Pred pred) {
    const Index i = first_live(
        [&](Index k) { return pred(std::as_const(pool_[k].value.get())); });
    if (i == kNil) return std::nullopt;
    return remove(Found{i, TagIndex::npos});
  }

  size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }

  // Heap bytes held, excluding what values own.
  size_t memory_bytes() const {
    return pool_.memory_bytes() + gens_.capacity() * sizeof(gens_[0]) +
           by_tag_.memory_bytes() + arrivals_.capacity() * sizeof(Arrival);
  }

  // Removes every message, calling f(const MsgKey&, MsgT&&) for each in
  // arrival order. The queue is already empty when f runs; messages f pushes
  // are not drained.
  template <typename F>
  void drain(F&& f) {
    std::vector<Arrival> arrivals;
    arrivals.swap(arrivals_);
    size_t k = begin_;
    begin_ = 0;
    by_tag_.clear();
    size_ = 0;
    // Takes the message of entry e out (if current) and releases its node.
    auto take_entry =
        [&](const Arrival& e) -> std::optional<std::pair<MsgKey, MsgT>> {
      if (gens_[e.node] != e.gen) return std::nullopt;
      Node& n = pool_[e.node];
      std::pair<MsgKey, MsgT> out{n.key, n.value.take()};
      release(e.node);
      return out;
    };
    try {
      for (; k < arrivals.size(); ++k) {
        if (auto m = take_entry(arrivals[k])) f(m->first, std::move(m->second));
      }
    } catch (...) {
      // Messages not yet handed to f are dropped.
      for (++k; k < arrivals.size(); ++k) take_entry(arrivals[k]);
      throw;
    }
  }

 private:
  using Index = matcher_internal::Index;
  using TagIndex = matcher_internal::TagIndex;
  static constexpr Index kNil = matcher_internal::kNil;
  // Bound on arrivals_ for invariant (2).
  static constexpr size_t kMaxArrivals = size_t{1} << 31;

  struct Node {
    matcher_internal::Link chain;  // by_tag_ bucket; free list when unused
    MsgKey key;
    matcher_internal::ValueSlot<MsgT> value;
  };

  struct Arrival {
    Index node;
    uint32_t gen;  // gens_[node] when the message arrived
  };

  // A located message and, if known, the slot of its tag's bucket.
  struct Found {
    Index node;
    size_t bucket_pos;
  };

  auto tag_of() const {
    return [this](Index i) -> const Tag96& { return pool_[i].key.tag; };
  }

  bool current(const Arrival& e) const { return gens_[e.node] == e.gen; }

  // First live message in arrival order satisfying pred(Index), or kNil.
  template <typename Pred>
  Index first_live(Pred&& pred) const {
    for (size_t k = begin_; k < arrivals_.size(); ++k) {
      const Arrival& e = arrivals_[k];
      if (current(e) && pred(e.node)) return e.node;
    }
    return kNil;
  }

  template <typename F>
  void for_each_live(F&& f) const {
    first_live([&](Index i) {
      f(i);
      return false;
    });
  }

  // Earliest-arrived message matching p (node kNil if none).
  Found locate(const RecvPattern& p) const {
    if (is_exact_selector(p.sel)) {
      const size_t pos = by_tag_.find(p.tag, TagIndex::hash(p.tag), tag_of());
      if (pos == TagIndex::npos) return Found{kNil, pos};
      for (Index i = by_tag_.head_at(pos); i != kNil; i = pool_[i].chain.next) {
        if (source_matches(p.source, pool_[i].key.source)) return Found{i, pos};
      }
      return Found{kNil, pos};
    }
    return Found{scan(p), TagIndex::npos};
  }

  // Earliest-arrived message matching wildcard pattern p, or kNil. Kept out
  // of line: inlined, its loop made the compiler leave the exact-tag path out
  // of line too (~9 ns per match at depth 1).
  [[gnu::noinline]] Index scan(const RecvPattern& p) const {
    return first_live([&](Index i) { return matches(p, pool_[i].key); });
  }

  // Makes room to append one entry to arrivals_ without reallocating:
  // squeezes out stale entries if at least half are stale, otherwise grows.
  // So each squeeze is paid for by as many removals, and the log's capacity
  // stays below 4x the peak number of live messages (or 64). Throws only if
  // growing fails, leaving the queue unchanged.
  void reserve_arrival() {
    if (arrivals_.size() < arrivals_.capacity()) return;
    if (size_ <= arrivals_.size() / 2) {
      size_t out = 0;
      // Branch-free: about half the entries are stale, in random order, so
      // a branch would mispredict often and each miss would cancel the
      // gens_ loads in flight.
      for (size_t k = begin_; k < arrivals_.size(); ++k) {
        arrivals_[out] = arrivals_[k];
        out += current(arrivals_[k]) ? 1 : 0;
      }
      arrivals_.resize(out);
      begin_ = 0;
      if (out < arrivals_.capacity()) return;
    }
    if (arrivals_.capacity() >= kMaxArrivals) {
      // As for the node pool: beyond every tenant's budget; stop loudly.
      std::fprintf(stderr, "psmd: matcher arrival log exhausted\n");
      std::abort();
    }
    arrivals_.reserve(std::max<size_t>(64, arrivals_.capacity() * 2));
  }

  // Returns node i, whose value is gone, to the pool; its arrival entry is
  // stale from now on (invariant 2).
  void release(Index i) {
    ++gens_[i];
    pool_.release(i);
  }

  // Unlinks the message from its bucket (dropping the bucket if now empty,
  // invariant 3), frees the node and returns the value.
  MsgT remove(Found f) {
    const Index i = f.node;
    size_t pos = f.bucket_pos;
    if (pos == TagIndex::npos) {
      const Tag96& tag = pool_[i].key.tag;
      pos = by_tag_.find(tag, TagIndex::hash(tag), tag_of());
    }
    Index& head = by_tag_.head_at(pos);
    matcher_internal::bucket_unlink<&Node::chain>(pool_, head, i);
    if (head == kNil) by_tag_.erase_at(pos);
    MsgT v = pool_[i].value.take();
    release(i);
    --size_;
    // Invariant (4); amortized O(1), each entry is stepped over once.
    while (begin_ < arrivals_.size() && !current(arrivals_[begin_])) ++begin_;
    if (begin_ == arrivals_.size()) {
      arrivals_.clear();
      begin_ = 0;
    }
    return v;
  }

  matcher_internal::NodePool<Node> pool_;
  std::vector<uint32_t> gens_;  // generation of each pool node
  TagIndex by_tag_;
  std::vector<Arrival> arrivals_;
  size_t begin_ = 0;  // entries before it are stale
  size_t size_ = 0;
};

}  // namespace psmd

#endif  // PSMD_DAEMON_MATCHER_H_
