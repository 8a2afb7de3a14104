#include "tests/verdicts.h"

#include <psm2.h>
#include <signal.h>

#include <cstdio>

#include "tests/programs/survivor.h"

namespace psmd::testing {

namespace {

std::string DescribeStatus(int status) {
  if (status == -1) return "still running";
  if (status > 128) return "killed by signal " + std::to_string(status - 128);
  if (status == kExitDataMismatch) return "exit 1 (data mismatch)";
  if (status == kExitCallFailed) return "exit 2 (a call failed)";
  return "exit " + std::to_string(status);
}

}  // namespace

std::string KillVerdict(const KillOutcome& o) {
  if (o.victim_status != 128 + SIGKILL) {
    return "the victim was not ended by the kill (" +
           DescribeStatus(o.victim_status) + "): it had ended on its own";
  }
  if (o.survivor_status != kExitRequestFailed) {
    return "the survivor did not end with a failed request: " +
           DescribeStatus(o.survivor_status) +
           "; it printed: " + o.survivor_out;
  }
  unsigned error = 0;
  long long ended_at = 0;
  if (sscanf(o.survivor_out.c_str(), "ended %u at %lld", &error, &ended_at) !=
      2) {
    return "the survivor printed no \"ended <error> at <ms>\": " +
           o.survivor_out;
  }
  if (error != PSM2_EPID_UNREACHABLE) {
    return "the survivor's request failed with error " + std::to_string(error) +
           ", not PSM2_EPID_UNREACHABLE (" +
           std::to_string(PSM2_EPID_UNREACHABLE) + ")";
  }
  if (ended_at < o.killed_at_ms) {
    return "the survivor ended " + std::to_string(o.killed_at_ms - ended_at) +
           " ms before the kill: the pair failed on its own";
  }
  if (ended_at - o.killed_at_ms > o.allowed_ms) {
    return "the survivor ended " + std::to_string(ended_at - o.killed_at_ms) +
           " ms after the kill, more than " + std::to_string(o.allowed_ms);
  }
  return "";
}

}  // namespace psmd::testing
