// libFuzzer target for what a successor psmd reads first of what it was
// handed (issue 33, item 3): the state file's envelope (handover.cc,
// ReadStateFile) and the registry's section (registry_image.h). Input: one
// byte choosing which, then the bytes. Besides crashes and sanitizer
// reports it checks that an accepted image obeys every rule of
// registry_image.h (checked here again, independently), and that writing
// it and parsing that again gives the same image. Built and run for a
// bounded time by daemon/handover/registry_image_fuzz.sh, from the seed
// corpus daemon/handover/registry_image_fuzz_corpus/
// (REGISTRY_IMAGE_FUZZ_WRITE_SEEDS=DIR writes it). At exit the target
// prints what the run got to ("registry_image_fuzz: reached ...").
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <set>
#include <string>
#include <vector>

#include "daemon/handover/handover.h"
#include "daemon/handover/registry_image.h"
#include "shm/epid.h"
#include "tests/fuzz_seeds.h"

namespace {

using namespace psmd::handover;

constexpr RegistryLimits kLimits = {7, 0x1234, 64, uint64_t{1} << 30, 4, 48};

void Check(bool ok) {
  if (!ok) std::abort();
}

struct Reached {
  uint64_t images = 0, endpoints = 0, attached = 0, steps = 0;
  uint64_t refused = 0, envelopes = 0, envelope_refused = 0;
  ~Reached() {
    printf(
        "registry_image_fuzz: reached images=%llu endpoints=%llu "
        "attached=%llu steps=%llu refused=%llu envelopes=%llu,%llu\n",
        static_cast<unsigned long long>(images),
        static_cast<unsigned long long>(endpoints),
        static_cast<unsigned long long>(attached),
        static_cast<unsigned long long>(steps),
        static_cast<unsigned long long>(refused),
        static_cast<unsigned long long>(envelopes),
        static_cast<unsigned long long>(envelope_refused));
  }
} reached;

// The rules of registry_image.h, checked again on an accepted image.
void CheckRules(const RegistryImage& im) {
  std::set<uint32_t> ids, fds;
  std::set<std::pair<uint32_t, uint64_t>> regions;
  std::vector<uint32_t> per_job(im.jobs.size(), 0);
  Check(im.default_budget <= kLimits.max_unexpected_budget);
  Check(im.endpoints.size() <= kLimits.max_endpoints);
  for (const JobImage& j : im.jobs) {
    Check(j.region_bytes != 0);
    Check(j.pool_bytes ==
          (j.region_states.size() + (j.inbox ? 1 : 0)) * j.region_bytes);
    Check(j.pool_fd < kLimits.fds && fds.insert(j.pool_fd).second);
  }
  for (const EndpointImage& e : im.endpoints) {
    Check(e.id != 0 && e.id < im.next_id && ids.insert(e.id).second);
    Check(e.epid ==
          psmd::shm::MakeEpid(kLimits.node_id, kLimits.boot_nonce, e.id));
    Check(e.job < im.jobs.size() && e.uid == im.jobs[e.job].uid && e.ready);
    const JobImage& j = im.jobs[e.job];
    Check(e.region_bytes == j.region_bytes &&
          e.region_offset % j.region_bytes == 0);
    const uint64_t index = e.region_offset / j.region_bytes;
    Check(index < j.region_states.size() && j.region_states[index] == 1);
    Check(regions.insert({e.job, index}).second);
    Check(e.sq_capacity && !(e.sq_capacity & (e.sq_capacity - 1)));
    Check(e.cq_capacity && !(e.cq_capacity & (e.cq_capacity - 1)));
    Check(e.attached == (e.liveness_fd != kNoFd));
    Check(e.segment_fd < kLimits.fds && fds.insert(e.segment_fd).second);
    Check(e.doorbell_fd < kLimits.fds && fds.insert(e.doorbell_fd).second);
    if (e.attached) {
      Check(e.liveness_fd < kLimits.fds && fds.insert(e.liveness_fd).second);
    }
    per_job[e.job]++;
  }
  for (size_t j = 0; j < im.jobs.size(); j++) {
    size_t owned = 0;
    for (uint8_t s : im.jobs[j].region_states) owned += s == 1;
    Check(per_job[j] > 0 && owned == per_job[j]);
  }
  for (const auto& t : im.closed_totals)
    Check(t.second.size() == kLimits.counters);
  for (const auto& h : im.histories) Check(h.closed.size() == kLimits.counters);
}

bool SameImage(const RegistryImage& a, const RegistryImage& b) {
  StateWriter wa, wb;
  WriteRegistryImage(wa, a);
  WriteRegistryImage(wb, b);
  return wa.bytes() == wb.bytes();
}

RegistryImage Example(int jobs, int per_job, bool steps) {
  RegistryImage im;
  im.default_budget = 64 << 20;
  uint32_t fd = 0, id = 1;
  for (int j = 0; j < jobs; j++) {
    JobImage job;
    job.uuid.fill(static_cast<uint8_t>(0xa0 + j));
    job.uid = 1000 + j;
    job.pool_fd = fd++;
    job.region_bytes = 1 << 20;
    job.region_states.assign(4, 0);
    job.pool_bytes = 4 << 20;
    for (int k = 0; k < per_job; k++) {
      EndpointImage e;
      e.id = id++;
      e.epid = psmd::shm::MakeEpid(kLimits.node_id, kLimits.boot_nonce, e.id);
      e.job = static_cast<uint32_t>(j);
      e.uid = job.uid;
      e.gid = job.uid;
      e.pid = 4000 + e.id;
      e.label = "rank" + std::to_string(k);
      e.sq_capacity = 256;
      e.cq_capacity = 1024;
      e.region_offset = uint64_t(k) << 20;
      e.region_bytes = 1 << 20;
      job.region_states[k] = 1;
      e.segment_fd = fd++;
      e.doorbell_fd = fd++;
      e.ready = true;
      e.attached = k != 0;  // the first one still waits for its attach
      e.liveness_fd = e.attached ? fd++ : kNoFd;
      e.token.fill(static_cast<uint8_t>(e.id));
      e.age_ns = 123456789;
      e.slots[psmd::shm::MakeEpid(kLimits.node_id, kLimits.boot_nonce, 1)] = 0;
      im.endpoints.push_back(e);
    }
    im.jobs.push_back(job);
  }
  im.next_id = id;
  im.closed_totals.push_back({1000, {1, 2, 3, 4}});
  HistoryImage h;
  h.uuid.fill(0xee);
  h.uid = 1000;
  h.closed = {5, 6, 7, 8};
  h.age_ns = 1000;
  if (steps) {
    StepImage step{
        42, 0,   1000, "0::/system.slice/slurmstepd.scope/job_42/step_0",
        2,  300, 2,    31457280};
    h.slurm = step;
    im.steps.push_back({im.jobs[0].uuid, step});
  }
  im.histories.push_back(h);
  return im;
}

std::vector<std::string> Seeds() {
  std::vector<std::string> seeds;
  for (auto [jobs, per_job, steps] :
       {std::tuple{1, 2, false}, std::tuple{2, 3, true},
        std::tuple{3, 1, true}}) {
    StateWriter w;
    WriteRegistryImage(w, Example(jobs, per_job, steps));
    seeds.push_back(std::string(1, '\1') + w.bytes());
  }
  StateWriter body;
  WriteRegistryImage(body, Example(1, 1, false));
  std::string error;
  int fd = WriteStateFile(body.bytes(), "fuzz", &error);
  std::string file(4096, '\0');
  file.resize(static_cast<size_t>(pread(fd, &file[0], file.size(), 0)));
  close(fd);
  seeds.push_back(std::string(1, '\0') + file);
  return seeds;
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  psmd::fuzz::WriteSeedsIfAsked("REGISTRY_IMAGE_FUZZ_WRITE_SEEDS",
                                "registry_image_fuzz", Seeds);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  if (data[0] == 0) {  // the envelope, from a file as the successor reads it
    int fd = memfd_create("fuzz", 0);
    Check(fd >= 0);
    Check(write(fd, data + 1, size - 1) == static_cast<ssize_t>(size - 1));
    std::string body;
    psmd::Status s = ReadStateFile(fd, &body);  // closes fd
    (s.ok() ? reached.envelopes : reached.envelope_refused)++;
    Check(s.ok() || !s.message.empty());
    return 0;
  }
  StateReader r(data + 1, size - 1);
  RegistryImage im;
  if (!ParseRegistryImage(r, kLimits, &im)) {
    Check(!r.ok() && !r.error().empty());
    reached.refused++;
    return 0;
  }
  CheckRules(im);
  StateWriter w;
  WriteRegistryImage(w, im);
  StateReader again(w.bytes().data(), w.bytes().size());
  RegistryImage im2;
  Check(ParseRegistryImage(again, kLimits, &im2));
  Check(SameImage(im, im2));
  reached.images++;
  reached.endpoints += !im.endpoints.empty();
  for (const auto& e : im.endpoints) reached.attached += e.attached;
  reached.steps += !im.steps.empty();
  return 0;
}
