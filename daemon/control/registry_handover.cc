// The registry's part of a handover (issue 33; daemon/handover/handover.h):
// jobs, endpoints' identities and the descriptors behind them, Slurm
// registrations, and the totals stats keep, as a RegistryImage
// (daemon/handover/registry_image.h: the format and its checks). What an
// endpoint's engine holds (queues, transfers, counters) is the engine's
// section.
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>

#include <spdlog/spdlog.h>

#include "daemon/control/registry.h"
#include "daemon/engine/cross_copy.h"
#include "daemon/handover/registry_image.h"
#include "shm/layout.h"

namespace psmd {

namespace {

using handover::FdTable;
using handover::StateReader;
using handover::StateWriter;

uint64_t AgeNs(std::chrono::steady_clock::time_point t,
               std::chrono::steady_clock::time_point now) {
  return now > t
             ? static_cast<uint64_t>(std::chrono::nanoseconds(now - t).count())
             : 0;
}

std::chrono::steady_clock::time_point Before(
    std::chrono::steady_clock::time_point now, uint64_t age_ns) {
  return now - std::chrono::nanoseconds(
                   std::min<uint64_t>(age_ns, uint64_t{1} << 62));
}

std::optional<handover::StepImage> ImageOf(const std::optional<SlurmStep>& s) {
  if (!s) return std::nullopt;
  return handover::StepImage{
      s->job_id, s->step_id,    s->uid,           s->cgroup,
      s->tasks,  s->memory_mib, s->max_endpoints, s->unexpected_budget_bytes};
}

SlurmStep StepOf(const handover::StepImage& s) {
  SlurmStep step;
  step.job_id = s.job_id;
  step.step_id = s.step_id;
  step.uid = s.uid;
  step.cgroup = s.cgroup;
  step.tasks = s.tasks;
  step.memory_mib = s.memory_mib;
  step.max_endpoints = s.max_endpoints;
  step.unexpected_budget_bytes = s.unexpected_budget_bytes;
  return step;
}

std::vector<uint64_t> VectorOf(const counters::Values& v) {
  return {v.begin(), v.end()};
}

counters::Values ValuesOf(const std::vector<uint64_t>& v) {
  counters::Values out{};
  std::copy_n(v.begin(), std::min(v.size(), out.size()), out.begin());
  return out;
}

}  // namespace

Status Registry::SaveState(StateWriter& w, FdTable& fds) {
  MutexLock lock(&mu_);
  if (!retiring_.empty()) {
    return {PSM2_INTERNAL_ERR, std::to_string(retiring_.size()) +
                                   " endpoints are still closing; try again"};
  }
  const auto now = std::chrono::steady_clock::now();
  handover::RegistryImage im;
  im.default_budget = default_unexpected_budget_;
  im.next_id = next_id_;
  std::map<const Job*, uint32_t> job_index;
  for (const auto& [key, job] : jobs_) {
    job_index[job.get()] = static_cast<uint32_t>(im.jobs.size());
    handover::JobImage j;
    j.uuid = key.uuid;
    j.uid = key.uid;
    j.pool_fd = fds.Add(job->pool().fd());
    j.pool_bytes = job->pool().size();
    j.region_bytes = job->region_bytes();
    j.inbox = job->has_inbox();
    j.region_states = job->RegionStates();
    j.unexpected_budget = job->unexpected_budget();
    im.jobs.push_back(std::move(j));
  }
  for (const auto& [id, rec] : records_) {
    const Endpoint& ep = *rec.ep;
    handover::EndpointImage e;
    e.id = id;
    e.epid = ep.epid();
    e.job = job_index.at(ep.job().get());
    e.uid = ep.uid();
    e.gid = ep.gid();
    e.pid = static_cast<uint32_t>(ep.pid());
    e.label = ep.label();
    e.sq_capacity = ep.geometry().sq_capacity;
    e.cq_capacity = ep.geometry().cq_capacity;
    e.region_offset = ep.region().offset;
    e.region_bytes = ep.region().bytes;
    e.segment_fd = fds.Add(ep.segment().fd());
    e.doorbell_fd = fds.Add(ep.doorbell_fd());
    e.ready = rec.ready;
    e.attached = rec.attached && rec.liveness_fd >= 0;
    e.liveness_fd = e.attached ? fds.Add(rec.liveness_fd) : handover::kNoFd;
    e.token = rec.token;
    e.age_ns = AgeNs(rec.opened, now);
    e.slots = rec.slot_by_epid;
    im.endpoints.push_back(std::move(e));
  }
  for (const auto& [uid, values] : closed_totals_) {
    im.closed_totals.emplace_back(uid, VectorOf(values));
  }
  for (const auto& [key, h] : job_history_) {
    im.histories.push_back({key.uuid, key.uid, VectorOf(h.closed),
                            AgeNs(h.last_closed, now), ImageOf(h.slurm)});
  }
  for (const auto& [uuid, step] : slurm_steps_) {
    im.steps.emplace_back(uuid, *ImageOf(step));
  }
  handover::WriteRegistryImage(w, im);
  return {};
}

Status Registry::LoadState(StateReader& r, FdTable& fds, uint16_t boot_nonce,
                           std::vector<std::pair<int, uint32_t>>* liveness) {
  auto bad = [&r]() { return Status{PSM2_INTERNAL_ERR, r.error()}; };
  handover::RegistryLimits limits;
  limits.node_id = config_.node_id;
  limits.boot_nonce = boot_nonce;
  limits.max_endpoints = config_.max_endpoints;
  limits.max_unexpected_budget = config_.max_unexpected_budget_bytes;
  limits.counters = counters::Values{}.size();
  limits.fds = fds.fds().size();
  handover::RegistryImage im;
  // Everything checked before anything is built or a descriptor taken.
  if (!handover::ParseRegistryImage(r, limits, &im)) return bad();

  // Pools and segments first, mapped at their sizes; doorbells and attach
  // connections last, once nothing can fail: a refusal leaves them
  // untaken, and the caller tells each client why on its connection
  // (handover::EndInherited).
  std::vector<std::shared_ptr<Job>> jobs;
  std::map<uid_t, std::shared_ptr<UidAccount>> accounts;
  for (const handover::JobImage& j : im.jobs) {
    int fd = -1;
    std::string error;
    shm::Mapping pool;
    if (!fds.Take(j.pool_fd, &fd, r, "job pool")) return bad();
    if (!shm::Mapping::Attach(fd, j.pool_bytes, &pool, &error)) {
      r.Fail("job pool", error);
      return bad();
    }
    auto& account = accounts[j.uid];
    if (!account) account = std::make_shared<UidAccount>();
    auto job =
        std::make_shared<Job>(JobKey{j.uuid, j.uid}, std::move(pool),
                              static_cast<uint32_t>(j.region_states.size()),
                              j.region_bytes, account, j.inbox);
    job->RestoreRegionStates(j.region_states);
    job->set_unexpected_budget(j.unexpected_budget);
    jobs.push_back(std::move(job));
  }
  std::vector<Endpoint::Identity> identities(im.endpoints.size());
  for (size_t i = 0; i < im.endpoints.size(); i++) {
    const handover::EndpointImage& e = im.endpoints[i];
    Endpoint::Identity& id = identities[i];
    id.id = e.id;
    id.epid = e.epid;
    id.job = jobs[e.job];
    id.uid = e.uid;
    id.gid = e.gid;
    id.pid = static_cast<pid_t>(e.pid);
    id.label = e.label;
    id.region = SendRegion{e.region_offset, e.region_bytes};
    id.geometry = shm::ComputeGeometry(e.sq_capacity, e.cq_capacity);
    int segment = -1;
    std::string error;
    if (!fds.Take(e.segment_fd, &segment, r, "segment")) return bad();
    if (!shm::Mapping::Attach(segment, id.geometry.bytes, &id.segment,
                              &error)) {
      r.Fail("segment", "of endpoint " + std::to_string(e.id) + ": " + error);
      return bad();
    }
  }
  // A doorbell is never dropped by a service manager; an attach connection
  // is once it hung up (TakeIfHanded: -1, the client is gone).
  for (const handover::EndpointImage& e : im.endpoints) {
    if (!fds.Handed(e.doorbell_fd)) {
      r.Fail("doorbell", "of endpoint " + std::to_string(e.id) +
                             " was not given back by the service manager "
                             "(is its FileDescriptorStoreMax= too small?)");
      return bad();
    }
  }
  std::vector<std::shared_ptr<Endpoint>> built;
  std::vector<int> liveness_fds;
  for (size_t i = 0; i < im.endpoints.size(); i++) {
    const handover::EndpointImage& e = im.endpoints[i];
    int fd = -1;
    fds.Take(e.doorbell_fd, &identities[i].doorbell_fd, r, "doorbell");
    if (e.liveness_fd != handover::kNoFd) {
      fds.TakeIfHanded(e.liveness_fd, &fd, r, "attach connection");
    }
    built.push_back(std::make_shared<Endpoint>(std::move(identities[i]),
                                               im.default_budget));
    liveness_fds.push_back(fd);
  }

  const auto now = std::chrono::steady_clock::now();
  {
    MutexLock lock(&mu_);
    boot_nonce_ = boot_nonce;
    default_unexpected_budget_ = im.default_budget;
    next_id_ = im.next_id;
    for (auto& job : jobs) jobs_[job->key()] = job;
    for (auto& [uid, account] : accounts) uid_accounts_[uid] = account;
    for (size_t i = 0; i < built.size(); i++) {
      const std::shared_ptr<Endpoint>& ep = built[i];
      const handover::EndpointImage& e = im.endpoints[i];
      Record rec;
      rec.ep = ep;
      rec.token = e.token;
      rec.attached = e.attached;
      rec.ready = true;
      rec.opened = Before(now, e.age_ns);
      rec.liveness_fd = liveness_fds[i];
      rec.slot_by_epid = e.slots;
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
    for (const auto& [uid, values] : im.closed_totals) {
      closed_totals_[uid] = ValuesOf(values);
    }
    for (const handover::HistoryImage& h : im.histories) {
      JobHistory history;
      history.closed = ValuesOf(h.closed);
      history.last_closed = Before(now, h.age_ns);
      if (h.slurm) history.slurm = StepOf(*h.slurm);
      job_history_[JobKey{h.uuid, h.uid}] = history;
    }
    for (const auto& [uuid, step] : im.steps) slurm_steps_[uuid] = StepOf(step);
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
