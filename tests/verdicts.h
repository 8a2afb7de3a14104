// The judgements of the multi-process tests, as functions of what the test
// observed, so that each can be fed a defective outcome (a failure before
// the kill, a wrong error, a crash, an attack that did nothing) and be seen
// to reject it: the tests that use them also test them that way. Each
// returns "" when the outcome passes, else what is wrong with it.
#ifndef PSMD_TESTS_VERDICTS_H_
#define PSMD_TESTS_VERDICTS_H_

#include <string>

namespace psmd::testing {

// A pair of which the test SIGKILLed one rank at killed_at_ms
// (CLOCK_MONOTONIC): statuses as Process::Wait returns them, and the
// survivor's stdout (tests/programs/survivor.h).
struct KillOutcome {
  int victim_status = -1;
  int survivor_status = -1;
  std::string survivor_out;
  long long killed_at_ms = 0;
  // How long after the kill the survivor may have ended.
  long long allowed_ms = 1000;
};

// Passes when the victim died of the kill (it had not ended on its own)
// and the survivor then ended because a request failed with
// PSM2_EPID_UNREACHABLE, not before the kill and not later than allowed.
std::string KillVerdict(const KillOutcome& o);

}  // namespace psmd::testing

#endif  // PSMD_TESTS_VERDICTS_H_
