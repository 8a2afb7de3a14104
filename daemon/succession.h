// One psmd succeeding another without ending any endpoint (issue 33;
// docs/design.md, "Handover"): HandOver is the old process's half, run by
// its main thread when psmctl upgrade asked (SIGUSR2); TakeOver the new
// one's, run by main() before it serves. The byte format and the exec are
// daemon/handover/handover.h's; each component writes and reads its own
// section (Registry, Workers and their engines).
//
// Thread-safety: the main thread's, while the components' other threads are
// stopped or frozen as each step says.
#ifndef PSMD_DAEMON_SUCCESSION_H_
#define PSMD_DAEMON_SUCCESSION_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "daemon/config.h"
#include "daemon/control/admission.h"
#include "daemon/control/registry.h"
#include "daemon/handover/handover.h"
#include "daemon/handover/upgrades.h"
#include "daemon/workers.h"

namespace psmd {

// What main() built, and how it starts and stops the gRPC server (which
// cannot be handed over: its connections end, and each client call opens
// a new one).
struct Daemon {
  const Config& config;
  Workers& workers;
  Registry& registry;
  Admission& admission;
  handover::Upgrades& upgrades;
  std::function<bool()> start_server;  // builds it, then admission.Start
  std::function<void()> stop_server;
};

// Hands over to `path`, run with `argv`. Returns only if that failed before
// the new binary ran; psmd then serves on as before, and *why says what
// failed.
void HandOver(Daemon& d, const std::string& path,
              const std::vector<std::string>& argv, std::string* why);

// On SIGTERM under systemd: the same state, stored with its descriptors in
// the service's file-descriptor store (handover::StoreWithServiceManager)
// for the psmd systemd starts next (systemctl restart). True when stored:
// the caller then exits at once, closing nothing of the endpoints'. False:
// psmd serves on (*why says what failed), and the caller stops as before.
bool HandOverToServiceManager(Daemon& d, std::string* why);

// The successor's view of what it was handed, read before the components
// are built (their shard count and the control socket come from it).
struct Inheritance {
  handover::ProcessState process;
  handover::FdTable fds;
  int listen_fd = -1;
  std::vector<int> pending;      // connections not yet classified
  handover::StateFileBody body;  // the state file's sections
  size_t rest_at = 0;            // where the registry's section starts in body
  // The old psmd's fabric, if it served one: main opens this one's with its
  // incarnation and listen addresses and adopts its sessions (AdoptFabric).
  handover::CarriedFabric fabric;
  std::map<hw::ConnId, uint64_t> adopted;  // session id -> node
  std::string fabric_error;                // why they were not adopted
};

// The options a successor's fabric opens with to carry on the old one's
// sessions: its incarnation, and its host description's addresses and
// ports as the listen addresses (the peers' node tables name them).
void InheritFabricOptions(const Inheritance& in, hw::FabricOptions* options);
// Right after the fabric opened: adopts the old one's sessions, or notes
// why not in in->fabric_error (TakeOver then refuses the state).
void AdoptFabric(Inheritance* in, hw::Fabric& fabric);

// Reads the state file `state_fd` for a psmd with `config`; `handed`: the
// table's descriptors as systemd gave them back (null after an exec, which
// kept their numbers). On failure (the file unreadable or of another
// format, another node id or socket) returns nothing, with the reason in
// *why, having told every inherited attach connection that reason and
// closed each of `inherited` (but stdin, stdout, stderr).
std::optional<Inheritance> ReadInheritance(int state_fd, const Config& config,
                                           const std::vector<int>& inherited,
                                           const std::vector<int>* handed,
                                           std::string* why);

// With the workers started, before admission and gRPC: freezes the
// workers, loads the registry's and the engines' sections, adopts the
// control socket and attach connections, thaws. A refusal ends every
// inherited endpoint (each client told why) and leaves psmd empty but
// serving on the inherited socket. Returns whether the state was adopted.
bool TakeOver(Daemon& d, Inheritance& inheritance);

}  // namespace psmd

#endif  // PSMD_DAEMON_SUCCESSION_H_
