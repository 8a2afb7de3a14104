// Polite polling: when to pause and when to yield the core.
//
// psmd's progress worker and its clients poll shared rings. A poll that
// finds nothing can pause (a few dozen cycles, no syscall) or yield the core
// with sched_yield (a syscall, after which the scheduler may run any other
// runnable task, a niced batch job included, for a whole time slice).
// Yielding is right when a poller we wait for shares our core (on a 2-core
// node three busy processes do): the work we wait for cannot happen until we
// give the core away. Pausing is right while work is likely to come soon
// and nobody we wait for shares the core: it costs no syscall and keeps the
// core from a batch job. Once no work has come for a while, yielding again
// lets every other thread (psmd's control threads, the application's own)
// run before we sleep. The hints below tell each poller whether it shares
// a core (docs/design.md, "Spinning").
//
// Protocol, over SpinHints in an endpoint's segment (shm/layout.h):
//  1. A client that polls idle publishes 1 + its CPU in client_cpu, only
//     when that changed (so the line stays shared while nothing moves), and
//     0 before it sleeps. It looks at its CPU on the first idle poll of a
//     wait and every kCpuCheckTurns-th after.
//  2. psmd's worker, every few dozen idle passes, counts the pollers on each
//     CPU (itself and every endpoint with a valid client_cpu), sets
//     core_shared on every endpoint whose CPU has another poller, and yields
//     on its own idle passes only while a client polls on its CPU, and then
//     only once that client has completions to reap, is blocked
//     (client_blocked) or no work came for a few dozen passes. Until then
//     the client can do nothing without us: handing it the core would cost
//     two switches for nothing.
//  3. A client's idle poll yields if core_shared or if it has polled in
//     vain for kPauseTurns, else pauses.
// Hints are relaxed loads and stores: a stale one costs a wrong choice
// between pause and yield until the next refresh, never correctness. A
// client can lie about its CPU; the most it achieves is what every poller
// did before hints existed, yield on every idle poll. One that lies with
// client_blocked, or never reaps, only changes how soon the worker leaves
// the liar's own core (at most 64 passes later).
//
// Thread safety: ClientSpin belongs to one endpoint and is used under its
// lock; CoreCensus belongs to the progress worker's thread.
#ifndef PSMD_SHM_SPIN_H_
#define PSMD_SHM_SPIN_H_

#include <sched.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <vector>

#include "shm/layout.h"

namespace psmd::shm {

// Tells the core we are spinning: the sibling hyperthread gets the pipeline
// and the loop does not flood the memory system with speculative loads.
inline void CpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield" ::: "memory");
#endif
}

// How long a poller pauses rather than yields once work stops, if it shares
// its core with nobody: a few round trips through psmd (~1.2 us when both
// sides have a core), no more, because a poller that needs our core may not
// have been counted yet (psmd, unpinned, just moved here and cannot count
// until it runs). The worker counts time, a client its empty polls (each
// ~50-100 ns with its pause). With 50 us and 512 polls an AM round trip
// with psmd unpinned beside two ranks was 7% slower than yielding always;
// with these, within the noise.
inline constexpr uint64_t kPauseWindowNs = 5'000;
inline constexpr uint32_t kPauseTurns = 64;

// The calling thread's CPU as a client_cpu word (1 + CPU; 0 if unknown).
// glibc reads it from the thread's rseq area: no syscall.
inline uint32_t CurrentCpuWord() {
  const int cpu = sched_getcpu();
  return cpu < 0 ? 0 : static_cast<uint32_t>(cpu) + 1;
}

// A client's side (protocol steps 1 and 3).
class ClientSpin {
 public:
  void Attach(SpinHints* hints) { hints_ = hints; }

  // One idle turn of a polling loop that waits for psmd; `turn` counts the
  // empty polls since work last came (from 1); `blocked`: submissions wait
  // in the library for room (SpinHints::client_blocked).
  void Idle(uint32_t turn, bool blocked) {
    if (blocked != blocked_) {
      blocked_ = blocked;
      hints_->client_blocked.store(blocked ? 1 : 0, std::memory_order_relaxed);
    }
    // Where we run, on the first idle turn of a wait and every 16th after:
    // a thread seldom moves, and reading it on every turn was a sixth of
    // an idle poll's instructions (am_rate under callgrind).
    if (turn % kCpuCheckTurns == 1) {
      const uint32_t cpu = CurrentCpuWord();
      if (cpu != published_) {
        published_ = cpu;
        hints_->client_cpu.store(cpu, std::memory_order_relaxed);
      }
    }
    if (turn > kPauseTurns ||
        hints_->core_shared.load(std::memory_order_relaxed) != 0) {
      sched_yield();
    } else {
      CpuRelax();
    }
  }

  // Before sleeping: a sleeping client is no poller to make room for.
  void Sleeping() {
    if (published_ == 0) return;
    published_ = 0;
    hints_->client_cpu.store(0, std::memory_order_relaxed);
  }

 private:
  static constexpr uint32_t kCpuCheckTurns = 16;
  SpinHints* hints_ = nullptr;
  uint32_t published_ = 0;  // what client_cpu holds, as far as we wrote it
  bool blocked_ = false;    // what client_blocked holds
};

// The worker's side (protocol step 2): pollers per CPU.
class CoreCensus {
 public:
  // cpus: how many CPU numbers exist (get_nprocs_conf()); a client_cpu
  // beyond them is ignored.
  explicit CoreCensus(uint32_t cpus) : count_(cpus + 1) {}

  // hints(i) for i < n are the endpoints' SpinHints; own_cpu is the
  // worker's client_cpu word (CurrentCpuWord()). Sets every endpoint's
  // core_shared and returns whether a client polls on the worker's CPU;
  // colocated() then lists those clients' indices.
  template <typename HintsAt>
  bool Refresh(size_t n, HintsAt hints, uint32_t own_cpu) {
    std::fill(count_.begin(), count_.end(), 0);
    seen_.resize(n);
    colocated_.clear();
    const auto valid = [&](uint32_t cpu) {
      return cpu != 0 && cpu < count_.size();
    };
    if (valid(own_cpu)) count_[own_cpu]++;
    for (size_t i = 0; i < n; i++) {
      // Read once: the client writes it whenever it moves.
      seen_[i] = hints(i)->client_cpu.load(std::memory_order_relaxed);
      if (!valid(seen_[i])) seen_[i] = 0;
      if (seen_[i] != 0) count_[seen_[i]]++;
    }
    for (size_t i = 0; i < n; i++) {
      SpinHints* h = hints(i);
      const uint32_t shared = seen_[i] != 0 && count_[seen_[i]] > 1 ? 1 : 0;
      // Written only on change, so the line stays shared with the client.
      if (h->core_shared.load(std::memory_order_relaxed) != shared) {
        h->core_shared.store(shared, std::memory_order_relaxed);
      }
      if (valid(own_cpu) && seen_[i] == own_cpu) colocated_.push_back(i);
    }
    return valid(own_cpu) && count_[own_cpu] > 1;
  }

  // The endpoints (indices of the last Refresh) whose client polled on the
  // worker's CPU.
  const std::vector<size_t>& colocated() const { return colocated_; }

 private:
  std::vector<uint16_t> count_;    // pollers, by client_cpu word
  std::vector<uint32_t> seen_;     // each endpoint's valid client_cpu, or 0
  std::vector<size_t> colocated_;  // see colocated()
};

}  // namespace psmd::shm

#endif  // PSMD_SHM_SPIN_H_
