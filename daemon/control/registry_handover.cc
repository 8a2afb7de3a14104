// The registry's part of a handover (issue 33; daemon/handover/handover.h):
// jobs, endpoints' identities and the descriptors behind them, Slurm
// registrations, and the totals stats keep. What an endpoint's engine holds
// (queues, transfers, counters) is the engine's section.
#include <sys/socket.h>
#include <unistd.h>

#include <set>

#include <spdlog/spdlog.h>

#include "daemon/control/registry.h"
#include "daemon/engine/cross_copy.h"
#include "shm/epid.h"
#include "shm/layout.h"

namespace psmd {

namespace {

using handover::FdTable;
using handover::StateReader;
using handover::StateWriter;

constexpr uint32_t kNoFd = UINT32_MAX;
// Bounds on what a state may claim, checked before anything is built.
constexpr uint32_t kMaxRegions = 1u << 16;
constexpr uint32_t kMaxSlots = 1u << 20;
constexpr size_t kMaxLabel = 64 * 4;  // Escaped() at most quadruples
constexpr size_t kMaxCgroup = 4096;

void WriteUuid(StateWriter& w, const Uuid& u) {
  for (uint8_t b : u) w.U8(b);
}
bool ReadUuid(StateReader& r, Uuid* u) {
  for (auto& b : *u) {
    if (!r.U8(&b, "job uuid")) return false;
  }
  return true;
}

void WriteValues(StateWriter& w, const counters::Values& v) {
  w.U32(static_cast<uint32_t>(v.size()));
  for (uint64_t x : v) w.U64(x);
}
bool ReadValues(StateReader& r, counters::Values* v) {
  uint32_t n = 0;
  if (!r.Count(&n, 8, 4096, "counter count")) return false;
  if (n != v->size()) {
    return r.Fail("counter count", std::to_string(n) + " where this psmd has " +
                                       std::to_string(v->size()));
  }
  for (auto& x : *v) {
    if (!r.U64(&x, "counter")) return false;
  }
  return true;
}

void WriteStep(StateWriter& w, const std::optional<SlurmStep>& s) {
  w.Bool(s.has_value());
  if (!s) return;
  w.U32(s->job_id);
  w.U32(s->step_id);
  w.U32(s->uid);
  w.Str(s->cgroup);
}
bool ReadStep(StateReader& r, std::optional<SlurmStep>* s) {
  bool has = false;
  if (!r.Bool(&has, "slurm step")) return false;
  if (!has) {
    s->reset();
    return true;
  }
  SlurmStep step;
  uint32_t uid = 0;
  if (!r.U32(&step.job_id, "slurm job id") ||
      !r.U32(&step.step_id, "slurm step id") || !r.U32(&uid, "slurm uid") ||
      !r.Str(&step.cgroup, kMaxCgroup, "slurm cgroup")) {
    return false;
  }
  step.uid = uid;
  *s = step;
  return true;
}

uint64_t AgeNs(std::chrono::steady_clock::time_point t,
               std::chrono::steady_clock::time_point now) {
  return now > t ? static_cast<uint64_t>(
                       std::chrono::nanoseconds(now - t).count())
                 : 0;
}

}  // namespace

Status Registry::SaveState(StateWriter& w, FdTable& fds) {
  MutexLock lock(&mu_);
  if (!retiring_.empty()) {
    return {PSM2_INTERNAL_ERR, std::to_string(retiring_.size()) +
                                   " endpoints are still closing; try again"};
  }
  const auto now = std::chrono::steady_clock::now();
  w.U64(default_unexpected_budget_);
  w.U32(next_id_);
  // Jobs, by index: endpoints name theirs by it.
  std::map<const Job*, uint32_t> job_index;
  w.U32(static_cast<uint32_t>(jobs_.size()));
  for (const auto& [key, job] : jobs_) {
    job_index[job.get()] = static_cast<uint32_t>(job_index.size());
    WriteUuid(w, key.uuid);
    w.U32(key.uid);
    w.U32(fds.Add(job->pool().fd()));
    w.U64(job->pool().size());
    w.U64(job->region_bytes());
    w.Bool(job->has_inbox());
    const std::vector<uint8_t> states = job->RegionStates();
    w.U32(static_cast<uint32_t>(states.size()));
    for (uint8_t s : states) w.U8(s);
  }
  w.U32(static_cast<uint32_t>(records_.size()));
  for (const auto& [id, rec] : records_) {
    const Endpoint& ep = *rec.ep;
    w.U32(id);
    w.U64(ep.epid());
    w.U32(job_index.at(ep.job().get()));
    w.U32(ep.uid());
    w.U32(ep.gid());
    w.U32(static_cast<uint32_t>(ep.pid()));
    w.Str(ep.label());
    w.U32(ep.geometry().sq_capacity);
    w.U32(ep.geometry().cq_capacity);
    w.U64(ep.region().offset);
    w.U64(ep.region().bytes);
    w.U32(fds.Add(ep.segment().fd()));
    w.U32(fds.Add(ep.doorbell_fd()));
    w.Bool(rec.ready);
    w.Bool(rec.attached);
    w.U32(rec.attached && rec.liveness_fd >= 0 ? fds.Add(rec.liveness_fd)
                                               : kNoFd);
    for (uint8_t b : rec.token) w.U8(b);
    w.U64(AgeNs(rec.opened, now));
    w.U32(static_cast<uint32_t>(rec.slot_by_epid.size()));
    for (const auto& [epid, slot] : rec.slot_by_epid) {
      w.U64(epid);
      w.U32(slot);
    }
  }
  w.U32(static_cast<uint32_t>(closed_totals_.size()));
  for (const auto& [uid, values] : closed_totals_) {
    w.U32(uid);
    WriteValues(w, values);
  }
  w.U32(static_cast<uint32_t>(job_history_.size()));
  for (const auto& [key, h] : job_history_) {
    WriteUuid(w, key.uuid);
    w.U32(key.uid);
    WriteValues(w, h.closed);
    w.U64(AgeNs(h.last_closed, now));
    WriteStep(w, h.slurm);
  }
  w.U32(static_cast<uint32_t>(slurm_steps_.size()));
  for (const auto& [uuid, step] : slurm_steps_) {
    WriteUuid(w, uuid);
    WriteStep(w, step);
  }
  return {};
}

Status Registry::LoadState(StateReader& r, FdTable& fds, uint16_t boot_nonce,
                           std::vector<std::pair<int, uint32_t>>* liveness) {
  // Everything is read and checked into these first; nothing is built, and
  // no descriptor taken, before the whole section passed.
  struct JobIn {
    JobKey key{};
    uint32_t pool_fd = 0;
    uint64_t pool_bytes = 0;
    uint64_t region_bytes = 0;
    bool inbox = false;
    std::vector<uint8_t> states;
  };
  struct EndpointIn {
    uint32_t id = 0;
    uint64_t epid = 0;
    uint32_t job = 0;
    uint32_t uid = 0, gid = 0, pid = 0;
    std::string label;
    uint32_t sq = 0, cq = 0;
    SendRegion region;
    uint32_t segment_fd = 0, doorbell_fd = 0, liveness_fd = kNoFd;
    bool ready = false, attached = false;
    AttachToken token{};
    uint64_t age_ns = 0;
    std::map<uint64_t, uint32_t> slots;
  };
  auto bad = [&r]() { return Status{PSM2_INTERNAL_ERR, r.error()}; };
  uint64_t default_budget = 0;
  uint32_t next_id = 0, njobs = 0, neps = 0;
  if (!r.U64(&default_budget, "default unexpected budget") ||
      !r.U32(&next_id, "next endpoint id") ||
      !r.Count(&njobs, 16, config_.max_endpoints, "job count")) {
    return bad();
  }
  if (default_budget > config_.max_unexpected_budget_bytes) {
    r.Fail("default unexpected budget", "exceeds max_unexpected_mib");
    return bad();
  }
  std::vector<JobIn> jobs(njobs);
  std::set<JobKey> keys;
  for (JobIn& j : jobs) {
    uint32_t uid = 0, nregions = 0;
    if (!ReadUuid(r, &j.key.uuid) || !r.U32(&uid, "job uid") ||
        !r.U32(&j.pool_fd, "job pool") || !r.U64(&j.pool_bytes, "pool size") ||
        !r.U64(&j.region_bytes, "region size") ||
        !r.Bool(&j.inbox, "job inbox") ||
        !r.Count(&nregions, 1, kMaxRegions, "region count")) {
      return bad();
    }
    j.key.uid = uid;
    j.states.resize(nregions);
    for (auto& s : j.states) {
      if (!r.U8(&s, "region state")) return bad();
      if (s > 2) {
        r.Fail("region state", std::to_string(s) + " is unknown");
        return bad();
      }
    }
    if (!keys.insert(j.key).second) {
      r.Fail("job", UuidToString(j.key.uuid) + " appears twice");
      return bad();
    }
    if (j.region_bytes == 0 ||
        j.pool_bytes != (nregions + (j.inbox ? 1 : 0)) * j.region_bytes) {
      r.Fail("job pool", "size " + std::to_string(j.pool_bytes) +
                             " does not hold its " + std::to_string(nregions) +
                             " regions of " + std::to_string(j.region_bytes));
      return bad();
    }
  }
  if (!r.Count(&neps, 64, config_.max_endpoints, "endpoint count")) return bad();
  std::vector<EndpointIn> eps(neps);
  std::set<uint32_t> ids;
  std::set<std::pair<uint32_t, uint64_t>> regions_taken;
  std::vector<uint32_t> job_endpoints(njobs, 0);
  for (EndpointIn& e : eps) {
    uint32_t nslots = 0;
    if (!r.U32(&e.id, "endpoint id") || !r.U64(&e.epid, "epid") ||
        !r.U32(&e.job, "endpoint job") || !r.U32(&e.uid, "endpoint uid") ||
        !r.U32(&e.gid, "endpoint gid") || !r.U32(&e.pid, "endpoint pid") ||
        !r.Str(&e.label, kMaxLabel, "label") || !r.U32(&e.sq, "sq capacity") ||
        !r.U32(&e.cq, "cq capacity") || !r.U64(&e.region.offset, "region") ||
        !r.U64(&e.region.bytes, "region size") ||
        !r.U32(&e.segment_fd, "segment") || !r.U32(&e.doorbell_fd, "doorbell") ||
        !r.Bool(&e.ready, "ready") || !r.Bool(&e.attached, "attached") ||
        !r.U32(&e.liveness_fd, "attach connection")) {
      return bad();
    }
    for (auto& b : e.token) {
      if (!r.U8(&b, "attach token")) return bad();
    }
    if (!r.U64(&e.age_ns, "endpoint age") ||
        !r.Count(&nslots, 12, kMaxSlots, "connection count")) {
      return bad();
    }
    for (uint32_t i = 0; i < nslots; i++) {
      uint64_t epid = 0;
      uint32_t slot = 0;
      if (!r.U64(&epid, "connection epid") || !r.U32(&slot, "connection slot"))
        return bad();
      e.slots[epid] = slot;
    }
    const std::string who = "endpoint " + std::to_string(e.id);
    if (e.id == 0 || e.id >= next_id || !ids.insert(e.id).second) {
      r.Fail(who.c_str(), "id is 0, repeated, or not below the next id");
      return bad();
    }
    if (e.epid != shm::MakeEpid(config_.node_id, boot_nonce, e.id)) {
      r.Fail(who.c_str(), "epid does not name this node, boot and id");
      return bad();
    }
    if (e.job >= njobs) {
      r.Fail(who.c_str(), "names no job");
      return bad();
    }
    if (!e.ready || (e.attached != (e.liveness_fd != kNoFd))) {
      r.Fail(who.c_str(), "is not ready, or attached without a connection");
      return bad();
    }
    const JobIn& job = jobs[e.job];
    if (e.uid != job.key.uid) {
      r.Fail(who.c_str(), "uid is not its job's");
      return bad();
    }
    const uint64_t index = e.region.offset / job.region_bytes;
    if (e.region.bytes != job.region_bytes ||
        e.region.offset % job.region_bytes != 0 ||
        index >= job.states.size() || job.states[index] != 1 ||
        !regions_taken.insert({e.job, index}).second) {
      r.Fail(who.c_str(), "region is not one its job owns for it alone");
      return bad();
    }
    if (e.sq == 0 || e.cq == 0 || e.sq > (1u << 20) || e.cq > (1u << 20) ||
        (e.sq & (e.sq - 1)) != 0 || (e.cq & (e.cq - 1)) != 0) {
      r.Fail(who.c_str(), "ring capacities are not powers of two in bounds");
      return bad();
    }
    job_endpoints[e.job]++;
  }
  for (uint32_t j = 0; j < njobs; j++) {
    if (job_endpoints[j] == 0) {
      r.Fail("job", UuidToString(jobs[j].key.uuid) + " has no endpoint");
      return bad();
    }
    uint32_t owned = 0;
    for (uint8_t s : jobs[j].states) owned += s == 1;
    if (owned != job_endpoints[j]) {
      r.Fail("job", UuidToString(jobs[j].key.uuid) +
                        " owns regions no endpoint has");
      return bad();
    }
  }
  // Each descriptor index in range and named once, so that taking them
  // below cannot fail.
  std::set<uint32_t> fd_indices;
  auto named_once = [&](uint32_t index, const char* what) {
    if (index >= fds.fds().size() || !fd_indices.insert(index).second) {
      return r.Fail(what, "names descriptor " + std::to_string(index) +
                              ", out of range or named twice");
    }
    return true;
  };
  for (const JobIn& j : jobs) {
    if (!named_once(j.pool_fd, "job pool")) return bad();
  }
  for (const EndpointIn& e : eps) {
    if (!named_once(e.segment_fd, "segment") ||
        !named_once(e.doorbell_fd, "doorbell") ||
        (e.liveness_fd != kNoFd &&
         !named_once(e.liveness_fd, "attach connection"))) {
      return bad();
    }
  }
  std::map<uid_t, counters::Values> closed_totals;
  std::map<JobKey, JobHistory> history;
  std::map<Uuid, SlurmStep> steps;
  uint32_t n = 0;
  if (!r.Count(&n, 8, 1u << 20, "closed totals")) return bad();
  for (uint32_t i = 0; i < n; i++) {
    uint32_t uid = 0;
    counters::Values v{};
    if (!r.U32(&uid, "closed totals uid") || !ReadValues(r, &v)) return bad();
    closed_totals[uid] = v;
  }
  const auto now = std::chrono::steady_clock::now();
  if (!r.Count(&n, 32, 1u << 20, "job histories")) return bad();
  for (uint32_t i = 0; i < n; i++) {
    JobKey key{};
    uint32_t uid = 0;
    uint64_t age = 0;
    JobHistory h;
    if (!ReadUuid(r, &key.uuid) || !r.U32(&uid, "history uid") ||
        !ReadValues(r, &h.closed) || !r.U64(&age, "history age") ||
        !ReadStep(r, &h.slurm)) {
      return bad();
    }
    key.uid = uid;
    h.last_closed = now - std::chrono::nanoseconds(std::min<uint64_t>(
                              age, uint64_t{1} << 62));
    history[key] = h;
  }
  if (!r.Count(&n, 17, 1u << 20, "slurm steps")) return bad();
  for (uint32_t i = 0; i < n; i++) {
    Uuid uuid{};
    std::optional<SlurmStep> step;
    if (!ReadUuid(r, &uuid) || !ReadStep(r, &step)) return bad();
    if (!step) {
      r.Fail("slurm step", "registration without a step");
      return bad();
    }
    steps[uuid] = *step;
  }
  if (!r.AtEnd()) {
    r.Fail("registry", std::to_string(r.Left()) + " bytes left unread");
    return bad();
  }

  // Checked: now take the descriptors and build. A descriptor that is not
  // what the state says (a pool or segment of another size) still refuses
  // the state; what was built so far is dropped, never half-served.
  std::vector<std::shared_ptr<Job>> built_jobs;
  std::map<uid_t, std::shared_ptr<UidAccount>> accounts;
  for (JobIn& j : jobs) {
    int fd = -1;
    std::string error;
    shm::Mapping pool;
    if (!fds.Take(j.pool_fd, &fd, r, "job pool")) return bad();
    if (!shm::Mapping::Attach(fd, j.pool_bytes, &pool, &error)) {
      r.Fail("job pool", error);
      return bad();
    }
    auto& account = accounts[j.key.uid];
    if (!account) account = std::make_shared<UidAccount>();
    auto job = std::make_shared<Job>(
        j.key, std::move(pool),
        static_cast<uint32_t>(j.states.size()), j.region_bytes, account,
        j.inbox);
    job->RestoreRegionStates(j.states);
    built_jobs.push_back(std::move(job));
  }
  // Segments next; doorbells and attach connections last, once nothing can
  // fail: a refusal leaves them untaken, and the caller tells each client
  // why on its connection (handover::EndInherited).
  std::vector<Endpoint::Identity> identities(eps.size());
  for (size_t i = 0; i < eps.size(); i++) {
    EndpointIn& e = eps[i];
    Endpoint::Identity& id = identities[i];
    id.id = e.id;
    id.epid = e.epid;
    id.job = built_jobs[e.job];
    id.uid = e.uid;
    id.gid = e.gid;
    id.pid = static_cast<pid_t>(e.pid);
    id.label = e.label;
    id.region = e.region;
    id.geometry = shm::ComputeGeometry(e.sq, e.cq);
    int segment = -1;
    std::string error;
    if (!fds.Take(e.segment_fd, &segment, r, "segment")) return bad();
    if (!shm::Mapping::Attach(segment, id.geometry.bytes, &id.segment,
                              &error)) {
      r.Fail("segment", "of endpoint " + std::to_string(e.id) + ": " + error);
      return bad();
    }
  }
  std::vector<std::shared_ptr<Endpoint>> built;
  std::vector<int> liveness_fds;
  for (size_t i = 0; i < eps.size(); i++) {
    int liveness = -1;
    fds.Take(eps[i].doorbell_fd, &identities[i].doorbell_fd, r, "doorbell");
    if (eps[i].liveness_fd != kNoFd) {
      fds.TakeIfHanded(eps[i].liveness_fd, &liveness, r, "attach connection");
    }
    built.push_back(
        std::make_shared<Endpoint>(std::move(identities[i]), default_budget));
    liveness_fds.push_back(liveness);
  }

  {
    MutexLock lock(&mu_);
    boot_nonce_ = boot_nonce;
    default_unexpected_budget_ = default_budget;
    next_id_ = next_id;
    for (auto& job : built_jobs) jobs_[job->key()] = job;
    for (auto& [uid, account] : accounts) uid_accounts_[uid] = account;
    for (size_t i = 0; i < built.size(); i++) {
      const std::shared_ptr<Endpoint>& ep = built[i];
      EndpointIn& e = eps[i];
      Record rec;
      rec.ep = ep;
      rec.token = e.token;
      rec.attached = e.attached;
      rec.ready = true;
      rec.opened = now - std::chrono::nanoseconds(
                             std::min<uint64_t>(e.age_ns, uint64_t{1} << 62));
      rec.liveness_fd = liveness_fds[i];
      rec.slot_by_epid = std::move(e.slots);
      if (rec.liveness_fd >= 0) {
        ep->pidfd.store(CrossCopier::PeerPidfd(rec.liveness_fd),
                        std::memory_order_release);
      }
      // -1: the service manager dropped the connection, its client is gone.
      if (rec.attached) liveness->emplace_back(rec.liveness_fd, ep->id());
      ep->job()->endpoints++;
      open_by_uid_[ep->uid()]++;
      id_by_epid_[ep->epid()] = ep->id();
      records_.emplace(ep->id(), std::move(rec));
    }
    closed_totals_ = std::move(closed_totals);
    job_history_ = std::move(history);
    slurm_steps_ = std::move(steps);
  }
  for (auto& ep : built) worker_->AddEndpoint(ep);
  return {};
}

void Registry::EndAll(const std::string& reason) {
  {
    MutexLock lock(&mu_);
    const std::string line = reason + "\n";
    for (auto& [id, rec] : records_) {
      if (rec.liveness_fd < 0) continue;
      (void)!send(rec.liveness_fd, line.data(), line.size(),
                  MSG_DONTWAIT | MSG_NOSIGNAL);
    }
  }
  RemoveAll();
}

}  // namespace psmd
