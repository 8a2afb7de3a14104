// The daemon's clock for deadlines and idle times: CLOCK_MONOTONIC in
// nanoseconds. Thread-safe.
#ifndef PSMD_DAEMON_CLOCK_H_
#define PSMD_DAEMON_CLOCK_H_

#include <chrono>
#include <cstdint>

namespace psmd {

inline uint64_t NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace psmd

#endif  // PSMD_DAEMON_CLOCK_H_
