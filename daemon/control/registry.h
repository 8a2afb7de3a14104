// The registry of jobs and endpoints: what the control plane creates,
// connects, lists and removes. It owns segment creation and the attach
// tokens; the progress worker owns the endpoints' matching state.
//
// Thread-safety: every public method may be called from any thread (gRPC
// handlers, the admission thread); state is guarded by one mutex (mu_, the
// annotations say what it guards), which is never held while waiting for
// the progress worker.
#ifndef PSMD_DAEMON_CONTROL_REGISTRY_H_
#define PSMD_DAEMON_CONTROL_REGISTRY_H_

#include <sys/types.h>

#include <array>
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "base/mutex.h"
#include "daemon/config.h"
#include "daemon/control/endpoint_journal.h"
#include "daemon/control/refusals.h"
#include "daemon/engine/endpoint.h"
#include "daemon/engine/job.h"
#include "daemon/handover/handover.h"
#include "daemon/workers.h"
#include "shm/attach.h"
#include "shm/status.h"

namespace psmd {

// Who is calling, as the kernel says (SO_PEERCRED).
struct Credentials {
  pid_t pid = 0;
  uid_t uid = 0;
  gid_t gid = 0;
  // The caller's /proc/PID/cgroup as Admission read it when the connection
  // came in (while a pidfd showed the same process alive); empty: unknown.
  std::string cgroup;
  bool is_root() const { return uid == 0; }
};

// A Slurm step as its SPANK plugin registered it (RegisterSlurmStep).
struct SlurmStep {
  uint32_t job_id = 0;
  uint32_t step_id = 0;
  uid_t uid = 0;
  // "HIERARCHY:CONTROLLERS:/path/job_J/step_S": a line of /proc/PID/cgroup
  // of one of its tasks, cut after the step's directory.
  std::string cgroup;
  // Its allocation on this node, as Slurm told the plugin: its tasks here
  // and its memory here (MiB; 0: unknown, or Slurm does not track memory).
  uint32_t tasks = 0;
  uint64_t memory_mib = 0;
  // Its job's budgets here, from those (SlurmBudgets; set by
  // RegisterSlurmStep).
  uint32_t max_endpoints = 0;
  uint64_t unexpected_budget_bytes = 0;
  bool operator==(const SlurmStep& o) const {
    return job_id == o.job_id && step_id == o.step_id && uid == o.uid &&
           cgroup == o.cgroup && tasks == o.tasks && memory_mib == o.memory_mib;
  }
};

// A Slurm step's budgets on this node from its allocation
// (docs/operations.md, "Per-step budgets"): fills step->max_endpoints,
//   min(max_endpoints_per_job, tasks * slurm_endpoints_per_task),
// or max_endpoints_per_job when either factor is 0; and
// step->unexpected_budget_bytes,
//   min(job_unexpected_budget_bytes,
//       memory_mib MiB * slurm_unexpected_percent / 100),
// or job_unexpected_budget_bytes when either factor is 0.
void SlurmBudgets(const Config& config, SlurmStep* step);

// Whether a process whose /proc/PID/cgroup reads `proc_cgroup` is inside
// `step_cgroup` (a line of that file, as SlurmStep::cgroup): one of its
// lines names the same hierarchy and the step's directory or one below it.
bool InCgroup(const std::string& proc_cgroup, const std::string& step_cgroup);

using AttachToken = std::array<uint8_t, shm::kAttachTokenBytes>;

struct OpenedEndpoint {
  uint32_t id = 0;
  uint64_t epid = 0;
  AttachToken token{};
  uint64_t segment_bytes = 0;
  uint64_t pool_bytes = 0;
  // What an endpoint opened now gets (SIGHUP may have changed it).
  uint64_t unexpected_budget_bytes = 0;
};

// How a control call names an endpoint: its id and the epid its opener was
// told. Ids start at 1 in every psmd, so an id alone from a client of an
// earlier psmd on the same socket (killed, then restarted by systemd) could
// name another job's endpoint here; the epid's boot nonce tells. psmctl
// close names an id only (epid 0: not checked).
struct EndpointName {
  // An id alone is a name too (psmctl close; tests).
  EndpointName(uint32_t id, uint64_t epid = 0)  // NOLINT(runtime/explicit)
      : id(id), epid(epid) {}
  uint32_t id;
  uint64_t epid;
};

struct ConnectOutcome {
  int error = 0;  // psm2_error_t
  uint32_t slot = 0;
  std::string message;
  std::string host;  // ConnectResult.host
};

struct EndpointSnapshot {
  uint32_t id = 0;
  uint64_t epid = 0;
  Uuid uuid{};
  pid_t pid = 0;
  uid_t uid = 0;
  gid_t gid = 0;
  std::string label;
  uint32_t connections = 0;
  counters::Values counters{};
};

// A job's counters over its life on this node, open and closed endpoints
// summed (what GetStats reports per job).
struct JobTotals {
  JobKey key{};
  // Open endpoints, and those closing whose counters are not final yet;
  // 0: the job has finished.
  uint32_t open_endpoints = 0;
  // Since its last endpoint closed, when it has finished.
  std::chrono::nanoseconds finished_age{0};
  counters::Values counters{};
  std::optional<SlurmStep> slurm;  // its key's registration, if any
};

// What GetStats answers, taken at one instant: an endpoint that closes is
// counted in exactly one of endpoints (open), its job's and the node's
// totals (closed), never in none or both, so no total ever falls.
struct StatsSnapshot {
  std::vector<EndpointSnapshot> endpoints;  // open, by id
  std::vector<JobTotals> jobs;              // by (uuid, uid)
  counters::Values total{};                 // every endpoint since start
};

// A job as psmctl lists it, with the budgets that apply to it: one with open
// endpoints, or a Slurm step registered here that has none (yet, or any
// more, until its end is told).
struct JobSnapshot {
  Uuid uuid{};
  uid_t uid = 0;
  std::vector<uint32_t> endpoint_ids;  // open endpoints, ascending
  uint64_t pool_bytes = 0;
  // What an endpoint opened now gets (SIGHUP may have changed it).
  uint64_t unexpected_budget_bytes = 0;
  // Its limits: the configuration's, or its Slurm step's (SlurmBudgets).
  uint32_t max_endpoints = 0;
  uint64_t job_unexpected_budget_bytes = 0;
  std::optional<SlurmStep> slurm;  // its key's registration, if any
};

class Registry {
 public:
  // How long, and how many per uid, finished jobs' totals are kept, so that
  // a scraper sees a job's last values before its series ends (psmctl(8),
  // "COUNTERS"). The count bounds what a tenant costs psmd by opening and
  // closing jobs at any rate: the oldest is forgotten first.
  static constexpr std::chrono::minutes kFinishedJobRetention{10};
  static constexpr size_t kMaxFinishedJobsPerUid = 64;

  Registry(const Config& config, Workers* worker);
  ~Registry();

  Status Open(const Credentials& who, const Uuid& uuid,
              const std::string& label, OpenedEndpoint* out);
  // Redeems an attach token. On success fills fds (borrowed: valid while the
  // endpoint lives; the caller sends them, it does not close them) and binds
  // the endpoint's life to `liveness_fd`.
  Status Attach(const AttachToken& token, const Credentials& who,
                int liveness_fd, int fds[shm::kAttachFdCount],
                uint32_t* endpoint_id);
  Status Close(const Credentials& who, EndpointName name);
  // The attach connection hung up: the client is gone (or closed).
  void ConnectionLost(uint32_t id);
  Status Connect(const Credentials& who, EndpointName name,
                 const std::vector<uint64_t>& epids,
                 std::vector<ConnectOutcome>* out);
  Status Disconnect(const Credentials& who, EndpointName name,
                    const std::vector<uint32_t>& slots,
                    std::vector<int>* errors);
  // Endpoints the caller may see: its own uid's, or all for root.
  std::vector<EndpointSnapshot> Snapshot(const Credentials& who);
  // Counters the caller may see (its own uid's, or all for root): per open
  // endpoint, per job and in total, closed endpoints included. A finished
  // job is reported until kFinishedJobRetention after its last endpoint
  // closed, as `now` tells (tests pass a later instant).
  StatsSnapshot Stats(const Credentials& who,
                      std::chrono::steady_clock::time_point now =
                          std::chrono::steady_clock::now());
  // Jobs the caller may see (its own uid's, or all for root), by uuid.
  std::vector<JobSnapshot> Jobs(const Credentials& who);
  const Config& config() const { return config_; }
  // Refusals by a limit, per uid (Registry's own and Admission's).
  Refusals& refusals() { return refusals_; }
  // Bits 47..32 of the epids minted by this run of psmd.
  uint16_t boot_nonce() const { return boot_nonce_; }
  size_t endpoint_count();
  // The most endpoints psmd serves at once (--max-endpoints).
  uint32_t max_endpoints() const { return config_.max_endpoints; }
  // The unexpected-message budget endpoints opened from now on get (SIGHUP
  // reload); open endpoints keep theirs.
  void SetDefaultUnexpectedBudget(uint64_t bytes);
  // Removes endpoints whose attach token was not redeemed in time.
  void ExpireUnattached();
  // Removes every endpoint (daemon shutdown).
  void RemoveAll();
  // From now on every attached endpoint has a record in `journal` (main's,
  // which outlives the registry's use of it), from its attach to its
  // removal: those attached already are recorded now (a successor's).
  void SetJournal(EndpointJournal* journal);

  // ---- Handover (issue 33; daemon/handover/handover.h) ----
  // Writes every job and endpoint (the descriptors each needs into `fds`),
  // the Slurm registrations and the totals stats keep. Called with the
  // admission thread and gRPC stopped and the workers frozen, when nothing
  // else reaches the registry.
  Status SaveState(handover::StateWriter& w, handover::FdTable& fds);
  // In a successor, before admission starts, with the workers started and
  // frozen: reads and checks all of what SaveState wrote first, and only
  // then builds the jobs and endpoints and adds each endpoint to its worker
  // (a refusal leaves the registry empty and takes no descriptor). Fills
  // *liveness with each attached endpoint's connection and id, for
  // Admission::Adopt: -1 for a connection the service manager did not give
  // back (it hung up: the caller then removes the endpoint, ConnectionLost).
  Status LoadState(handover::StateReader& r, handover::FdTable& fds,
                   uint16_t boot_nonce,
                   std::vector<std::pair<int, uint32_t>>* liveness);
  // Tells every attached client `reason` on its attach connection (its
  // library prints it as it reports the lost psmd), then RemoveAll.
  void EndAll(const std::string& reason);

  // Slurm's SPANK plugin, root only (who.is_root()). Registers `step` as the
  // owner of job key `uuid`: from now on only processes of step.uid inside
  // step.cgroup may open endpoints with that key (Open refuses others,
  // naming why), and its job gets the budgets SlurmBudgets gives step (Open
  // refuses an endpoint beyond step.max_endpoints, naming the step's
  // tasks; the engine holds senders beyond its unexpected budget). The
  // same registration again is a no-op; another step's for a registered
  // key is refused.
  Status RegisterSlurmStep(const Credentials& who, const Uuid& uuid,
                           const SlurmStep& step);
  // Root only: the step ended. Closes every endpoint still open with its
  // key (any uid), forgets the registration and fills `closed` (if not
  // null) with what it closed. *registered tells whether the step was
  // registered here (a step whose tasks never started on this node was not).
  Status EndSlurmStep(const Credentials& who, uint32_t job_id, uint32_t step_id,
                      bool* registered, std::vector<EndpointSnapshot>* closed);

 private:
  struct Record {
    std::shared_ptr<Endpoint> ep;
    AttachToken token{};
    bool attached = false;
    // False until the progress worker serves the endpoint: Open adds it
    // there without mu_ held, and until then nobody may attach, connect
    // to, or close it (a close would reach the worker before the add).
    bool ready = false;
    std::chrono::steady_clock::time_point opened;
    int liveness_fd = -1;
    std::map<uint64_t, uint32_t>
        slot_by_epid;  // connections made by this endpoint
  };

  // Open's first half, under mu_ (it takes it): checks quotas, creates the
  // segment and the record (not ready yet).
  Status Reserve(const Credentials& who, const Uuid& uuid,
                 const std::string& label, OpenedEndpoint* out,
                 std::shared_ptr<Endpoint>* reserved) PSMD_EXCLUDES(mu_);
  // The engine shard a new endpoint of `job` goes to (mu_ held).
  uint32_t PickShard(const Job& job) PSMD_REQUIRES(mu_);
  // Takes the endpoint out of every table (mu_ held); the caller then removes
  // it from the worker without the lock.
  std::shared_ptr<Endpoint> Unlink(uint32_t id) PSMD_REQUIRES(mu_);
  void Retire(std::shared_ptr<Endpoint> ep) PSMD_EXCLUDES(mu_);
  // The record of the endpoint `name` if `who` may act on it (mu_ held);
  // PSM2_EP_WAS_CLOSED if name.epid is of an earlier psmd.
  Status FindControllable(const Credentials& who, EndpointName name,
                          Record** out) PSMD_REQUIRES(mu_);
  std::vector<EndpointSnapshot> SnapshotLocked(const Credentials& who)
      PSMD_REQUIRES(mu_);
  // Drops the histories of finished jobs beyond the retention: older than
  // it, or more than kMaxFinishedJobsPerUid of one uid (oldest first).
  void ForgetFinishedJobs(std::chrono::steady_clock::time_point now)
      PSMD_REQUIRES(mu_);
  bool MayControl(const Credentials& who, const Endpoint& ep) const {
    return who.is_root() || who.uid == ep.uid();
  }
  // Refuses `who` a key that a Slurm step registered, unless it is of the
  // step's uid and inside its cgroup (mu_ held).
  Status CheckSlurmStep(const Credentials& who, const Uuid& uuid)
      PSMD_REQUIRES(mu_);
  // The registration of `key`'s uuid, if it is for key's uid (mu_ held).
  std::optional<SlurmStep> SlurmStepOf(const JobKey& key) PSMD_REQUIRES(mu_);

  Refusals refusals_;
  // As started; the default unexpected budget changes (SIGHUP), so it is
  // default_unexpected_budget_ that counts.
  const Config config_;
  Workers* const worker_;
  // Drawn at start, or the old psmd's after a handover (LoadState, before
  // any other thread runs).
  uint16_t boot_nonce_;

  Mutex mu_;
  uint64_t default_unexpected_budget_ PSMD_GUARDED_BY(mu_);
  uint32_t next_id_ PSMD_GUARDED_BY(mu_) = 1;
  std::unordered_map<uint32_t, Record> records_ PSMD_GUARDED_BY(mu_);
  EndpointJournal* journal_ PSMD_GUARDED_BY(mu_) = nullptr;
  // Open endpoints per owner uid.
  std::unordered_map<uid_t, uint32_t> open_by_uid_ PSMD_GUARDED_BY(mu_);
  // Each uid's account, shared by its jobs while any lives.
  std::unordered_map<uid_t, std::weak_ptr<UidAccount>> uid_accounts_
      PSMD_GUARDED_BY(mu_);
  std::unordered_map<uint64_t, uint32_t> id_by_epid_ PSMD_GUARDED_BY(mu_);
  std::map<JobKey, std::shared_ptr<Job>> jobs_ PSMD_GUARDED_BY(mu_);
  // Closed endpoints' counters by owner uid, for the whole run.
  std::map<uid_t, counters::Values> closed_totals_ PSMD_GUARDED_BY(mu_);
  // Endpoints Unlink took out of records_ whose Retire has not finished:
  // the worker may still count for them, and stats still show them.
  std::unordered_map<uint32_t, std::shared_ptr<Endpoint>> retiring_
      PSMD_GUARDED_BY(mu_);
  // What a job's totals keep of its closed endpoints, from its first close
  // until ForgetFinishedJobs drops it.
  struct JobHistory {
    counters::Values closed{};
    uint32_t retiring = 0;  // its endpoints in retiring_
    std::chrono::steady_clock::time_point last_closed{};
    // Its Slurm step's registration, kept past the step's end.
    std::optional<SlurmStep> slurm;
  };
  std::map<JobKey, JobHistory> job_history_ PSMD_GUARDED_BY(mu_);
  // Job keys registered by Slurm's SPANK plugin, until their step ends.
  std::map<Uuid, SlurmStep> slurm_steps_ PSMD_GUARDED_BY(mu_);
};

}  // namespace psmd

#endif  // PSMD_DAEMON_CONTROL_REGISTRY_H_
