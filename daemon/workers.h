// Workers: psmd's engine shards (issue 38; docs/design.md, "Engine shards").
// One ProgressWorker per shard, each with its own engine, endpoints, sleep
// and wake-up, and the Crossing between them. The registry places an
// endpoint on a shard at open (it picks the id: MqEngine::ShardOf); every
// call about an endpoint goes to its shard's worker. Shard 0 owns the fabric
// to other nodes: the other shards' endpoints are made known to it as they
// are added, and their calls for other nodes cross to it (mq_engine.h,
// invariant 12).
//
// Thread-safety: as ProgressWorker's: the public methods may be called from
// any thread once Start returned; Enable* and SetCpus before Start.
#ifndef PSMD_DAEMON_WORKERS_H_
#define PSMD_DAEMON_WORKERS_H_

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "daemon/config.h"
#include "daemon/engine/crossing.h"
#include "daemon/handover/handover.h"
#include "daemon/progress.h"

namespace psmd {

class Workers {
 public:
  // `count` workers (WorkerCount(config)).
  Workers(const Config& config, uint32_t count);
  ~Workers();  // stops them
  Workers(const Workers&) = delete;
  Workers& operator=(const Workers&) = delete;

  uint32_t count() const { return static_cast<uint32_t>(workers_.size()); }
  ProgressWorker& at(uint32_t shard) { return *workers_[shard]; }
  const ProgressWorker& at(uint32_t shard) const { return *workers_[shard]; }
  // The worker that serves endpoint `id`.
  ProgressWorker& of(uint32_t id) {
    return *workers_[MqEngine::ShardOf(id, count())];
  }

  // Before Start: worker i pinned to cpus[i % cpus.size()] (none if empty).
  void SetCpus(const std::vector<int>& cpus);
  // Before Start: systemd's watchdog, pinged by worker 0 while every worker
  // turns.
  void EnableWatchdog(uint64_t interval_us);
  bool Start(std::string* error);
  void Stop();
  void SetSpinUs(uint32_t spin_us);

  // Before Start: shard 0 serves endpoints of other nodes through `fabric`,
  // for every shard.
  void EnableFabric(std::unique_ptr<hw::Fabric> fabric, const Config& config,
                    uint16_t boot_nonce);

  void AddEndpoint(std::shared_ptr<Endpoint> ep) {
    // Known to the fabric's shard before a frame can name it.
    if (count() > 1 && has_fabric() && MqEngine::ShardOf(ep->id(), count()))
      at(0).AddForeign(ep);
    of(ep->id()).AddEndpoint(std::move(ep));
  }
  void RemoveEndpoint(uint32_t id) { of(id).RemoveEndpoint(id); }
  void SetPeer(uint32_t id, uint32_t slot, const PeerLink& link) {
    of(id).SetPeer(id, slot, link);
  }
  void ClearPeer(uint32_t id, uint32_t slot) { of(id).ClearPeer(id, slot); }

  // The fabric: shard 0's.
  bool has_fabric() const { return at(0).has_fabric(); }
  const std::string& fabric_host() const { return at(0).fabric_host(); }
  const std::string& fabric_backend() const { return at(0).fabric_backend(); }
  const std::string& fabric_provider() const { return at(0).fabric_provider(); }
  bool fabric_sessions() const { return at(0).fabric_sessions(); }
  std::vector<ProgressWorker::RemoteOutcome> QueryRemote(
      uint32_t id, const std::vector<uint64_t>& epids) {
    return at(0).QueryRemote(id, epids);
  }
  std::vector<Remote::PeerRow> FabricStats() { return at(0).FabricStats(); }

  // ---- Handover (issue 33; daemon/handover/handover.h) ----
  // Freezes every worker (no client ring is read any more), drains what
  // crosses between shards until every engine is quiesced in one round, and
  // writes one kEngineSection per shard. With a fabric, the drain also
  // handles the fabric's events until what the inter-node engine holds can
  // be carried, writes its kRemoteSection and hands the fabric's sessions
  // over into *fabric ("Handover with a fabric"). Fails, thawed again, if
  // the engines do not quiesce within `timeout_ms` (copies in place running
  // long, frames to a peer not acknowledged).
  Status FreezeAndSave(handover::StateWriter& w, uint32_t timeout_ms,
                       handover::CarriedFabric* fabric);
  // In a successor whose workers were started and frozen (Freeze), with
  // every endpoint added: each shard's kEngineSection, then, when the
  // fabric was carried (its sessions adopted: `sessions`, their ids and
  // nodes), the kRemoteSection.
  Status LoadState(handover::StateReader& r, bool fabric_carried,
                   const std::map<hw::ConnId, uint64_t>& sessions);
  // After a takeover: the registry's boot nonce (shard 0's fabric).
  void SetBootNonce(uint16_t nonce) { workers_[0]->SetBootNonce(nonce); }
  // A refused state's adopted sessions end (shard 0's fabric).
  void CloseSessions(const std::vector<hw::CarriedSession>& sessions);
  void Freeze();
  void Thaw();

  // Node totals over the workers.
  uint64_t doorbells() const;
  uint64_t sleeps() const;
  // The oldest of the workers' last turns (psmctl health).
  uint64_t LastTurnAgeNs() const;

 private:
  using Clock = std::chrono::steady_clock;
  // Until every peer holds what it sends here (Remote::PeersHeld), with the
  // clients running, for at most kHoldWait: what comes later is handled by
  // the drain all the same, only inside the blackout.
  void AwaitPeersHeld();
  // How long the peers may take to hold (FreezeAndSave): the control plane
  // is stopped meanwhile, and a client's control call waits 5 s for a psmd
  // handing over (client/control_client.cc).
  static constexpr std::chrono::milliseconds kHoldWait{1000};

  Crossing crossing_;
  std::vector<std::unique_ptr<ProgressWorker>> workers_;
};

}  // namespace psmd

#endif  // PSMD_DAEMON_WORKERS_H_
