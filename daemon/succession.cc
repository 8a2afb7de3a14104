#include "daemon/succession.h"

#include <systemd/sd-daemon.h>
#include <unistd.h>

#include <algorithm>
#include <set>

#include <spdlog/spdlog.h>

#include "daemon/log.h"
#include "version/version.h"

namespace psmd {

namespace {

// How long the shards may take to settle (copies in place finishing).
constexpr uint32_t kSettleMs = 10'000;

// Serving again after a handover that failed before the exec. A fabric
// whose sessions were handed over (`fabric`) serves no more: its peers wait
// for a successor that does not come, and end the sessions at their
// timeout.
void Resume(Daemon& d, const handover::CarriedFabric& fabric = {}) {
  if (fabric.present && !fabric.sessions.empty()) {
    spdlog::critical(
        "upgrade: the exec failed after the fabric's {} sessions were handed "
        "over: jobs across nodes end within fabric_timeout_ms; restart psmd "
        "to serve other nodes again",
        fabric.sessions.size());
  }
  d.workers.Thaw();
  if (!d.start_server()) {
    spdlog::critical("upgrade: cannot restart the gRPC control server");
  }
  sd_notify(0, "READY=1\nSTATUS=serving (an upgrade failed)");
}

}  // namespace

namespace {

// Steps 2-5 of docs/design.md "Handover": everything frozen and written
// into a sealed state file. Returns its descriptor and fills *fds, or
// resumes serving and returns -1 (why in *why).
int FreezeAndWrite(Daemon& d, handover::FdTable* fds,
                   handover::CarriedFabric* fabric, std::string* why) {
  const uint64_t frozen_at = handover::MonotonicNs();
  // No new connection is classified, no call runs: nothing changes the
  // registry or adds work to a shard from here on.
  std::vector<int> pending;
  d.admission.Freeze(&pending);
  d.stop_server();
  handover::StateWriter engines;
  if (Status s = d.workers.FreezeAndSave(engines, kSettleMs, fabric); !s.ok()) {
    *why = s.message;
    Resume(d);
    return -1;
  }
  handover::StateWriter registry;
  handover::ProcessState process;
  process.listen_fd = fds->Add(d.admission.listen_fd());
  for (int fd : pending) process.pending.push_back(fds->Add(fd));
  if (Status s = d.registry.SaveState(registry, *fds); !s.ok()) {
    *why = s.message;
    Resume(d, *fabric);
    return -1;
  }
  process.node_id = d.config.node_id;
  process.boot_nonce = d.registry.boot_nonce();
  process.socket_path = d.config.socket_path;
  process.workers = d.workers.count();
  process.activated = d.admission.activated();
  process.bound = d.admission.bound();
  process.frozen_at_ns = frozen_at;
  process.old_pid = static_cast<uint32_t>(getpid());
  process.generation = d.upgrades.generation.load() + 1;
  process.old_version = version::Version();

  handover::StateWriter body;
  size_t at = body.BeginSection(handover::kProcessSection);
  process.Write(body);
  body.EndSection(at);
  at = body.BeginSection(handover::kFdSection);
  fds->Write(body);
  body.EndSection(at);
  at = body.BeginSection(handover::kFabricSection);
  fabric->Write(body);
  body.EndSection(at);
  body.Section(handover::kRegistrySection, registry.bytes());
  // The engines' sections follow, written from where they were built.
  const size_t bytes = body.bytes().size() + engines.bytes().size();
  int state_fd = handover::WriteStateFile({body.bytes(), engines.bytes()},
                                          version::Version(), why);
  if (state_fd < 0) {
    Resume(d, *fabric);
    return -1;
  }
  spdlog::info(
      "handing over {} endpoints ({} descriptors, {} sessions with other "
      "nodes, {} bytes of state)",
      d.registry.endpoint_count(), fds->fds().size(), fabric->sessions.size(),
      bytes);
  return state_fd;
}

}  // namespace

void HandOver(Daemon& d, const std::string& path,
              const std::vector<std::string>& argv, std::string* why) {
  sd_notifyf(0, "RELOADING=1\nSTATUS=handing over to %s", path.c_str());
  handover::FdTable fds;
  handover::CarriedFabric fabric;
  const int state_fd = FreezeAndWrite(d, &fds, &fabric, why);
  if (state_fd < 0) return;
  spdlog::info("upgrade: executing {}", Escaped(path));
  spdlog::default_logger()->flush();
  handover::Exec(path, argv, state_fd, fds.fds(), why);
  // Still here: the exec failed, and nothing else was given up.
  close(state_fd);
  Resume(d, fabric);
}

bool HandOverToServiceManager(Daemon& d, std::string* why) {
  handover::FdTable fds;
  handover::CarriedFabric fabric;
  const int state_fd = FreezeAndWrite(d, &fds, &fabric, why);
  if (state_fd < 0) return false;
  if (!handover::StoreWithServiceManager(state_fd, fds.fds(), why)) {
    close(state_fd);
    Resume(d, fabric);
    return false;
  }
  spdlog::info(
      "stopping with every endpoint in systemd's file-descriptor store: "
      "the next psmd it starts (systemctl restart) takes them over; a stop "
      "ends them");
  spdlog::default_logger()->flush();
  return true;
}

std::optional<Inheritance> ReadInheritance(int state_fd, const Config& config,
                                           const std::vector<int>& inherited,
                                           const std::vector<int>* handed,
                                           std::string* why) {
  Inheritance in;
  auto refuse = [&](const std::string& reason) -> std::optional<Inheritance> {
    *why = reason;
    std::vector<int> rest;
    for (int fd : inherited) {
      if (fd != state_fd) rest.push_back(fd);
    }
    handover::EndInherited(
        "psmd (pid " + std::to_string(getpid()) +
            ") could not take over from the psmd before it: " + reason +
            "; its endpoints have ended: open new ones",
        rest);
    return std::nullopt;
  };
  if (Status s = handover::ReadStateFile(state_fd, &in.body); !s.ok()) {
    return refuse(s.message);
  }
  handover::StateReader r(in.body.data(), in.body.size());
  handover::StateReader section;
  if (!r.Section(handover::kProcessSection, &section, "process") ||
      !in.process.Read(section) || !r.Absorb(section) ||
      !r.Section(handover::kFdSection, &section, "descriptors") ||
      !in.fds.Read(section, handed) || !r.Absorb(section) ||
      !r.Section(handover::kFabricSection, &section, "fabric") ||
      !in.fabric.Read(section) || !r.Absorb(section)) {
    return refuse(r.error());
  }
  if (in.process.node_id != config.node_id) {
    return refuse("the old psmd was node " +
                  std::to_string(in.process.node_id) + ", this one is node " +
                  std::to_string(config.node_id) + " (node_id)");
  }
  if (in.process.socket_path != config.socket_path) {
    return refuse("the old psmd served " + in.process.socket_path +
                  ", this one is to serve " + config.socket_path + " (socket)");
  }
  if (in.process.workers == 0 || in.process.workers > 64) {
    return refuse("the state names " + std::to_string(in.process.workers) +
                  " workers");
  }
  if (!in.fds.Take(in.process.listen_fd, &in.listen_fd, r, "control socket")) {
    return refuse(r.error());
  }
  for (uint32_t index : in.process.pending) {
    int fd = -1;
    if (!in.fds.Take(index, &fd, r, "pending connection")) {
      return refuse(r.error());
    }
    in.pending.push_back(fd);
  }
  in.rest_at = in.body.size() - r.Left();
  // Anything inherited that the state does not name is not ours to keep.
  std::set<int> named(in.fds.fds().begin(), in.fds.fds().end());
  for (int fd : inherited) {
    if (fd != state_fd && named.count(fd) == 0) close(fd);
  }
  return in;
}

void InheritFabricOptions(const Inheritance& in, hw::FabricOptions* options) {
  if (!in.fabric.present) return;
  hw::HostDescription self;
  std::string error;
  if (!hw::ParseHostDescription(in.fabric.host_description, &self, &error)) {
    return;  // (CarriedFabric::Read parsed it)
  }
  options->incarnation = in.fabric.incarnation;
  options->listen.clear();
  for (const hw::HostAddress& a : self.addresses) {
    const bool v6 = a.host.find(':') != std::string::npos;
    options->listen.push_back((v6 ? "[" + a.host + "]" : a.host) + ":" +
                              std::to_string(a.port));
  }
}

void AdoptFabric(Inheritance* in, hw::Fabric& fabric) {
  if (!in->fabric.present) return;
  std::string why;
  if (!fabric.AdoptSessions(in->fabric.sessions, &why)) {
    in->fabric_error = "the fabric's sessions: " + why;
    return;
  }
  for (const hw::CarriedSession& s : in->fabric.sessions) {
    in->adopted[s.id] = s.node;
  }
}

bool TakeOver(Daemon& d, Inheritance& in) {
  const handover::StateFileBody& body = in.body;
  handover::StateReader r(body.data() + in.rest_at, body.size() - in.rest_at,
                          in.rest_at);
  handover::StateReader section;
  std::vector<std::pair<int, uint32_t>> liveness;
  d.workers.Freeze();
  Status status;
  bool registry_loaded = false;
  if (!r.Section(handover::kRegistrySection, &section, "registry")) {
    status = {PSM2_INTERNAL_ERR, r.error()};
  } else {
    status =
        d.registry.LoadState(section, in.fds, in.process.boot_nonce, &liveness);
    registry_loaded = status.ok();
  }
  // Frames from other nodes name the epids' boot nonce, the old psmd's if
  // the registry took its endpoints.
  d.workers.SetBootNonce(d.registry.boot_nonce());
  if (status.ok() && in.fabric.present && !in.fabric_error.empty()) {
    status = {PSM2_INTERNAL_ERR, in.fabric_error};
  }
  if (status.ok()) {
    status = d.workers.LoadState(r, in.fabric.present, in.adopted);
  }
  if (status.ok() && !r.AtEnd()) {
    status = {PSM2_INTERNAL_ERR,
              std::to_string(r.Left()) + " bytes after the last section"};
  }
  if (!status.ok()) {
    const std::string reason =
        "psmd (pid " + std::to_string(getpid()) + ", " + version::Version() +
        ") could not take over from psmd " + in.process.old_version + ": " +
        status.message + "; its endpoints have ended: open new ones";
    spdlog::error("handover refused: {}; every inherited endpoint ends",
                  status.message);
    if (registry_loaded) d.registry.EndAll(reason);
    // The peers end what waits on this node at once, not at their timeout.
    if (!in.adopted.empty()) d.workers.CloseSessions(in.fabric.sessions);
    handover::EndInherited(reason, in.fds.TakeRest());
    liveness.clear();
  }
  std::vector<uint32_t> gone;  // their clients hung up meanwhile
  for (auto it = liveness.begin(); it != liveness.end();) {
    if (it->first >= 0) {
      ++it;
      continue;
    }
    gone.push_back(it->second);
    it = liveness.erase(it);
  }
  d.admission.Adopt(in.listen_fd, in.process.activated, in.process.bound,
                    liveness, in.pending);
  d.workers.Thaw();
  for (uint32_t id : gone) d.registry.ConnectionLost(id);
  if (!status.ok()) return false;
  const uint64_t blackout = handover::MonotonicNs() - in.process.frozen_at_ns;
  d.upgrades.generation = in.process.generation;
  d.upgrades.last_blackout_ns = blackout;
  d.upgrades.last_carried = static_cast<uint32_t>(d.registry.endpoint_count());
  spdlog::info(
      "took over from psmd {} (generation {}): {} endpoints, {} workers, "
      "blackout {:.1f} ms",
      Escaped(in.process.old_version), in.process.generation,
      d.registry.endpoint_count(), in.process.workers, blackout / 1e6);
  return true;
}

}  // namespace psmd
