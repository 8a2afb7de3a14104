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

// The value of `key` in the last line "hostile: <stage> k=v ..." that
// tests/programs/hostile printed in `out`; -1 when there is none.
long long Reported(const std::string& out, const std::string& stage,
                   const std::string& key);

// The attacks of tests/programs/hostile, judged by what they report (`out`)
// and what psmd counted meanwhile (deltas of psmctl stats --json): each
// must have done what the attack needs, and been stopped by its quota
// where one applies.
//
// posted-recvs: all `want` receives posted and none refused by psmd (the
// job's quota is above them), cancels and reposts going on, and psmd
// handling reposts while the bystander was measured (`posted_meanwhile`).
std::string PostedRecvsVerdict(const std::string& out, long long want,
                               long long refused, long long posted_meanwhile);
// connect-junk: every one of `want` epids answered PSM2_EPID_UNREACHABLE,
// and a call still under way when the measurement ended.
std::string ConnectJunkVerdict(const std::string& out, long long want);
// endpoints: exactly `quota` endpoints open, the next refused with
// PSM2_TOO_MANY_ENDPOINTS, which psmd counted (`refused`).
std::string EndpointsVerdict(const std::string& out, long long quota,
                             long long refused);
// control-connections: all `count` (more than `quota`) connected, psmd
// refused at least those beyond the quota and held at most `quota` at the
// end.
std::string ControlConnectionsVerdict(const std::string& out, long long count,
                                      long long quota, long long refused);
// An attack seen only in psmd's counters (a doorbell flood, an unexpected
// flood): `what` moved by at least `minimum` while the bystander was
// measured.
std::string CounterVerdict(const std::string& what, long long moved,
                           long long minimum);

// The bystander's median half round trip beside an attack, and beside an
// ordinary CPU hog of the same tenant just before and just after it (the
// same-run control: the machine's load then is the load the attack saw).
struct LatencyRound {
  double control_before_us = 0;
  double attacked_us = 0;
  double control_after_us = 0;
};
enum class LatencyCall { kPass, kSlow, kNoisy };
// kNoisy when the two controls differ by more than `spread` times (the
// machine's load changed: the round says nothing); else kSlow when the
// attacked latency exceeds `margin` times their mean.
LatencyCall JudgeLatency(const LatencyRound& r, double margin, double spread);

}  // namespace psmd::testing

#endif  // PSMD_TESTS_VERDICTS_H_
