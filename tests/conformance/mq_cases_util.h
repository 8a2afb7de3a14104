// Helpers shared by the matched-queue conformance cases (mq_cases_*.cc), and
// the lists of those cases, which mq_conformance.cc runs.
//
// Conventions of the cases: rank 0 (kSender) sends and rank 1 receives
// unless a case says otherwise. Every case calls Pair::Barrier the same
// number of times on both ranks, whatever fails, so that the ranks stay in
// step. Requests are completed with Finish (a psm2_mq_wait that gives up
// after kCompleteTimeoutS instead of hanging the program) except where the
// wait/test functions themselves are under test.
//
// Where the PSM2 documentation leaves something open, the cases encode what
// Intel's libpsm2 11.2.185 does over shared memory (PSM2_DEVICES=self,shm);
// such places say "Intel" in their comment. Differences psmd makes on
// purpose are guarded by `p.impl == "psmd"` with the reason next to them.
#ifndef PSMD_TESTS_CONFORMANCE_MQ_CASES_UTIL_H_
#define PSMD_TESTS_CONFORMANCE_MQ_CASES_UTIL_H_

#include <chrono>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "tests/conformance/pair.h"

namespace psmd::conformance::mq {

using Clock = std::chrono::steady_clock;

inline constexpr int kSender = 0;
inline constexpr uint32_t kAll = 0xffffffffu;
// A request that should complete gets this long before the case gives up
// on it (generous: the whole program runs in about a second on Intel).
inline constexpr double kCompleteTimeoutS = 10.0;
// A message the peer has already sent gets this long to show up.
inline constexpr double kArrivalTimeoutS = 5.0;

// ---------------------------------------------------------------------------
// Checks that say what went wrong (pair.h's CONF_CHECK prints only the
// expression).

void CheckMsg(bool ok, const char* expr, const char* file, int line,
              const char* fmt, ...) __attribute__((format(printf, 5, 6)));

// Prints both codes by name when got != want.
void CheckErr(psm2_error_t got, psm2_error_t want, const char* expr,
              const char* file, int line);

#define MQ_CHECK(cond, ...)                                            \
  ::psmd::conformance::mq::CheckMsg((cond), #cond, __FILE__, __LINE__, \
                                    __VA_ARGS__)
#define MQ_CHECK_ERR(expr, want) \
  ::psmd::conformance::mq::CheckErr((expr), (want), #expr, __FILE__, __LINE__)

// ---------------------------------------------------------------------------
// Tags.

inline psm2_mq_tag_t Tag(uint32_t t0, uint32_t t1 = 0, uint32_t t2 = 0) {
  psm2_mq_tag_t t;
  memset(&t, 0, sizeof(t));
  t.tag0 = t0;
  t.tag1 = t1;
  t.tag2 = t2;
  return t;
}

inline const psm2_mq_tag_t kExact =
    Tag(kAll, kAll, kAll);  // selector: every bit counts
inline const psm2_mq_tag_t kAnyTag =
    Tag(0, 0, 0);  // selector: matches anything

inline bool SameTag(const psm2_mq_tag_t& a, const psm2_mq_tag_t& b) {
  return a.tag0 == b.tag0 && a.tag1 == b.tag1 && a.tag2 == b.tag2;
}

// "tag0.tag1.tag2" in hex.
std::string Str(const psm2_mq_tag_t& t);

// The 64-bit view of a tag: tag0 is the low word, tag1 the high word.
inline uint64_t Tag64(const psm2_mq_tag_t& t) {
  return (static_cast<uint64_t>(t.tag1) << 32) | t.tag0;
}

inline void* Ctx(uintptr_t v) { return reinterpret_cast<void*>(v); }

// By-value shims: the PSM2 prototypes take tags through non-const pointers.
// Sends go to p.peer.
psm2_error_t Irecv2(Pair& p, psm2_epaddr_t src, psm2_mq_tag_t tag,
                    psm2_mq_tag_t sel, void* buf, uint32_t len, void* ctx,
                    psm2_mq_req_t* req);
psm2_error_t Isend2(Pair& p, uint32_t flags, psm2_mq_tag_t tag, const void* buf,
                    uint32_t len, void* ctx, psm2_mq_req_t* req);
psm2_error_t Send2(Pair& p, uint32_t flags, psm2_mq_tag_t tag, const void* buf,
                   uint32_t len);
psm2_error_t Iprobe2(Pair& p, psm2_epaddr_t src, psm2_mq_tag_t tag,
                     psm2_mq_tag_t sel, psm2_mq_status2_t* st);

// ---------------------------------------------------------------------------
// Payloads: a byte pattern that depends on the position and on a seed (made
// from the message's size and index), so that a misplaced, reordered or
// stale byte shows.

void Fill(void* buf, size_t len, uint32_t seed);

// The rendezvous threshold option that applies between the two ranks:
// PSM2_MQ_RNDV_HFI_SZ when they are on different nodes (psmd daemons linked
// by the fabric), else PSM2_MQ_RNDV_SHM_SZ.
int RndvThresholdKey(const Pair& p);

// Index of the first byte that differs from the pattern, or -1.
long FirstMismatch(const void* buf, size_t len, uint32_t seed);

// A receive buffer of `len` bytes followed by guard bytes, which no receive
// may touch.
class GuardedBuf {
 public:
  explicit GuardedBuf(size_t len)
      : len_(len), bytes_(len + kGuard, kGuardByte) {}
  uint8_t* data() { return bytes_.data(); }
  bool GuardIntact() const;

 private:
  static constexpr size_t kGuard = 64;
  static constexpr uint8_t kGuardByte = 0xEE;
  size_t len_;
  std::vector<uint8_t> bytes_;
};

// ---------------------------------------------------------------------------
// Progress and completion.

double SecondsSince(Clock::time_point t0);

// Calls psm2_poll for `seconds`.
void PollFor(Pair& p, double seconds);

inline psm2_error_t TestReq(psm2_mq_req_t* req, psm2_mq_status_t* st) {
  return psm2_mq_test(req, st);
}
inline psm2_error_t TestReq(psm2_mq_req_t* req, psm2_mq_status2_t* st) {
  return psm2_mq_test2(req, st);
}

// Tests *req, polling in between, until it completes (true: *st filled if
// non-null, *req reset) or timeout_s passes (false).
template <typename Status>
bool PollUntilDone(Pair& p, psm2_mq_req_t* req, Status* st, double timeout_s) {
  auto t0 = Clock::now();
  for (;;) {
    psm2_error_t err = TestReq(req, st);
    if (err == PSM2_OK) return true;
    if (err != PSM2_MQ_NO_COMPLETIONS) {
      MQ_CHECK_ERR(err, PSM2_MQ_NO_COMPLETIONS);
      return false;
    }
    if (SecondsSince(t0) > timeout_s) return false;
    psm2_poll(p.ep);
  }
}

// Cancels a request that Finish gave up on, so that a receive cannot
// swallow a later case's message.
void Abandon(Pair& p, psm2_mq_req_t* req);

// Completes *req like psm2_mq_wait, but a request that never completes is a
// failure of the case (naming `what`), not a hung program.
template <typename Status>
bool Finish(Pair& p, psm2_mq_req_t* req, Status* st, const std::string& what) {
  if (PollUntilDone(p, req, st, kCompleteTimeoutS)) {
    MQ_CHECK(*req == PSM2_MQ_REQINVALID,
             "%s: a completed request was not reset to "
             "PSM2_MQ_REQINVALID",
             what.c_str());
    return true;
  }
  MQ_CHECK(false, "%s: request did not complete within %.0f s", what.c_str(),
           kCompleteTimeoutS);
  Abandon(p, req);
  return false;
}

bool Finish(Pair& p, psm2_mq_req_t* req, const std::string& what);

// Polls until a message matching tag/sel waits in the unexpected queue
// (psm2_mq_iprobe2 sees it). This is how cases make a message unexpected:
// Pair::Barrier polls only until the peer's barrier file exists, so the
// receiver can leave it before processing a message sent just before.
bool AwaitUnexpected(Pair& p, psm2_mq_tag_t tag, const std::string& what,
                     psm2_mq_tag_t sel = kExact);

// Returns once every receive this rank posted before the call is in its
// matched queue, so that a message sent after the next barrier finds it
// posted (pair.h, rule 3). psmd answers a probe only after the submissions
// queued before it on the same ring; Intel's library posts receives at once
// and probes locally. Returns the probe's answer (for a tag no case sends:
// PSM2_MQ_NO_COMPLETIONS).
psm2_error_t AwaitPosted(Pair& p);

// Wraps a case: after it ran, a message left in the unexpected queue (rule 1
// of pair.h broken by the case or the implementation) is reported and
// received, so that the next case starts clean.
CaseFn Checked(void (*fn)(Pair&));

// ---------------------------------------------------------------------------
// The cases, already wrapped in Checked, in the order they run.

std::vector<Case> MatchingCases();    // mq_cases_matching.cc
std::vector<Case> DeliveryCases();    // mq_cases_delivery.cc
std::vector<Case> CompletionCases();  // mq_cases_completion.cc
std::vector<Case> RendezvousCases();  // mq_cases_rendezvous.cc

}  // namespace psmd::conformance::mq

#endif  // PSMD_TESTS_CONFORMANCE_MQ_CASES_UTIL_H_
