#include "daemon/control/registry.h"

#include <psm2.h>
#include <sys/eventfd.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>

#include <spdlog/spdlog.h>

#include "daemon/clock.h"
#include "daemon/log.h"

#include "daemon/engine/cross_copy.h"
#include "shm/epid.h"
#include "shm/layout.h"
#include "shm/segment.h"

namespace psmd {

namespace {

constexpr auto kAttachDeadline = std::chrono::seconds(5);

// An attached endpoint's record in the endpoint journal.
EndpointJournal::Entry JournalEntryOf(const Endpoint& ep) {
  EndpointJournal::Entry e;
  e.id = ep.id();
  e.epid = ep.epid();
  e.uid = ep.uid();
  e.pid = static_cast<uint32_t>(ep.pid());
  e.job = ep.job()->key().uuid;
  e.attached_unix_ns = UnixNowNs();
  return e;
}

void FillRandom(void* buf, size_t len) {
  auto* p = static_cast<uint8_t*>(buf);
  while (len > 0) {
    ssize_t n = getrandom(p, len, 0);
    if (n <= 0) continue;
    p += n;
    len -= static_cast<size_t>(n);
  }
}

uint16_t RandomNonce() {
  uint16_t v;
  FillRandom(&v, sizeof(v));
  return v;
}

}  // namespace

std::string UuidToString(const Uuid& u) {
  char buf[37];
  snprintf(
      buf, sizeof(buf),
      "%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x",
      u[0], u[1], u[2], u[3], u[4], u[5], u[6], u[7], u[8], u[9], u[10], u[11],
      u[12], u[13], u[14], u[15]);
  return buf;
}

bool InCgroup(const std::string& proc_cgroup, const std::string& step_cgroup) {
  // "ID:CONTROLLERS:" then the path; the path must start with "/".
  const size_t colon = step_cgroup.find(':');
  const size_t path_at =
      colon == std::string::npos ? colon : step_cgroup.find(':', colon + 1);
  if (path_at == std::string::npos || path_at + 1 >= step_cgroup.size() ||
      step_cgroup[path_at + 1] != '/') {
    return false;
  }
  size_t start = 0;
  while (start < proc_cgroup.size()) {
    size_t end = proc_cgroup.find('\n', start);
    if (end == std::string::npos) end = proc_cgroup.size();
    const std::string line = proc_cgroup.substr(start, end - start);
    start = end + 1;
    if (line.size() < step_cgroup.size() ||
        line.compare(0, step_cgroup.size(), step_cgroup) != 0) {
      continue;
    }
    // The step's directory itself, or one below it ("/step_0" is not
    // "/step_01").
    if (line.size() == step_cgroup.size() || line[step_cgroup.size()] == '/')
      return true;
  }
  return false;
}

void SlurmBudgets(const Config& config, SlurmStep* step) {
  step->max_endpoints = config.max_endpoints_per_job;
  const uint64_t endpoints =
      uint64_t{step->tasks} * config.slurm_endpoints_per_task;
  if (endpoints > 0 && endpoints < step->max_endpoints)
    step->max_endpoints = static_cast<uint32_t>(endpoints);
  step->unexpected_budget_bytes = config.job_unexpected_budget_bytes;
  // memory_mib is Slurm's, taken as at most 2^36 MiB (64 PiB): no
  // overflow below.
  const uint64_t share =
      (std::min<uint64_t>(step->memory_mib, uint64_t{1} << 36) << 20) *
      config.slurm_unexpected_percent / 100;
  if (share > 0 && share < step->unexpected_budget_bytes)
    step->unexpected_budget_bytes = share;
}

Registry::Registry(const Config& config, Workers* worker)
    : config_(config),
      worker_(worker),
      boot_nonce_(RandomNonce()),
      default_unexpected_budget_(config.unexpected_budget_bytes) {}

Registry::~Registry() { RemoveAll(); }

uint32_t Registry::PickShard(const Job& job) {
  const uint32_t shards = worker_->count();
  if (shards == 1) return 0;
  // The shard with the fewest endpoints of the job, then the fewest of
  // all: a big job spreads over every shard, and small jobs fill them
  // evenly (docs/design.md, "Engine shards").
  std::vector<std::pair<uint32_t, uint32_t>> load(shards);  // job's, all
  for (const auto& [id, record] : records_) {
    auto& [of_job, all] = load[MqEngine::ShardOf(id, shards)];
    of_job += record.ep->job().get() == &job;
    all++;
  }
  return static_cast<uint32_t>(std::min_element(load.begin(), load.end()) -
                               load.begin());
}

Status Registry::Open(const Credentials& who, const Uuid& uuid,
                      const std::string& label, OpenedEndpoint* out) {
  std::shared_ptr<Endpoint> ep;
  if (Status e = Reserve(who, uuid, label, out, &ep); !e.ok()) return e;
  // Not under mu_: the worker may be busy, and opens, attaches and closes
  // of every other tenant must not wait for it.
  worker_->AddEndpoint(ep);
  {
    MutexLock lock(&mu_);
    records_.at(ep->id()).ready = true;
    id_by_epid_[ep->epid()] = ep->id();
  }
  spdlog::info("opened endpoint {} epid {:#x} for pid {} uid {} job {} ({})",
               ep->id(), ep->epid(), who.pid, who.uid, UuidToString(uuid),
               ep->label());
  return {};
}

Status Registry::Reserve(const Credentials& who, const Uuid& uuid,
                         const std::string& label, OpenedEndpoint* out,
                         std::shared_ptr<Endpoint>* reserved) {
  MutexLock lock(&mu_);
  if (records_.size() >= config_.max_endpoints) {
    refusals_.Count(who.uid, refusals::k_endpoints_refused);
    return {PSM2_TOO_MANY_ENDPOINTS,
            "psmd serves its maximum of " +
                std::to_string(config_.max_endpoints) +
                " endpoints; close some or raise psmd --max-endpoints"};
  }
  if (!who.is_root() &&
      open_by_uid_[who.uid] >= config_.max_endpoints_per_uid) {
    WarnClient(who.uid,
               "uid {} (pid {}) refused an endpoint: it holds {} "
               "(--max-endpoints-per-uid)",
               who.uid, who.pid, config_.max_endpoints_per_uid);
    refusals_.Count(who.uid, refusals::k_endpoints_refused);
    return {PSM2_TOO_MANY_ENDPOINTS,
            "uid " + std::to_string(who.uid) + " holds its maximum of " +
                std::to_string(config_.max_endpoints_per_uid) +
                " open endpoints on this node; close some or raise psmd "
                "--max-endpoints-per-uid"};
  }
  if (Status e = CheckSlurmStep(who, uuid); !e.ok()) return e;
  JobKey key{uuid, who.uid};
  // CheckSlurmStep passed: a registration of the key is who's step's.
  auto step = slurm_steps_.find(uuid);
  if (step != slurm_steps_.end()) {
    auto open = jobs_.find(key);
    const uint32_t held = open == jobs_.end() ? 0 : open->second->endpoints;
    const SlurmStep& s = step->second;
    if (held >= s.max_endpoints) {
      WarnClient(who.uid,
                 "uid {} (pid {}) refused an endpoint: Slurm step {}.{} holds "
                 "its maximum of {} on this node",
                 who.uid, who.pid, s.job_id, s.step_id, s.max_endpoints);
      refusals_.Count(who.uid, refusals::k_endpoints_refused);
      return {PSM2_TOO_MANY_ENDPOINTS,
              "Slurm job " + std::to_string(s.job_id) + " step " +
                  std::to_string(s.step_id) + " holds its maximum of " +
                  std::to_string(s.max_endpoints) +
                  " open endpoints on this node (" + std::to_string(s.tasks) +
                  " tasks here, " +
                  std::to_string(config_.slurm_endpoints_per_task) +
                  " per task: psmd's slurm_endpoints_per_task); close one, "
                  "or run the step with more tasks here"};
    }
  }
  std::string error;
  std::shared_ptr<Job>& job = jobs_[key];
  if (!job) {
    // With the fabric, one region more: the inbox of payloads from other
    // nodes (daemon/remote/remote.h).
    const bool inbox = !config_.fabric_listen.empty();
    uint64_t pool_bytes =
        uint64_t{config_.max_endpoints_per_job + (inbox ? 1 : 0)} *
        config_.region_bytes;
    shm::Mapping pool;
    if (!shm::Mapping::Create("psmd-pool", pool_bytes, who.uid, who.gid, &pool,
                              &error)) {
      jobs_.erase(key);
      return {PSM2_NO_MEMORY, "cannot create the job's payload pool: " + error};
    }
    std::shared_ptr<UidAccount> account = uid_accounts_[who.uid].lock();
    if (!account) {
      account = std::make_shared<UidAccount>();
      uid_accounts_[who.uid] = account;
    }
    job = std::make_shared<Job>(
        key, std::move(pool), config_.max_endpoints_per_job,
        config_.region_bytes, std::move(account), inbox);
    if (step != slurm_steps_.end())
      job->set_unexpected_budget(step->second.unexpected_budget_bytes);
  }
  auto region = job->TakeRegion();
  if (!region) {
    if (job->endpoints == 0) jobs_.erase(key);
    refusals_.Count(who.uid, refusals::k_endpoints_refused);
    return {PSM2_TOO_MANY_ENDPOINTS,
            "job " + UuidToString(uuid) + " has opened its maximum of " +
                std::to_string(config_.max_endpoints_per_job) +
                " endpoints on this node; raise psmd --max-endpoints-per-job"};
  }

  Endpoint::Identity identity;
  // Its shard is in its id (MqEngine::ShardOf): ids of other shards are
  // skipped, never reused.
  const uint32_t shard = PickShard(*job);
  identity.id = next_id_;
  while (MqEngine::ShardOf(identity.id, worker_->count()) != shard) {
    identity.id++;
  }
  next_id_ = identity.id + 1;
  identity.epid = shm::MakeEpid(config_.node_id, boot_nonce_, identity.id);
  identity.job = job;
  identity.uid = who.uid;
  identity.gid = who.gid;
  identity.pid = who.pid;
  // Escaped once here: the label is logged and shown by psmctl.
  identity.label = Escaped(label.substr(0, 64));
  identity.region = *region;
  identity.geometry =
      shm::ComputeGeometry(config_.sq_capacity, config_.cq_capacity);
  auto fail = [&](const std::string& what) PSMD_REQUIRES(mu_) {
    job->RetireRegion(*region);
    if (job->endpoints == 0) jobs_.erase(key);
    return Status{PSM2_NO_MEMORY, what};
  };
  if (!shm::Mapping::Create("psmd-endpoint", identity.geometry.bytes, who.uid,
                            who.gid, &identity.segment, &error)) {
    return fail("cannot create the endpoint segment: " + error);
  }
  identity.doorbell_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (identity.doorbell_fd < 0)
    return fail(std::string("eventfd: ") + strerror(errno));

  // The header is written once, before anyone else can map the segment.
  shm::SegmentParams params;
  params.endpoint_id = identity.id;
  params.epid = identity.epid;
  params.geometry = identity.geometry;
  params.pool_bytes = job->pool().size();
  params.region_offset = identity.region.offset;
  params.region_bytes = identity.region.bytes;
  params.unexpected_budget = default_unexpected_budget_;
  params.max_unexpected_budget = config_.max_unexpected_budget_bytes;
  shm::WriteSegmentHeader(identity.segment.base(), params);
  auto ep = std::make_shared<Endpoint>(std::move(identity),
                                       default_unexpected_budget_);

  job->endpoints++;
  open_by_uid_[who.uid]++;
  Record rec;
  rec.ep = ep;
  FillRandom(rec.token.data(), rec.token.size());
  rec.opened = std::chrono::steady_clock::now();
  out->id = ep->id();
  out->epid = ep->epid();
  out->token = rec.token;
  out->segment_bytes = ep->geometry().bytes;
  out->pool_bytes = job->pool().size();
  records_.emplace(ep->id(), std::move(rec));
  *reserved = ep;
  return {};
}

Status Registry::Attach(const AttachToken& token, const Credentials& who,
                        int liveness_fd, int fds[shm::kAttachFdCount],
                        uint32_t* endpoint_id) {
  MutexLock lock(&mu_);
  for (auto& [id, rec] : records_) {
    if (!rec.ready || rec.attached || rec.token != token) continue;
    // The token is a capability, but only for the process that opened it.
    if (rec.ep->uid() != who.uid || rec.ep->pid() != who.pid) {
      return {PSM2_PARAM_ERR, "attach token presented by pid " +
                                  std::to_string(who.pid) + " uid " +
                                  std::to_string(who.uid) +
                                  ", but it was issued to another process"};
    }
    rec.attached = true;
    rec.liveness_fd = liveness_fd;
    rec.ep->pidfd.store(CrossCopier::PeerPidfd(liveness_fd),
                        std::memory_order_release);
    rec.token.fill(0);
    fds[0] = rec.ep->segment().fd();
    fds[1] = rec.ep->job()->pool().fd();
    fds[2] = rec.ep->doorbell_fd();
    *endpoint_id = id;
    if (journal_ != nullptr) journal_->Record(JournalEntryOf(*rec.ep));
    return {};
  }
  return {PSM2_PARAM_ERR, "unknown or expired attach token"};
}

std::shared_ptr<Endpoint> Registry::Unlink(uint32_t id) {
  auto it = records_.find(id);
  if (it == records_.end() || !it->second.ready) return nullptr;
  std::shared_ptr<Endpoint> ep = std::move(it->second.ep);
  // Wake the client's side of the attach connection so it notices too.
  if (it->second.liveness_fd >= 0) shutdown(it->second.liveness_fd, SHUT_RDWR);
  records_.erase(it);
  if (journal_ != nullptr) journal_->Clear(id);
  id_by_epid_.erase(ep->epid());
  if (--open_by_uid_[ep->uid()] == 0) open_by_uid_.erase(ep->uid());
  Job& job = *ep->job();
  job.RetireRegion(ep->region());
  job_history_[job.key()].retiring++;
  retiring_[ep->id()] = ep;
  if (--job.endpoints == 0) jobs_.erase(job.key());
  return ep;
}

void Registry::Retire(std::shared_ptr<Endpoint> ep) {
  if (!ep) return;
  worker_->RemoveEndpoint(ep->id());
  {
    // Counters are final now that the worker has dropped the endpoint. They
    // move from retiring_ to the totals under one lock: Stats counts them
    // once, before and after.
    counters::Values last = ep->counters.Values();
    MutexLock lock(&mu_);
    counters::Accumulate(last, &closed_totals_[ep->uid()]);
    const JobKey& key = ep->job()->key();
    JobHistory& history = job_history_[key];
    counters::Accumulate(last, &history.closed);
    history.retiring--;
    history.last_closed = std::chrono::steady_clock::now();
    retiring_.erase(ep->id());
    if (history.retiring == 0 && jobs_.count(key) == 0)
      ForgetFinishedJobs(history.last_closed);
  }
  spdlog::info(
      "closed endpoint {} epid {:#x} (pid {}): sent {} msgs, received {} msgs",
      ep->id(), ep->epid(), ep->pid(), ep->counters.msgs_sent.Get(),
      ep->counters.msgs_received.Get());
  // Last reference: the segment is unmapped and its memfd closed here, and the
  // pool too once the job's last endpoint is gone.
}

Status Registry::FindControllable(const Credentials& who, EndpointName name,
                                  Record** out) {
  const uint32_t id = name.id;
  // Before the lookup: whatever has this id now, it is not the caller's
  // endpoint, which ended with the psmd that opened it. Says nothing of
  // anyone's endpoints here.
  if (name.epid != 0 && (shm::NodeIdOf(name.epid) != config_.node_id ||
                         shm::BootNonceOf(name.epid) != boot_nonce_)) {
    char text[240];
    snprintf(text, sizeof(text),
             "endpoint %u (epid %#llx, boot nonce %#x) was opened by a psmd "
             "that has ended; this psmd (boot nonce %#x) started since on "
             "the same socket and knows nothing of it: open a new endpoint",
             id, static_cast<unsigned long long>(name.epid),
             shm::BootNonceOf(name.epid), boot_nonce_);
    return {PSM2_EP_WAS_CLOSED, text};
  }
  auto it = records_.find(id);
  // Another uid's endpoint gets the answer a missing one gets: the caller
  // may not learn that it exists, nor whose it is (psmctl endpoints hides it).
  if (it == records_.end() || !it->second.ready ||
      !MayControl(who, *it->second.ep)) {
    return {PSM2_PARAM_ERR,
            "no endpoint " + std::to_string(id) +
                " of yours (already closed? only its uid or root may close "
                "it or connect from it)"};
  }
  *out = &it->second;
  return {};
}

Status Registry::Close(const Credentials& who, EndpointName name) {
  std::shared_ptr<Endpoint> ep;
  {
    MutexLock lock(&mu_);
    Record* found = nullptr;
    if (Status e = FindControllable(who, name, &found); !e.ok()) return e;
    ep = Unlink(name.id);
  }
  Retire(std::move(ep));
  return {};
}

void Registry::ConnectionLost(uint32_t id) {
  std::shared_ptr<Endpoint> ep;
  {
    MutexLock lock(&mu_);
    auto it = records_.find(id);
    if (it != records_.end())
      it->second.liveness_fd = -1;  // the caller closes it
    ep = Unlink(id);
  }
  if (ep)
    spdlog::info("endpoint {}: client pid {} went away", ep->id(), ep->pid());
  Retire(std::move(ep));
}

Status Registry::Connect(const Credentials& who, EndpointName name,
                         const std::vector<uint64_t>& epids,
                         std::vector<ConnectOutcome>* out) {
  const uint32_t id = name.id;
  struct NewLink {
    uint32_t slot;
    PeerLink link;
  };
  std::vector<NewLink> links;
  // Epids of other nodes: asked of their daemons without mu_ held.
  std::vector<size_t> remote_index;
  std::vector<uint64_t> remote_epids;
  {
    MutexLock lock(&mu_);
    Record* found = nullptr;
    if (Status e = FindControllable(who, name, &found); !e.ok()) return e;
    Record& rec = *found;
    out->clear();
    for (uint64_t epid : epids) {
      ConnectOutcome o;
      if (shm::NodeIdOf(epid) != config_.node_id && worker_->has_fabric()) {
        remote_index.push_back(out->size());
        remote_epids.push_back(epid);
        out->push_back(o);
        continue;
      }
      auto peer_it = id_by_epid_.find(epid);
      const Endpoint* peer = peer_it == id_by_epid_.end()
                                 ? nullptr
                                 : records_.at(peer_it->second).ep.get();
      // Another uid's endpoint is answered exactly as a missing one, so
      // that no tenant can learn which epids exist on the node.
      if (peer == nullptr ||
          peer->job()->key().uid != rec.ep->job()->key().uid) {
        char hex[32];
        snprintf(hex, sizeof(hex), "%#llx",
                 static_cast<unsigned long long>(epid));
        o.error = PSM2_EPID_UNREACHABLE;
        o.message = std::string("no endpoint with epid ") + hex +
                    " of this uid on this node";
        if (shm::NodeIdOf(epid) != config_.node_id) {
          o.message += " (it names node " +
                       std::to_string(shm::NodeIdOf(epid)) +
                       ", and this psmd has no fabric: --fabric-listen)";
        }
        out->push_back(o);
        continue;
      }
      if (!(peer->job()->key() == rec.ep->job()->key())) {
        o.error = PSM2_EPID_INVALID_UUID_KEY;
        o.message = "endpoint " + std::to_string(peer->id()) +
                    " belongs to another job of this uid (a different job "
                    "uuid); endpoints of different jobs never connect";
        out->push_back(o);
        continue;
      }
      // Reconnecting an epid reuses its slot (and re-arms it after a
      // disconnect).
      auto slot_it =
          rec.slot_by_epid
              .try_emplace(epid, static_cast<uint32_t>(rec.slot_by_epid.size()))
              .first;
      o.slot = slot_it->second;
      links.push_back({o.slot, PeerLink{peer->id(), peer->epid()}});
      out->push_back(o);
    }
  }
  if (!remote_epids.empty()) {
    std::vector<ProgressWorker::RemoteOutcome> answers =
        worker_->QueryRemote(id, remote_epids);
    MutexLock lock(&mu_);
    Record* found = nullptr;
    if (Status e = FindControllable(who, name, &found); !e.ok()) return e;
    for (size_t i = 0; i < remote_epids.size(); i++) {
      ConnectOutcome& o = (*out)[remote_index[i]];
      o.error = answers[i].error;
      o.message = answers[i].message;
      o.host = answers[i].host;
      if (o.error != PSM2_OK) continue;
      auto slot_it =
          found->slot_by_epid
              .try_emplace(remote_epids[i],
                           static_cast<uint32_t>(found->slot_by_epid.size()))
              .first;
      o.slot = slot_it->second;
      links.push_back({o.slot, PeerLink{kRemotePeer, remote_epids[i]}});
    }
  }
  for (const NewLink& l : links) worker_->SetPeer(id, l.slot, l.link);
  return {};
}

Status Registry::Disconnect(const Credentials& who, EndpointName name,
                            const std::vector<uint32_t>& slots,
                            std::vector<int>* errors) {
  const uint32_t id = name.id;
  std::vector<uint32_t> cleared;
  {
    MutexLock lock(&mu_);
    Record* found = nullptr;
    if (Status e = FindControllable(who, name, &found); !e.ok()) return e;
    Record& rec = *found;
    errors->clear();
    for (uint32_t slot : slots) {
      bool found = false;
      for (auto s = rec.slot_by_epid.begin(); s != rec.slot_by_epid.end();
           ++s) {
        if (s->second == slot) {
          found = true;
          break;
        }
      }
      // The slot number stays reserved for its epid, so a reconnect reuses it
      // and a stale descriptor can never reach a different peer.
      errors->push_back(found ? PSM2_OK : PSM2_EPID_UNKNOWN);
      if (found) cleared.push_back(slot);
    }
  }
  for (uint32_t slot : cleared) worker_->ClearPeer(id, slot);
  return {};
}

std::vector<EndpointSnapshot> Registry::Snapshot(const Credentials& who) {
  MutexLock lock(&mu_);
  return SnapshotLocked(who);
}

std::vector<EndpointSnapshot> Registry::SnapshotLocked(const Credentials& who) {
  std::vector<EndpointSnapshot> out;
  for (auto& [id, rec] : records_) {
    const Endpoint& ep = *rec.ep;
    if (!MayControl(who, ep)) continue;
    EndpointSnapshot s;
    s.id = ep.id();
    s.epid = ep.epid();
    s.uuid = ep.job()->key().uuid;
    s.pid = ep.pid();
    s.uid = ep.uid();
    s.gid = ep.gid();
    s.label = ep.label();
    s.connections = static_cast<uint32_t>(rec.slot_by_epid.size());
    s.counters = ep.counters.Values();
    out.push_back(std::move(s));
  }
  std::sort(out.begin(), out.end(),
            [](const EndpointSnapshot& a, const EndpointSnapshot& b) {
              return a.id < b.id;
            });
  return out;
}

StatsSnapshot Registry::Stats(const Credentials& who,
                              std::chrono::steady_clock::time_point now) {
  MutexLock lock(&mu_);
  ForgetFinishedJobs(now);
  StatsSnapshot out;
  out.endpoints = SnapshotLocked(who);
  std::map<JobKey, JobTotals> jobs;
  auto count = [&](const JobKey& key, const counters::Values& values) {
    JobTotals& j = jobs[key];
    j.open_endpoints++;
    counters::Accumulate(values, &j.counters);
    counters::Accumulate(values, &out.total);
  };
  for (const EndpointSnapshot& s : out.endpoints) {
    count({s.uuid, s.uid}, s.counters);
  }
  for (const auto& [id, ep] : retiring_) {
    if (MayControl(who, *ep)) count(ep->job()->key(), ep->counters.Values());
  }
  for (const auto& [key, history] : job_history_) {
    if (!who.is_root() && who.uid != key.uid) continue;
    JobTotals& j = jobs[key];
    counters::Accumulate(history.closed, &j.counters);
    // (`now` was read before the lock: a close since is "just now".)
    if (j.open_endpoints == 0) {
      j.finished_age =
          std::max(std::chrono::nanoseconds(0),
                   std::chrono::nanoseconds(now - history.last_closed));
    }
  }
  for (auto& [key, j] : jobs) {
    j.key = key;
    j.slurm = SlurmStepOf(key);
    out.jobs.push_back(j);
  }
  for (const auto& [uid, t] : closed_totals_) {
    if (who.is_root() || who.uid == uid) counters::Accumulate(t, &out.total);
  }
  return out;
}

void Registry::ForgetFinishedJobs(std::chrono::steady_clock::time_point now) {
  // Finished: no endpoint open (jobs_) nor closing (retiring).
  std::map<uid_t, std::vector<std::map<JobKey, JobHistory>::iterator>> by_uid;
  for (auto it = job_history_.begin(); it != job_history_.end(); ++it) {
    if (it->second.retiring > 0 || jobs_.count(it->first) > 0) continue;
    by_uid[it->first.uid].push_back(it);
  }
  for (auto& [uid, finished] : by_uid) {
    // Newest first: those past the count or the age go.
    std::sort(finished.begin(), finished.end(), [](auto a, auto b) {
      return a->second.last_closed > b->second.last_closed;
    });
    for (size_t i = 0; i < finished.size(); i++) {
      if (i >= kMaxFinishedJobsPerUid ||
          now - finished[i]->second.last_closed > kFinishedJobRetention) {
        job_history_.erase(finished[i]);
      }
    }
  }
}

Status Registry::CheckSlurmStep(const Credentials& who, const Uuid& uuid) {
  auto it = slurm_steps_.find(uuid);
  if (it == slurm_steps_.end()) return {};  // no Slurm: as before
  const SlurmStep& step = it->second;
  std::string why;
  if (who.uid != step.uid) {
    why = "it is of uid " + std::to_string(who.uid) + ", the step's is uid " +
          std::to_string(step.uid);
  } else if (who.cgroup.empty()) {
    why = "psmd could not read its cgroup (/proc/" + std::to_string(who.pid) +
          "/cgroup)";
  } else if (!InCgroup(who.cgroup, step.cgroup)) {
    why = "it is not inside the step's cgroup " + step.cgroup;
  }
  if (why.empty()) return {};
  WarnClient(who.uid,
             "pid {} uid {} refused an endpoint of job key {}: Slurm step "
             "{}.{}'s, and {}",
             who.pid, who.uid, UuidToString(uuid), step.job_id, step.step_id,
             why);
  return {PSM2_EPID_INVALID_UUID_KEY,
          "job key " + UuidToString(uuid) + " belongs to Slurm job " +
              std::to_string(step.job_id) + " step " +
              std::to_string(step.step_id) + " on this node; pid " +
              std::to_string(who.pid) + " may not use it: " + why};
}

std::optional<SlurmStep> Registry::SlurmStepOf(const JobKey& key) {
  auto it = slurm_steps_.find(key.uuid);
  if (it != slurm_steps_.end() && it->second.uid == key.uid) return it->second;
  auto h = job_history_.find(key);
  if (h != job_history_.end()) return h->second.slurm;
  return std::nullopt;
}

Status Registry::RegisterSlurmStep(const Credentials& who, const Uuid& uuid,
                                   const SlurmStep& step) {
  if (!who.is_root()) {
    return {PSM2_PARAM_ERR,
            "only root registers Slurm steps (psmd's SPANK plugin); pid " +
                std::to_string(who.pid) + " is uid " + std::to_string(who.uid)};
  }
  if (!InCgroup(step.cgroup, step.cgroup)) {
    return {PSM2_PARAM_ERR,
            "not a cgroup line (ID:CONTROLLERS:/path): '" + step.cgroup + "'"};
  }
  SlurmStep budgeted = step;
  SlurmBudgets(config_, &budgeted);
  MutexLock lock(&mu_);
  auto [it, added] = slurm_steps_.try_emplace(uuid, budgeted);
  if (!added && !(it->second == step)) {
    return {PSM2_PARAM_ERR, "job key " + UuidToString(uuid) +
                                " is already Slurm job " +
                                std::to_string(it->second.job_id) + " step " +
                                std::to_string(it->second.step_id) + "'s"};
  }
  if (added) {
    spdlog::info(
        "Slurm job {} step {} (uid {}, cgroup {}) registered job key {}: {} "
        "tasks and {} MiB here, so at most {} endpoints and {} bytes of "
        "unexpected messages",
        step.job_id, step.step_id, step.uid, step.cgroup, UuidToString(uuid),
        step.tasks, step.memory_mib, budgeted.max_endpoints,
        budgeted.unexpected_budget_bytes);
    // A job of the key already open here (its endpoints opened before the
    // registration) keeps the budgets it was opened with.
  }
  return {};
}

Status Registry::EndSlurmStep(const Credentials& who, uint32_t job_id,
                              uint32_t step_id, bool* registered,
                              std::vector<EndpointSnapshot>* closed) {
  if (!who.is_root()) {
    return {PSM2_PARAM_ERR,
            "only root ends Slurm steps (psmd's SPANK plugin); pid " +
                std::to_string(who.pid) + " is uid " + std::to_string(who.uid)};
  }
  std::vector<std::shared_ptr<Endpoint>> left;
  std::vector<EndpointSnapshot> snapshots;
  *registered = false;
  {
    MutexLock lock(&mu_);
    auto step_it = slurm_steps_.begin();
    for (; step_it != slurm_steps_.end(); ++step_it) {
      if (step_it->second.job_id == job_id &&
          step_it->second.step_id == step_id)
        break;
    }
    if (step_it == slurm_steps_.end()) return {};
    *registered = true;
    const Uuid uuid = step_it->first;
    const SlurmStep step = step_it->second;
    slurm_steps_.erase(step_it);
    std::vector<uint32_t> ids;
    for (const EndpointSnapshot& s : SnapshotLocked(who)) {
      if (s.uuid == uuid && records_.at(s.id).ready) {
        ids.push_back(s.id);
        snapshots.push_back(s);
      }
    }
    for (uint32_t id : ids) {
      std::shared_ptr<Endpoint> ep = Unlink(id);
      if (ep) left.push_back(std::move(ep));
    }
    // Its totals keep naming the step after it ended.
    auto h = job_history_.find(JobKey{uuid, step.uid});
    if (h != job_history_.end()) h->second.slurm = step;
    for (const EndpointSnapshot& s : snapshots) {
      spdlog::warn(
          "Slurm job {} step {} ended; closing endpoint {} it left (pid {} uid "
          "{}, {})",
          job_id, step_id, s.id, s.pid, s.uid, s.label);
    }
    spdlog::info("Slurm job {} step {} ended: {} endpoints left, closed",
                 job_id, step_id, snapshots.size());
  }
  for (auto& ep : left) Retire(std::move(ep));
  if (closed != nullptr) *closed = std::move(snapshots);
  return {};
}

std::vector<JobSnapshot> Registry::Jobs(const Credentials& who) {
  MutexLock lock(&mu_);
  std::map<JobKey, JobSnapshot> jobs;  // ordered: a stable listing
  for (const auto& [id, rec] : records_) {
    const Endpoint& ep = *rec.ep;
    if (!MayControl(who, ep)) continue;
    JobSnapshot& j = jobs[ep.job()->key()];
    j.uuid = ep.job()->key().uuid;
    j.uid = ep.uid();
    j.pool_bytes = ep.job()->pool().size();
    j.unexpected_budget_bytes = default_unexpected_budget_;
    j.endpoint_ids.push_back(ep.id());
    j.slurm = SlurmStepOf(ep.job()->key());
    j.max_endpoints = config_.max_endpoints_per_job;
    j.job_unexpected_budget_bytes = std::min(
        config_.job_unexpected_budget_bytes, ep.job()->unexpected_budget());
    auto step = slurm_steps_.find(ep.job()->key().uuid);
    if (step != slurm_steps_.end() && step->second.uid == ep.uid())
      j.max_endpoints = step->second.max_endpoints;
  }
  // A registered step without endpoints is listed too: psmd holds its
  // registration (before its tasks open, or after they closed until its
  // step's end is told), and an epilog asks whether anything of a job is
  // left (psmctl jobs --check-ended).
  for (const auto& [uuid, step] : slurm_steps_) {
    if (!who.is_root() && who.uid != step.uid) continue;
    JobSnapshot& j = jobs[JobKey{uuid, step.uid}];
    if (j.slurm) continue;  // it has endpoints: listed above
    j.uuid = uuid;
    j.uid = step.uid;
    j.unexpected_budget_bytes = default_unexpected_budget_;
    j.slurm = step;
    j.max_endpoints = step.max_endpoints;
    j.job_unexpected_budget_bytes = step.unexpected_budget_bytes;
  }
  std::vector<JobSnapshot> out;
  for (auto& [key, j] : jobs) {
    std::sort(j.endpoint_ids.begin(), j.endpoint_ids.end());
    out.push_back(std::move(j));
  }
  return out;
}

size_t Registry::endpoint_count() {
  MutexLock lock(&mu_);
  return records_.size();
}

void Registry::SetDefaultUnexpectedBudget(uint64_t bytes) {
  MutexLock lock(&mu_);
  default_unexpected_budget_ = bytes;
}

void Registry::ExpireUnattached() {
  std::vector<std::shared_ptr<Endpoint>> expired;
  {
    MutexLock lock(&mu_);
    auto now = std::chrono::steady_clock::now();
    std::vector<uint32_t> ids;
    for (auto& [id, rec] : records_) {
      if (!rec.attached && now - rec.opened > kAttachDeadline)
        ids.push_back(id);
    }
    for (uint32_t id : ids) {
      const Endpoint& ep = *records_.at(id).ep;
      WarnClient(ep.uid(),
                 "endpoint {}: pid {} uid {} never attached its segments; "
                 "reclaiming it",
                 id, ep.pid(), ep.uid());
      expired.push_back(Unlink(id));
    }
  }
  for (auto& ep : expired) Retire(std::move(ep));
}

void Registry::SetJournal(EndpointJournal* journal) {
  MutexLock lock(&mu_);
  journal_ = journal;
  for (const auto& [id, rec] : records_) {
    if (rec.attached) journal_->Record(JournalEntryOf(*rec.ep));
  }
}

void Registry::RemoveAll() {
  std::vector<std::shared_ptr<Endpoint>> all;
  {
    MutexLock lock(&mu_);
    std::vector<uint32_t> ids;
    for (auto& [id, rec] : records_) ids.push_back(id);
    for (uint32_t id : ids) all.push_back(Unlink(id));
  }
  for (auto& ep : all) Retire(std::move(ep));
}

}  // namespace psmd
