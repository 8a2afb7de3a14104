// Prefaulter: maps the pages of a shared pool into this process a window at
// a time, before the first use of each, instead of one page fault per page.
//
// The first touch of a pool page costs a page fault in every process that
// maps it, even when another process has already allocated the page: about
// 10-12 us per 4 KiB page in this paravirtualized guest. madvise
// (MADV_POPULATE_WRITE, Linux 5.14) maps a whole window in the kernel for
// about 0.25 us a page when the pages exist and 1 us when it must allocate
// them (docs/perf.md, "First touch"). A byte ring such as a send region or an
// inbox reaches every page once before it wraps; a receiver reads chunks
// wherever their senders put them. So each user of the pool asks Prepare for
// the range it is about to read or write, and the first range in a window
// populates the whole window, once per process. Memory: a window populates
// at most kWindow bytes that are not used yet (the ring will reach them).
//
// Invariants:
//   1. done_[w] is set once window w has been populated (or the kernel
//      refused, which Prepare does not retry: faults then happen as before).
//   2. Prepare never touches memory outside [base, base + bytes).
//
// Thread-safety: none; a Prefaulter is used under its owner's lock or on its
// owner's thread. Several Prefaulters may cover one mapping (each populates
// its own windows; repeating is harmless).
#ifndef PSMD_SHM_PREFAULT_H_
#define PSMD_SHM_PREFAULT_H_

#include <sys/mman.h>

#include <cerrno>
#include <cstdint>
#include <vector>

namespace psmd::shm {

class Prefaulter {
 public:
  static constexpr uint64_t kWindow = 1ull << 20;

  Prefaulter() = default;
  Prefaulter(uint8_t* base, uint64_t bytes)
      : base_(base),
        bytes_(bytes),
        done_((bytes + kWindow - 1) / kWindow, false) {}

  // [offset, offset + len) is about to be used.
  void Prepare(uint64_t offset, uint64_t len) {
    if (len == 0 || offset >= bytes_) return;
    const uint64_t last = (len > bytes_ - offset ? bytes_ : offset + len) - 1;
    for (uint64_t w = offset / kWindow; w <= last / kWindow; w++) {
      if (!done_[w]) Populate(w);
    }
  }

 private:
  void Populate(uint64_t w) {
    done_[w] = true;
    if (refused_) return;
    const uint64_t start = w * kWindow;
    const uint64_t len = bytes_ - start < kWindow ? bytes_ - start : kWindow;
    // EINVAL: a kernel without it; stop asking. Other errors (memory,
    // a signal) leave this window to fault as usual.
    if (madvise(base_ + start, len, MADV_POPULATE_WRITE) != 0 &&
        errno == EINVAL) {
      refused_ = true;
    }
  }

  uint8_t* base_ = nullptr;
  uint64_t bytes_ = 0;
  std::vector<bool> done_;
  bool refused_ = false;
};

}  // namespace psmd::shm

#endif  // PSMD_SHM_PREFAULT_H_
