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
//     in per-tag hash buckets, all others in one wildcard list, each in
//     posting order. A monotonic per-entry sequence stamp picks the earlier of
//     the bucket's and the wildcard list's first match.
//   - Unexpected: every message is on one arrival-ordered list and on its
//     tag's bucket. Exact-tag receives look only in the bucket; wildcard
//     receives scan the arrival list.
// So an exact-tag match costs O(1) whatever the queue depth, and wildcards
// cost what they must (a scan), with MPI ordering preserved across both.
// Nodes come from a chunked pool with a free list and are linked by 32-bit
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
#include <limits>
#include <memory>
#include <new>
#include <optional>
#include <stdexcept>
#include <type_traits>
#include <utility>
#include <vector>

#include <emmintrin.h>

#include "daemon/tag.h"

namespace psmd {
namespace matcher_internal {

// Nodes are addressed by 32-bit pool indices rather than pointers: half the
// link size, and indices stay valid when the pool grows.
using Index = uint32_t;
inline constexpr Index kNil = std::numeric_limits<Index>::max();

struct Link {
  Index prev = kNil;
  Index next = kNil;
};

// Head and tail of an intrusive doubly linked list of pool nodes.
struct List {
  Index head = kNil;
  Index tail = kNil;
  bool empty() const { return head == kNil; }
};

// Intrusive list operations. `kLink` is a pointer to the Link member that
// threads this list (a node can be on two lists at once), `nodes` anything
// indexable by Index.
template <auto kLink, typename Nodes>
void list_push_back(Nodes& nodes, List& list, Index i) {
  Link& l = nodes[i].*kLink;
  l.prev = list.tail;
  l.next = kNil;
  if (list.tail == kNil) {
    list.head = i;
  } else {
    (nodes[list.tail].*kLink).next = i;
  }
  list.tail = i;
}

template <auto kLink, typename Nodes>
void list_unlink(Nodes& nodes, List& list, Index i) {
  const Link l = nodes[i].*kLink;
  if (l.prev == kNil) {
    list.head = l.next;
  } else {
    (nodes[l.prev].*kLink).next = l.next;
  }
  if (l.next == kNil) {
    list.tail = l.prev;
  } else {
    (nodes[l.next].*kLink).prev = l.prev;
  }
}

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

// Raw storage for one T inside a pool node. The owning queue knows which
// nodes are live and constructs/destroys values explicitly; std::optional
// would add a flag (and padding) to every node.
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

  void grow() {
    if (chunks_.size() >= (kNil >> kChunkBits)) throw std::length_error("matcher: node pool full");
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
// distinct live tag at load <= 1/2.
class TagIndex {
 public:
  static constexpr size_t npos = ~size_t{0};

  static uint64_t hash(const Tag96& tag) { return Tag96Hash{}(tag); }

  template <typename TagOf>
  size_t find(const Tag96& tag, uint64_t h, TagOf tag_of) const {
    if (groups_.empty()) return npos;
    const uint32_t fp = Fingerprint(h);
    for (size_t g = Home(h);; g = (g + 1) & gmask_) {
      const Group& grp = groups_[g];
      for (unsigned m = Match(grp, fp); m != 0; m &= m - 1) {
        const unsigned j = static_cast<unsigned>(__builtin_ctz(m));
        if (tag_of(grp.head[j]) == tag) return g * kWidth + j;
      }
      if (Match(grp, kEmpty) != 0) return npos;
    }
  }

  void reserve_one() {
    if (used_ + 1 > MaxLoad(groups_.size() * kWidth)) {
      size_t cap = kWidth;
      while (MaxLoad(cap) < 2 * (live_ + 1)) cap *= 2;
      rehash(cap);
    }
  }

  template <typename TagOf>
  size_t find_or_insert(const Tag96& tag, uint64_t h, TagOf tag_of) {
    const uint32_t fp = Fingerprint(h);
    size_t free_pos = npos;
    for (size_t g = Home(h);; g = (g + 1) & gmask_) {
      Group& grp = groups_[g];
      for (unsigned m = Match(grp, fp); m != 0; m &= m - 1) {
        const unsigned j = static_cast<unsigned>(__builtin_ctz(m));
        if (tag_of(grp.head[j]) == tag) return g * kWidth + j;
      }
      if (free_pos == npos) {
        const unsigned f = Match(grp, kEmpty) | Match(grp, kDeleted);
        if (f != 0) free_pos = g * kWidth + static_cast<unsigned>(__builtin_ctz(f));
      }
      if (Match(grp, kEmpty) != 0) break;
    }
    uint32_t& slot_fp = groups_[free_pos / kWidth].fp[free_pos % kWidth];
    if (slot_fp == kEmpty) ++used_;
    slot_fp = fp;
    head_at(free_pos) = kNil;
    ++live_;
    return free_pos;
  }

  Index& head_at(size_t pos) { return groups_[pos / kWidth].head[pos % kWidth]; }
  Index head_at(size_t pos) const { return groups_[pos / kWidth].head[pos % kWidth]; }

  void erase_at(size_t pos) {
    Group& grp = groups_[pos / kWidth];
    if (Match(grp, kEmpty) != 0) {
      grp.fp[pos % kWidth] = kEmpty;
      --used_;
    } else {
      grp.fp[pos % kWidth] = kDeleted;
    }
    grp.head[pos % kWidth] = kNil;
    --live_;
  }

  template <typename F>
  void for_each_head(F&& f) const {
    if (live_ == 0) return;
    for (const Group& grp : groups_) {
      for (size_t j = 0; j < kWidth; ++j) {
        if (grp.fp[j] > kDeleted) f(grp.head[j]);
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

 private:
  static constexpr size_t kWidth = 8;
  static constexpr uint32_t kEmpty = 0;
  static constexpr uint32_t kDeleted = 1;

  struct alignas(64) Group {
    uint32_t fp[kWidth];
    Index head[kWidth];
  };

  static size_t MaxLoad(size_t cap) { return cap - cap / 8; }
  static uint32_t Fingerprint(uint64_t h) {
    const uint32_t f = static_cast<uint32_t>(h);
    return f < 2 ? f + 2 : f;
  }
  static size_t HomeOf(uint32_t fp, size_t ngroups) {
    return static_cast<size_t>((uint64_t{fp} * ngroups) >> 32);
  }
  size_t Home(uint64_t h) const { return HomeOf(Fingerprint(h), groups_.size()); }
  static unsigned Match(const Group& g, uint32_t fp) {
    const __m128i x = _mm_set1_epi32(static_cast<int>(fp));
    const __m128i a = _mm_cmpeq_epi32(_mm_load_si128(reinterpret_cast<const __m128i*>(g.fp)), x);
    const __m128i b = _mm_cmpeq_epi32(_mm_load_si128(reinterpret_cast<const __m128i*>(g.fp + 4)), x);
    return static_cast<unsigned>(_mm_movemask_epi8(_mm_packs_epi16(_mm_packs_epi32(a, b), _mm_setzero_si128())));
  }

  void rehash(size_t capacity) {
    std::vector<Group> fresh(capacity / kWidth);
    const size_t gmask = fresh.size() - 1;
    for (const Group& grp : groups_) {
      for (size_t j = 0; j < kWidth; ++j) {
        if (grp.fp[j] <= kDeleted) continue;
        for (size_t g = HomeOf(grp.fp[j], fresh.size());; g = (g + 1) & gmask) {
          const unsigned f = Match(fresh[g], kEmpty);
          if (f != 0) {
            const unsigned k = static_cast<unsigned>(__builtin_ctz(f));
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

  std::vector<Group> groups_;
  size_t gmask_ = 0;
  size_t live_ = 0;
  size_t used_ = 0;
};

}  // namespace matcher_internal

// ---------------------------------------------------------------------------
// PostedQueue: posted receives waiting for a message.
//
// Invariants:
//   (1) Every live receive is on exactly one chain: the exact_ bucket of its
//       tag if its selector is kTagSelAll, otherwise wild_.
//   (2) Every live receive has a unique seq; a lower seq was posted earlier.
//   (3) Every chain is in posting (= seq) order, because post() appends with
//       a fresh stamp and removal never reorders.
//   (4) exact_ holds no empty bucket.
//   (5) size_ equals the number of live receives; exactly the live nodes hold
//       a constructed value.
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
    for_each_node([&](Index i) { pool_[i].value.destroy(); });
  }

  void swap(PostedQueue& other) noexcept {
    using std::swap;
    swap(pool_, other.pool_);
    swap(exact_, other.exact_);
    swap(wild_, other.wild_);
    swap(next_seq_, other.next_seq_);
    swap(size_, other.size_);
  }

  void post(const RecvPattern& p, RecvT value) {
    const bool exact = is_exact_selector(p.sel);
    // Allocation (the only thing that can throw) happens before any change.
    if (exact) exact_.reserve_one();
    const Index i = pool_.acquire();
    Node& n = pool_[i];
    n.seq = next_seq_++;
    n.pattern = p;
    n.value.construct(std::move(value));
    if (exact) {
      const size_t pos = exact_.find_or_insert(p.tag, TagIndex::hash(p.tag), tag_of());
      matcher_internal::bucket_push_back<&Node::chain>(pool_, exact_.head_at(pos), i);
    } else {
      matcher_internal::list_push_back<&Node::chain>(pool_, wild_, i);
    }
    ++size_;
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
    // wild_ is in seq order: past exact_seq no wildcard can win, so stop
    // there. This keeps exact matches cheap even with many later wildcards.
    for (Index i = wild_.head; i != kNil && pool_[i].seq < exact_seq; i = pool_[i].chain.next) {
      if (matches(pool_[i].pattern, key)) {
        matcher_internal::list_unlink<&Node::chain>(pool_, wild_, i);
        return release(i);
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
    Index best = kNil;
    uint64_t best_seq = std::numeric_limits<uint64_t>::max();
    // Each chain is seq-ordered: only its first satisfying entry can win,
    // and entries at or past the best so far need not be looked at.
    auto scan = [&](Index head) {
      for (Index i = head; i != kNil && pool_[i].seq < best_seq; i = pool_[i].chain.next) {
        if (pred(std::as_const(pool_[i].value.get()))) {
          best = i;
          best_seq = pool_[i].seq;
          return;
        }
      }
    };
    scan(wild_.head);
    exact_.for_each_head(scan);
    if (best == kNil) return std::nullopt;
    if (is_exact_selector(pool_[best].pattern.sel)) {
      const Tag96& tag = pool_[best].pattern.tag;
      unlink_exact(best, exact_.find(tag, TagIndex::hash(tag), tag_of()));
    } else {
      matcher_internal::list_unlink<&Node::chain>(pool_, wild_, best);
    }
    return release(best);
  }

  size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }

  // Removes every entry, calling f(RecvT&&) for each in posting order. The
  // queue is already empty when f runs; receives f posts are not drained.
  // Allocates O(n) scratch: drain is for teardown, not the fast path.
  template <typename F>
  void drain(F&& f) {
    std::vector<Index> order;
    order.reserve(size_);
    for_each_node([&](Index i) { order.push_back(i); });
    std::sort(order.begin(), order.end(),
              [&](Index a, Index b) { return pool_[a].seq < pool_[b].seq; });
    exact_.clear();
    wild_ = List{};
    size_ = 0;

    size_t k = 0;
    try {
      for (; k < order.size(); ++k) {
        RecvT v = pool_[order[k]].value.take();
        pool_.release(order[k]);
        f(std::move(v));
      }
    } catch (...) {
      // Entries not yet handed to f are dropped.
      for (++k; k < order.size(); ++k) {
        pool_[order[k]].value.destroy();
        pool_.release(order[k]);
      }
      throw;
    }
  }

 private:
  using Index = matcher_internal::Index;
  using List = matcher_internal::List;
  using TagIndex = matcher_internal::TagIndex;
  static constexpr Index kNil = matcher_internal::kNil;

  struct Node {
    matcher_internal::Link chain;  // bucket or wild_; free list when unused
    uint64_t seq;
    RecvPattern pattern;
    matcher_internal::ValueSlot<RecvT> value;
  };

  auto tag_of() const {
    return [this](Index i) -> const Tag96& { return pool_[i].pattern.tag; };
  }

  // Calls f(index) for every live node, in no particular order.
  template <typename F>
  void for_each_node(F&& f) const {
    auto walk = [&](Index head) {
      for (Index i = head; i != kNil;) {
        const Index next = pool_[i].chain.next;  // f may destroy node i
        f(i);
        i = next;
      }
    };
    walk(wild_.head);
    exact_.for_each_head(walk);
  }

  Index first_accepting(Index head, uint64_t source) const {
    for (Index i = head; i != kNil; i = pool_[i].chain.next) {
      if (source_matches(pool_[i].pattern.source, source)) return i;
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
  List wild_;
  uint64_t next_seq_ = 0;
  size_t size_ = 0;
};

// ---------------------------------------------------------------------------
// UnexpectedQueue: arrived messages waiting for a receive.
//
// Invariants:
//   (1) Every live message is on arrival_ and on the by_tag_ bucket of its
//       tag, both in arrival order (push appends to both; removal unlinks
//       from both and never reorders).
//   (2) by_tag_ holds no empty bucket.
//   (3) size_ equals the number of live messages; exactly the live nodes
//       hold a constructed value.
// From (1): an exact-selector receive can only match messages with its own
// tag, so the first source-accepted entry of that bucket is the
// earliest-arrived match; any other receive scans arrival_ in order.
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
    for (Index i = arrival_.head; i != kNil; i = pool_[i].order.next) pool_[i].value.destroy();
  }

  void swap(UnexpectedQueue& other) noexcept {
    using std::swap;
    swap(pool_, other.pool_);
    swap(by_tag_, other.by_tag_);
    swap(arrival_, other.arrival_);
    swap(size_, other.size_);
  }

  void push(const MsgKey& key, MsgT value) {
    // Allocation (the only thing that can throw) happens before any change.
    by_tag_.reserve_one();
    const Index i = pool_.acquire();
    Node& n = pool_[i];
    n.key = key;
    n.value.construct(std::move(value));
    matcher_internal::list_push_back<&Node::order>(pool_, arrival_, i);
    const size_t pos = by_tag_.find_or_insert(key.tag, TagIndex::hash(key.tag), tag_of());
    matcher_internal::bucket_push_back<&Node::chain>(pool_, by_tag_.head_at(pos), i);
    ++size_;
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
    for (Index i = arrival_.head; i != kNil; i = pool_[i].order.next) {
      if (pred(std::as_const(pool_[i].value.get()))) return remove(Found{i, TagIndex::npos});
    }
    return std::nullopt;
  }

  size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }

  // Removes every message, calling f(const MsgKey&, MsgT&&) for each in
  // arrival order. The queue is already empty when f runs; messages f pushes
  // are not drained.
  template <typename F>
  void drain(F&& f) {
    Index i = arrival_.head;
    arrival_ = List{};
    by_tag_.clear();
    size_ = 0;
    try {
      while (i != kNil) {
        const Index next = pool_[i].order.next;
        const MsgKey key = pool_[i].key;
        MsgT v = pool_[i].value.take();
        pool_.release(i);
        i = next;
        f(key, std::move(v));
      }
    } catch (...) {
      // Messages not yet handed to f are dropped.
      while (i != kNil) {
        const Index next = pool_[i].order.next;
        pool_[i].value.destroy();
        pool_.release(i);
        i = next;
      }
      throw;
    }
  }

 private:
  using Index = matcher_internal::Index;
  using List = matcher_internal::List;
  using TagIndex = matcher_internal::TagIndex;
  static constexpr Index kNil = matcher_internal::kNil;

  struct Node {
    matcher_internal::Link order;  // arrival_
    matcher_internal::Link chain;  // by_tag_ bucket; free list when unused
    MsgKey key;
    matcher_internal::ValueSlot<MsgT> value;
  };

  // A located message and, if known, the slot of its tag's bucket.
  struct Found {
    Index node;
    size_t bucket_pos;
  };

  auto tag_of() const {
    return [this](Index i) -> const Tag96& { return pool_[i].key.tag; };
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
    for (Index i = arrival_.head; i != kNil; i = pool_[i].order.next) {
      if (matches(p, pool_[i].key)) return Found{i, TagIndex::npos};
    }
    return Found{kNil, TagIndex::npos};
  }

  // Unlinks the message from arrival_ and its bucket (dropping the bucket if
  // now empty, invariant 2), frees the node and returns the value.
  MsgT remove(Found f) {
    const Index i = f.node;
    matcher_internal::list_unlink<&Node::order>(pool_, arrival_, i);
    size_t pos = f.bucket_pos;
    if (pos == TagIndex::npos) {
      const Tag96& tag = pool_[i].key.tag;
      pos = by_tag_.find(tag, TagIndex::hash(tag), tag_of());
    }
    Index& head = by_tag_.head_at(pos);
    matcher_internal::bucket_unlink<&Node::chain>(pool_, head, i);
    if (head == kNil) by_tag_.erase_at(pos);
    MsgT v = pool_[i].value.take();
    pool_.release(i);
    --size_;
    return v;
  }

  matcher_internal::NodePool<Node> pool_;
  TagIndex by_tag_;
  List arrival_;
  size_t size_ = 0;
};

}  // namespace psmd

#endif  // PSMD_DAEMON_MATCHER_H_
