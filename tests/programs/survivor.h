// How a test program that outlives its peer says so, for the tests that
// judge it (tests/verdicts.h): a request that ended with an error is
// reported by one line "ended <psm2_error_t> at <CLOCK_MONOTONIC ms> cpu_ms
// <CPU ms the process used>" and exit status kExitRequestFailed, apart from
// a data mismatch (1) and a call that failed (2), so that a test expecting
// "failed because the peer died" cannot mistake a corruption or a crash for
// it. The CPU time tells a test, which read the process's before the
// failure, whether it spun meanwhile (it cannot read it once it ended).
#ifndef PSMD_TESTS_PROGRAMS_SURVIVOR_H_
#define PSMD_TESTS_PROGRAMS_SURVIVOR_H_

#include <sys/resource.h>

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
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  const long long cpu_ms =
      (usage.ru_utime.tv_sec + usage.ru_stime.tv_sec) * 1000LL +
      (usage.ru_utime.tv_usec + usage.ru_stime.tv_usec) / 1000;
  printf("ended %u at %lld cpu_ms %lld\n", error, MonotonicMs(), cpu_ms);
  fflush(stdout);
  exit(kExitRequestFailed);
}

}  // namespace psmd::testing

#endif  // PSMD_TESTS_PROGRAMS_SURVIVOR_H_
