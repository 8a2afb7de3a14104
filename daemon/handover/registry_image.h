// The registry's section of the state one psmd hands the next (issue 33;
// daemon/handover/handover.h): what it holds as plain values, and its byte
// format, written and checked here in one place. The registry
// (daemon/control/registry_handover.cc) fills an image to save and builds
// itself from a checked one; the checks need nothing but the bytes and the
// successor's limits, so they are fuzzed alone (registry_image_fuzz.cc).
//
// ParseRegistryImage checks, before it returns an image:
//   1. every count against the successor's limits and the bytes left;
//   2. every endpoint: id non-zero, unique, below the next id; its epid of
//      this node, this boot and its id; of a job it names; of its job's
//      uid; ready; attached exactly when it has an attach connection; ring
//      capacities powers of two within bounds;
//   3. every endpoint's region: exactly one region of its job, owned, and
//      no other endpoint's;
//   4. every job: a pool of exactly its regions (and its inbox), at least
//      one endpoint, as many owned regions as endpoints, no key twice;
//   5. every descriptor index within the table and named once;
//   6. every Slurm registration a step; the section read to its end.
//
// Thread-safety: plain values and functions.
#ifndef PSMD_DAEMON_HANDOVER_REGISTRY_IMAGE_H_
#define PSMD_DAEMON_HANDOVER_REGISTRY_IMAGE_H_

#include <array>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "daemon/handover/state_codec.h"

namespace psmd::handover {

using UuidBytes = std::array<uint8_t, 16>;

// An endpoint without an attach connection (not attached yet).
inline constexpr uint32_t kNoFd = UINT32_MAX;

struct StepImage {
  uint32_t job_id = 0;
  uint32_t step_id = 0;
  uint32_t uid = 0;
  std::string cgroup;
  // Its allocation here and the budgets registration gave its job (kept as
  // registered: a changed configuration reaches new steps only).
  uint32_t tasks = 0;
  uint64_t memory_mib = 0;
  uint32_t max_endpoints = 0;
  uint64_t unexpected_budget_bytes = 0;
};

struct JobImage {
  UuidBytes uuid{};
  uint32_t uid = 0;
  uint32_t pool_fd = 0;  // FdTable index
  uint64_t pool_bytes = 0;
  uint64_t region_bytes = 0;
  bool inbox = false;
  std::vector<uint8_t> region_states;       // 0 free, 1 owned, 2 retired
  uint64_t unexpected_budget = UINT64_MAX;  // its Slurm step's, if any
};

struct EndpointImage {
  uint32_t id = 0;
  uint64_t epid = 0;
  uint32_t job = 0;  // index into RegistryImage::jobs
  uint32_t uid = 0, gid = 0, pid = 0;
  std::string label;
  uint32_t sq_capacity = 0, cq_capacity = 0;
  uint64_t region_offset = 0, region_bytes = 0;
  uint32_t segment_fd = 0, doorbell_fd = 0;  // FdTable indices
  uint32_t liveness_fd = kNoFd;              // FdTable index, or kNoFd
  bool ready = false, attached = false;
  std::array<uint8_t, 16> token{};
  uint64_t age_ns = 0;
  std::map<uint64_t, uint32_t> slots;  // connections: peer epid -> slot
};

struct HistoryImage {
  UuidBytes uuid{};
  uint32_t uid = 0;
  std::vector<uint64_t> closed;  // counters
  uint64_t age_ns = 0;
  std::optional<StepImage> slurm;
};

struct RegistryImage {
  uint64_t default_budget = 0;
  uint32_t next_id = 1;
  std::vector<JobImage> jobs;
  std::vector<EndpointImage> endpoints;
  std::vector<std::pair<uint32_t, std::vector<uint64_t>>> closed_totals;
  std::vector<HistoryImage> histories;
  std::vector<std::pair<UuidBytes, StepImage>> steps;
};

// What the successor allows.
struct RegistryLimits {
  uint16_t node_id = 0;
  uint16_t boot_nonce = 0;
  uint32_t max_endpoints = 0;
  uint64_t max_unexpected_budget = 0;
  size_t counters = 0;  // values per counter set (proto/counters.h)
  size_t fds = 0;       // entries of the descriptor table
};

void WriteRegistryImage(StateWriter& w, const RegistryImage& image);
// Reads and checks (the header's list) a whole section; false with the
// reason in r.error().
bool ParseRegistryImage(StateReader& r, const RegistryLimits& limits,
                        RegistryImage* image);

}  // namespace psmd::handover

#endif  // PSMD_DAEMON_HANDOVER_REGISTRY_IMAGE_H_
