// A progress worker: the thread that consumes submission rings, runs the
// matched-queue engine and publishes completions, and that sleeps when there
// is nothing to do.
//
// Wake-up protocol (docs/design.md): after `spin_us` without work the worker
// sets every endpoint's daemon_sleeping word, fences, re-checks all rings,
// and sleeps in epoll on the endpoints' doorbell eventfds. A client that
// publishes a submission, fences and then sees daemon_sleeping == 1 rings its
// eventfd. Either the worker's re-check sees the submission or the client
// sees the flag, never neither.
//
// Thread-safety: the public methods may be called from any thread; they hand
// the work to the worker thread through a command queue and wait for it, so
// the worker's hot loop takes no lock (it checks one atomic flag per pass).
// What only the worker's thread touches (the engine, the inter-node engine,
// the doorbell bookkeeping) is PSMD_GUARDED_BY its thread role (role_,
// base/thread_role.h), and the functions that run there PSMD_REQUIRES it:
// the thread-safety build rejects any other code that reaches for them.
#ifndef PSMD_DAEMON_PROGRESS_H_
#define PSMD_DAEMON_PROGRESS_H_

#include <pthread.h>

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "base/mutex.h"
#include "base/thread_role.h"
#include "daemon/config.h"
#include "daemon/engine/endpoint.h"
#include "daemon/engine/mq_engine.h"
#include "daemon/handover/handover.h"
#include "daemon/handover/state_codec.h"
#include "daemon/remote/remote.h"
#include "hw/fabric.h"
#include "shm/spin.h"

namespace psmd {

class ProgressWorker {
 public:
  // Shard `shard` of crossing->shards() (daemon/workers.h), or the only one.
  explicit ProgressWorker(const Config& config, uint32_t shard = 0,
                          Crossing* crossing = nullptr);
  ~ProgressWorker();  // stops the thread
  ProgressWorker(const ProgressWorker&) = delete;
  ProgressWorker& operator=(const ProgressWorker&) = delete;

  // Before Start: send systemd WATCHDOG=1 from the worker's loop at least
  // every interval_us / 4, so that pings stop when this thread is stuck,
  // or when `others_turning` says another worker is.
  void EnableWatchdog(uint64_t interval_us,
                      std::function<bool()> others_turning = {});
  // Before Start: the CPU the worker's thread is pinned to (-1: none).
  void SetCpu(int cpu) { pin_cpu_ = cpu; }
  uint32_t shard() const { return shard_; }
  bool Start(std::string* error);
  void Stop();
  // After Stop: ends the engine's copies in place (its copier thread). A
  // copy may read an endpoint of another shard, which that shard's engine
  // frees when it goes: every shard's copies end before any engine does.
  void EndCopies();
  // Takes effect at the worker's next idle stretch (SIGHUP reload).
  void SetSpinUs(uint32_t spin_us) {
    spin_us_.store(spin_us, std::memory_order_relaxed);
  }

  void AddEndpoint(std::shared_ptr<Endpoint> ep);
  void RemoveEndpoint(uint32_t id);
  void SetPeer(uint32_t id, uint32_t slot, const PeerLink& link);
  void ClearPeer(uint32_t id, uint32_t slot);

  // ---- Handover (issue 33; daemon/handover/handover.h) ----
  // Stops reading the clients' rings: from the next pass on the worker only
  // runs commands (a frozen worker still wakes for RunSync). Rings keep
  // what clients publish meanwhile; the successor reads it.
  void Freeze();
  // Reads the rings again (a successor, once its state is loaded).
  void Thaw();
  // One pass of the work that needs no client ring (items from other
  // shards, the outbox, copies in place, and with a fabric its events),
  // frozen; true when it moved nothing and neither the engine nor the
  // fabric's engine holds anything the state cannot carry
  // (MqEngine::PollQuiescing, Quiesced; Remote::Carriable, whose reason
  // drain_why() keeps).
  bool Drain();
  std::string drain_why();
  // The engine's state, frozen and drained (MqEngine::SaveState).
  void SaveState(handover::StateWriter& w);
  // Into a frozen worker whose endpoints were added: MqEngine::LoadState.
  Status LoadState(handover::StateReader& r);
  // With a fabric, drained: the fabric's engine's state (Remote::SaveState),
  // then the fabric's sessions, which hands the fabric over (false with
  // *why: nothing was handed over). LoadRemote in the successor, after
  // every shard's LoadState; CloseSessions ends the adopted sessions of a
  // state refused (their peers fail what waits on this node).
  void SaveRemote(handover::StateWriter& w);
  bool ExportFabric(handover::CarriedFabric* out, std::string* why);
  Status LoadRemote(handover::StateReader& r,
                    const std::map<hw::ConnId, uint64_t>& sessions);
  void CloseSessions(const std::vector<hw::CarriedSession>& sessions);
  // Remote::HoldPeers and PeersHeld (shard 0's), before the freeze.
  void HoldPeers(bool hold);
  bool PeersHeld();
  // The epids' boot nonce, as the registry has it after a takeover.
  void SetBootNonce(uint16_t nonce);

  // Before Start: serve endpoints of other nodes through `fabric`
  // (daemon/remote/remote.h); its event fd joins the worker's epoll set.
  void EnableFabric(std::unique_ptr<hw::Fabric> fabric, const Config& config,
                    uint16_t boot_nonce);
  bool has_fabric() const { return remote_ != nullptr; }
  // Before Start, on a shard other than 0 when shard 0 has the fabric: this
  // shard's calls for other nodes cross to it (mq_engine.h, invariant 12).
  void RouteFabricToShard0();
  // On shard 0 with the fabric: endpoint `ep` of another shard is about to
  // be added there (MqEngine::AddForeign).
  void AddForeign(std::shared_ptr<Endpoint> ep);
  struct RemoteOutcome {
    int error = 0;  // psm2_error_t
    std::string message;
    std::string host;  // the node table's name of the epid's node, or ""
  };
  // Asks the daemons of the epids' nodes whether endpoint `id`'s job and
  // uid have those endpoints (psm2_ep_connect); waits at most the fabric
  // timeout and a second.
  std::vector<RemoteOutcome> QueryRemote(uint32_t id,
                                         const std::vector<uint64_t>& epids);
  // The fabric's per-peer-node counters (empty without a fabric).
  std::vector<Remote::PeerRow> FabricStats();
  // This node's host description ("" without a fabric); set before Start.
  const std::string& fabric_host() const { return fabric_host_; }
  const std::string& fabric_backend() const { return fabric_backend_; }
  const std::string& fabric_provider() const { return fabric_provider_; }
  bool fabric_sessions() const { return fabric_sessions_; }

  uint64_t doorbells() const {
    return doorbells_.load(std::memory_order_relaxed);
  }
  uint64_t sleeps() const { return sleeps_.load(std::memory_order_relaxed); }
  // What the worker did (psmctl stats, per worker; docs/operations.md): its
  // thread's CPU time, endpoints served, submissions consumed, messages
  // taken from and handed to other shards, and the time it had work (from
  // the first busy pass after an idle stretch to the 64th idle pass after
  // it, when the worker reads the clock anyway) beside the wall time since
  // it started. Any thread.
  struct Load {
    uint64_t cpu_ns = 0;
    uint32_t endpoints = 0;
    uint64_t submissions = 0;
    uint64_t cross_in = 0;
    uint64_t cross_out = 0;
    uint64_t busy_ns = 0;
    uint64_t wall_ns = 0;
  };
  Load load() const PSMD_NO_THREAD_SAFETY_ANALYSIS;
  // Where the worker runs (psmctl stats; docs/operations.md, "CPU
  // placement"). Every 64 idle passes it counts the pollers on its CPU:
  // `cpu` is that CPU at the last count (-1 before the first),
  // `core_checks` the counts made, `core_shared` those that found a client
  // polling there, `yields` its idle passes that gave the core away.
  struct Placement {
    int32_t cpu = -1;
    uint64_t core_checks = 0;
    uint64_t core_shared = 0;
    uint64_t yields = 0;
    MqEngine::SliceStats slices;  // MqEngine::slice_stats
  };
  // Any thread: the engine's part is its slice_stats, single-writer
  // Counters (relaxed loads), the one piece of the engine another thread
  // may read; the analysis cannot tell that member from the rest.
  Placement placement() const PSMD_NO_THREAD_SAFETY_ANALYSIS {
    return {cpu_.load(std::memory_order_relaxed), core_checks_.Get(),
            core_shared_.Get(), yields_.Get(), engine_.slice_stats()};
  }
  // Nanoseconds since the worker last went round its loop (psmctl health).
  // The worker notes the time every kHeartbeatPasses busy passes, on every
  // clock check when idle, and after every sleep, and sleeps at most
  // kMaxSleepMs, so a healthy worker's age stays near a second or below.
  uint64_t LastTurnAgeNs() const;

  // The worker thread's name (/proc/PID/task/TID/comm), so that an operator
  // or a test can find it.
  static constexpr char kThreadName[] = "psmd-progress";
  static constexpr int kMaxSleepMs = 1000;
  static constexpr uint32_t kHeartbeatPasses = 4096;

 private:
  // Runs fn on the worker thread and waits until it has run (fn is
  // PSMD_REQUIRES(role_): the one hand-over the analysis takes on trust).
  void RunSync(std::function<void()> fn);
  void Loop();
  void RunCommands() PSMD_REQUIRES(role_);
  void Sleep() PSMD_REQUIRES(role_);
  // Sets the endpoints' core_shared hints with the worker on own_cpu (a
  // client_cpu word; 0: not polling) and returns whether a client polls on
  // that CPU (shm/spin.h).
  bool CountPollers(uint32_t own_cpu) PSMD_REQUIRES(role_);
  // Whether a client polling on the worker's CPU has completions to reap or
  // submissions waiting for room (client_blocked): only then does a worker
  // that shares the core hand it over at once after work. Until then that
  // client waits for us (or for a peer elsewhere, whose answer we must carry),
  // and a yield would cost two core switches (3-5 us each here) for nothing;
  // after a few dozen idle passes the worker yields anyway, for whatever else
  // runs there (docs/design.md, "Spinning").
  bool CoreWanted() PSMD_REQUIRES(role_);
  // A doorbell of `ep`, rung `rings` times since we last drained it, woke
  // us with nothing submitted; past a rate, its doorbell leaves epoll for
  // kMuteNs. Its rings are still polled whenever the worker is awake.
  void NoteIdleDoorbell(Endpoint& ep, uint64_t rings, uint64_t now_ns)
      PSMD_REQUIRES(role_);
  // Puts muted doorbells whose time is over back into epoll; returns the ms
  // until the next one is due (-1: none muted), for epoll_wait's timeout.
  int ResumeMutedDoorbells(uint64_t now_ns) PSMD_REQUIRES(role_);
  // The worker turned: notes the time (LastTurnAgeNs), under systemd's
  // watchdog pings it at most every watchdog_ping_ns_, and about once a
  // second has the engine report receivers whose senders wait for good
  // (MqEngine::ReportBudgetStalls).
  void NoteTurn(uint64_t now_ns) PSMD_REQUIRES(role_);

  // The worker's thread, from the first line of Loop; setup before Start
  // plays it too (nothing else runs then).
  ThreadRole role_;
  MqEngine engine_ PSMD_GUARDED_BY(role_);
  // Endpoints on other nodes, beside the engine (which it is attached to);
  // null without a fabric. Set before Start; destroyed before the engine.
  std::unique_ptr<Remote> remote_ PSMD_PT_GUARDED_BY(role_);
  std::thread thread_;
  // The doorbells, the wake fd and the fabric's: made by Start, then the
  // worker's.
  int epoll_fd_ PSMD_GUARDED_BY(role_) = -1;
  int wake_fd_ = -1;  // eventfd: commands or stop pending

  Mutex mu_;
  std::deque<std::function<void()>> commands_ PSMD_GUARDED_BY(mu_);
  std::atomic<bool> commands_pending_{false};
  std::atomic<bool> stop_{false};
  // Set and cleared on the worker's thread (Freeze, Thaw run there); read
  // by the loop.
  bool frozen_ PSMD_GUARDED_BY(role_) = false;

  // A client ringing its doorbell with nothing submitted (NoteIdleDoorbell),
  // by endpoint id: its idle rings in the current second, and until when
  // it is not listened to.
  struct DoorbellWatch {
    uint32_t idle_rings = 0;
    uint64_t window_ns = 0;       // start of the current second
    uint64_t muted_until_ns = 0;  // 0: listened to
  };
  std::unordered_map<uint32_t, DoorbellWatch> doorbell_watch_
      PSMD_GUARDED_BY(role_);
  uint32_t muted_doorbells_ PSMD_GUARDED_BY(role_) = 0;
  // Pollers per CPU (shm/spin.h), and whether one of our clients polls on
  // the worker's CPU, so that an idle pass must yield rather than pause.
  // Yielding is the safe guess before the first count.
  shm::CoreCensus census_ PSMD_GUARDED_BY(role_);
  bool share_core_ PSMD_GUARDED_BY(role_) = true;
  uint32_t fabric_timeout_ms_ = 5000;
  // Why the last Drain found the fabric's engine not carriable.
  std::string drain_why_ PSMD_GUARDED_BY(role_);
  std::string fabric_host_;
  std::string fabric_backend_;    // config's fabric
  std::string fabric_provider_;   // hw::Fabric::Provider()
  bool fabric_sessions_ = false;  // config's fabric_sessions
  std::atomic<uint32_t> spin_us_;
  const bool copy_in_place_;  // Config::copy_in_place
  const uint64_t copy_min_bytes_;
  const uint32_t copy_after_us_;
  uint64_t watchdog_ping_ns_ = 0;         // 0: no watchdog; set before Start
  std::function<bool()> others_turning_;  // set before Start
  const uint32_t shard_;
  Crossing* const crossing_;  // null: the only worker
  int pin_cpu_ = -1;
  std::atomic<uint32_t> endpoints_{0};
  std::atomic<uint64_t> busy_ns_{0};
  uint64_t start_ns_ = 0;      // set by Start, before the thread runs
  pthread_t native_thread_{};  // set by Start: load() reads its CPU clock
  uint64_t last_ping_ns_ PSMD_GUARDED_BY(role_) = 0;
  uint64_t last_stall_check_ns_ PSMD_GUARDED_BY(role_) = 0;
  std::atomic<uint64_t> doorbells_{0};
  std::atomic<uint64_t> sleeps_{0};
  std::atomic<int32_t> cpu_{-1};  // written by the worker only
  Counter core_checks_;
  Counter core_shared_;
  Counter yields_;
  std::atomic<uint64_t> last_turn_ns_{0};  // steady clock
};

}  // namespace psmd

#endif  // PSMD_DAEMON_PROGRESS_H_
