#include "daemon/progress.h"

#include "daemon/clock.h"

#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/sysinfo.h>
#include <systemd/sd-daemon.h>
#include <unistd.h>

#include <psm2.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <future>

#include <spdlog/spdlog.h>

#include "daemon/log.h"
#include "daemon/remote/remote.h"
#include "shm/doorbell.h"
#include "shm/epid.h"

namespace psmd {

namespace {

// Tags in epoll data: the worker's own wake fd, or an endpoint id.
constexpr uint64_t kWakeTag = 0;
constexpr uint64_t kFabricTag = UINT64_MAX;  // not an endpoint id (32 bits)
constexpr uint64_t kSecondNs = 1'000'000'000;
// Rings, not wake-ups: a flooding client rings ~10^5-10^6 times a second
// but wakes a worker that spins before sleeping only ~100 times, fewer
// under load, so counting wake-ups could not tell it from a busy client.
constexpr uint32_t kMaxIdleDoorbellsPerSecond = 1000;
constexpr uint64_t kMuteNs = 100'000'000;

}  // namespace

ProgressWorker::ProgressWorker(const Config& config, uint32_t shard,
                               Crossing* crossing)
    : engine_(config.max_unexpected_budget_bytes,
              config.job_unexpected_budget_bytes,
              config.uid_unexpected_budget_bytes),
      census_(static_cast<uint32_t>(get_nprocs_conf())),
      spin_us_(config.spin_us),
      copy_in_place_(config.copy_in_place != "off"),
      copy_min_bytes_(config.copy_min_bytes),
      copy_after_us_(config.copy_after_us),
      shard_(shard),
      crossing_(crossing) {
  engine_.SetPostedLimits(config.max_posted_recvs_per_job,
                          config.max_posted_recvs_per_uid);
  // Made here, not in Start: the other shards' workers may push to this one
  // (and read its fd) as soon as they run.
  wake_fd_ = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (crossing_ != nullptr) {
    engine_.JoinShards(crossing_, shard_);
    crossing_->SetWakeFd(shard_, wake_fd_);
  }
}

ProgressWorker::~ProgressWorker() {
  Stop();
  if (epoll_fd_ >= 0) close(epoll_fd_);
  if (wake_fd_ >= 0) close(wake_fd_);
}

bool ProgressWorker::Start(std::string* error) {
  role_.AssertHeld();  // the worker thread starts at the end
  epoll_fd_ = epoll_create1(EPOLL_CLOEXEC);
  if (epoll_fd_ < 0 || wake_fd_ < 0) {
    *error = std::string("progress worker: ") + strerror(errno);
    return false;
  }
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.u64 = kWakeTag;
  epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, wake_fd_, &ev);
  if (remote_ != nullptr) {
    // The ring's eventfd: an idle worker sleeps until a frame arrives.
    epoll_event fev{};
    fev.events = EPOLLIN;
    fev.data.u64 = kFabricTag;
    epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, remote_->event_fd(), &fev);
  }
  if (copy_in_place_) {
    // Without CAP_SYS_PTRACE psmd can still copy between processes of its
    // own uid; the others fall back to the pool one by one (EPERM).
    engine_.EnableCrossCopy([fd = wake_fd_] { shm::RingEventFd(fd); },
                            copy_min_bytes_, uint64_t{copy_after_us_} * 1000);
    spdlog::info(
        "rendezvous transfers of {} bytes or more that stall for {} us are "
        "copied in place{}",
        copy_min_bytes_, copy_after_us_,
        CrossCopier::Permitted()
            ? ""
            : " where permitted (no CAP_SYS_PTRACE: only processes of "
              "psmd's own uid)");
  }
  start_ns_ = NowNs();
  last_turn_ns_.store(start_ns_, std::memory_order_relaxed);
  thread_ = std::thread([this] { Loop(); });
  native_thread_ = thread_.native_handle();
  // Named so that operators (top -H) and tests can find it.
  const std::string name =
      shard_ == 0 ? kThreadName : kThreadName + std::to_string(shard_);
  pthread_setname_np(thread_.native_handle(), name.c_str());
  if (pin_cpu_ >= 0) {
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(pin_cpu_, &set);
    if (int err =
            pthread_setaffinity_np(thread_.native_handle(), sizeof(set), &set);
        err != 0) {
      spdlog::warn(
          "worker {}: cannot pin it to CPU {} ({}); it runs unpinned: check "
          "worker_cpus against the CPUs psmd may use (systemd's "
          "CPUAffinity=, Slurm's CpuSpecList)",
          shard_, pin_cpu_, strerror(err));
    }
  }
  return true;
}

ProgressWorker::Load ProgressWorker::load() const {
  Load l;
  clockid_t clock;
  timespec ts{};
  if (thread_.joinable() &&
      pthread_getcpuclockid(native_thread_, &clock) == 0 &&
      clock_gettime(clock, &ts) == 0) {
    l.cpu_ns = uint64_t(ts.tv_sec) * 1'000'000'000 + uint64_t(ts.tv_nsec);
  }
  l.endpoints = endpoints_.load(std::memory_order_relaxed);
  // Single-writer Counters of the engine (relaxed loads): the part of it
  // another thread may read, as placement() does.
  const MqEngine::ShardCounters c = engine_.shard_counters();
  l.submissions = c.submissions;
  l.cross_in = c.cross_in;
  l.cross_out = c.cross_out;
  l.busy_ns = busy_ns_.load(std::memory_order_relaxed);
  l.wall_ns = start_ns_ == 0 ? 0 : NowNs() - start_ns_;
  return l;
}

void ProgressWorker::EnableWatchdog(uint64_t interval_us,
                                    std::function<bool()> others_turning) {
  others_turning_ = std::move(others_turning);
  // A quarter of the interval: a ping may come up to one clock check and
  // one sleep late and still be on time.
  watchdog_ping_ns_ = std::max<uint64_t>(interval_us * 1000 / 4, 1'000'000);
}

void ProgressWorker::NoteTurn(uint64_t now_ns) {
  last_turn_ns_.store(now_ns, std::memory_order_relaxed);
  if (now_ns - last_stall_check_ns_ >= kSecondNs) {
    last_stall_check_ns_ = now_ns;
    engine_.ReportBudgetStalls(now_ns);
  }
  if (watchdog_ping_ns_ == 0 || now_ns - last_ping_ns_ < watchdog_ping_ns_)
    return;
  // One worker pings for all: not while another is stuck.
  if (others_turning_ && !others_turning_()) return;
  last_ping_ns_ = now_ns;
  sd_notify(0, "WATCHDOG=1");
}

void ProgressWorker::Stop() {
  if (!thread_.joinable()) return;
  stop_.store(true);
  shm::RingEventFd(wake_fd_);
  thread_.join();
}

void ProgressWorker::EndCopies() {
  RunSync([&]() PSMD_REQUIRES(role_) { engine_.EndCopies(); });
}

void ProgressWorker::RunSync(std::function<void()> fn) {
  if (!thread_.joinable() || stop_.load()) {
    fn();  // no worker thread (shutting down): nothing runs concurrently
    return;
  }
  std::promise<void> done;
  auto future = done.get_future();
  {
    MutexLock lock(&mu_);
    commands_.push_back([&] {
      fn();
      done.set_value();
    });
    commands_pending_.store(true, std::memory_order_release);
  }
  shm::RingEventFd(wake_fd_);
  future.wait();
}

void ProgressWorker::AddEndpoint(std::shared_ptr<Endpoint> ep) {
  RunSync([&]() PSMD_REQUIRES(role_) {
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.u64 = ep->id();
    epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, ep->doorbell_fd(), &ev);
    engine_.Add(std::move(ep));
  });
  endpoints_.fetch_add(1, std::memory_order_relaxed);
}

void ProgressWorker::Freeze() {
  RunSync([&]() PSMD_REQUIRES(role_) { frozen_ = true; });
}

void ProgressWorker::Thaw() {
  RunSync([&]() PSMD_REQUIRES(role_) { frozen_ = false; });
}

bool ProgressWorker::Drain() {
  bool quiesced = false;
  RunSync([&]() PSMD_REQUIRES(role_) {
    // A pass that moved anything may have handed another shard an item
    // after it said it was quiesced: only a round in which no shard moved
    // anything counts (Workers::FreezeAndSave).
    bool did = engine_.PollQuiescing();
    bool remote_quiet = true;
    if (remote_ != nullptr) {
      // Acks for what this psmd sent, and what peers send meanwhile, are
      // handled as ever: only the clients' rings wait.
      if (remote_->Poll()) {
        did = true;
        drain_why_ = "frames from other nodes still arriving (last: " +
                     remote_->LastActivity() + ")";
      } else {
        remote_quiet = remote_->Carriable(&drain_why_);
      }
      engine_.FlushAcross();
    }
    engine_.NotifyClients();
    quiesced = !did && remote_quiet && engine_.Quiesced();
  });
  return quiesced;
}

std::string ProgressWorker::drain_why() {
  std::string why;
  RunSync([&]() PSMD_REQUIRES(role_) { why = drain_why_; });
  return why;
}

void ProgressWorker::SaveRemote(handover::StateWriter& w) {
  RunSync([&]() PSMD_REQUIRES(role_) { remote_->SaveState(w); });
}

bool ProgressWorker::ExportFabric(handover::CarriedFabric* out,
                                  std::string* why) {
  bool ok = false;
  RunSync([&]() PSMD_REQUIRES(role_) {
    hw::Fabric& f = remote_->fabric();
    out->present = true;
    out->incarnation = f.Incarnation();
    out->host_description = f.HostDescription();
    ok = f.ExportSessions(&out->sessions, why);
  });
  return ok;
}

Status ProgressWorker::LoadRemote(
    handover::StateReader& r, const std::map<hw::ConnId, uint64_t>& sessions) {
  Status status;
  RunSync(
      [&]() PSMD_REQUIRES(role_) { status = remote_->LoadState(r, sessions); });
  return status;
}

void ProgressWorker::HoldPeers(bool hold) {
  RunSync([&]() PSMD_REQUIRES(role_) { remote_->HoldPeers(hold); });
}

bool ProgressWorker::PeersHeld() {
  bool held = false;
  RunSync([&]() PSMD_REQUIRES(role_) { held = remote_->PeersHeld(); });
  return held;
}

void ProgressWorker::SetBootNonce(uint16_t nonce) {
  RunSync([&]() PSMD_REQUIRES(role_) {
    if (remote_ != nullptr) remote_->set_boot_nonce(nonce);
  });
}

void ProgressWorker::CloseSessions(
    const std::vector<hw::CarriedSession>& sessions) {
  RunSync([&]() PSMD_REQUIRES(role_) {
    for (const hw::CarriedSession& s : sessions) remote_->fabric().Close(s.id);
  });
}

void ProgressWorker::SaveState(handover::StateWriter& w) {
  RunSync([&]() PSMD_REQUIRES(role_) {
    w.Reserve(w.bytes().size() + engine_.StateBytesHint());
    engine_.SaveState(w);
  });
}

Status ProgressWorker::LoadState(handover::StateReader& r) {
  Status status;
  RunSync([&]() PSMD_REQUIRES(role_) { status = engine_.LoadState(r); });
  return status;
}

void ProgressWorker::RemoveEndpoint(uint32_t id) {
  RunSync([&]() PSMD_REQUIRES(role_) {
    for (Endpoint* ep : engine_.endpoints()) {
      if (ep->id() != id) continue;
      auto watch = doorbell_watch_.find(id);
      if (watch != doorbell_watch_.end() && watch->second.muted_until_ns != 0) {
        muted_doorbells_--;  // already out of epoll
      } else {
        epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, ep->doorbell_fd(), nullptr);
      }
    }
    doorbell_watch_.erase(id);
    if (engine_.FindEndpoint(id) != nullptr) {
      endpoints_.fetch_sub(1, std::memory_order_relaxed);
    }
    engine_.Remove(id);
    engine_.NotifyClients();  // sync senders told about a vanished receiver
  });
}

void ProgressWorker::SetPeer(uint32_t id, uint32_t slot, const PeerLink& link) {
  RunSync([&]() PSMD_REQUIRES(role_) { engine_.SetPeer(id, slot, link); });
}

void ProgressWorker::ClearPeer(uint32_t id, uint32_t slot) {
  RunSync([&]() PSMD_REQUIRES(role_) { engine_.ClearPeer(id, slot); });
}

void ProgressWorker::EnableFabric(std::unique_ptr<hw::Fabric> fabric,
                                  const Config& config, uint16_t boot_nonce) {
  role_.AssertHeld();  // before Start
  fabric_host_ = fabric->HostDescription();
  fabric_backend_ = config.fabric;
  fabric_provider_ = fabric->Provider();
  fabric_sessions_ = config.fabric_sessions == "on";
  remote_ = std::make_unique<Remote>(
      &engine_, std::move(fabric), config.node_id, boot_nonce,
      config.fabric_nodes, config.fabric_timeout_ms);
  engine_.AttachRemote(remote_.get());
  fabric_timeout_ms_ = config.fabric_timeout_ms;
}

void ProgressWorker::RouteFabricToShard0() {
  role_.AssertHeld();  // before Start
  engine_.RouteFabricToShard0();
}

void ProgressWorker::AddForeign(std::shared_ptr<Endpoint> ep) {
  RunSync([&]() PSMD_REQUIRES(role_) { engine_.AddForeign(std::move(ep)); });
}

std::vector<ProgressWorker::RemoteOutcome> ProgressWorker::QueryRemote(
    uint32_t id, const std::vector<uint64_t>& epids) {
  struct Shared {
    Mutex mu;
    CondVar cv;
    size_t left PSMD_GUARDED_BY(mu) = 0;
    std::vector<RemoteOutcome> out PSMD_GUARDED_BY(mu);
  };
  auto shared = std::make_shared<Shared>();
  {
    MutexLock lock(&shared->mu);
    shared->out.resize(epids.size());
    shared->left = epids.size();
    for (auto& o : shared->out) {
      o.error = PSM2_TIMEOUT;
      o.message = "psmd's progress worker did not get an answer in time";
    }
  }
  RunSync([&]() PSMD_REQUIRES(role_) {
    Endpoint* ep = engine_.FindAny(id);  // of any shard (invariant 12)
    for (size_t i = 0; i < epids.size(); i++) {
      auto done = [shared, i](int error, const std::string& why) {
        MutexLock lock(&shared->mu);
        shared->out[i].error = error;
        shared->out[i].message = why;
        shared->left--;
        shared->cv.NotifyAll();
      };
      if (ep == nullptr || remote_ == nullptr) {
        done(PSM2_EPID_UNREACHABLE, "no fabric to other nodes");
        continue;
      }
      // After Query, which reads the node table again for a new node.
      remote_->Query(*ep, epids[i], done);
      std::string host = remote_->HostName(shm::NodeIdOf(epids[i]));
      MutexLock lock(&shared->mu);
      shared->out[i].host = std::move(host);
    }
  });
  const auto deadline = std::chrono::steady_clock::now() +
                        std::chrono::milliseconds(fabric_timeout_ms_ + 1000);
  MutexLock lock(&shared->mu);
  while (shared->left > 0 && shared->cv.WaitUntil(&shared->mu, deadline)) {
  }
  return shared->out;
}

std::vector<Remote::PeerRow> ProgressWorker::FabricStats() {
  std::vector<Remote::PeerRow> out;
  if (remote_ == nullptr) return out;
  RunSync([&]() PSMD_REQUIRES(role_) { out = remote_->Stats(); });
  return out;
}

uint64_t ProgressWorker::LastTurnAgeNs() const {
  uint64_t now = NowNs();
  uint64_t last = last_turn_ns_.load(std::memory_order_relaxed);
  return now > last ? now - last : 0;
}

void ProgressWorker::RunCommands() {
  std::deque<std::function<void()>> batch;
  {
    MutexLock lock(&mu_);
    batch.swap(commands_);
    commands_pending_.store(false, std::memory_order_relaxed);
  }
  for (auto& fn : batch) fn();
}

void ProgressWorker::Loop() {
  role_.Play();
  uint64_t last_work = NowNs();
  uint32_t idle_passes = 0;
  uint32_t busy_passes = 0;
  // Pause rather than yield on an idle pass: work is likely soon and no
  // client polls on our core (shm/spin.h).
  bool pause = false;
  // When the current stretch with work began (0: idle), for busy_ns_.
  uint64_t busy_since = 0;
  while (!stop_.load(std::memory_order_relaxed)) {
    if (commands_pending_.load(std::memory_order_acquire)) RunCommands();
    if (frozen_) {
      // Handing over: the rings are the successor's. Wait for commands.
      pollfd p{wake_fd_, POLLIN, 0};
      poll(&p, 1, 100);
      uint64_t rings;
      (void)!read(wake_fd_, &rings, sizeof(rings));  // EAGAIN: the timeout
      continue;
    }
    bool did = engine_.PollAll();
    if (remote_ != nullptr) {
      did |= remote_->Poll();
      engine_.FlushAcross();  // frames for other shards' endpoints
    }
    engine_.NotifyClients();
    if (did) {
      // A clock read only when work starts after an idle stretch.
      if (busy_since == 0) busy_since = NowNs();
      idle_passes = 0;
      pause = true;  // even on a shared core: see CoreWanted
      if (++busy_passes % kHeartbeatPasses == 0) NoteTurn(NowNs());
      continue;
    }
    // Reading the clock and counting pollers cost more than a pass over a
    // few rings; do both only every so often.
    if (++idle_passes % 64 != 0) {
      if (pause && !(share_core_ && CoreWanted())) {
        shm::CpuRelax();
      } else {
        // The client we wait for, or another thread, may need this core.
        sched_yield();
        yields_.Add(1);
      }
      continue;
    }
    uint64_t now = NowNs();
    NoteTurn(now);
    if (busy_since != 0) {
      busy_ns_.fetch_add(now - busy_since, std::memory_order_relaxed);
      busy_since = 0;
    }
    if (muted_doorbells_ > 0) ResumeMutedDoorbells(now);
    if (idle_passes == 64) last_work = now;
    const uint32_t cpu_word = shm::CurrentCpuWord();
    share_core_ = CountPollers(cpu_word);
    cpu_.store(static_cast<int32_t>(cpu_word) - 1, std::memory_order_relaxed);
    core_checks_.Add(1);
    if (share_core_) core_shared_.Add(1);
    pause = !share_core_ && now - last_work < shm::kPauseWindowNs;
    const uint64_t spin_ns =
        uint64_t{spin_us_.load(std::memory_order_relaxed)} * 1000;
    if (now - last_work < spin_ns) continue;
    CountPollers(0);  // asleep, the worker is no poller to make room for
    Sleep();
    idle_passes = 0;
  }
  // Drain commands still waiting so no control thread blocks forever.
  RunCommands();
}

bool ProgressWorker::CoreWanted() {
  const auto& eps = engine_.endpoints();
  for (size_t i : census_.colocated()) {
    // (An index from before an endpoint came or went names another one
    // until the next count: a hint, like the census itself.)
    if (i >= eps.size()) continue;
    if (MqEngine::CompletionsUnreaped(*eps[i]) ||
        eps[i]->control()->spin.client_blocked.load(
            std::memory_order_relaxed) != 0) {
      return true;
    }
  }
  return false;
}

bool ProgressWorker::CountPollers(uint32_t own_cpu) {
  const auto& eps = engine_.endpoints();
  return census_.Refresh(
      eps.size(), [&](size_t i) { return &eps[i]->control()->spin; }, own_cpu);
}

void ProgressWorker::NoteIdleDoorbell(Endpoint& ep, uint64_t rings,
                                      uint64_t now_ns) {
  DoorbellWatch& watch = doorbell_watch_[ep.id()];
  if (now_ns - watch.window_ns >= kSecondNs) {
    watch.window_ns = now_ns;
    watch.idle_rings = 0;
  }
  // A client rings only when it published something and saw us asleep,
  // at most once per publication and per sleep of ours; a few rings find
  // nothing because we took the work first. A thousand a second are a
  // client ringing for nothing.
  watch.idle_rings = static_cast<uint32_t>(
      std::min<uint64_t>(uint64_t{watch.idle_rings} + rings, UINT32_MAX));
  if (watch.idle_rings < kMaxIdleDoorbellsPerSecond ||
      watch.muted_until_ns != 0) {
    return;
  }
  epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, ep.doorbell_fd(), nullptr);
  watch.muted_until_ns = now_ns + kMuteNs;
  muted_doorbells_++;
  WarnClient(ep.uid(),
             "endpoint {} (pid {}, uid {}) rings its doorbell with nothing "
             "submitted ({} in under a second); not listening to it for {} ms "
             "at a time",
             ep.id(), ep.pid(), ep.uid(), watch.idle_rings,
             kMuteNs / 1'000'000);
}

int ProgressWorker::ResumeMutedDoorbells(uint64_t now_ns) {
  if (muted_doorbells_ == 0) return -1;
  uint64_t next = UINT64_MAX;
  for (Endpoint* ep : engine_.endpoints()) {
    auto watch = doorbell_watch_.find(ep->id());
    if (watch == doorbell_watch_.end()) continue;
    uint64_t& muted_until_ns = watch->second.muted_until_ns;
    if (muted_until_ns == 0) continue;
    if (now_ns >= muted_until_ns) {
      muted_until_ns = 0;
      muted_doorbells_--;
      epoll_event ev{};
      ev.events = EPOLLIN;
      ev.data.u64 = ep->id();
      epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, ep->doorbell_fd(), &ev);
    } else {
      next = std::min(next, muted_until_ns);
    }
  }
  if (next == UINT64_MAX) return -1;
  return static_cast<int>((next - now_ns) / 1'000'000) + 1;
}

void ProgressWorker::Sleep() {
  const auto& eps = engine_.endpoints();
  for (Endpoint* ep : eps) {
    shm::SetDaemonSleeping(ep->control()->doorbells, true);
  }
  if (crossing_ != nullptr) crossing_->SetSleeping(shard_, true);
  shm::WakeupFence();  // the flags before the re-check (shm/doorbell.h)
  Remote* remote = remote_.get();
  // The fabric's eventfd count is sticky: a frame after this Poll still
  // wakes epoll_wait.
  bool work = engine_.AnySubmissionPending() || engine_.copies_done() ||
              commands_pending_.load(std::memory_order_acquire) ||
              stop_.load() || (remote != nullptr && remote->Poll()) ||
              (crossing_ != nullptr && engine_.CrossingPending());
  if (remote != nullptr) engine_.FlushAcross();  // what that Poll pushed
  if (!work) {
    sleeps_.fetch_add(1, std::memory_order_relaxed);
    epoll_event events[64];
    int n;
    // Bounded, so that an idle worker still turns (LastTurnAgeNs).
    int timeout_ms = ResumeMutedDoorbells(NowNs());
    if (timeout_ms < 0 || timeout_ms > kMaxSleepMs) timeout_ms = kMaxSleepMs;
    if (remote != nullptr && remote->SleepLimitMs() >= 0) {
      timeout_ms = std::min(timeout_ms, remote->SleepLimitMs());
    }
    if (engine_.takeovers_pending()) {  // look for stalled transfers
      timeout_ms = std::min<int>(timeout_ms,
                                 static_cast<int>(copy_after_us_ / 1000) + 1);
    }
    // A budget another shard may free, or a lane that was full: that shard
    // does not wake us for either (mq_engine.h, invariant 11).
    if (crossing_ != nullptr &&
        (engine_.OutboxWaiting() || engine_.HeldForBudget())) {
      timeout_ms = std::min(timeout_ms, 1);
    }
    if (watchdog_ping_ns_ != 0) {  // wake to ping even when no client rings
      timeout_ms =
          std::min(timeout_ms, static_cast<int>(watchdog_ping_ns_ / 1'000'000));
    }
    do {
      n = epoll_wait(epoll_fd_, events, 64, timeout_ms);
    } while (n < 0 && errno == EINTR);
    const uint64_t now = NowNs();
    NoteTurn(now);
    for (int i = 0; i < n; i++) {
      if (events[i].data.u64 == kWakeTag) {
        shm::DrainEventFd(wake_fd_);
        continue;
      }
      if (events[i].data.u64 == kFabricTag) {
        shm::DrainEventFd(remote->event_fd());
        continue;
      }
      doorbells_.fetch_add(1, std::memory_order_relaxed);
      for (Endpoint* ep : eps) {
        if (ep->id() != events[i].data.u64) continue;
        uint64_t rings = shm::DrainEventFd(ep->doorbell_fd());
        if (engine_.DoorbellIdle(*ep)) NoteIdleDoorbell(*ep, rings, now);
      }
    }
  }
  for (Endpoint* ep : engine_.endpoints()) {
    shm::SetDaemonSleeping(ep->control()->doorbells, false);
  }
  if (crossing_ != nullptr) crossing_->SetSleeping(shard_, false);
}

}  // namespace psmd
