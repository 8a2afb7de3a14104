// Refusals by a limit, per uid (proto/counters.h, PSMD_REFUSAL_COUNTERS):
// every limit psmd enforces on a tenant is counted for that tenant, so that
// `psmctl stats` shows who hit which limit, not only the log.
//
// Thread-safety: thread-safe (one mutex; counting is rare, off the data
// path).
#ifndef PSMD_DAEMON_CONTROL_REFUSALS_H_
#define PSMD_DAEMON_CONTROL_REFUSALS_H_

#include <sys/types.h>

#include <mutex>
#include <unordered_map>

#include "proto/counters.h"

namespace psmd {

class Refusals {
 public:
  void Count(uid_t uid, refusals::Id what) {
    std::lock_guard<std::mutex> lock(mu_);
    by_uid_[uid][what]++;
  }
  // `uid`'s refusals, or every uid's together for root (uid 0).
  refusals::Values For(uid_t uid) const {
    std::lock_guard<std::mutex> lock(mu_);
    refusals::Values out{};
    for (const auto& [u, values] : by_uid_) {
      if (uid == 0 || u == uid) refusals::Accumulate(values, &out);
    }
    return out;
  }

 private:
  mutable std::mutex mu_;
  // One entry per uid ever refused: bounded by the node's users.
  std::unordered_map<uid_t, refusals::Values> by_uid_;  // guarded by mu_
};

}  // namespace psmd

#endif  // PSMD_DAEMON_CONTROL_REFUSALS_H_
