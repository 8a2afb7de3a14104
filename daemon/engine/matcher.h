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
// Design:
//   - Posted: receives are grouped by class (selector, and whether any
//     source is accepted) and hashed on (class, tag & selector, source) into
//     FIFO buckets; a message looks up one bucket per class in use (exact
//     96-bit, 64-bit and MPI wildcard receives alike). A monotonic
//     per-entry sequence stamp picks the earliest of those buckets' heads.
//     Every receive is also hashed on its id, so a cancel is O(1) too.
//   - Unexpected: every message is on its tag's bucket and has an entry in
//     an arrival-ordered log. Exact-tag receives look only in the bucket;
//     wildcard receives scan the log (its length is bounded by the
//     receiver's unexpected-bytes budget).
// So posting, matching and cancelling a receive cost O(1) whatever the queue
// depth (O(classes in use), at most PostedQueue::kMaxClasses, plus a scan
// of the receives of further classes), with MPI ordering preserved. No
// operation touches every entry: hash tables grow incrementally
// (HashIndex), node pools in fixed chunks. One tenant posting millions of
// receives must not stall the worker that serves every other (issue 12).
//
// Why it is laid out as it is: at depth a match costs what its cache misses
// cost, so the match path touches as few cold cache lines as it can (the
// hash slot of its key, then the entry itself) and links are 32-bit
// indices. The unexpected queue's arrival order is kept in an array rather
// than a linked list: scans read memory front to back instead of chasing
// pointers, and removing an entry writes nothing into its neighbours.
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

#ifndef PSMD_DAEMON_ENGINE_MATCHER_H_
#define PSMD_DAEMON_ENGINE_MATCHER_H_

#include <algorithm>
#include <array>
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

#include <sys/mman.h>

#include "daemon/engine/tag.h"

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

// Zeroed memory straight from the kernel, whose zero pages arrive as they
// are first touched, and given straight back: node chunks and large hash
// tables. Through malloc, a queue of a million receives left 64 MiB of
// freed chunks resident in the worker's arena after its endpoint closed
// (issue 38), and calloc memsets a large block whenever glibc serves it
// from its heap, a stop-the-world pass over a whole new table.
inline void* MapZeroed(size_t bytes) {
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) throw std::bad_alloc();
  return p;
}
inline void Unmap(void* p, size_t bytes) { munmap(p, bytes); }

// Fixed-size chunks of nodes plus a free list threaded through
// `Node::chain.next`. Chunks (not one growing vector) so growth never moves
// live nodes: no latency spike from copying a deep queue, and pointers handed
// out by find() stay valid until that node is removed. Memory is bounded by
// the peak number of live nodes and reused afterwards. The pool never touches
// node values: the queue constructs and destroys them.
template <typename Node>
class NodePool {
 public:
  static_assert(std::is_trivially_destructible_v<Node>,
                "chunks are unmapped without destroying their nodes");

  Node& operator[](Index i) { return chunks_[i >> kChunkBits][i & kChunkMask]; }
  const Node& operator[](Index i) const {
    return chunks_[i >> kChunkBits][i & kChunkMask];
  }

  // Number of nodes allocated so far: every index handed out is below it.
  Index capacity() const {
    return static_cast<Index>(chunks_.size()) * kChunkSize;
  }

  size_t memory_bytes() const {
    return chunks_.size() * kChunkBytes +
           chunks_.capacity() * sizeof(chunks_[0]);
  }

  // For a pool whose nodes are all unused and which will not be used again
  // until empty: unmaps its last chunk. Returns whether any chunk is left.
  // Lets an owner give a large pool back a bounded amount at a time.
  bool release_chunk() {
    free_ = kNil;  // threads through the chunks going away
    if (!chunks_.empty()) chunks_.pop_back();
    return !chunks_.empty();
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
  static constexpr size_t kPageBytes = 4096;
  static constexpr size_t kChunkBytes =
      (kChunkSize * sizeof(Node) + kPageBytes - 1) / kPageBytes * kPageBytes;
  struct ChunkUnmap {
    void operator()(Node* p) const { Unmap(p, kChunkBytes); }
  };
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
    Node* nodes = static_cast<Node*>(MapZeroed(kChunkBytes));
    std::uninitialized_default_construct_n(nodes, kChunkSize);
    std::unique_ptr<Node[], ChunkUnmap> chunk(nodes);
    chunks_.push_back(std::move(chunk));  // (unmapped again if this throws)
    // Thread the new chunk onto the free list in index order so that a
    // freshly filled queue is laid out sequentially in memory.
    for (Index k = kChunkSize; k-- > 0;) {
      (*this)[base + k].chain.next = free_;
      free_ = base + k;
    }
  }

  std::vector<std::unique_ptr<Node[], ChunkUnmap>> chunks_;
  Index free_ = kNil;
};

// Open-addressing hash table from a key's 32-bit hash to the head of the
// key's bucket list. The key itself is not stored: the caller's `eq(head)`
// compares it against the head node, which the caller is about to touch
// anyway. Linear probing with backward-shift deletion, so lookups stay short
// however many buckets have come and gone. A slot is 8 bytes (the hash + the
// head) so the table stays cache-resident at depth. A bucket is erased as
// soon as its last node leaves, and the table grows at load 1/4: at load 1/2
// probe runs and backward shifts were long enough that their unpredictable
// branches cost more than the larger table does (docs/perf.md, "Matching
// engine").
//
// Growth is incremental (as in Redis's dict): when the table is full enough,
// a table twice the size becomes the one new buckets go to, and the old one
// is only looked up and erased from while each reserve_one() moves the next
// kMigrateSlots of its slots over. No operation ever walks the whole table:
// a single-step rehash of 16.7 M receives stalled psmd for 7.9 s (issue 12).
// An all-zero slot is empty and large tables are fresh anonymous mappings,
// so a new table costs no initialisation pass either (the kernel hands out
// zero pages as they are first touched).
//
// Invariants:
//   (1) Every bucket has exactly one slot, in cur_ or in old_.
//   (2) cur_ holds no tombstones. old_ gains no slots: a bucket erased there
//       leaves a tombstone, and a moved one too, so nothing in old_ ever
//       moves and the migration cursor cannot skip a slot.
//   (3) Every live slot of old_ is at or after migrate_; old_ is retired
//       when migrate_ reaches its end, and its pages are unmapped a few at
//       a time by the following reserve_one() calls (retired_).
//   (4) After reserve_one(), live_ + 1 <= cur_.size / 4 and every probe run
//       ends at an empty slot, in either table.
//   (5) old_ is gone before cur_ must grow again: cur_ grows when it reaches
//       a quarter full, to twice the old size, so it starts at most an eighth
//       full; reaching a quarter takes at least old_.size / 4 inserts, and
//       kMigrateSlots per insert empties old_ within old_.size / 16. (Should
//       that ever fail, grow() finishes the migration first; the
//       largest_step() hook lets tests check it does not happen.)
class HashIndex {
 public:
  static constexpr size_t npos = ~size_t{0};
  // Slots of the old table moved per reserve_one() (invariant 5).
  static constexpr size_t kMigrateSlots = 16;
  // Bytes of a retired table unmapped per reserve_one().
  static constexpr size_t kUnmapBytes = size_t{64} << 10;

  HashIndex() = default;
  HashIndex(const HashIndex&) = delete;
  HashIndex& operator=(const HashIndex&) = delete;
  HashIndex(HashIndex&& other) noexcept { swap(other); }
  ~HashIndex() { unmap_some(retired_bytes_); }
  HashIndex& operator=(HashIndex&& other) noexcept {
    HashIndex tmp(std::move(other));
    swap(tmp);
    return *this;
  }

  void swap(HashIndex& other) noexcept {
    using std::swap;
    cur_.swap(other.cur_);
    old_.swap(other.old_);
    swap(migrate_, other.migrate_);
    swap(live_, other.live_);
    swap(old_live_, other.old_live_);
    swap(probes_, other.probes_);
    swap(largest_step_, other.largest_step_);
    swap(retired_, other.retired_);
    swap(retired_bytes_, other.retired_bytes_);
  }

  // Position of the bucket whose slot holds hash `h` and whose head
  // satisfies eq(head), or npos. Positions stay valid until the next
  // reserve_one(), find_or_insert() or erase().
  template <typename Eq>
  size_t find(uint32_t h, Eq eq) const {
    if (live_ == 0) return npos;
    const size_t pos = cur_.find(h, eq, &probes_);
    if (pos != npos || old_.size == 0) return pos;
    const size_t old_pos = old_.find(h, eq, &probes_);
    return old_pos == npos ? npos : cur_.size + old_pos;
  }

  // Asks for the slot where a lookup of hash `h` starts, without waiting.
  void prefetch_slot(uint32_t h) const {
    if (live_ == 0) return;
    prefetch_address(&cur_.slots[h & cur_.mask]);
    if (old_.size != 0) prefetch_address(&old_.slots[h & old_.mask]);
  }

  // Head of the first bucket in `h`'s probe run whose slot holds hash `h`,
  // or kNil: the bucket find() would return unless two live keys share all
  // 32 hash bits, found without reading any node. For prefetching.
  Index head_by_hash(uint32_t h) const {
    if (live_ == 0) return kNil;
    Index head = cur_.head_by_hash(h);
    if (head == kNil && old_.size != 0) head = old_.head_by_hash(h);
    return head;
  }

  // Grows (or moves a bounded share of the old table) so that the next
  // find_or_insert() neither allocates nor throws. Invalidates positions.
  // Strong exception guarantee (only the allocation of a table can throw).
  void reserve_one() {
    unmap_some(kUnmapBytes);
    size_t step = 0;
    if (old_.size != 0) step += migrate(kMigrateSlots);
    if ((live_ + 1) * 4 > cur_.size) {
      Table fresh(std::max<size_t>(16, cur_.size * 2));  // may throw
      if (old_.size != 0) step += migrate(old_.size);    // see invariant 5
      old_.swap(cur_);
      cur_.swap(fresh);
      migrate_ = 0;
      old_live_ = live_;
      if (old_live_ == 0) retire(old_);
    }
    largest_step_ = std::max(largest_step_, step);
  }

  // Like find(), but creates the bucket (with head kNil) if absent. The
  // caller must set_head() before the next call (no empty buckets). Call
  // reserve_one() first.
  template <typename Eq>
  size_t find_or_insert(uint32_t h, Eq eq) {
    const size_t found = find(h, eq);
    if (found != npos) return found;
    const size_t pos = cur_.free_slot_for(h);
    cur_.slots[pos].hash = h;
    ++live_;
    return pos;
  }

  Index head(size_t pos) const { return slot(pos).head(); }
  void set_head(size_t pos, Index head) { slot(pos).set_head(head); }

  // Removes the (now empty) bucket at `pos`.
  void erase(size_t pos) {
    --live_;
    if (pos >= cur_.size) {
      old_.slots[pos - cur_.size].mark_dead();  // invariant 2
      --old_live_;
      return;
    }
    // Backward shift: later members of the probe run move back so that no
    // lookup crosses a hole it should not.
    Slot* s = cur_.slots;
    const size_t mask = cur_.mask;
    size_t hole = pos;
    for (size_t j = (hole + 1) & mask; !s[j].empty(); j = (j + 1) & mask) {
      // Slot j may fill the hole iff the hole lies on j's probe path, i.e.
      // j is at least as far from its home slot as from the hole.
      if (((j - s[j].hash) & mask) >= ((j - hole) & mask)) {
        s[hole] = s[j];
        hole = j;
      }
    }
    s[hole] = Slot{};
  }

  // Calls f(head) for every bucket.
  template <typename F>
  void for_each_head(F&& f) const {
    if (live_ == 0) return;
    cur_.for_each_head(f);
    old_.for_each_head(f);
  }

  void clear() { *this = HashIndex(); }

  // For an index whose buckets are forgotten (moved out of its queue, never
  // looked up again): frees its tables, unmapping at most kUnmapBytes of a
  // large one per call. Returns whether any memory is left.
  bool release_some() {
    live_ = old_live_ = 0;
    if (retired_bytes_ == 0) retire(old_.size != 0 ? old_ : cur_);
    unmap_some(kUnmapBytes);
    return retired_bytes_ > 0 || cur_.size > 0 || old_.size > 0;
  }

  size_t memory_bytes() const {
    return (cur_.size + old_.size) * sizeof(Slot) + retired_bytes_;
  }

  // Test hooks: slots looked at by lookups so far, and the most slots one
  // reserve_one() moved.
  uint64_t probes() const { return probes_; }
  size_t largest_step() const { return largest_step_; }

 private:
  // head is stored complemented so that an all-zero slot is empty (calloc).
  struct Slot {
    uint32_t hash;  // low bits are the home position
    uint32_t enc;   // ~head; 0: empty; kDead: a tombstone (old table only)
    static constexpr uint32_t kDead = 1;  // ~kDead is never a node index
    bool empty() const { return enc == 0; }
    bool live() const { return enc > kDead; }
    Index head() const { return ~enc; }
    void set_head(Index head) { enc = ~head; }
    void mark_dead() { enc = kDead; }
  };
  static_assert(sizeof(Slot) == 8);

  // Zeroed memory for n slots. Large tables are mapped straight from the
  // kernel, whose zero pages arrive as they are first touched: calloc would
  // memset them whenever glibc serves the request from its heap (it does
  // once a freed mapping has raised its mmap threshold), and that memset is
  // a stop-the-world pass over the whole new table.
  static constexpr size_t kMapBytes = size_t{1} << 20;
  static Slot* Allocate(size_t n) {
    const size_t bytes = n * sizeof(Slot);
    if (bytes >= kMapBytes) return static_cast<Slot*>(MapZeroed(bytes));
    void* p = std::calloc(n, sizeof(Slot));
    if (p == nullptr) throw std::bad_alloc();
    return static_cast<Slot*>(p);
  }
  static void Free(Slot* p, size_t n) {
    if (p == nullptr) return;
    if (n * sizeof(Slot) >= kMapBytes) {
      Unmap(p, n * sizeof(Slot));
    } else {
      std::free(p);
    }
  }

  struct Table {
    Slot* slots = nullptr;
    size_t size = 0;  // 0 or a power of two
    size_t mask = 0;

    Table() = default;
    explicit Table(size_t n) : slots(Allocate(n)), size(n), mask(n - 1) {}
    Table(const Table&) = delete;
    Table& operator=(const Table&) = delete;
    Table& operator=(Table&& o) noexcept {
      Table tmp;
      tmp.swap(o);
      swap(tmp);
      return *this;
    }
    ~Table() { Free(slots, size); }
    void swap(Table& o) noexcept {
      std::swap(slots, o.slots);
      std::swap(size, o.size);
      std::swap(mask, o.mask);
    }

    template <typename Eq>
    size_t find(uint32_t h, Eq& eq, uint64_t* probes) const {
      if (size == 0) return npos;
      for (size_t pos = h & mask;; pos = (pos + 1) & mask) {
        ++*probes;
        const Slot& s = slots[pos];
        if (s.empty()) return npos;
        if (s.hash == h && s.live() && eq(s.head())) return pos;
      }
    }
    Index head_by_hash(uint32_t h) const {
      if (size == 0) return kNil;
      for (size_t pos = h & mask; !slots[pos].empty(); pos = (pos + 1) & mask) {
        if (slots[pos].hash == h && slots[pos].live()) return slots[pos].head();
      }
      return kNil;
    }
    size_t free_slot_for(uint32_t h) const {
      size_t pos = h & mask;
      while (!slots[pos].empty()) pos = (pos + 1) & mask;
      return pos;
    }
    template <typename F>
    void for_each_head(F& f) const {
      for (size_t k = 0; k < size; ++k) {
        if (slots[k].live()) f(slots[k].head());
      }
    }
  };

  Slot& slot(size_t pos) {
    return pos < cur_.size ? cur_.slots[pos] : old_.slots[pos - cur_.size];
  }
  const Slot& slot(size_t pos) const {
    return pos < cur_.size ? cur_.slots[pos] : old_.slots[pos - cur_.size];
  }

  // Moves up to n slots of old_ (from migrate_ on) into cur_; frees old_
  // once it is all moved. Returns the number of slots looked at.
  size_t migrate(size_t n) {
    size_t k = 0;
    for (; k < n && migrate_ < old_.size; ++k, ++migrate_) {
      Slot& s = old_.slots[migrate_];
      if (!s.live()) continue;
      cur_.slots[cur_.free_slot_for(s.hash)] = s;
      s.mark_dead();
      --old_live_;
    }
    if (migrate_ == old_.size) {
      retire(old_);
      old_live_ = 0;
      migrate_ = 0;
    }
    return k;
  }

  // Frees table t: a small one at once, a mapped one kUnmapBytes per later
  // reserve_one() (unmapping touched pages costs ~0.5 us each: 16 MB at
  // once was a 2 ms step).
  void retire(Table& t) {
    unmap_some(retired_bytes_);  // finish the previous one (long done)
    if (t.size * sizeof(Slot) >= kMapBytes) {
      retired_ = reinterpret_cast<char*>(t.slots);
      retired_bytes_ = t.size * sizeof(Slot);
      t.slots = nullptr;
      t.size = t.mask = 0;
    }
    t = Table();
  }
  size_t unmap_some(size_t bytes) {
    bytes = std::min(bytes, retired_bytes_);
    if (bytes == 0) return 0;
    munmap(retired_ + retired_bytes_ - bytes, bytes);
    retired_bytes_ -= bytes;
    return bytes / 4096;
  }

  Table cur_;
  Table old_;
  char* retired_ = nullptr;  // a migrated table's pages still mapped
  size_t retired_bytes_ = 0;
  size_t migrate_ = 0;   // next slot of old_ to move
  size_t live_ = 0;      // buckets in both tables
  size_t old_live_ = 0;  // of which in old_
  mutable uint64_t probes_ = 0;
  size_t largest_step_ = 0;
};

// The hash of a tag, for the unexpected queue's tag index.
inline uint32_t TagHash(const Tag96& tag) {
  return static_cast<uint32_t>(Tag96Hash{}(tag));
}

// MurmurHash3's fmix64: full avalanche, so the low bits index a table.
inline uint64_t Mix64(uint64_t h) {
  h ^= h >> 33;
  h *= 0xFF51AFD7ED558CCDULL;
  h ^= h >> 33;
  h *= 0xC4CEB9FE1A85EC53ULL;
  h ^= h >> 33;
  return h;
}

inline Tag96 MaskTag(const Tag96& tag, const Tag96& sel) {
  return Tag96{{tag.w[0] & sel.w[0], tag.w[1] & sel.w[1], tag.w[2] & sel.w[2]}};
}

}  // namespace matcher_internal

// ---------------------------------------------------------------------------
// PostedQueue: posted receives waiting for a message.
//
// A receive's class is its selector plus whether it takes any source. For a
// class, the message tag bits its selector compares and the source it
// accepts (or kAnySource) determine exactly which receives a message
// matches, so receives are hashed on (class, tag & selector, source) into
// FIFO buckets: every receive of the bucket a message's key leads to
// matches it, and the bucket's first is the earliest. A message looks up
// one bucket per class in use, and takes the earliest of their heads. That
// covers exact 96-bit receives, 64-bit psm2_mq_irecv receives (tag2 selector
// 0), MPI's ANY_TAG/ANY_SOURCE selectors and the match-all selector alike,
// each at O(1) whatever the queue depth. Only a receive whose class would
// be the kMaxClasses+1-th in use goes to the overflow list, which matching
// scans (up to the best hashed candidate).
//
// Every receive is also on the bucket of its id (the daemon's request
// token) in a second hash table, so a cancel finds it in O(1) rather than
// scanning all of them (with 1 M receives posted, cancels pushed a
// bystander's round trip to 8.6 ms; issue 12).
//
// Invariants:
//   (1) Every live receive is a node of pool_, on the by_key_ bucket of
//       (its class, its tag & selector, its source filter) if its class is
//       < kMaxClasses, otherwise (class kOverflow) on the overflow list; and
//       on the by_id_ bucket of its id.
//   (2) Every live receive has a unique seq; a lower seq was posted earlier.
//   (3) Every bucket and the overflow list are in posting (= seq) order,
//       because post() appends with a fresh stamp and removal never
//       reorders.
//   (4) by_key_ and by_id_ hold no empty bucket. classes_[c].live counts the
//       receives of class c; bit c of live_classes_ is set iff it is > 0.
//   (5) size_ equals the number of live receives; exactly they hold a
//       constructed value.
// From (1)-(3): the earliest-posted receive matching a message is the
// earliest of the heads of the buckets its key leads to, one per class in
// live_classes_, and the first matching receive of the overflow list.
template <typename RecvT>
class PostedQueue {
  static_assert(std::is_nothrow_move_constructible_v<RecvT>,
                "RecvT must be nothrow move constructible");

 public:
  // Classes hashed at once; a match looks up one bucket per class in use.
  // MPI uses 2-4 (exact, ANY_SOURCE, ANY_TAG, both).
  static constexpr uint32_t kMaxClasses = 16;
  static_assert(kMaxClasses < 32, "live_classes_ holds one bit per class");

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
  ~PostedQueue() { destroy_values(); }

  void swap(PostedQueue& other) noexcept {
    using std::swap;
    swap(pool_, other.pool_);
    by_key_.swap(other.by_key_);
    by_id_.swap(other.by_id_);
    swap(shed_.pool, other.shed_.pool);
    shed_.by_key.swap(other.shed_.by_key);
    shed_.by_id.swap(other.shed_.by_id);
    swap(classes_, other.classes_);
    swap(live_classes_, other.live_classes_);
    swap(overflow_, other.overflow_);
    swap(overflow_steps_, other.overflow_steps_);
    swap(next_seq_, other.next_seq_);
    swap(size_, other.size_);
  }

  // Posts a receive; `id` is what remove_id() finds it by (need not be
  // unique: remove_id() takes the earliest-posted receive with that id).
  void post(const RecvPattern& p, RecvT value, uint64_t id = 0) {
    // Allocation (the only thing that can throw) happens before any change.
    const uint32_t c = class_for(p);
    if (c != kOverflow) by_key_.reserve_one();
    by_id_.reserve_one();
    pool_.reserve_one();
    const Index i = pool_.acquire();
    Node& n = pool_[i];
    n.tag = matcher_internal::MaskTag(p.tag, p.sel);
    n.sel = p.sel;
    n.source = p.source;
    n.seq = next_seq_++;
    n.id = id;
    n.cls = c;
    n.value.construct(std::move(value));
    if (c == kOverflow) {
      matcher_internal::bucket_push_back<&Node::chain>(pool_, overflow_, i);
    } else {
      if (classes_[c].live++ == 0) {
        classes_[c].sel = p.sel;
        classes_[c].any_source = p.source == kAnySource;
        live_classes_ |= 1u << c;
      }
      const size_t pos =
          by_key_.find_or_insert(KeyHash(c, n.tag, n.source), KeyEq(c, n));
      push_back<&Node::chain>(by_key_, pos, i);
    }
    const size_t pos = by_id_.find_or_insert(IdHash(id), IdEq(id));
    push_back<&Node::id_chain>(by_id_, pos, i);
    ++size_;
  }

  // Start loading the memory take_match(key) will read, without changing the
  // queue. At depth a match waits for main memory twice (~130 ns each here):
  // for its key's hash slot, then for the node the slot names. A caller
  // holding a batch of messages calls prefetch_slot() for all of them, then
  // prefetch_entry() for all of them, then matches: the first pass only
  // computes addresses, so all the slot misses are in flight at once; the
  // second reads the slots (mostly arrived by then) and does the same for
  // the nodes.
  void prefetch_slot(const MsgKey& key) const {
    for_each_class_key(key, [&](uint32_t, const Tag96&, uint64_t, uint32_t h) {
      by_key_.prefetch_slot(h);
    });
  }
  void prefetch_entry(const MsgKey& key) const {
    for_each_class_key(key, [&](uint32_t, const Tag96&, uint64_t, uint32_t h) {
      const Index head = by_key_.head_by_hash(h);
      if (head != kNil) matcher_internal::prefetch_node(pool_[head]);
    });
  }

  // Removes and returns the earliest-posted receive matching `key`. Always
  // inlined: the engine calls it on every message's path from a copy of
  // MqEngine::Arrive per part of a message, and GCC inlines a function this
  // size into one caller only; the call cost bench/hop 25 instructions a
  // message more (callgrind).
  [[gnu::always_inline]] std::optional<RecvT> take_match(const MsgKey& key) {
    Index best = kNil;
    uint64_t best_seq = std::numeric_limits<uint64_t>::max();
    size_t best_pos = HashIndex::npos;
    for_each_class_key(
        key, [&](uint32_t c, const Tag96& masked, uint64_t src, uint32_t h) {
          const size_t pos = by_key_.find(h, [&](Index head) {
            const Node& n = pool_[head];
            return n.cls == c && n.source == src && n.tag == masked;
          });
          if (pos == HashIndex::npos) return;
          const Index head = by_key_.head(pos);
          if (pool_[head].seq < best_seq) {
            best = head;
            best_seq = pool_[head].seq;
            best_pos = pos;
          }
        });
    // Overflow receives posted after the best candidate cannot win.
    for (Index i = overflow_; i != kNil && pool_[i].seq < best_seq;
         i = pool_[i].chain.next) {
      ++overflow_steps_;
      const Node& n = pool_[i];
      if (source_matches(n.source, key.source) &&
          tag_matches(n.tag, n.sel, key.tag)) {
        best = i;
        best_pos = HashIndex::npos;
        break;
      }
    }
    if (best == kNil) return std::nullopt;
    unlink(best, best_pos);
    return release(best);
  }

  // Removes and returns the earliest-posted receive posted with `id`
  // (cancel). O(1).
  std::optional<RecvT> remove_id(uint64_t id) {
    const size_t pos = by_id_.find(IdHash(id), IdEq(id));
    if (pos == HashIndex::npos) return std::nullopt;
    const Index i = by_id_.head(pos);
    unlink(i, HashIndex::npos);
    return release(i);
  }

  // Removes the earliest-posted receive whose value satisfies
  // pred(const RecvT&). O(n): for tests and tools; the daemon cancels with
  // remove_id(). pred is evaluated on entries in no particular order and
  // must have no side effects.
  template <typename Pred>
  std::optional<RecvT> remove_first_if(Pred pred) {
    Index best = kNil;
    for_each_live([&](Index i) {
      if ((best == kNil || pool_[i].seq < pool_[best].seq) &&
          pred(std::as_const(pool_[i].value.get()))) {
        best = i;
      }
    });
    if (best == kNil) return std::nullopt;
    unlink(best, HashIndex::npos);
    return release(best);
  }

  // Removes every receive whose value satisfies pred(const RecvT&), calling
  // f(RecvT&&) for each (in no particular order). One O(n) pass however
  // many go: a peer's death removes every receive naming it.
  template <typename Pred, typename F>
  void remove_all_if(Pred pred, F f) {
    std::vector<Index> doomed;
    for_each_live([&](Index i) {
      if (pred(std::as_const(pool_[i].value.get()))) doomed.push_back(i);
    });
    for (Index i : doomed) {
      unlink(i, HashIndex::npos);
      f(release(i));
    }
  }

  size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }

  // Heap bytes held, excluding what values own.
  size_t memory_bytes() const {
    return pool_.memory_bytes() + by_key_.memory_bytes() +
           by_id_.memory_bytes() + shed_.pool.memory_bytes() +
           shed_.by_key.memory_bytes() + shed_.by_id.memory_bytes();
  }

  // Gives back the memory an empty queue kept from its peak, a bounded
  // amount per call (a chunk of nodes or HashIndex::kUnmapBytes of a
  // table): the first call on an empty queue sets its nodes and tables
  // aside, O(1), and each call frees some of them, whatever the queue does
  // meanwhile. Returns whether more is left to free (call again). Nodes
  // and tables are otherwise kept for reuse, so a queue a tenant filled
  // with a million receives and cancelled would hold ~180 MB until its
  // endpoint closed (issue 38).
  bool shed_memory() {
    if (size_ == 0 && !shedding() && pool_.capacity() != 0) {
      shed_.pool = std::move(pool_);
      pool_ = matcher_internal::NodePool<Node>();
      shed_.by_key.swap(by_key_);
      shed_.by_id.swap(by_id_);
      reset_index();
    }
    if (!shedding()) return false;
    // Tables first: theirs are the pages a later post touches at random.
    if (!shed_.by_key.release_some() && !shed_.by_id.release_some()) {
      shed_.pool.release_chunk();
    }
    return shedding();
  }

  // Calls f(const RecvPattern&, uint64_t id, const RecvT&) for every
  // receive in posting order, leaving the queue as it is; f must not touch
  // the queue. The pattern's tag is the posted tag & its selector, which
  // matches what the posted one did: posting the receives again in this
  // order, with these patterns and ids, into an empty queue gives a queue
  // that matches every message as this one does (a handover, issue 33).
  // Allocates O(n) scratch, as drain does.
  template <typename F>
  void for_each_in_order(F&& f) const {
    std::vector<Index> all;
    all.reserve(size_);
    for_each_live([&](Index i) { all.push_back(i); });
    std::sort(all.begin(), all.end(),
              [&](Index a, Index b) { return pool_[a].seq < pool_[b].seq; });
    for (const Index i : all) {
      const Node& n = pool_[i];
      f(RecvPattern{n.source, n.tag, n.sel}, n.id, n.value.get());
    }
  }

  // Removes every entry, calling f(RecvT&&) for each in posting order. The
  // queue is already empty when f runs; receives f posts are not drained.
  // Allocates O(n) scratch: drain is for teardown, not the fast path.
  template <typename F>
  void drain(F&& f) {
    std::vector<Index> all;
    all.reserve(size_);
    for_each_live([&](Index i) { all.push_back(i); });
    std::sort(all.begin(), all.end(),
              [&](Index a, Index b) { return pool_[a].seq < pool_[b].seq; });
    reset_index();
    size_t e = 0;
    try {
      while (e < all.size()) {
        const Index i = all[e++];  // handed out even if f throws
        RecvT v = pool_[i].value.take();
        pool_.release(i);
        f(std::move(v));
      }
    } catch (...) {
      // Entries not yet handed to f are dropped.
      for (; e < all.size(); ++e) {
        pool_[all[e]].value.destroy();
        pool_.release(all[e]);
      }
      throw;
    }
  }

  // Drops every entry. Frees the memory in O(chunks) when RecvT is trivially
  // destructible (the daemon's case: no per-receive walk when an endpoint
  // with millions of receives closes).
  void clear() {
    destroy_values();
    pool_ = matcher_internal::NodePool<Node>();
    reset_index();
  }

  // Test hooks: lookup and scan work done so far (hash slots probed plus
  // overflow entries looked at), and the most hash slots one post moved
  // while growing a table.
  uint64_t work() const {
    return by_key_.probes() + by_id_.probes() + overflow_steps_;
  }
  size_t largest_growth_step() const {
    return std::max(by_key_.largest_step(), by_id_.largest_step());
  }

 private:
  using Index = matcher_internal::Index;
  using HashIndex = matcher_internal::HashIndex;
  using Link = matcher_internal::Link;
  static constexpr Index kNil = matcher_internal::kNil;
  static constexpr uint32_t kOverflow = kMaxClasses;

  struct Node {
    Link chain;     // by_key_ bucket or overflow list; free list when unused
    Link id_chain;  // by_id_ bucket
    Tag96 tag;      // the pattern's tag & its selector
    Tag96 sel;
    uint64_t source;
    uint64_t seq;
    uint64_t id;
    uint32_t cls;  // < kMaxClasses, or kOverflow
    matcher_internal::ValueSlot<RecvT> value;
  };

  struct Class {
    Tag96 sel{};
    bool any_source = false;
    uint32_t live = 0;
  };

  static uint32_t KeyHash(uint32_t c, const Tag96& masked, uint64_t source) {
    uint64_t h = (uint64_t{masked.w[1]} << 32) | masked.w[0];
    h ^= ((uint64_t{c} << 32) | masked.w[2]) * 0x9E3779B97F4A7C15ULL;
    h ^= matcher_internal::Mix64(source + 0x632BE59BD9B4E019ULL);
    return static_cast<uint32_t>(matcher_internal::Mix64(h));
  }
  static uint32_t IdHash(uint64_t id) {
    return static_cast<uint32_t>(matcher_internal::Mix64(id));
  }
  auto KeyEq(uint32_t c, const Node& of) const {
    return [this, c, tag = of.tag, src = of.source](Index head) {
      const Node& n = pool_[head];
      return n.cls == c && n.source == src && n.tag == tag;
    };
  }
  auto IdEq(uint64_t id) const {
    return [this, id](Index head) { return pool_[head].id == id; };
  }

  // The class p belongs to: one in use with its selector and source kind, a
  // free one (the lowest), or kOverflow when all are taken. Visits only the
  // classes in use: a queue that empties between receives (a ping-pong)
  // frees its class every time.
  uint32_t class_for(const RecvPattern& p) const {
    const bool any = p.source == kAnySource;
    for (uint32_t m = live_classes_; m != 0; m &= m - 1) {
      const uint32_t c = static_cast<uint32_t>(__builtin_ctz(m));
      if (classes_[c].sel == p.sel && classes_[c].any_source == any) return c;
    }
    const uint32_t free = ~live_classes_ & ((1u << kMaxClasses) - 1);
    return free == 0 ? kOverflow : static_cast<uint32_t>(__builtin_ctz(free));
  }

  // Calls f(class, key tag & selector, source to look up, hash) for every
  // class in use.
  template <typename F>
  void for_each_class_key(const MsgKey& key, F&& f) const {
    for (uint32_t m = live_classes_; m != 0; m &= m - 1) {
      const uint32_t c = static_cast<uint32_t>(__builtin_ctz(m));
      const Class& k = classes_[c];
      const Tag96 masked = matcher_internal::MaskTag(key.tag, k.sel);
      const uint64_t src = k.any_source ? kAnySource : key.source;
      f(c, masked, src, KeyHash(c, masked, src));
    }
  }

  template <auto kLink>
  void push_back(HashIndex& index, size_t pos, Index i) {
    Index head = index.head(pos);
    matcher_internal::bucket_push_back<kLink>(pool_, head, i);
    index.set_head(pos, head);
  }

  // Takes receive i off its key bucket (at by_key_ position key_pos, if
  // known) or the overflow list, and off its id bucket (invariant 4).
  void unlink(Index i, size_t key_pos) {
    const Node& n = pool_[i];
    if (n.cls == kOverflow) {
      matcher_internal::bucket_unlink<&Node::chain>(pool_, overflow_, i);
    } else {
      if (key_pos == HashIndex::npos) {
        key_pos =
            by_key_.find(KeyHash(n.cls, n.tag, n.source), KeyEq(n.cls, n));
      }
      Index head = by_key_.head(key_pos);
      matcher_internal::bucket_unlink<&Node::chain>(pool_, head, i);
      if (head == kNil) {
        by_key_.erase(key_pos);
      } else {
        by_key_.set_head(key_pos, head);
      }
      if (--classes_[n.cls].live == 0) live_classes_ &= ~(1u << n.cls);
    }
    const size_t id_pos = by_id_.find(IdHash(n.id), IdEq(n.id));
    Index head = by_id_.head(id_pos);
    matcher_internal::bucket_unlink<&Node::id_chain>(pool_, head, i);
    if (head == kNil) {
      by_id_.erase(id_pos);
    } else {
      by_id_.set_head(id_pos, head);
    }
  }

  // Returns the value of unlinked node i and frees the node.
  RecvT release(Index i) {
    RecvT v = pool_[i].value.take();
    pool_.release(i);
    --size_;
    return v;
  }

  // Calls f(index) for every live receive, in no particular order (every
  // one is on exactly one id bucket).
  template <typename F>
  void for_each_live(F&& f) const {
    by_id_.for_each_head([&](Index head) {
      for (Index i = head; i != kNil;) {
        const Index next = pool_[i].id_chain.next;  // f may free node i
        f(i);
        i = next;
      }
    });
  }

  void destroy_values() {
    if constexpr (!std::is_trivially_destructible_v<RecvT>) {
      for_each_live([&](Index i) { pool_[i].value.destroy(); });
    }
  }

  // Empties the indexes (not the pool).
  void reset_index() {
    by_key_.clear();
    by_id_.clear();
    classes_ = {};
    live_classes_ = 0;
    overflow_ = kNil;
    size_ = 0;
  }

  bool shedding() const {
    return shed_.pool.capacity() != 0 || shed_.by_key.memory_bytes() != 0 ||
           shed_.by_id.memory_bytes() != 0;
  }

  matcher_internal::NodePool<Node> pool_;
  HashIndex by_key_;
  HashIndex by_id_;
  // What shed_memory() has set aside and not yet freed: no live node, no
  // bucket anyone looks up.
  struct Shed {
    matcher_internal::NodePool<Node> pool;
    HashIndex by_key;
    HashIndex by_id;
  } shed_;
  std::array<Class, kMaxClasses> classes_{};
  uint32_t live_classes_ = 0;  // bit c: class c in use
  Index overflow_ = kNil;      // head of the overflow list
  mutable uint64_t overflow_steps_ = 0;
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
    const size_t pos = by_tag_.find_or_insert(
        matcher_internal::TagHash(key.tag), tag_is(key.tag));
    Index head = by_tag_.head(pos);
    matcher_internal::bucket_push_back<&Node::chain>(pool_, head, i);
    by_tag_.set_head(pos, head);
    ++size_;
  }

  // As PostedQueue's, for a later take(p) or find(p). Only exact patterns
  // have a bucket to prefetch; a wildcard scans arrivals_.
  void prefetch_slot(const RecvPattern& p) const {
    if (is_exact_selector(p.sel))
      by_tag_.prefetch_slot(matcher_internal::TagHash(p.tag));
  }
  void prefetch_entry(const RecvPattern& p) const {
    if (!is_exact_selector(p.sel)) return;
    const Index head = by_tag_.head_by_hash(matcher_internal::TagHash(p.tag));
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
    return remove(Found{i, HashIndex::npos});
  }

  size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }

  // Heap bytes held, excluding what values own.
  size_t memory_bytes() const {
    return pool_.memory_bytes() + gens_.capacity() * sizeof(gens_[0]) +
           by_tag_.memory_bytes() + arrivals_.capacity() * sizeof(Arrival);
  }

  // Calls f(const MsgKey&, const MsgT&) for every message in arrival order,
  // leaving the queue as it is; f must not touch the queue. Pushing them
  // again in this order into an empty queue gives a queue that matches as
  // this one does (a handover, issue 33).
  template <typename F>
  void for_each_in_order(F&& f) const {
    for_each_live([&](Index i) { f(pool_[i].key, pool_[i].value.get()); });
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
  using HashIndex = matcher_internal::HashIndex;
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

  auto tag_is(const Tag96& tag) const {
    return [this, &tag](Index i) { return pool_[i].key.tag == tag; };
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
      const size_t pos =
          by_tag_.find(matcher_internal::TagHash(p.tag), tag_is(p.tag));
      if (pos == HashIndex::npos) return Found{kNil, pos};
      for (Index i = by_tag_.head(pos); i != kNil; i = pool_[i].chain.next) {
        if (source_matches(p.source, pool_[i].key.source)) return Found{i, pos};
      }
      return Found{kNil, pos};
    }
    return Found{scan(p), HashIndex::npos};
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
    if (pos == HashIndex::npos) {
      const Tag96& tag = pool_[i].key.tag;
      pos = by_tag_.find(matcher_internal::TagHash(tag), tag_is(tag));
    }
    Index head = by_tag_.head(pos);
    matcher_internal::bucket_unlink<&Node::chain>(pool_, head, i);
    if (head == kNil) {
      by_tag_.erase(pos);
    } else {
      by_tag_.set_head(pos, head);
    }
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
  matcher_internal::HashIndex by_tag_;
  std::vector<Arrival> arrivals_;
  size_t begin_ = 0;  // entries before it are stale
  size_t size_ = 0;
};

}  // namespace psmd

#endif  // PSMD_DAEMON_ENGINE_MATCHER_H_
