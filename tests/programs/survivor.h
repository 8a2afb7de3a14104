// How a test program that outlives its peer says so, for the tests that
// judge it (tests/verdicts.h): a request that ended with an error is
// reported by one line "ended <psm2_error_t> at <CLOCK_MONOTONIC ms>" and
// exit status kExitRequestFailed, apart from a data mismatch (1) and a
// call that failed (2), so that a test expecting "failed because the peer
// died" cannot mistake a corruption or a crash for it.
#ifndef PSMD_TESTS_PROGRAMS_SURVIVOR_H_
#define PSMD_TESTS_PROGRAMS_SURVIVOR_H_

#include <chrono>
#include <cstdio>
#include <cstdlib>

namespace psmd::testing {

constexpr int kExitDataMismatch = 1;
constexpr int kExitCallFailed = 2;
constexpr int kExitRequestFailed = 4;

// CLOCK_MONOTONIC in ms: one clock for every process of the machine, which
// a test compares with the time of its kill, and which no time adjustment
// moves.
inline long long MonotonicMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

[[noreturn]] inline void EndWithRequestError(unsigned error) {
  printf("ended %u at %lld\n", error, MonotonicMs());
  fflush(stdout);
  exit(kExitRequestFailed);
}

}  // namespace psmd::testing

#endif  // PSMD_TESTS_PROGRAMS_SURVIVOR_H_
