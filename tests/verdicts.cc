#include "tests/verdicts.h"

#include <psm2.h>
#include <signal.h>

#include <algorithm>
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

long long Reported(const std::string& out, const std::string& stage,
                   const std::string& key) {
  const std::string head = "hostile: " + stage + " ";
  size_t at = out.rfind(head);
  if (at == std::string::npos || (at > 0 && out[at - 1] != '\n')) return -1;
  const size_t end = out.find('\n', at);
  const std::string line =
      " " + out.substr(at + head.size(), end - at - head.size());
  const size_t k = line.find(" " + key + "=");
  if (k == std::string::npos) return -1;
  long long value = -1;
  sscanf(line.c_str() + k + key.size() + 2, "%lld", &value);
  return value;
}

namespace {

// "" when `stage`'s `key` was reported as `want`, else what was.
std::string Expect(const std::string& out, const std::string& stage,
                   const std::string& key, long long want) {
  const long long got = Reported(out, stage, key);
  if (got == want) return "";
  return "hostile reported " + stage + " " + key + "=" + std::to_string(got) +
         " (-1: not at all), not " + std::to_string(want) + ": " + out;
}

}  // namespace

std::string PostedRecvsVerdict(const std::string& out, long long want,
                               long long refused, long long posted_meanwhile) {
  if (std::string e = Expect(out, "ready", "posted", want); !e.empty())
    return e;
  if (Reported(out, "done", "cancels") < 1)
    return "no receive was cancelled and reposted: " + out;
  if (refused != 0) {
    return "psmd refused " + std::to_string(refused) +
           " receives: the attack did not hold all it posted";
  }
  if (posted_meanwhile < 1)
    return "psmd saw no receive posted while the bystander was measured";
  return "";
}

std::string ConnectJunkVerdict(const std::string& out, long long want) {
  if (std::string e = Expect(out, "ready", "epids", want); !e.empty()) return e;
  if (std::string e = Expect(out, "ready", "unreachable", want); !e.empty())
    return e;
  if (std::string e = Expect(out, "done", "unreachable", want); !e.empty())
    return e;
  if (Reported(out, "done", "calls") < 2)
    return "no connect call overlapped the measurement: " + out;
  return "";
}

std::string EndpointsVerdict(const std::string& out, long long quota,
                             long long refused) {
  if (std::string e = Expect(out, "ready", "opened", quota); !e.empty())
    return e;
  if (std::string e =
          Expect(out, "ready", "refused_with", PSM2_TOO_MANY_ENDPOINTS);
      !e.empty()) {
    return e;
  }
  if (std::string e = Expect(out, "done", "opened", quota); !e.empty())
    return e;
  if (refused < 1) return "psmd counted no endpoint refused";
  return "";
}

std::string ControlConnectionsVerdict(const std::string& out, long long count,
                                      long long quota, long long refused) {
  if (count <= quota) return "the attack does not reach the quota";
  if (std::string e = Expect(out, "ready", "connected", count); !e.empty())
    return e;
  if (refused < count - quota || refused > count) {
    return "psmd refused " + std::to_string(refused) +
           " control connections, not at least the " +
           std::to_string(count - quota) + " beyond the quota";
  }
  const long long open = Reported(out, "done", "open");
  if (open < 0 || open > quota) {
    return "psmd held " + std::to_string(open) +
           " control connections at the end, quota " + std::to_string(quota) +
           ": " + out;
  }
  return "";
}

std::string CounterVerdict(const std::string& what, long long moved,
                           long long minimum) {
  if (moved >= minimum) return "";
  return "psmd counted " + std::to_string(moved) + " " + what +
         " while the bystander was measured, fewer than " +
         std::to_string(minimum) + ": the attack was not at it";
}

LatencyCall JudgeLatency(const LatencyRound& r, double margin, double spread) {
  const double lo = std::min(r.control_before_us, r.control_after_us);
  const double hi = std::max(r.control_before_us, r.control_after_us);
  if (lo <= 0 || hi > spread * lo) return LatencyCall::kNoisy;
  return r.attacked_us > margin * (lo + hi) / 2 ? LatencyCall::kSlow
                                                : LatencyCall::kPass;
}

}  // namespace psmd::testing
