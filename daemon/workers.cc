#include "daemon/workers.h"

#include <algorithm>

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

bool Workers::Start(std::string* error) {
  for (auto& w : workers_) {
    if (!w->Start(error)) return false;
  }
  return true;
}

void Workers::Stop() {
  for (auto& w : workers_) w->Stop();
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
