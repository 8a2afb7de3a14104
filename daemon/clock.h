// The daemon's clocks: NowNs for deadlines and idle times (CLOCK_MONOTONIC
// in nanoseconds), UnixNowNs for instants others read (the wall clock, in
// nanoseconds since the epoch). Thread-safe.
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

inline uint64_t UnixNowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

}  // namespace psmd

#endif  // PSMD_DAEMON_CLOCK_H_
