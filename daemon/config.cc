#include "daemon/config.h"

#include <cerrno>
#include <cstdlib>
#include <functional>
#include <map>

#include "shm/ring.h"

namespace psmd {
namespace {

bool ParseUnsigned(const std::string& text, uint64_t max, uint64_t* out) {
  if (text.empty()) return false;
  char* end = nullptr;
  errno = 0;
  unsigned long long v = strtoull(text.c_str(), &end, 10);
  if (errno != 0 || *end != '\0' || v > max) return false;
  *out = v;
  return true;
}

}  // namespace

std::string FlagsUsage() {
  return "usage: psmd [--socket PATH] [--log-level "
         "trace|debug|info|warn|error|off]\n"
         "            [--spin-us N] [--sq-slots N] [--cq-slots N] "
         "[--region-mib N]\n"
         "            [--max-endpoints-per-job N] [--max-endpoints N]\n"
         "            [--max-endpoints-per-uid N] [--node-id N]\n"
         "            [--unexpected-mib N] [--max-unexpected-mib N] "
         "[--job-unexpected-mib N]\n"
         "            [--uid-unexpected-mib N]\n";
}

bool ParseFlags(int argc, char** argv, Config* c, bool* help,
                std::string* error) {
  *help = false;
  using Setter = std::function<bool(const std::string&)>;
  auto number = [](auto* field, uint64_t max) -> Setter {
    return [field, max](const std::string& v) {
      uint64_t n;
      if (!ParseUnsigned(v, max, &n)) return false;
      *field = static_cast<std::remove_pointer_t<decltype(field)>>(n);
      return true;
    };
  };
  auto mebibytes = [](uint64_t* field) -> Setter {
    return [field](const std::string& v) {
      uint64_t n;
      if (!ParseUnsigned(v, 1u << 20, &n) || n == 0) return false;
      *field = n << 20;
      return true;
    };
  };
  auto power_of_two = [](uint32_t* field) -> Setter {
    return [field](const std::string& v) {
      uint64_t n;
      if (!ParseUnsigned(v, 1u << 20, &n) || !shm::IsPowerOfTwo(n) || n < 8)
        return false;
      *field = static_cast<uint32_t>(n);
      return true;
    };
  };
  std::map<std::string, std::pair<Setter, const char*>> flags = {
      {"--socket",
       {[c](const std::string& v) {
          c->socket_path = v;
          return !v.empty() && v.size() < 108;
        },
        "a path shorter than 108 bytes"}},
      {"--log-level",
       {[c](const std::string& v) {
          c->log_level = v;
          return v == "trace" || v == "debug" || v == "info" || v == "warn" ||
                 v == "error" || v == "off";
        },
        "one of trace, debug, info, warn, error, off"}},
      {"--spin-us",
       {number(&c->spin_us, 10'000'000), "microseconds, 0 to 10000000"}},
      {"--sq-slots",
       {power_of_two(&c->sq_capacity), "a power of two from 8 to 1048576"}},
      {"--cq-slots",
       {power_of_two(&c->cq_capacity), "a power of two from 8 to 1048576"}},
      {"--region-mib", {mebibytes(&c->region_bytes), "MiB, 1 to 1048576"}},
      {"--unexpected-mib",
       {mebibytes(&c->unexpected_budget_bytes), "MiB, 1 to 1048576"}},
      {"--max-unexpected-mib",
       {mebibytes(&c->max_unexpected_budget_bytes), "MiB, 1 to 1048576"}},
      {"--job-unexpected-mib",
       {mebibytes(&c->job_unexpected_budget_bytes), "MiB, 1 to 1048576"}},
      {"--uid-unexpected-mib",
       {mebibytes(&c->uid_unexpected_budget_bytes), "MiB, 1 to 1048576"}},
      {"--max-endpoints-per-job",
       {number(&c->max_endpoints_per_job, 4096), "1 to 4096"}},
      {"--max-endpoints",
       {number(&c->max_endpoints, 1u << 20), "1 to 1048576"}},
      {"--max-endpoints-per-uid",
       {number(&c->max_endpoints_per_uid, 1u << 20), "1 to 1048576"}},
      {"--node-id", {number(&c->node_id, 0xffff), "0 to 65535"}},
  };
  for (int i = 1; i < argc; i++) {
    std::string arg = argv[i];
    if (arg == "--help" || arg == "-h") {
      *help = true;
      return true;
    }
    std::string value;
    bool has_value = false;
    if (auto eq = arg.find('='); eq != std::string::npos) {
      value = arg.substr(eq + 1);
      arg = arg.substr(0, eq);
      has_value = true;
    }
    auto it = flags.find(arg);
    if (it == flags.end()) {
      *error = "unknown flag '" + arg + "' (see psmd --help)";
      return false;
    }
    if (!has_value) {
      if (i + 1 >= argc) {
        *error = "flag " + arg + " needs a value: " + it->second.second;
        return false;
      }
      value = argv[++i];
    }
    if (!it->second.first(value)) {
      *error = "bad value '" + value + "' for " + arg + ": expected " +
               it->second.second;
      return false;
    }
  }
  if (c->max_endpoints_per_job == 0 || c->max_endpoints == 0 ||
      c->max_endpoints_per_uid == 0) {
    *error = "endpoint limits must be at least 1";
    return false;
  }
  if (c->unexpected_budget_bytes > c->max_unexpected_budget_bytes) {
    *error = "--unexpected-mib must not exceed --max-unexpected-mib";
    return false;
  }
  return true;
}

}  // namespace psmd
