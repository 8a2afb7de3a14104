#include "daemon/log.h"

#include <sys/stat.h>

#include <cinttypes>
#include <cstdio>
#include <cstdlib>

#include <spdlog/sinks/stdout_sinks.h>
#include <spdlog/sinks/systemd_sink.h>

namespace psmd {
namespace {

// True when fd 2 is the stream systemd connected to the journal (its
// JOURNAL_STREAM names that stream's device and inode; a child that merely
// inherited the variable has another stderr).
bool StderrIsJournal() {
  const char* stream = getenv("JOURNAL_STREAM");
  if (stream == nullptr) return false;
  unsigned long long dev = 0, ino = 0;
  if (sscanf(stream, "%llu:%llu", &dev, &ino) != 2) return false;
  struct stat st;
  if (fstat(2, &st) != 0) return false;
  return st.st_dev == dev && st.st_ino == ino;
}

}  // namespace

std::string SetUpLogging(const Config& config) {
  bool journal = config.log_target == "journal" ||
                 (config.log_target == "auto" && StderrIsJournal());
  std::shared_ptr<spdlog::logger> logger;
  if (journal) {
    // The journal stamps time and priority itself; the message is the line.
    logger = std::make_shared<spdlog::logger>(
        "psmd", std::make_shared<spdlog::sinks::systemd_sink_mt>("psmd"));
  } else {
    logger = std::make_shared<spdlog::logger>(
        "psmd", std::make_shared<spdlog::sinks::stderr_sink_mt>());
    logger->set_pattern("%Y-%m-%dT%H:%M:%S.%e %l %v");
  }
  logger->set_level(spdlog::level::from_str(config.log_level));
  logger->flush_on(spdlog::level::trace);
  spdlog::set_default_logger(logger);
  return journal ? "journal" : "stderr";
}

std::string Escaped(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (unsigned char ch : text) {
    if (ch >= 0x20 && ch < 0x7f && ch != '\\') {
      out.push_back(static_cast<char>(ch));
    } else {
      char buf[5];
      snprintf(buf, sizeof(buf), "\\x%02x", ch);
      out += buf;
    }
  }
  return out;
}

RateLimiter::RateLimiter(uint32_t burst,
                         std::chrono::steady_clock::duration window,
                         size_t max_keys)
    : burst_(burst), window_(window), max_keys_(max_keys) {}

bool RateLimiter::Allow(uint64_t key, uint64_t* suppressed) {
  constexpr uint64_t kOverflowKey = UINT64_MAX;
  const auto now = std::chrono::steady_clock::now();
  MutexLock lock(&mu_);
  if (windows_.size() >= max_keys_ && windows_.count(key) == 0) {
    for (auto it = windows_.begin(); it != windows_.end();) {
      bool over = now - it->second.start >= window_ &&
                  it->second.suppressed == 0 && it->first != kOverflowKey;
      it = over ? windows_.erase(it) : std::next(it);
    }
    if (windows_.size() >= max_keys_) key = kOverflowKey;
  }
  auto [it, fresh] = windows_.try_emplace(key);
  Window& w = it->second;
  if (fresh || now - w.start >= window_) {
    w.start = now;
    w.allowed = 0;
  }
  if (w.allowed >= burst_) {
    w.suppressed++;
    return false;
  }
  w.allowed++;
  *suppressed = w.suppressed;
  w.suppressed = 0;
  return true;
}

RateLimiter& ClientWarningLimiter() {
  static auto* limiter = new RateLimiter(5, std::chrono::seconds(10), 4096);
  return *limiter;
}

}  // namespace psmd
