// Two-rank harness for conformance programs: the same binary runs against
// Intel's libpsm2 (the oracle) and against psmd, chosen at run time by
// LD_LIBRARY_PATH (see run_pair.sh). Each program registers named cases; both
// ranks run every case in the same order, separated by a barrier.
//
// Thread-safety: none; a conformance program is single-threaded.
//
// Rules for a case, so that it runs unchanged on both implementations:
//   1. It completes (waits for) every request it starts and receives every
//      message it sends before returning: the next case starts clean.
//   2. It drives progress only through PSM2 calls (psm2_poll, psm2_mq_wait*,
//      ...). Intel's PSM2 makes no progress otherwise.
//   3. A barrier orders the two ranks, not their messages: a message sent
//      before a barrier may still be in flight after it (in psmd, not yet
//      processed by the daemon). To make a message unexpected on purpose,
//      the receiver waits until a probe sees it (AwaitUnexpected in
//      mq_cases_util.h) before posting its receive; to make it expected,
//      the receiver calls AwaitPosted after posting, before the barrier.
#ifndef PSMD_TESTS_CONFORMANCE_PAIR_H_
#define PSMD_TESTS_CONFORMANCE_PAIR_H_

#include <psm2.h>
#include <psm2_am.h>
#include <psm2_mq.h>

#include <cstdio>
#include <functional>
#include <string>
#include <vector>

namespace psmd::conformance {

struct Pair {
  int rank = 0;  // 0 or 1
  psm2_ep_t ep = nullptr;
  psm2_mq_t mq = nullptr;
  psm2_epid_t self_epid = 0;
  psm2_epid_t peer_epid = 0;
  psm2_epaddr_t peer = nullptr;
  std::string dir;   // shared scratch directory of this run
  std::string impl;  // "psmd" or "intel" (PSMD_CONFORMANCE_IMPL)

  // Whether the two ranks are on one node: always under Intel's library
  // (its shared-memory epids name no node: psm2_epid_nid differs between
  // them); under psmd when their epids name the same node (run_pair.sh's
  // psmd-nodes puts them on daemons linked by the fabric).
  bool OneNode() const;

  // Both ranks return only once both have reached their n-th Barrier call
  // (the name is for diagnostics). Polls the endpoint while waiting.
  void Barrier(const std::string& name);

  int barrier_seq = 0;
};

using CaseFn = std::function<void(Pair&)>;

struct Case {
  std::string name;
  CaseFn fn;
};

// A failed check inside a case: prints where and what, and marks the case
// failed. Execution of the case continues (so both ranks stay in step).
#define CONF_CHECK(cond) \
  ::psmd::conformance::Check((cond), #cond, __FILE__, __LINE__)
#define CONF_CHECK_EQ(a, b) \
  ::psmd::conformance::CheckEq((a), (b), #a " == " #b, __FILE__, __LINE__)
#define CONF_CHECK_OK(err)                                                   \
  ::psmd::conformance::CheckEq(static_cast<int>(err), 0, #err " is PSM2_OK", \
                               __FILE__, __LINE__)

void Check(bool ok, const char* expr, const char* file, int line);

template <typename A, typename B>
void CheckEq(const A& a, const B& b, const char* expr, const char* file,
             int line) {
  bool ok = (a == b);
  if (!ok) {
    char buf[128];
    snprintf(buf, sizeof(buf), " (got %llu vs %llu)",
             static_cast<unsigned long long>(a),
             static_cast<unsigned long long>(b));
    Check(false, (std::string(expr) + buf).c_str(), file, line);
  } else {
    Check(true, expr, file, line);
  }
}

// Runs the program: parses --rank N --dir DIR [--uuid HEX] [--case NAME]
// [--list], sets up the pair (psm2_init, ep_open, mq_init, connect to the
// peer), runs the cases (all, or the named one) with a barrier between
// them, prints "PASS rankN name" / "FAIL rankN name" per case, tears
// down, and returns the process exit status (0 only if every case passed on
// this rank).
int RunCases(int argc, char** argv, const std::vector<Case>& cases);

}  // namespace psmd::conformance

#endif  // PSMD_TESTS_CONFORMANCE_PAIR_H_
