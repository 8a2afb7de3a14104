#include "daemon/handover/registry_image.h"

#include <set>
#include <utility>

#include "shm/epid.h"

namespace psmd::handover {

namespace {

constexpr uint32_t kMaxRegions = 1u << 16;
constexpr uint32_t kMaxSlots = 1u << 20;
constexpr uint32_t kMaxRing = 1u << 20;
constexpr size_t kMaxLabel = 64 * 4;  // 64 bytes, escaped (at most 4 each)
constexpr size_t kMaxCgroup = 4096;
constexpr uint32_t kMaxKept = 1u << 20;  // totals, histories, steps

void WriteUuid(StateWriter& w, const UuidBytes& u) {
  for (uint8_t b : u) w.U8(b);
}
bool ReadUuid(StateReader& r, UuidBytes* u) {
  for (auto& b : *u) {
    if (!r.U8(&b, "job uuid")) return false;
  }
  return true;
}

void WriteValues(StateWriter& w, const std::vector<uint64_t>& v) {
  w.U32(static_cast<uint32_t>(v.size()));
  for (uint64_t x : v) w.U64(x);
}
bool ReadValues(StateReader& r, size_t expected, std::vector<uint64_t>* v) {
  uint32_t n = 0;
  if (!r.Count(&n, 8, 4096, "counter count")) return false;
  if (n != expected) {
    return r.Fail("counter count", std::to_string(n) + " where this psmd has " +
                                       std::to_string(expected));
  }
  v->resize(n);
  for (auto& x : *v) {
    if (!r.U64(&x, "counter")) return false;
  }
  return true;
}

void WriteStep(StateWriter& w, const std::optional<StepImage>& s) {
  w.Bool(s.has_value());
  if (!s) return;
  w.U32(s->job_id);
  w.U32(s->step_id);
  w.U32(s->uid);
  w.Str(s->cgroup);
  w.U32(s->tasks);
  w.U64(s->memory_mib);
  w.U32(s->max_endpoints);
  w.U64(s->unexpected_budget_bytes);
}
bool ReadStep(StateReader& r, std::optional<StepImage>* s) {
  bool has = false;
  if (!r.Bool(&has, "slurm step")) return false;
  if (!has) {
    s->reset();
    return true;
  }
  StepImage step;
  if (!r.U32(&step.job_id, "slurm job id") ||
      !r.U32(&step.step_id, "slurm step id") ||
      !r.U32(&step.uid, "slurm uid") ||
      !r.Str(&step.cgroup, kMaxCgroup, "slurm cgroup") ||
      !r.U32(&step.tasks, "slurm tasks") ||
      !r.U64(&step.memory_mib, "slurm memory") ||
      !r.U32(&step.max_endpoints, "slurm endpoints") ||
      !r.U64(&step.unexpected_budget_bytes, "slurm unexpected budget")) {
    return false;
  }
  *s = std::move(step);
  return true;
}

bool PowerOfTwoInBounds(uint32_t v) {
  return v != 0 && v <= kMaxRing && (v & (v - 1)) == 0;
}

}  // namespace

void WriteRegistryImage(StateWriter& w, const RegistryImage& image) {
  w.U64(image.default_budget);
  w.U32(image.next_id);
  w.U32(static_cast<uint32_t>(image.jobs.size()));
  for (const JobImage& j : image.jobs) {
    WriteUuid(w, j.uuid);
    w.U32(j.uid);
    w.U32(j.pool_fd);
    w.U64(j.pool_bytes);
    w.U64(j.region_bytes);
    w.Bool(j.inbox);
    w.U32(static_cast<uint32_t>(j.region_states.size()));
    for (uint8_t s : j.region_states) w.U8(s);
    w.U64(j.unexpected_budget);
  }
  w.U32(static_cast<uint32_t>(image.endpoints.size()));
  for (const EndpointImage& e : image.endpoints) {
    w.U32(e.id);
    w.U64(e.epid);
    w.U32(e.job);
    w.U32(e.uid);
    w.U32(e.gid);
    w.U32(e.pid);
    w.Str(e.label);
    w.U32(e.sq_capacity);
    w.U32(e.cq_capacity);
    w.U64(e.region_offset);
    w.U64(e.region_bytes);
    w.U32(e.segment_fd);
    w.U32(e.doorbell_fd);
    w.Bool(e.ready);
    w.Bool(e.attached);
    w.U32(e.liveness_fd);
    for (uint8_t b : e.token) w.U8(b);
    w.U64(e.age_ns);
    w.U32(static_cast<uint32_t>(e.slots.size()));
    for (const auto& [epid, slot] : e.slots) {
      w.U64(epid);
      w.U32(slot);
    }
  }
  w.U32(static_cast<uint32_t>(image.closed_totals.size()));
  for (const auto& [uid, values] : image.closed_totals) {
    w.U32(uid);
    WriteValues(w, values);
  }
  w.U32(static_cast<uint32_t>(image.histories.size()));
  for (const HistoryImage& h : image.histories) {
    WriteUuid(w, h.uuid);
    w.U32(h.uid);
    WriteValues(w, h.closed);
    w.U64(h.age_ns);
    WriteStep(w, h.slurm);
  }
  w.U32(static_cast<uint32_t>(image.steps.size()));
  for (const auto& [uuid, step] : image.steps) {
    WriteUuid(w, uuid);
    WriteStep(w, step);
  }
}

bool ParseRegistryImage(StateReader& r, const RegistryLimits& limits,
                        RegistryImage* image) {
  RegistryImage im;
  uint32_t njobs = 0, neps = 0;
  if (!r.U64(&im.default_budget, "default unexpected budget") ||
      !r.U32(&im.next_id, "next endpoint id") ||
      !r.Count(&njobs, 16, limits.max_endpoints, "job count")) {
    return false;
  }
  if (im.default_budget > limits.max_unexpected_budget) {
    return r.Fail("default unexpected budget", "exceeds max_unexpected_mib");
  }
  im.jobs.resize(njobs);
  std::set<std::pair<UuidBytes, uint32_t>> keys;
  for (JobImage& j : im.jobs) {
    uint32_t nregions = 0;
    if (!ReadUuid(r, &j.uuid) || !r.U32(&j.uid, "job uid") ||
        !r.U32(&j.pool_fd, "job pool") || !r.U64(&j.pool_bytes, "pool size") ||
        !r.U64(&j.region_bytes, "region size") ||
        !r.Bool(&j.inbox, "job inbox") ||
        !r.Count(&nregions, 1, kMaxRegions, "region count")) {
      return false;
    }
    j.region_states.resize(nregions);
    for (auto& s : j.region_states) {
      if (!r.U8(&s, "region state")) return false;
      if (s > 2)
        return r.Fail("region state", std::to_string(s) + " is unknown");
    }
    if (!r.U64(&j.unexpected_budget, "job unexpected budget")) return false;
    if (!keys.insert({j.uuid, j.uid}).second) {
      return r.Fail("job", "key appears twice");
    }
    const uint64_t regions = nregions + (j.inbox ? 1 : 0);
    if (j.region_bytes == 0 || j.region_bytes > (uint64_t{1} << 40) ||
        j.pool_bytes != regions * j.region_bytes) {
      return r.Fail("job pool", "size " + std::to_string(j.pool_bytes) +
                                    " does not hold its " +
                                    std::to_string(regions) + " regions of " +
                                    std::to_string(j.region_bytes));
    }
  }
  if (!r.Count(&neps, 64, limits.max_endpoints, "endpoint count")) return false;
  im.endpoints.resize(neps);
  std::set<uint32_t> ids;
  std::set<std::pair<uint32_t, uint64_t>> regions_taken;
  std::vector<uint32_t> job_endpoints(njobs, 0);
  for (EndpointImage& e : im.endpoints) {
    uint32_t nslots = 0;
    if (!r.U32(&e.id, "endpoint id") || !r.U64(&e.epid, "epid") ||
        !r.U32(&e.job, "endpoint job") || !r.U32(&e.uid, "endpoint uid") ||
        !r.U32(&e.gid, "endpoint gid") || !r.U32(&e.pid, "endpoint pid") ||
        !r.Str(&e.label, kMaxLabel, "label") ||
        !r.U32(&e.sq_capacity, "sq capacity") ||
        !r.U32(&e.cq_capacity, "cq capacity") ||
        !r.U64(&e.region_offset, "region") ||
        !r.U64(&e.region_bytes, "region size") ||
        !r.U32(&e.segment_fd, "segment") ||
        !r.U32(&e.doorbell_fd, "doorbell") || !r.Bool(&e.ready, "ready") ||
        !r.Bool(&e.attached, "attached") ||
        !r.U32(&e.liveness_fd, "attach connection")) {
      return false;
    }
    for (auto& b : e.token) {
      if (!r.U8(&b, "attach token")) return false;
    }
    if (!r.U64(&e.age_ns, "endpoint age") ||
        !r.Count(&nslots, 12, kMaxSlots, "connection count")) {
      return false;
    }
    for (uint32_t i = 0; i < nslots; i++) {
      uint64_t epid = 0;
      uint32_t slot = 0;
      if (!r.U64(&epid, "connection epid") ||
          !r.U32(&slot, "connection slot")) {
        return false;
      }
      e.slots[epid] = slot;
    }
    const std::string who = "endpoint " + std::to_string(e.id);
    if (e.id == 0 || e.id >= im.next_id || !ids.insert(e.id).second) {
      return r.Fail(who.c_str(), "id is 0, repeated, or not below the next id");
    }
    if (e.epid != shm::MakeEpid(limits.node_id, limits.boot_nonce, e.id)) {
      return r.Fail(who.c_str(), "epid does not name this node, boot and id");
    }
    if (e.job >= njobs) return r.Fail(who.c_str(), "names no job");
    if (!e.ready || e.attached != (e.liveness_fd != kNoFd)) {
      return r.Fail(who.c_str(),
                    "is not ready, or attached without a connection");
    }
    const JobImage& job = im.jobs[e.job];
    if (e.uid != job.uid) return r.Fail(who.c_str(), "uid is not its job's");
    const uint64_t index = e.region_offset / job.region_bytes;
    if (e.region_bytes != job.region_bytes ||
        e.region_offset % job.region_bytes != 0 ||
        index >= job.region_states.size() || job.region_states[index] != 1 ||
        !regions_taken.insert({e.job, index}).second) {
      return r.Fail(who.c_str(), "region is not one its job owns for it alone");
    }
    if (!PowerOfTwoInBounds(e.sq_capacity) ||
        !PowerOfTwoInBounds(e.cq_capacity)) {
      return r.Fail(who.c_str(),
                    "ring capacities are not powers of two in bounds");
    }
    job_endpoints[e.job]++;
  }
  for (uint32_t j = 0; j < njobs; j++) {
    uint32_t owned = 0;
    for (uint8_t s : im.jobs[j].region_states) owned += s == 1;
    if (job_endpoints[j] == 0 || owned != job_endpoints[j]) {
      return r.Fail("job", "has no endpoint, or owns regions no endpoint has");
    }
  }
  std::set<uint32_t> fd_indices;
  auto named_once = [&](uint32_t index, const char* what) {
    if (index >= limits.fds || !fd_indices.insert(index).second) {
      return r.Fail(what, "names descriptor " + std::to_string(index) +
                              ", out of range or named twice");
    }
    return true;
  };
  for (const JobImage& j : im.jobs) {
    if (!named_once(j.pool_fd, "job pool")) return false;
  }
  for (const EndpointImage& e : im.endpoints) {
    if (!named_once(e.segment_fd, "segment") ||
        !named_once(e.doorbell_fd, "doorbell") ||
        (e.liveness_fd != kNoFd &&
         !named_once(e.liveness_fd, "attach connection"))) {
      return false;
    }
  }
  uint32_t n = 0;
  if (!r.Count(&n, 8, kMaxKept, "closed totals")) return false;
  std::set<uint32_t> uids;
  for (uint32_t i = 0; i < n; i++) {
    std::pair<uint32_t, std::vector<uint64_t>> t;
    if (!r.U32(&t.first, "closed totals uid") ||
        !ReadValues(r, limits.counters, &t.second)) {
      return false;
    }
    if (!uids.insert(t.first).second) {
      return r.Fail("closed totals", "uid appears twice");
    }
    im.closed_totals.push_back(std::move(t));
  }
  if (!r.Count(&n, 33, kMaxKept, "job histories")) return false;
  im.histories.resize(n);
  for (HistoryImage& h : im.histories) {
    if (!ReadUuid(r, &h.uuid) || !r.U32(&h.uid, "history uid") ||
        !ReadValues(r, limits.counters, &h.closed) ||
        !r.U64(&h.age_ns, "history age") || !ReadStep(r, &h.slurm)) {
      return false;
    }
  }
  if (!r.Count(&n, 41, kMaxKept, "slurm steps")) return false;
  for (uint32_t i = 0; i < n; i++) {
    UuidBytes uuid{};
    std::optional<StepImage> step;
    if (!ReadUuid(r, &uuid) || !ReadStep(r, &step)) return false;
    if (!step) return r.Fail("slurm step", "registration without a step");
    im.steps.emplace_back(uuid, std::move(*step));
  }
  if (!r.AtEnd()) {
    return r.Fail("registry", std::to_string(r.Left()) + " bytes left unread");
  }
  *image = std::move(im);
  return true;
}

}  // namespace psmd::handover
