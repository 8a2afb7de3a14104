// psmd's logging: where the log goes (the journal with syslog priorities when
// psmd runs under systemd, stderr otherwise), how a string that came from a
// client is made safe to print, and how warnings a client can trigger are
// kept from flooding the log.
//
// Thread-safety: SetUpLogging is called once by the main thread before any
// other thread starts. Escaped is a pure function. RateLimiter and WarnClient
// may be used from any thread (a mutex guards the limiter's table).
#ifndef PSMD_DAEMON_LOG_H_
#define PSMD_DAEMON_LOG_H_

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>

#include <spdlog/spdlog.h>

#include "base/mutex.h"
#include "daemon/config.h"

namespace psmd {

// Installs the default logger for config.log_target and config.log_level.
// Returns where the log goes ("journal" or "stderr").
std::string SetUpLogging(const Config& config);

// `text` with every byte outside printable ASCII, and the backslash, written
// as \xNN: a client's executable name or path cannot start a new log line,
// split a psmctl row or carry terminal escapes.
std::string Escaped(std::string_view text);

// At most `burst` events per key in each `window`; past that, events are
// counted and the count is handed to the next event let through. Keys live
// until their window is over, and at most `max_keys` at once (past that, new
// keys share one overflow key), so the table is bounded whatever the clients
// do.
class RateLimiter {
 public:
  RateLimiter(uint32_t burst, std::chrono::steady_clock::duration window,
              size_t max_keys);
  // True when the event may be logged; *suppressed is then the number of
  // events of this key refused since the last one let through.
  bool Allow(uint64_t key, uint64_t* suppressed);

 private:
  struct Window {
    std::chrono::steady_clock::time_point start;
    uint32_t allowed = 0;
    uint64_t suppressed = 0;
  };
  const uint32_t burst_;
  const std::chrono::steady_clock::duration window_;
  const size_t max_keys_;
  Mutex mu_;
  std::unordered_map<uint64_t, Window> windows_ PSMD_GUARDED_BY(mu_);
};

// The limiter of lines a client can cause: 5 per uid and kind per 10 s.
RateLimiter& ClientWarningLimiter();

// Logs a line that a client of `uid` caused, unless that uid has used up its
// share of lines of this kind (this format): one kind of complaint cannot
// hide another. The next line let through says how many were suppressed.
template <typename... Args>
void LogClient(spdlog::level::level_enum level, uint32_t uid,
               fmt::format_string<Args...> format, Args&&... args) {
  const fmt::string_view text = format;
  const uint64_t kind =
      std::hash<std::string_view>()(std::string_view(text.data(), text.size()));
  uint64_t suppressed = 0;
  if (!ClientWarningLimiter().Allow((uint64_t{uid} << 32) ^ (kind >> 32),
                                    &suppressed)) {
    return;
  }
  std::string line = fmt::format(format, std::forward<Args>(args)...);
  if (suppressed == 0) {
    spdlog::log(level, "{}", line);
  } else {
    spdlog::log(level, "{} ({} more like it about uid {} suppressed)", line,
                suppressed, uid);
  }
}

template <typename... Args>
void WarnClient(uint32_t uid, fmt::format_string<Args...> format,
                Args&&... args) {
  LogClient(spdlog::level::warn, uid, format, std::forward<Args>(args)...);
}

}  // namespace psmd

#endif  // PSMD_DAEMON_LOG_H_
