// psmd's configuration: defaults suited to a compute node, then the TOML file
// (/etc/psmd/psmd.toml or --config PATH), then command-line flags, the flag
// winning. Every setting is both a file key and a flag, described once in the
// table in config.cc. Values are checked the same way from either source.
//
// Thread-safety: a Config is a plain value; ConfigLoader is used by the main
// thread only (at start-up and on SIGHUP).
#ifndef PSMD_DAEMON_CONFIG_H_
#define PSMD_DAEMON_CONFIG_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "base/mutex.h"
#include "shm/attach.h"

namespace psmd {

struct Config {
  std::string socket_path = shm::kDefaultSocketPath;
  std::string log_level = "info";
  // auto: the journal when stderr is connected to it (JOURNAL_STREAM), else
  // stderr.
  std::string log_target = "auto";
  // How long the progress thread polls after its last piece of work before
  // it sleeps in epoll until a client rings (microseconds).
  uint32_t spin_us = 200;
  // Rendezvous transfers of at least copy_min_bytes between processes of
  // this node that made no progress for copy_after_us: copied by psmd from
  // the sender's memory into the receive buffer (auto), or left to the
  // stream through the pool (off). docs/perf.md, "Copies in place", has
  // the figures behind the defaults.
  std::string copy_in_place = "auto";
  uint64_t copy_min_bytes = 1u << 20;
  uint32_t copy_after_us = 10000;
  // Engine shards (docs/design.md, "Engine shards"): progress workers, each
  // serving its share of the endpoints; 0 is "auto" (WorkerCount). One by
  // default: a second polling thread costs a core that, on a small node,
  // the ranks want (docs/perf.md, "Engine scale").
  uint32_t workers = 1;
  // CPUs the workers are pinned to, in order, e.g. "2,3" or "4-7" (worker
  // i on the i-th, round robin); empty: not pinned.
  std::string worker_cpus;
  uint32_t sq_capacity = 256;   // submission ring slots per endpoint
  uint32_t cq_capacity = 1024;  // completion ring slots per endpoint
  // Per-job payload pool: one send region per endpoint of the job.
  uint64_t region_bytes = 8ull << 20;
  uint32_t max_endpoints_per_job = 64;
  uint32_t max_endpoints = 1024;
  // Endpoints one non-root uid may hold open at once, so that one tenant
  // cannot take every slot (root is bounded by max_endpoints only).
  uint32_t max_endpoints_per_uid = 256;
  // Control (gRPC) connections one non-root uid may hold open at once: each
  // costs psmd an fd and about 16 KiB. A rank holds one while it opens,
  // connects or closes.
  uint32_t max_control_connections_per_uid = 256;
  // Posted receives of one job, and of all jobs of one uid (each costs psmd
  // about 160 bytes): beyond them a receive fails with PSM2_NO_MEMORY.
  uint64_t max_posted_recvs_per_job = uint64_t{1} << 21;
  uint64_t max_posted_recvs_per_uid = uint64_t{1} << 22;
  // Unexpected-message budget of each endpoint (PSM2_MQ_MAX_SYSBUF_MBYTES):
  // the default, and the most a client may ask for.
  uint64_t unexpected_budget_bytes = 64ull << 20;
  uint64_t max_unexpected_budget_bytes = 1024ull << 20;
  // Unexpected-message budget of each job: its endpoints' together, so that
  // one job's many endpoints cannot make psmd hold without bound.
  uint64_t job_unexpected_budget_bytes = 4096ull << 20;
  // ... and of all jobs of one uid together (a uid may open any number).
  uint64_t uid_unexpected_budget_bytes = 8192ull << 20;
  // A Slurm step's budgets on this node, from its allocation (what psmd's
  // SPANK plugin registers; Registry, SlurmBudgets): its job may hold at
  // most tasks * slurm_endpoints_per_task endpoints here at once, and
  // slurm_unexpected_percent of the step's memory on the node in
  // unexpected messages; never more than max_endpoints_per_job and
  // job_unexpected_budget_bytes. 0: that budget is not from the allocation.
  uint32_t slurm_endpoints_per_task = 1;
  uint32_t slurm_unexpected_percent = 10;
  uint16_t node_id = 0;  // high bits of every epid minted here
  // The fabric between nodes' daemons (hw/, docs/design.md "Between
  // nodes"). No listen address: this daemon serves its node only.
  // "ADDR[:PORT[-PORT]]" each, comma-joined (the flag is repeatable; the
  // first is the node's primary address).
  std::string fabric_listen;
  // The backend: socket (TCP on io_uring, hw/socket/) or ofi (libfabric,
  // hw/ofi/, through fabric_provider; empty: the first that serves).
  std::string fabric = "socket";
  std::string fabric_provider;
  std::string fabric_auth = "munge";  // munge | none (loopback only)
  std::string munge_socket;           // empty: libmunge's default
  uint32_t fabric_timeout_ms = 5000;
  // Sessions (docs/design.md, "Sessions: a broken connection resumes"):
  // "on" makes a connection that breaks resume without loss within
  // fabric_timeout_ms; every node must agree. On by default; "off" gives
  // back the 8 B rate sessions cost (docs/design.md, "Sessions").
  std::string fabric_sessions = "on";
  // "on": rendezvous chunks between daemons are read by RMA where the
  // fabric can (the ofi backend); off by default: the pools are then
  // registered for remote reads, which anyone who reaches the provider's
  // endpoint could issue (docs/design.md, "Rendezvous by RMA read").
  std::string fabric_rma = "off";
  // The node table: "NODE HOSTNAME NODE@ADDR:PORT,..." per line, read again
  // whenever it changes (daemon/remote/remote.h).
  std::string fabric_nodes;
  // A command printing the node table (e.g. deploy/slurm/psmd-slurm-nodes,
  // from Slurm's node list): psmd runs it at start, on SIGHUP and every
  // fabric_nodes_refresh_s (0: not periodically) and writes what it prints
  // to fabric_nodes when it changed. Empty: fabric_nodes is an
  // administrator's file.
  std::string fabric_nodes_command;
  uint32_t fabric_nodes_refresh_s = 300;
};

// Progress workers psmd runs: config.workers, or for "auto" the CPUs psmd
// may use minus one (for the ranks), at least 1 and at most kMaxAutoWorkers.
inline constexpr uint32_t kMaxWorkers = 64;
inline constexpr uint32_t kMaxAutoWorkers = 8;
uint32_t WorkerCount(const Config& config);

// The CPUs of a worker_cpus list ("0,2-3" is 0, 2, 3); false if malformed.
bool ParseCpuList(const std::string& text, std::vector<int>* cpus);

// The listen addresses of config.fabric_listen, in order.
std::vector<std::string> FabricListenAddresses(const Config& config);
// Whether a handover (psmctl upgrade, systemctl restart) carries this
// configuration's connections to other nodes: it has none, or they run with
// sessions, over the socket fabric or over the ofi one without RMA reads
// (docs/design.md, "Handover with a fabric").
bool HandoverCarriesFabric(const Config& config);

inline constexpr char kDefaultConfigPath[] = "/etc/psmd/psmd.toml";

// The effective configuration as a TOML document that psmd reads back to the
// same Config (psmd --check-config, psmctl config).
std::string ConfigToToml(const Config& config);

// "key: old -> new" for every setting that differs between a and b.
std::vector<std::string> ConfigChanges(const Config& a, const Config& b);

// The configuration in force, read by control handlers while SIGHUP may
// replace it. Thread-safe.
class SharedConfig {
 public:
  explicit SharedConfig(const Config& config) : config_(config) {}
  Config Get() const {
    MutexLock lock(&mu_);
    return config_;
  }
  void Set(const Config& config) {
    MutexLock lock(&mu_);
    config_ = config;
  }

 private:
  mutable Mutex mu_;
  Config config_ PSMD_GUARDED_BY(mu_);
};

// Reads the command line once, and builds a Config from defaults, the file and
// the flags whenever asked (again on SIGHUP, so that an edited file is seen
// and the flags still win).
class ConfigLoader {
 public:
  // Parses argv. Returns -1 to go on; otherwise the exit code psmd should
  // end with, having printed what was asked (--help, --version: 0) or what
  // was wrong (2).
  int ParseCommandLine(int argc, char** argv);

  // Defaults, then the file, then the flags. Returns false with one line per
  // bad value or unknown key in *errors (each naming the file and line, or
  // the flag, and what is expected).
  bool Load(Config* out, std::vector<std::string>* errors) const;

  bool check_config() const { return check_config_; }
  // psmd --fabric-info: list the libfabric providers psmd could use.
  bool fabric_info() const { return fabric_info_; }
  const std::string& config_path() const { return config_path_; }

 private:
  std::string config_path_ = kDefaultConfigPath;
  bool config_path_given_ = false;
  bool check_config_ = false;
  bool fabric_info_ = false;
  std::map<std::string, std::string> flags_;  // file key -> flag value
};

}  // namespace psmd

#endif  // PSMD_DAEMON_CONFIG_H_
