#include "daemon/workers.h"

#include <algorithm>
#include <chrono>
#include <thread>

#include <spdlog/spdlog.h>

namespace psmd {

Workers::Workers(const Config& config, uint32_t count) : crossing_(count) {
  for (uint32_t shard = 0; shard < count; shard++) {
    workers_.push_back(std::make_unique<ProgressWorker>(
        config, shard, count > 1 ? &crossing_ : nullptr));
  }
}

Workers::~Workers() { Stop(); }

void Workers::SetCpus(const std::vector<int>& cpus) {
  if (cpus.empty()) return;
  for (uint32_t i = 0; i < count(); i++) {
    workers_[i]->SetCpu(cpus[i % cpus.size()]);
  }
}

void Workers::EnableWatchdog(uint64_t interval_us) {
  const uint64_t stuck_ns = interval_us * 1000 / 2;
  workers_[0]->EnableWatchdog(interval_us, [this, stuck_ns] {
    return std::all_of(workers_.begin() + 1, workers_.end(),
                       [&](auto& w) { return w->LastTurnAgeNs() < stuck_ns; });
  });
}

void Workers::EnableFabric(std::unique_ptr<hw::Fabric> fabric,
                           const Config& config, uint16_t boot_nonce) {
  at(0).EnableFabric(std::move(fabric), config, boot_nonce);
  for (uint32_t shard = 1; shard < count(); shard++) {
    at(shard).RouteFabricToShard0();
  }
}

bool Workers::Start(std::string* error) {
  for (auto& w : workers_) {
    if (!w->Start(error)) return false;
  }
  return true;
}

void Workers::Stop() {
  for (auto& w : workers_) w->Stop();
  // Before any engine goes (ProgressWorker::EndCopies).
  for (auto& w : workers_) w->EndCopies();
}

void Workers::Freeze() {
  for (auto& w : workers_) w->Freeze();
}

void Workers::Thaw() {
  for (auto& w : workers_) w->Thaw();
}

void Workers::AwaitPeersHeld() {
  const auto start = Clock::now();
  while (!workers_[0]->PeersHeld() && Clock::now() - start < kHoldWait) {
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
}

Status Workers::FreezeAndSave(handover::StateWriter& w, uint32_t timeout_ms,
                              handover::CarriedFabric* fabric) {
  const bool fabric_here = workers_[0]->has_fabric();
  const auto start = Clock::now();
  if (fabric_here) {
    // The peers hold their messages to this node's endpoints first, while
    // the clients still run (not part of the blackout): the drain then
    // settles once what was in flight has arrived. (Frames parked here for
    // receivers that post nothing are carried, not waited for.)
    workers_[0]->HoldPeers(true);
    AwaitPeersHeld();
  }
  // Serving on after a failure: the peers send again.
  auto thaw = [&] {
    Thaw();
    if (fabric_here) workers_[0]->HoldPeers(false);
  };
  Freeze();
  // A shard's drain may hand items to another, so a round counts only when
  // every shard was quiesced in it.
  const auto deadline = start + std::chrono::milliseconds(timeout_ms);
  auto next_note = Clock::now() + std::chrono::seconds(1);
  for (;;) {
    bool all = true;
    for (auto& worker : workers_) all &= worker->Drain();
    if (all) break;
    const auto now = Clock::now();
    if (now > next_note && workers_[0]->has_fabric()) {
      next_note = now + std::chrono::seconds(1);
      spdlog::info("handover: waiting between nodes: {}",
                   workers_[0]->drain_why());
    }
    if (now > deadline) {
      const std::string remote =
          workers_[0]->has_fabric()
              ? "; between nodes: " + workers_[0]->drain_why()
              : std::string();
      thaw();
      return {PSM2_TIMEOUT,
              "the engine shards did not settle within " +
                  std::to_string(timeout_ms) +
                  " ms (copies in place or messages between shards still "
                  "moving" +
                  remote + "); psmd goes on serving, try again"};
    }
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  for (auto& worker : workers_) {
    const size_t at = w.BeginSection(handover::kEngineSection);
    worker->SaveState(w);
    w.EndSection(at);
  }
  if (fabric_here) {
    const size_t at = w.BeginSection(handover::kRemoteSection);
    workers_[0]->SaveRemote(w);
    w.EndSection(at);
    // Last: from here on the fabric is the successor's.
    std::string why;
    if (!workers_[0]->ExportFabric(fabric, &why)) {
      thaw();
      return {PSM2_INTERNAL_ERR,
              "the fabric's sessions cannot be handed over: " + why +
                  "; psmd goes on serving, try again"};
    }
  }
  return {};
}

void Workers::CloseSessions(const std::vector<hw::CarriedSession>& sessions) {
  if (workers_[0]->has_fabric()) workers_[0]->CloseSessions(sessions);
}

Status Workers::LoadState(handover::StateReader& r, bool fabric_carried,
                          const std::map<hw::ConnId, uint64_t>& sessions) {
  for (uint32_t shard = 0; shard < count(); shard++) {
    handover::StateReader body;
    if (!r.Section(handover::kEngineSection, &body, "engine shard")) {
      return {PSM2_INTERNAL_ERR, r.error()};
    }
    if (Status s = workers_[shard]->LoadState(body); !s.ok()) {
      s.message = "engine shard " + std::to_string(shard) + ": " + s.message;
      return s;
    }
    if (!body.AtEnd()) {
      return {PSM2_INTERNAL_ERR, "engine shard " + std::to_string(shard) +
                                     ": " + std::to_string(body.Left()) +
                                     " bytes left unread"};
    }
  }
  if (!fabric_carried) return {};
  if (!workers_[0]->has_fabric()) {
    return {PSM2_INTERNAL_ERR,
            "the old psmd served a fabric and this one has none "
            "(fabric_listen)"};
  }
  handover::StateReader body;
  if (!r.Section(handover::kRemoteSection, &body, "fabric's engine")) {
    return {PSM2_INTERNAL_ERR, r.error()};
  }
  if (Status s = workers_[0]->LoadRemote(body, sessions); !s.ok()) return s;
  if (!body.AtEnd()) {
    return {PSM2_INTERNAL_ERR,
            "the fabric's engine: " + std::to_string(body.Left()) +
                " bytes left unread"};
  }
  return {};
}

void Workers::SetSpinUs(uint32_t spin_us) {
  for (auto& w : workers_) w->SetSpinUs(spin_us);
}

uint64_t Workers::doorbells() const {
  uint64_t n = 0;
  for (const auto& w : workers_) n += w->doorbells();
  return n;
}

uint64_t Workers::sleeps() const {
  uint64_t n = 0;
  for (const auto& w : workers_) n += w->sleeps();
  return n;
}

uint64_t Workers::LastTurnAgeNs() const {
  uint64_t oldest = 0;
  for (const auto& w : workers_) oldest = std::max(oldest, w->LastTurnAgeNs());
  return oldest;
}

}  // namespace psmd
