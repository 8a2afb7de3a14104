// libFuzzer target for what a successor psmd reads first of what it was
// handed (issue 33, item 3): the state file's envelope (handover.cc,
// ReadStateFile), the registry's section (registry_image.h), the fabric's
// (CarriedFabric::Read) and an inbox arena's (ReadArenaState, then
// shm::SendArena::Adopt). Input: one byte choosing which, then the bytes.
// Besides crashes and sanitizer reports it checks that an accepted image obeys
// every rule of registry_image.h (checked here again, independently), and that
// writing it and parsing that again gives the same image. Built and run for a
// bounded time by daemon/handover/registry_image_fuzz.sh, from the seed
// corpus daemon/handover/registry_image_fuzz_corpus/
// (REGISTRY_IMAGE_FUZZ_WRITE_SEEDS=DIR writes it). At exit the target
// prints what the run got to ("registry_image_fuzz: reached ...").
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
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
  uint64_t refused = 0, envelopes = 0, envelopes_in_place = 0;
  uint64_t envelope_refused = 0;
  uint64_t fabrics = 0, sessions = 0, fabric_refused = 0;
  uint64_t arenas = 0, allocations = 0, arena_refused = 0;
  ~Reached() {
    printf(
        "registry_image_fuzz: reached images=%llu endpoints=%llu "
        "attached=%llu steps=%llu refused=%llu envelopes=%llu,%llu,%llu "
        "fabrics=%llu,%llu,%llu arenas=%llu,%llu,%llu\n",
        static_cast<unsigned long long>(images),
        static_cast<unsigned long long>(endpoints),
        static_cast<unsigned long long>(attached),
        static_cast<unsigned long long>(steps),
        static_cast<unsigned long long>(refused),
        static_cast<unsigned long long>(envelopes),
        static_cast<unsigned long long>(envelopes_in_place),
        static_cast<unsigned long long>(envelope_refused),
        static_cast<unsigned long long>(fabrics),
        static_cast<unsigned long long>(sessions),
        static_cast<unsigned long long>(fabric_refused),
        static_cast<unsigned long long>(arenas),
        static_cast<unsigned long long>(allocations),
        static_cast<unsigned long long>(arena_refused));
  }
} reached;

// The fabric's section: what is accepted keeps CarriedFabric::Read's rules
// and survives writing and reading again.
void FuzzFabric(const uint8_t* data, size_t size) {
  StateReader r(data, size);
  CarriedFabric f;
  if (!f.Read(r)) {
    Check(!r.ok() && !r.error().empty());
    reached.fabric_refused++;
    return;
  }
  if (f.present) {
    psmd::hw::HostDescription self;
    std::string error;
    Check(f.incarnation != 0);
    Check(psmd::hw::ParseHostDescription(f.host_description, &self, &error));
    for (const psmd::hw::CarriedSession& s : f.sessions) {
      Check(s.id != 0 && s.node != 0 && s.node != self.node);
      Check(s.addresses.size() <= psmd::hw::kMaxHostAddresses);
    }
    reached.sessions += !f.sessions.empty();
  }
  StateWriter w;
  f.Write(w);
  StateReader again(w.bytes().data(), w.bytes().size());
  CarriedFabric g;
  Check(g.Read(again) && again.AtEnd());
  Check(g.present == f.present && g.incarnation == f.incarnation &&
        g.host_description == f.host_description &&
        g.sessions.size() == f.sessions.size());
  for (size_t i = 0; i < f.sessions.size(); i++) {
    const auto &a = f.sessions[i], &b = g.sessions[i];
    Check(a.id == b.id && a.node == b.node && a.outgoing == b.outgoing &&
          a.peer_incarnation == b.peer_incarnation && a.tx_seq == b.tx_seq &&
          a.rx_delivered == b.rx_delivered &&
          a.addresses.size() == b.addresses.size());
  }
  reached.fabrics++;
}

// An inbox arena's state over a region of kArenaBytes: every chunk it names
// is in use, so that whatever Adopt accepts, no allocation after it may
// overlap one of them, or another allocation, or leave the region.
constexpr uint64_t kArenaOffset = 4096, kArenaBytes = 4096;
// Its pool: chunk headers are cache-line aligned (shm/pool.h).
struct alignas(64) ArenaPool {
  uint8_t bytes[kArenaOffset + kArenaBytes + 4096] = {};
};
void FuzzArena(const uint8_t* data, size_t size) {
  StateReader r(data, size);
  psmd::shm::SendArena::State s;
  if (!ReadArenaState(r, &s)) {
    reached.arena_refused++;
    return;
  }
  auto pool_memory = std::make_unique<ArenaPool>();
  uint8_t* pool = pool_memory->bytes;
  using psmd::shm::ChunkOf;
  using psmd::shm::kChunkHeaderBytes;
  // [begin, end) region offsets that must not be allocated over.
  std::vector<std::pair<uint64_t, uint64_t>> live;
  auto mark = [&](uint64_t at, uint64_t bytes) {
    if (at >= kArenaBytes || bytes > kArenaBytes - at ||
        bytes < kChunkHeaderBytes || at % 64 != 0)
      return;
    ChunkOf(pool, kArenaOffset + at + kChunkHeaderBytes)
        ->state.store(psmd::shm::kChunkInUse);
    live.emplace_back(at, at + bytes);
  };
  uint64_t at = s.tail;
  for (const auto& p : s.ring) {
    if (!p.is_padding) mark(at % kArenaBytes, p.bytes);
    at += p.bytes;
  }
  for (const auto& p : s.set_aside) mark(p.at, p.bytes);
  psmd::shm::SendArena arena(pool, kArenaOffset, kArenaBytes, 0);
  std::string why;
  if (!arena.Adopt(s, &why)) {
    Check(!why.empty() && arena.empty());
    reached.arena_refused++;
    return;
  }
  reached.arenas++;
  // The rest of the input: up to 32 sizes to allocate (never released).
  const uint8_t* rest = data + (size - r.Left());
  for (size_t i = 0; i < std::min<size_t>(r.Left(), 32); i++) {
    const uint64_t bytes = 1 + rest[i] * 8;
    auto off =
        arena.Allocate(bytes, rest[i] & 1 ? psmd::shm::ChunkUse::kMayLinger
                                          : psmd::shm::ChunkUse::kBrief);
    if (!off) continue;
    const uint64_t begin = *off - kArenaOffset - kChunkHeaderBytes;
    const uint64_t end = begin + psmd::shm::SendArena::Footprint(bytes);
    Check(*off >= kArenaOffset + kChunkHeaderBytes && end <= kArenaBytes);
    for (const auto& [b, e] : live) Check(end <= b || begin >= e);
    live.emplace_back(begin, end);
    reached.allocations++;
  }
}

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
  int fd = WriteStateFile({body.bytes()}, "fuzz", &error);
  std::string file(4096, '\0');
  file.resize(static_cast<size_t>(pread(fd, &file[0], file.size(), 0)));
  close(fd);
  seeds.push_back(std::string(1, '\0') + file);
  seeds.push_back(std::string(1, '\4') + file);
  CarriedFabric fabric;
  fabric.present = true;
  fabric.incarnation = 0x1234567890abcdefull;
  fabric.host_description = "7@127.0.0.2:4000";
  for (uint64_t node : {2, 3}) {
    psmd::hw::CarriedSession s;
    s.id = node;
    s.node = node;
    s.outgoing = node == 2;
    s.addresses = {{"127.0.0." + std::to_string(node + 1), 4000}};
    s.peer_incarnation = 0x77 + node;
    s.tx_seq = 100 * node;
    s.rx_delivered = 90 * node;
    fabric.sessions.push_back(s);
  }
  StateWriter fw;
  fabric.Write(fw);
  seeds.push_back(std::string(1, '\2') + fw.bytes());
  auto pool = std::make_unique<ArenaPool>();
  psmd::shm::SendArena arena(pool->bytes, kArenaOffset, kArenaBytes, 0);
  for (uint64_t bytes : {100, 700, 40, 1500}) (void)arena.Allocate(bytes);
  StateWriter aw;
  WriteArenaState(aw, arena.Save());
  seeds.push_back(std::string(1, '\3') + aw.bytes() +
                  std::string("\x10\x40\x01\x90\x08", 5));
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
  // The envelope, from a file as the successor reads it: copied (0), or
  // sealed as psmd's own and read in place (4).
  if (data[0] == 0 || data[0] == 4) {
    int fd = memfd_create("fuzz", MFD_ALLOW_SEALING);
    Check(fd >= 0);
    Check(write(fd, data + 1, size - 1) == static_cast<ssize_t>(size - 1));
    const bool sealed = data[0] == 4 && size > 1;
    if (sealed) {
      Check(fcntl(fd, F_ADD_SEALS,
                  F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_WRITE) == 0);
    }
    StateFileBody body;
    psmd::Status s = ReadStateFile(fd, &body);  // closes fd
    Check(!s.ok() || body.mapped() == sealed);
    Check(s.ok() || body.size() == 0);
    (s.ok() ? reached.envelopes : reached.envelope_refused)++;
    reached.envelopes_in_place += s.ok() && body.mapped();
    Check(s.ok() || !s.message.empty());
    return 0;
  }
  if (data[0] == 2) {
    FuzzFabric(data + 1, size - 1);
    return 0;
  }
  if (data[0] == 3) {
    FuzzArena(data + 1, size - 1);
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
