#include "daemon/workers.h"

#include <algorithm>
#include <chrono>
#include <thread>

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

Status Workers::FreezeAndSave(handover::StateWriter& w, uint32_t timeout_ms) {
  Freeze();
  // A shard's drain may hand items to another, so a round counts only when
  // every shard was quiesced in it.
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  for (;;) {
    bool all = true;
    for (auto& worker : workers_) all &= worker->Drain();
    if (all) break;
    if (std::chrono::steady_clock::now() > deadline) {
      Thaw();
      return {PSM2_TIMEOUT,
              "the engine shards did not settle within " +
                  std::to_string(timeout_ms) +
                  " ms (copies in place or messages between shards still "
                  "moving); psmd goes on serving, try again"};
    }
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  for (auto& worker : workers_) {
    const size_t at = w.BeginSection(handover::kEngineSection);
    worker->SaveState(w);
    w.EndSection(at);
  }
  return {};
}

Status Workers::LoadState(handover::StateReader& r) {
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
