// match_bench: cost of one match in the posted and unexpected queues
// (daemon/engine/matcher.h) as a function of queue depth, beside the linear
// reference model (daemon/engine/matcher_reference.h).
//
// Every benchmark pre-fills a queue with `depth` entries, then repeatedly
// matches the entry for a target and puts it back at the end, keeping the
// depth constant. One iteration = one match + one re-post/re-push; Time is
// ns per iteration. Targets are pre-generated so the timed loop does no RNG
// work.
//
//   *Exact   every receive (or probe pattern) has a full selector and every
//            entry has its own tag: the hash-bucket path. The target is
//            uniformly random among the queued entries.
//   *Mixed   as *Exact, but 1 in 16 entries is matched through a wildcard
//            selector:
//            posted: 1 in 16 receives is a wildcard (any source, one tag word
//            ignored) and 1 in 16 messages targets one of them;
//            unexpected: 1 in 16 takes uses a wildcard pattern.
//   *InOrder as *Exact, but the target is always the oldest entry (matching
//            in arrival order, as MPI traffic mostly does); this is where
//            the linear model is at its best.
//
// The random-target benchmarks at depth 65536 are the ones the matching
// engine is judged on: every match touches cold memory there (several MiB
// of entries), whereas depth 1 runs entirely in L1.
//
// Run: bazel run -c opt //bench:match_bench
// (about 30 s; add --benchmark_repetitions=5 for medians on a busy machine)

#include <benchmark/benchmark.h>

#include <cstdint>
#include <optional>
#include <random>
#include <utility>
#include <vector>

#include "daemon/engine/matcher.h"
#include "daemon/engine/matcher_reference.h"
#include "daemon/engine/tag.h"

namespace psmd {
namespace {

// A receive / message handle as the daemon would store it.
struct Handle {
  uint64_t request;
};

constexpr uint32_t kContext = 0x3333;      // tag word 1 of exact traffic
constexpr uint32_t kWildContext = 0x5555;  // tag word 1 of wildcard traffic
constexpr size_t kTargets = size_t{1} << 16;

// Distinct tag per entry index (odd multiplier: a bijection on uint32).
uint32_t TagWord(uint32_t i) { return i * 2654435761u; }
uint64_t SourceOf(uint32_t i) { return i % 64; }
bool IsWildEntry(uint32_t i, bool mixed) { return mixed && i % 16 == 15; }

RecvPattern ExactRecv(uint32_t i) {
  return RecvPattern{SourceOf(i), Tag96{{TagWord(i), kContext, 0}}, kTagSelAll};
}

// Any source, tag word 1 ignored: matches only the messages of entry i.
RecvPattern WildRecv(uint32_t i) {
  return RecvPattern{kAnySource, Tag96{{TagWord(i), kWildContext, 0}},
                     Tag96{{~0u, 0u, ~0u}}};
}

MsgKey MsgOf(uint32_t i, bool mixed) {
  return MsgKey{
      SourceOf(i),
      Tag96{{TagWord(i), IsWildEntry(i, mixed) ? kWildContext : kContext, 0}}};
}

RecvPattern RecvOf(uint32_t i, bool mixed) {
  return IsWildEntry(i, mixed) ? WildRecv(i) : ExactRecv(i);
}

enum class Order { kRandom, kInOrder };

// Entry indices to match, in order. kInOrder: entry k % depth is the oldest
// one queued at step k, because every match re-queues its entry at the end.
std::vector<uint32_t> Targets(uint32_t depth, Order order) {
  std::vector<uint32_t> t(kTargets);
  if (order == Order::kInOrder) {
    for (size_t k = 0; k < kTargets; ++k)
      t[k] = static_cast<uint32_t>(k % depth);
    return t;
  }
  std::mt19937 rng(42);
  std::uniform_int_distribution<uint32_t> dist(0, depth - 1);
  for (uint32_t& x : t) x = dist(rng);
  return t;
}

// Matches per batch in the *Batch benchmarks: the daemon's ring batch
// (kBatch in daemon/engine/mq_engine.cc).
constexpr size_t kBatch = 32;

// Prefetches the queue entries of the next kBatch targets when iteration k
// starts a batch, in the two passes the daemon makes over each batch it pops
// off a ring.
template <typename Queue, typename KeyOf>
void PrefetchBatch(const Queue& q, const std::vector<uint32_t>& targets,
                   size_t k, KeyOf key_of) {
  if (k % kBatch != 0) return;
  for (size_t j = k; j < k + kBatch; ++j)
    q.prefetch_slot(key_of(targets[j & (kTargets - 1)]));
  for (size_t j = k; j < k + kBatch; ++j)
    q.prefetch_entry(key_of(targets[j & (kTargets - 1)]));
}

template <template <typename> class Queue, bool kBatched = false>
void PostedBench(benchmark::State& state, bool mixed, Order order) {
  const auto depth = static_cast<uint32_t>(state.range(0));
  Queue<Handle> q;
  for (uint32_t i = 0; i < depth; ++i) q.post(RecvOf(i, mixed), Handle{i});
  const std::vector<uint32_t> targets = Targets(depth, order);
  size_t k = 0;
  for (auto _ : state) {
    if constexpr (kBatched) {
      PrefetchBatch(q, targets, k, [&](uint32_t i) { return MsgOf(i, mixed); });
    }
    const uint32_t i = targets[k++ & (kTargets - 1)];
    std::optional<Handle> h = q.take_match(MsgOf(i, mixed));
    // Only the handle, not the optional: DoNotOptimize(h) made GCC store the
    // optional in two parts and reload it whole, a store-forwarding stall
    // (~15 ns) in some builds and not others.
    benchmark::DoNotOptimize(h->request);
    q.post(RecvOf(i, mixed), *h);
  }
  if (q.size() != depth) state.SkipWithError("depth changed");
  state.SetItemsProcessed(state.iterations());
}

template <template <typename> class Queue, bool kBatched = false>
void UnexpectedBench(benchmark::State& state, bool mixed, Order order) {
  const auto depth = static_cast<uint32_t>(state.range(0));
  Queue<Handle> q;
  for (uint32_t i = 0; i < depth; ++i) q.push(MsgOf(i, mixed), Handle{i});
  const std::vector<uint32_t> targets = Targets(depth, order);
  size_t k = 0;
  for (auto _ : state) {
    if constexpr (kBatched) {
      PrefetchBatch(q, targets, k,
                    [&](uint32_t i) { return RecvOf(i, mixed); });
    }
    const uint32_t i = targets[k++ & (kTargets - 1)];
    MsgKey key{};
    std::optional<Handle> h = q.take(RecvOf(i, mixed), &key);
    benchmark::DoNotOptimize(h->request);  // as in PostedBench
    q.push(key, *h);
  }
  if (q.size() != depth) state.SkipWithError("depth changed");
  state.SetItemsProcessed(state.iterations());
}

template <template <typename> class Queue>
void BM_PostedExact(benchmark::State& state) {
  PostedBench<Queue>(state, false, Order::kRandom);
}
template <template <typename> class Queue>
void BM_PostedMixed(benchmark::State& state) {
  PostedBench<Queue>(state, true, Order::kRandom);
}
template <template <typename> class Queue>
void BM_PostedExactInOrder(benchmark::State& state) {
  PostedBench<Queue>(state, false, Order::kInOrder);
}
template <template <typename> class Queue>
void BM_PostedExactBatch(benchmark::State& state) {
  PostedBench<Queue, true>(state, false, Order::kRandom);
}
template <template <typename> class Queue>
void BM_UnexpectedExact(benchmark::State& state) {
  UnexpectedBench<Queue>(state, false, Order::kRandom);
}
template <template <typename> class Queue>
void BM_UnexpectedExactBatch(benchmark::State& state) {
  UnexpectedBench<Queue, true>(state, false, Order::kRandom);
}
template <template <typename> class Queue>
void BM_UnexpectedMixed(benchmark::State& state) {
  UnexpectedBench<Queue>(state, true, Order::kRandom);
}
template <template <typename> class Queue>
void BM_UnexpectedExactInOrder(benchmark::State& state) {
  UnexpectedBench<Queue>(state, false, Order::kInOrder);
}

// 0.2 s per benchmark (not the default 0.5 s) keeps the whole run near
// 30 s: the linear model at depth 65536 takes ~0.1 ms per random match, so
// its iteration count is bounded by the time, not by a fixed number.
void Depths(benchmark::internal::Benchmark* b) {
  for (int depth : {1, 16, 256, 4096, 65536}) b->Arg(depth);
  b->ArgName("depth");
  b->MinTime(0.2);
}

BENCHMARK_TEMPLATE(BM_PostedExact, PostedQueue)->Apply(Depths);
BENCHMARK_TEMPLATE(BM_PostedExact, LinearPostedQueue)->Apply(Depths);
BENCHMARK_TEMPLATE(BM_PostedExactBatch, PostedQueue)->Apply(Depths);
BENCHMARK_TEMPLATE(BM_PostedMixed, PostedQueue)->Apply(Depths);
BENCHMARK_TEMPLATE(BM_PostedMixed, LinearPostedQueue)->Apply(Depths);
BENCHMARK_TEMPLATE(BM_PostedExactInOrder, PostedQueue)->Apply(Depths);
BENCHMARK_TEMPLATE(BM_PostedExactInOrder, LinearPostedQueue)->Apply(Depths);
BENCHMARK_TEMPLATE(BM_UnexpectedExact, UnexpectedQueue)->Apply(Depths);
BENCHMARK_TEMPLATE(BM_UnexpectedExact, LinearUnexpectedQueue)->Apply(Depths);
BENCHMARK_TEMPLATE(BM_UnexpectedExactBatch, UnexpectedQueue)->Apply(Depths);
BENCHMARK_TEMPLATE(BM_UnexpectedMixed, UnexpectedQueue)->Apply(Depths);
BENCHMARK_TEMPLATE(BM_UnexpectedMixed, LinearUnexpectedQueue)->Apply(Depths);
BENCHMARK_TEMPLATE(BM_UnexpectedExactInOrder, UnexpectedQueue)->Apply(Depths);
BENCHMARK_TEMPLATE(BM_UnexpectedExactInOrder, LinearUnexpectedQueue)
    ->Apply(Depths);

}  // namespace
}  // namespace psmd

BENCHMARK_MAIN();
