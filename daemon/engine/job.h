// A job on this node: the endpoints opened with one job uuid by one uid, and
// the payload pool they share.
//
// Thread-safety: identity and the pool mapping are immutable after creation.
// Region bookkeeping is guarded by the Registry's mutex.
#ifndef PSMD_DAEMON_ENGINE_JOB_H_
#define PSMD_DAEMON_ENGINE_JOB_H_

#include <sys/types.h>

#include <array>
#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "daemon/engine/validate.h"
#include "shm/mapping.h"

namespace psmd {

using Uuid = std::array<uint8_t, 16>;

std::string UuidToString(const Uuid& uuid);

struct JobKey {
  Uuid uuid;
  uid_t uid;
  bool operator<(const JobKey& o) const {
    return uuid != o.uuid ? uuid < o.uuid : uid < o.uid;
  }
  bool operator==(const JobKey& o) const {
    return uuid == o.uuid && uid == o.uid;
  }
};

// What all jobs of one uid hold together (a uid can open any number of job
// uuids). Charged by the engine shards where the messages and receives land
// (relaxed atomics: a job spans shards, mq_engine.h invariant 4).
struct UidAccount {
  std::atomic<uint64_t> unexpected_cost{0};  // its jobs' unexpected_cost
  std::atomic<uint64_t> posted_recvs{0};     // its jobs' posted_recvs
};

class Job {
 public:
  // `inbox`: the pool has one region more than `regions`, the daemon's own
  // (InboxRegion), where payloads from other nodes land.
  Job(JobKey key, shm::Mapping pool, uint32_t regions, uint64_t region_bytes,
      std::shared_ptr<UidAccount> account, bool inbox = false)
      : key_(key),
        pool_(std::move(pool)),
        region_bytes_(region_bytes),
        region_state_(regions),
        account_(std::move(account)),
        inbox_(inbox) {}

  const JobKey& key() const { return key_; }
  const shm::Mapping& pool() const { return pool_; }
  UidAccount& account() const { return *account_; }

  // Hands out a send region that no endpoint of this job has used yet.
  // Regions are not recycled within a job's lifetime: a receiver may still
  // hold a completion that points into a closed endpoint's region
  // (docs/design.md, "Payload pool").
  std::optional<SendRegion> TakeRegion() {
    for (size_t i = 0; i < region_state_.size(); i++) {
      if (region_state_[i] == RegionState::kFree) {
        region_state_[i] = RegionState::kOwned;
        return SendRegion{i * region_bytes_, region_bytes_};
      }
    }
    return std::nullopt;
  }
  void RetireRegion(const SendRegion& r) {
    region_state_[r.offset / region_bytes_] = RegionState::kRetired;
  }
  // The region after the endpoints' ones, written only by the progress
  // worker (daemon/remote/receive.cc); none without the fabric.
  std::optional<SendRegion> InboxRegion() const {
    if (!inbox_) return std::nullopt;
    return SendRegion{region_state_.size() * region_bytes_, region_bytes_};
  }

  // What each region is (0 free, 1 owned, 2 retired): handed to a
  // successor psmd (daemon/handover/), which checks and restores them.
  std::vector<uint8_t> RegionStates() const {
    return {reinterpret_cast<const uint8_t*>(region_state_.data()),
            reinterpret_cast<const uint8_t*>(region_state_.data()) +
                region_state_.size()};
  }
  // False (nothing changed) unless `states` has one known value per region.
  bool RestoreRegionStates(const std::vector<uint8_t>& states) {
    if (states.size() != region_state_.size()) return false;
    for (uint8_t v : states) {
      if (v > static_cast<uint8_t>(RegionState::kRetired)) return false;
    }
    for (size_t i = 0; i < states.size(); i++) {
      region_state_[i] = static_cast<RegionState>(states[i]);
    }
    return true;
  }
  // Whether `r` is exactly region i of this job and i is owned.
  bool OwnsRegion(const SendRegion& r) const {
    if (region_bytes_ == 0 || r.bytes != region_bytes_ ||
        r.offset % region_bytes_ != 0) {
      return false;
    }
    const uint64_t i = r.offset / region_bytes_;
    return i < region_state_.size() && region_state_[i] == RegionState::kOwned;
  }
  bool has_inbox() const { return inbox_; }
  uint64_t region_bytes() const { return region_bytes_; }
  size_t regions() const { return region_state_.size(); }

  int endpoints = 0;  // live endpoints; the job ends when this drops to 0

  // Its own unexpected-message budget (a Slurm step's share of its memory,
  // Registry::RegisterSlurmStep), below the engine's budget of every job;
  // set once, before its first endpoint reaches a progress worker.
  uint64_t unexpected_budget() const { return unexpected_budget_; }
  void set_unexpected_budget(uint64_t bytes) { unexpected_budget_ = bytes; }

  // Sum of its endpoints' unexpected_cost (mq_engine.h, invariant 4), and
  // of their posted_charged (invariant 9): charged by every engine shard
  // that serves an endpoint of the job.
  std::atomic<uint64_t> unexpected_cost{0};
  std::atomic<uint64_t> posted_recvs{0};

 private:
  enum class RegionState : uint8_t { kFree, kOwned, kRetired };
  JobKey key_;
  shm::Mapping pool_;
  uint64_t region_bytes_;
  std::vector<RegionState> region_state_;
  std::shared_ptr<UidAccount> account_;  // shared by the uid's jobs
  bool inbox_;
  uint64_t unexpected_budget_ = UINT64_MAX;
};

}  // namespace psmd

#endif  // PSMD_DAEMON_ENGINE_JOB_H_
