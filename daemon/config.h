// psmd's configuration: command-line flags with defaults suited to a compute
// node. Parsed once at start-up; immutable afterwards.
#ifndef PSMD_DAEMON_CONFIG_H_
#define PSMD_DAEMON_CONFIG_H_

#include <cstdint>
#include <string>

#include "shm/attach.h"

namespace psmd {

struct Config {
  std::string socket_path = shm::kDefaultSocketPath;
  std::string log_level = "info";
  // How long the progress thread polls after its last piece of work before
  // it sleeps in epoll until a client rings (microseconds).
  uint32_t spin_us = 200;
  uint32_t sq_capacity = 256;   // submission ring slots per endpoint
  uint32_t cq_capacity = 1024;  // completion ring slots per endpoint
  // Per-job payload pool: one send region per endpoint of the job.
  uint64_t region_bytes = 8ull << 20;
  uint32_t max_endpoints_per_job = 64;
  uint32_t max_endpoints = 1024;
  // Endpoints one non-root uid may hold open at once, so that one tenant
  // cannot take every slot (root is bounded by max_endpoints only).
  uint32_t max_endpoints_per_uid = 256;
  // Unexpected-message budget of each endpoint (PSM2_MQ_MAX_SYSBUF_MBYTES):
  // the default, and the most a client may ask for.
  uint64_t unexpected_budget_bytes = 64ull << 20;
  uint64_t max_unexpected_budget_bytes = 1024ull << 20;
  // Unexpected-message budget of each job: its endpoints' together, so that
  // one job's many endpoints cannot make psmd hold without bound.
  uint64_t job_unexpected_budget_bytes = 4096ull << 20;
  // ... and of all jobs of one uid together (a uid may open any number).
  uint64_t uid_unexpected_budget_bytes = 8192ull << 20;
  uint16_t node_id = 0;  // high bits of every epid minted here
};

// Parses argv into *config. Returns false and fills *error (naming the flag
// and the fix) on a bad command line; sets *help when --help was asked.
bool ParseFlags(int argc, char** argv, Config* config, bool* help,
                std::string* error);

std::string FlagsUsage();

}  // namespace psmd

#endif  // PSMD_DAEMON_CONFIG_H_
