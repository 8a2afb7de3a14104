#include "daemon/config.h"

#include <sched.h>
#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <sstream>

#include <toml++/toml.h>
#include <CLI/CLI.hpp>

#include "daemon/handover/handover.h"
#include "hw/fabric.h"
#include "shm/ring.h"
#include "version/version.h"

namespace psmd {
namespace {

bool ParseUnsigned(const std::string& text, uint64_t max, uint64_t* out) {
  if (text.empty() || text[0] < '0' || text[0] > '9') return false;
  char* end = nullptr;
  errno = 0;
  unsigned long long v = strtoull(text.c_str(), &end, 10);
  if (errno != 0 || *end != '\0' || v > max) return false;
  *out = v;
  return true;
}

// One setting: its file key (the flag is "--" + key with '-' for '_'), what
// it means, what values it takes, and how it is read from and written to a
// Config.
struct Setting {
  const char* key;
  const char* help;
  const char* expected;
  bool is_string;
  std::function<bool(const std::string&, Config*)> set;
  std::function<std::string(const Config&)> get;
  // A number setting that also takes a word (workers = "auto").
  bool takes_word = false;
};

template <typename T>
Setting Number(const char* key, T Config::*field, uint64_t min, uint64_t max,
               const char* help, const char* expected) {
  return {key,
          help,
          expected,
          false,
          [=](const std::string& v, Config* c) {
            uint64_t n;
            if (!ParseUnsigned(v, max, &n) || n < min) return false;
            c->*field = static_cast<T>(n);
            return true;
          },
          [=](const Config& c) { return std::to_string(c.*field); }};
}

Setting Mebibytes(const char* key, uint64_t Config::*field, const char* help) {
  return {key,
          help,
          "MiB, 1 to 1048576",
          false,
          [=](const std::string& v, Config* c) {
            uint64_t n;
            if (!ParseUnsigned(v, 1u << 20, &n) || n == 0) return false;
            c->*field = n << 20;
            return true;
          },
          [=](const Config& c) { return std::to_string((c.*field) >> 20); }};
}

Setting Slots(const char* key, uint32_t Config::*field, const char* help) {
  return {
      key,
      help,
      "a power of two from 8 to 1048576",
      false,
      [=](const std::string& v, Config* c) {
        uint64_t n;
        if (!ParseUnsigned(v, 1u << 20, &n) || !shm::IsPowerOfTwo(n) || n < 8)
          return false;
        c->*field = static_cast<uint32_t>(n);
        return true;
      },
      [=](const Config& c) { return std::to_string(c.*field); }};
}

Setting OneOf(const char* key, std::string Config::*field,
              std::vector<std::string> choices, const char* help,
              const char* expected) {
  return {key,
          help,
          expected,
          true,
          [=](const std::string& v, Config* c) {
            for (const auto& choice : choices) {
              if (v == choice) {
                c->*field = v;
                return true;
              }
            }
            return false;
          },
          [=](const Config& c) { return c.*field; }};
}

const std::vector<Setting>& Settings() {
  static const auto* settings = new std::vector<Setting>{
      {"socket", "the control socket clients connect to",
       "a path shorter than 108 bytes", true,
       [](const std::string& v, Config* c) {
         if (v.empty() || v.size() >= 108) return false;
         c->socket_path = v;
         return true;
       },
       [](const Config& c) { return c.socket_path; }},
      OneOf("log_level", &Config::log_level,
            {"trace", "debug", "info", "warn", "error", "off"},
            "least severe log level written (reloaded on SIGHUP)",
            "one of trace, debug, info, warn, error, off"),
      OneOf("log_target", &Config::log_target, {"auto", "stderr", "journal"},
            "where the log goes: auto (the journal when stderr is connected "
            "to it, else stderr), stderr or journal",
            "one of auto, stderr, journal"),
      Number("spin_us", &Config::spin_us, 0, 10'000'000,
             "microseconds the progress worker polls after its last work "
             "before it sleeps (reloaded on SIGHUP)",
             "microseconds, 0 to 10000000"),
      OneOf("copy_in_place", &Config::copy_in_place, {"auto", "off"},
            "rendezvous transfers between processes of this node that stall "
            "(the sender or receiver computes): auto (psmd copies the rest "
            "from the sender's memory into the receive buffer on a thread "
            "of its own, where the kernel lets it) or off (they wait for "
            "both libraries)",
            "auto or off"),
      Number("copy_min_bytes", &Config::copy_min_bytes, 0, uint64_t{1} << 32,
             "the smallest rendezvous message psmd copies in place",
             "bytes, 0 to 4294967296"),
      Number("copy_after_us", &Config::copy_after_us, 10, 10'000'000,
             "microseconds without progress after which psmd takes a "
             "rendezvous transfer over",
             "microseconds, 10 to 10000000"),
      {"workers",
       "progress workers, each serving its share of the endpoints (engine "
       "shards); auto: the CPUs psmd may use minus one, at most 8",
       "1 to 64, or auto", false,
       [](const std::string& v, Config* c) {
         uint64_t n;
         if (v == "auto") {
           c->workers = 0;
           return true;
         }
         if (!ParseUnsigned(v, kMaxWorkers, &n) || n == 0) return false;
         c->workers = static_cast<uint32_t>(n);
         return true;
       },
       [](const Config& c) {
         return c.workers == 0 ? std::string("auto")
                               : std::to_string(c.workers);
       },
       /*takes_word=*/true},
      {"worker_cpus",
       "CPUs the progress workers are pinned to, worker i on the i-th (round "
       "robin); empty: not pinned",
       "a CPU list such as 2,3 or 4-7", true,
       [](const std::string& v, Config* c) {
         std::vector<int> cpus;
         if (!v.empty() && !ParseCpuList(v, &cpus)) return false;
         c->worker_cpus = v;
         return true;
       },
       [](const Config& c) { return c.worker_cpus; }},
      Slots("sq_slots", &Config::sq_capacity,
            "submission ring slots per endpoint"),
      Slots("cq_slots", &Config::cq_capacity,
            "completion ring slots per endpoint"),
      Mebibytes("region_mib", &Config::region_bytes,
                "send region of each endpoint in its job's payload pool"),
      Number("max_endpoints_per_job", &Config::max_endpoints_per_job, 1, 4096,
             "endpoints one job may open on this node", "1 to 4096"),
      Number("max_endpoints", &Config::max_endpoints, 1, 1u << 20,
             "endpoints psmd serves at once", "1 to 1048576"),
      Number("max_endpoints_per_uid", &Config::max_endpoints_per_uid, 1,
             1u << 20, "endpoints one non-root uid may hold at once",
             "1 to 1048576"),
      Number("max_posted_recvs_per_job", &Config::max_posted_recvs_per_job, 1,
             uint64_t{1} << 32,
             "posted receives one job may hold (about 160 B of psmd each)",
             "1 to 4294967296"),
      Number("max_posted_recvs_per_uid", &Config::max_posted_recvs_per_uid, 1,
             uint64_t{1} << 32,
             "posted receives all jobs of one uid may hold together",
             "1 to 4294967296"),
      Number("max_control_connections_per_uid",
             &Config::max_control_connections_per_uid, 1, 1u << 20,
             "control (gRPC) connections one non-root uid may hold open at "
             "once",
             "1 to 1048576"),
      Mebibytes("unexpected_mib", &Config::unexpected_budget_bytes,
                "unexpected-message budget a new endpoint gets, psmd's memory "
                "for them at 128 B a message (reloaded on SIGHUP)"),
      Mebibytes("max_unexpected_mib", &Config::max_unexpected_budget_bytes,
                "most unexpected-message budget an endpoint may ask for "
                "(PSM2_MQ_MAX_SYSBUF_MBYTES)"),
      Mebibytes("job_unexpected_mib", &Config::job_unexpected_budget_bytes,
                "unexpected-message budget of all endpoints of one job"),
      Mebibytes("uid_unexpected_mib", &Config::uid_unexpected_budget_bytes,
                "unexpected-message budget of all jobs of one uid"),
      Number("slurm_endpoints_per_task", &Config::slurm_endpoints_per_task, 0,
             4096,
             "a Slurm step's job may hold this many endpoints per task of "
             "the step on this node (at most max_endpoints_per_job); 0: "
             "max_endpoints_per_job only",
             "0 to 4096"),
      Number("slurm_unexpected_percent", &Config::slurm_unexpected_percent, 0,
             100,
             "a Slurm step's job may hold this percentage of the step's "
             "memory on this node in unexpected messages (at most "
             "job_unexpected_mib); 0, or a step without memory in Slurm: "
             "job_unexpected_mib",
             "0 to 100"),
      Number("node_id", &Config::node_id, 0, 0xffff,
             "high bits of every endpoint id minted on this node; with "
             "--fabric-listen, this node's id among the nodes (non-zero)",
             "0 to 65535"),
      {"fabric_listen",
       "address the fabric to other nodes' daemons listens on (repeatable; "
       "the first is the primary; in the file, a list or a comma-separated "
       "string); none: no fabric",
       "ADDR[:PORT[-PORT]], IPv6 as [ADDR]:PORT", true,
       [](const std::string& v, Config* c) {
         std::string joined;
         size_t start = 0;
         while (start <= v.size() && !v.empty()) {
           size_t comma = v.find(',', start);
           std::string one =
               v.substr(start, comma == std::string::npos ? std::string::npos
                                                          : comma - start);
           hw::ListenAddress parsed;
           std::string error;
           if (!hw::ParseListenAddress(one, &parsed, &error)) return false;
           joined += (joined.empty() ? "" : ",") + one;
           if (comma == std::string::npos) break;
           start = comma + 1;
         }
         c->fabric_listen = joined;
         return true;
       },
       [](const Config& c) { return c.fabric_listen; }},
      OneOf("fabric", &Config::fabric, {"socket", "ofi"},
            "the fabric's backend: socket (TCP on io_uring) or ofi "
            "(libfabric, one FI_EP_RDM endpoint through fabric_provider; one "
            "listen address)",
            "socket or ofi"),
      {"fabric_provider",
       "with fabric = ofi, the libfabric provider in libfabric's syntax, "
       "e.g. tcp;ofi_rxm or udp;ofi_rxd (empty: the first RDM provider that "
       "serves the listen address)",
       "a provider name, or empty", true,
       [](const std::string& v, Config* c) {
         if (v.size() > 128) return false;
         c->fabric_provider = v;
         return true;
       },
       [](const Config& c) { return c.fabric_provider; }},
      OneOf("fabric_auth", &Config::fabric_auth, {"munge", "none"},
            "how daemons authenticate each other: munge (a MUNGE credential "
            "checked by the acceptor's munged) or none (refused unless every "
            "fabric address is loopback)",
            "munge or none"),
      {"munge_socket", "munged's socket (empty: libmunge's default)",
       "a path shorter than 108 bytes, or empty", true,
       [](const std::string& v, Config* c) {
         if (v.size() >= 108) return false;
         c->munge_socket = v;
         return true;
       },
       [](const Config& c) { return c.munge_socket; }},
      OneOf("fabric_sessions", &Config::fabric_sessions, {"off", "on"},
            "on: a connection to a peer daemon that breaks resumes without "
            "losing a frame within fabric_timeout_ms (every node the same)",
            "off or on"),
      OneOf("fabric_rma", &Config::fabric_rma, {"off", "on"},
            "on: rendezvous messages between daemons are read by RMA where "
            "the fabric can (ofi); exposes the jobs' pools to remote reads "
            "by anyone who reaches the fabric endpoint",
            "off or on"),
      Number("fabric_timeout_ms", &Config::fabric_timeout_ms, 100, 600'000,
             "a peer node's daemon that does not answer (connect, handshake, "
             "unacknowledged data, a connect query) within this is "
             "unreachable, and requests to it fail",
             "milliseconds, 100 to 600000"),
      {"fabric_nodes",
       "the node table: one line per node, NODE HOSTNAME HOSTDESCRIPTION "
       "(NODE@ADDR:PORT,...), the same file on every node",
       "a path, or empty", true,
       [](const std::string& v, Config* c) {
         c->fabric_nodes = v;
         return true;
       },
       [](const Config& c) { return c.fabric_nodes; }},
      // The node table from a command (Slurm's node list): both keys here,
      // together.
      {"fabric_nodes_command",
       "a command (run with /bin/sh -c) printing the node table, e.g. "
       "psmd-slurm-nodes --port PORT (Slurm's nodes); psmd writes its "
       "output to fabric_nodes at start, on SIGHUP and every "
       "fabric_nodes_refresh_s; empty: fabric_nodes is written by hand",
       "a command, or empty", true,
       [](const std::string& v, Config* c) {
         if (v.size() > 4096) return false;
         c->fabric_nodes_command = v;
         return true;
       },
       [](const Config& c) { return c.fabric_nodes_command; }},
      Number("fabric_nodes_refresh_s", &Config::fabric_nodes_refresh_s, 0,
             86400,
             "seconds between runs of fabric_nodes_command (0: only at start "
             "and on SIGHUP)",
             "seconds, 0 to 86400"),
  };
  return *settings;
}

std::string FlagOf(const char* key) {
  std::string flag = std::string("--") + key;
  for (char& ch : flag) {
    if (ch == '_') ch = '-';
  }
  return flag;
}

// Checks that need more than one value.
void CheckTogether(const Config& c, std::vector<std::string>* errors) {
  if (c.unexpected_budget_bytes > c.max_unexpected_budget_bytes) {
    errors->push_back(
        "unexpected_mib (--unexpected-mib) must not exceed max_unexpected_mib "
        "(--max-unexpected-mib)");
  }
  const std::vector<std::string> listen = FabricListenAddresses(c);
  if (!listen.empty() && c.node_id == 0) {
    errors->push_back(
        "fabric_listen (--fabric-listen) needs a non-zero node_id "
        "(--node-id): 0 is reserved for peers not yet authenticated");
  }
  if (c.fabric_auth == "none") {
    for (const std::string& a : listen) {
      hw::ListenAddress parsed;
      std::string error;
      if (hw::ParseListenAddress(a, &parsed, &error) &&
          !hw::IsLoopback(parsed.host)) {
        errors->push_back(
            "fabric_auth = none (--fabric-auth none) is refused: "
            "fabric address " +
            a +
            " is not loopback; daemons on a network must "
            "authenticate each other (--fabric-auth munge)");
      }
    }
  }
  if (c.fabric == "ofi" && listen.size() > 1) {
    errors->push_back(
        "fabric = ofi (--fabric ofi) listens on one address (one libfabric "
        "endpoint); give one fabric_listen (--fabric-listen)");
  }
  if (c.fabric != "ofi" && !c.fabric_provider.empty()) {
    errors->push_back(
        "fabric_provider (--fabric-provider) names a libfabric provider: it "
        "needs fabric = ofi (--fabric ofi)");
  }
  if (!listen.empty() && c.fabric_nodes.empty()) {
    errors->push_back(
        "fabric_listen (--fabric-listen) needs a node table (--fabric-nodes "
        "FILE) to reach other nodes");
  }
  if (!c.fabric_nodes_command.empty() && c.fabric_nodes.empty()) {
    errors->push_back(
        "fabric_nodes_command (--fabric-nodes-command) needs fabric_nodes "
        "(--fabric-nodes FILE): the file psmd writes its table to");
  }
}

// The text of a TOML value as a setting takes it, or false when its type is
// wrong for the setting.
bool ValueText(const toml::node& node, const Setting& s, std::string* out) {
  if (s.is_string && node.is_array()) {  // fabric_listen = ["a", "b"]
    out->clear();
    for (const toml::node& item : *node.as_array()) {
      if (!item.is_string()) return false;
      *out += (out->empty() ? "" : ",") + item.as_string()->get();
    }
    return std::string(s.key) == "fabric_listen";
  }
  if (s.is_string) {
    if (!node.is_string()) return false;
    *out = node.as_string()->get();
    return true;
  }
  if (s.takes_word && node.is_string()) {
    *out = node.as_string()->get();
    return true;
  }
  if (!node.is_integer()) return false;
  *out = std::to_string(node.as_integer()->get());
  return true;
}

}  // namespace

bool ParseCpuList(const std::string& text, std::vector<int>* cpus) {
  cpus->clear();
  std::stringstream in(text);
  std::string part;
  while (std::getline(in, part, ',')) {
    const size_t dash = part.find('-');
    uint64_t first;
    uint64_t last;
    if (!ParseUnsigned(part.substr(0, dash), CPU_SETSIZE - 1, &first))
      return false;
    last = first;
    if (dash != std::string::npos &&
        (!ParseUnsigned(part.substr(dash + 1), CPU_SETSIZE - 1, &last) ||
         last < first)) {
      return false;
    }
    for (uint64_t cpu = first; cpu <= last; cpu++) {
      cpus->push_back(static_cast<int>(cpu));
    }
  }
  return !cpus->empty() && text.back() != ',';
}

uint32_t WorkerCount(const Config& config) {
  if (config.workers != 0) return config.workers;
  cpu_set_t set;
  CPU_ZERO(&set);
  int usable = 1;
  if (sched_getaffinity(0, sizeof(set), &set) == 0) usable = CPU_COUNT(&set);
  return static_cast<uint32_t>(
      std::clamp<int>(usable - 1, 1, static_cast<int>(kMaxAutoWorkers)));
}

bool HandoverCarriesFabric(const Config& config) {
  if (config.fabric_listen.empty()) return true;
  if (config.fabric_sessions != "on") return false;
  // A job's pool stays registered for RMA reads while the job lives, and
  // registrations are not carried (Remote::Carriable): the drain would wait
  // its whole settle time, every client frozen, and then give up.
  return config.fabric == "socket" ||
         (config.fabric == "ofi" && config.fabric_rma == "off");
}

std::vector<std::string> FabricListenAddresses(const Config& config) {
  std::vector<std::string> out;
  size_t start = 0;
  const std::string& v = config.fabric_listen;
  while (start < v.size()) {
    size_t comma = v.find(',', start);
    if (comma == std::string::npos) comma = v.size();
    if (comma > start) out.push_back(v.substr(start, comma - start));
    start = comma + 1;
  }
  return out;
}

std::string ConfigToToml(const Config& config) {
  std::ostringstream out;
  for (const Setting& s : Settings()) {
    std::string text = s.get(config);
    toml::table line;
    if (s.is_string || (s.takes_word && text.find_first_not_of("0123456789") !=
                                            std::string::npos)) {
      line.insert(s.key, text);  // a string, or a number setting's word
    } else {
      line.insert(s.key, static_cast<int64_t>(std::stoull(text)));
    }
    out << line << "\n";
  }
  return out.str();
}

std::vector<std::string> ConfigChanges(const Config& a, const Config& b) {
  std::vector<std::string> changes;
  for (const Setting& s : Settings()) {
    std::string before = s.get(a), after = s.get(b);
    if (before != after) {
      changes.push_back(std::string(s.key) + ": " + before + " -> " + after);
    }
  }
  return changes;
}

int ConfigLoader::ParseCommandLine(int argc, char** argv) {
  CLI::App app{
      "psmd: the per-node PSM2 messaging daemon. Every setting may also be "
      "given in the configuration file (key = flag name with '_' for '-'); "
      "a flag wins over the file."};
  app.name("psmd");
  const Config defaults;
  bool version = false;
  app.add_flag("--version", version, "print the version and commit, and exit");
  app.add_option("--config", config_path_,
                 "configuration file (TOML); a missing default file is no "
                 "error, a missing --config file is")
      ->default_str(kDefaultConfigPath)
      ->type_name("PATH");
  bool handover_format = false;
  app.add_flag("--handover-format", handover_format,
               "print the handover state format this psmd reads (psmctl "
               "upgrade asks a new binary before handing over), and exit");
  app.add_flag("--fabric-info", fabric_info_,
               "list the libfabric providers, fabrics and domains that can "
               "serve psmd's ofi fabric (with --fabric-provider: those "
               "matching it), as fi_info does, and exit 0, or 1 if none");
  app.add_flag("--check-config", check_config_,
               "print the effective configuration and exit 0, or one line per "
               "bad value and exit 2");
  std::map<std::string, std::string> given;
  std::vector<std::pair<std::string, CLI::Option*>> options;
  std::vector<std::string> listen_flags;  // --fabric-listen, repeatable
  for (const Setting& s : Settings()) {
    if (std::string(s.key) == "fabric_listen") {
      CLI::Option* opt =
          app.add_option(FlagOf(s.key), listen_flags,
                         std::string(s.help) + " [" + s.expected + "]")
              ->type_name("ADDR")
              ->allow_extra_args(false);
      options.emplace_back(s.key, opt);
      continue;
    }
    CLI::Option* opt =
        app.add_option(FlagOf(s.key), given[s.key],
                       std::string(s.help) + " [" + s.expected + "]")
            ->default_str(s.get(defaults))
            ->type_name(s.is_string ? "TEXT" : "N");
    options.emplace_back(s.key, opt);
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    fprintf(stderr, "psmd: %s (see psmd --help)\n", e.what());
    return 2;
  }
  if (version) {
    printf("psmd %s (commit %s)\n", version::Version(), version::Commit());
    return 0;
  }
  if (handover_format) {
    printf("%u\n", handover::kFormatVersion);
    return 0;
  }
  config_path_given_ = app.count("--config") > 0;
  for (const auto& [key, opt] : options) {
    if (opt->count() > 0) flags_[key] = given[key];
  }
  if (!listen_flags.empty()) {
    std::string joined;
    for (const std::string& a : listen_flags) {
      joined += (joined.empty() ? "" : ",") + a;
    }
    flags_["fabric_listen"] = joined;
  }
  return -1;
}

bool ConfigLoader::Load(Config* out, std::vector<std::string>* errors) const {
  Config c;
  const size_t errors_before = errors->size();
  FILE* probe = fopen(config_path_.c_str(), "r");
  if (probe == nullptr && (config_path_given_ || errno != ENOENT)) {
    errors->push_back(config_path_ + ": cannot read: " + strerror(errno));
  }
  if (probe != nullptr) {
    fclose(probe);
    // In file order (the table iterates by key), one line each.
    std::vector<std::pair<uint32_t, std::string>> file_errors;
    try {
      toml::table file = toml::parse_file(config_path_);
      for (const auto& [key, node] : file) {
        const uint32_t line = node.source().begin.line;
        const std::string where = config_path_ + ":" + std::to_string(line);
        auto fail = [&](std::string text) {
          file_errors.emplace_back(line, where + ": " + text);
        };
        const Setting* setting = nullptr;
        for (const Setting& s : Settings()) {
          if (key.str() == s.key) setting = &s;
        }
        if (setting == nullptr) {
          fail("unknown key '" + std::string(key.str()) +
               "' (psmd --help lists the settings)");
          continue;
        }
        std::string text;
        if (!ValueText(node, *setting, &text)) {
          fail(std::string(setting->key) + ": expected " +
               (setting->is_string ? "a string: " : "a number: ") +
               setting->expected);
        } else if (!setting->set(text, &c)) {
          fail(std::string(setting->key) + " = " + text + ": expected " +
               setting->expected);
        }
      }
    } catch (const toml::parse_error& e) {
      errors->push_back(config_path_ + ":" +
                        std::to_string(e.source().begin.line) + ": " +
                        std::string(e.description()));
    }
    std::sort(file_errors.begin(), file_errors.end());
    for (auto& [line, text] : file_errors) errors->push_back(std::move(text));
  }
  for (const Setting& s : Settings()) {
    auto it = flags_.find(s.key);
    if (it == flags_.end()) continue;
    if (!s.set(it->second, &c)) {
      errors->push_back(FlagOf(s.key) + " " + it->second + ": expected " +
                        s.expected);
    }
  }
  CheckTogether(c, errors);
  if (errors->size() != errors_before) return false;
  *out = c;
  return true;
}

}  // namespace psmd
