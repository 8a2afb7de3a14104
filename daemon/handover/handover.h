// Handing a running psmd over to a new process without ending any endpoint
// (issue 33; docs/design.md, "Handover"). The old psmd stops taking work,
// writes what it holds into a sealed memfd (the state file: an envelope with
// the format version and a checksum around sections written with
// state_codec.h), clears close-on-exec on every descriptor the state names
// (the control socket, each job's pool, each endpoint's segment, doorbell
// and attach connection) and execs the new binary in its place: same pid, so
// systemd's MAINPID and a container's init stay right, and every descriptor
// stays open, so no client sees its attach connection hang up. The new
// process finds the state file through PSMD_HANDOVER_FD, checks it, and
// adopts it; one that cannot (another format, a damaged file, a different
// node id) refuses it whole, tells each client why on its attach connection,
// closes everything it inherited and starts empty.
//
// Thread-safety: functions, called by the main thread while nothing else
// runs (before the exec, or before the successor starts its threads).
#ifndef PSMD_DAEMON_HANDOVER_HANDOVER_H_
#define PSMD_DAEMON_HANDOVER_HANDOVER_H_

#include <cstdint>
#include <initializer_list>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "daemon/handover/state_codec.h"
#include "hw/fabric.h"
#include "shm/pool.h"
#include "shm/status.h"

namespace psmd::handover {

// The state file's format. Bumped whenever any section's layout or meaning
// changes: a successor reads exactly its own format (a downgrade or an
// incompatible upgrade is refused before the old psmd stops: psmctl upgrade
// asks the new binary first, `psmd --handover-format`).
// 2: the fabric's sessions and the inter-node engine's state (a psmd with a
// fabric hands over).
// 3: eager sends converted to rendezvous and payloads kept for receivers,
// in the inter-node engine's state.
// 4: with engine shards and a fabric, the engines' items held for other
// nodes (shard 0's) and held from them (the receiver's shard); frames set
// aside for other nodes' endpoints that are off, in the inter-node
// engine's state.
// 5: frames parked for this node's endpoints (with the receives they took),
// in the inter-node engine's state.
inline constexpr uint32_t kFormatVersion = 5;

// The environment variable naming the state file's descriptor in the
// successor (removed from the environment as it is read).
inline constexpr char kEnvFd[] = "PSMD_HANDOVER_FD";

// Sections, in the order they are written.
enum Section : uint32_t {
  kProcessSection = 1,
  kFdSection = 2,
  kFabricSection = 5,  // CarriedFabric: read before the fabric opens
  kRegistrySection = 3,
  kEngineSection = 4,  // one per shard, in shard order
  kRemoteSection = 6,  // the inter-node engine's, if the fabric is carried
};

// Descriptors the state names by index: written as indices, so that a
// successor checks each before use and adopts each at most once.
class FdTable {
 public:
  uint32_t Add(int fd) {
    fds_.push_back(fd);
    return static_cast<uint32_t>(fds_.size() - 1);
  }
  const std::vector<int>& fds() const { return fds_; }
  void Write(StateWriter& w) const;
  // Reads the table. `handed`: the descriptors as the service manager gave
  // them back, by index (-1: not given back); null: as the table names
  // them (an exec keeps the numbers). Checks that every entry is open here
  // and none named twice.
  bool Read(StateReader& r, const std::vector<int>* handed = nullptr);
  // Entry `index`, once: the caller owns it from then on (and closes it).
  // Fails (naming `what`) for an index out of range, taken before, or not
  // given back.
  bool Take(uint32_t index, int* fd, StateReader& r, const char* what);
  // The same, but an entry not given back is no error: *fd = -1 (the
  // service manager drops a connection that hung up, whose client is gone).
  bool TakeIfHanded(uint32_t index, int* fd, StateReader& r, const char* what);
  // Whether entry `index` exists and was given back (not taken yet).
  bool Handed(uint32_t index) const {
    return index < fds_.size() && fds_[index] >= 0 && !taken_[index];
  }
  // Closes every entry nobody took (a refused or partly adopted state).
  void CloseUntaken();
  // The entries nobody took, now marked taken (the caller ends them:
  // EndInherited).
  std::vector<int> TakeRest();

 private:
  std::vector<int> fds_;
  std::vector<bool> taken_;
};

// What the process hands over beside the registry and the engines.
struct ProcessState {
  uint16_t node_id = 0;
  uint16_t boot_nonce = 0;  // the epids' (shm/epid.h): clients keep theirs
  std::string socket_path;
  uint32_t workers = 1;    // ids name shards (MqEngine::ShardOf): kept
  uint32_t listen_fd = 0;  // FdTable index of the control socket
  // FdTable indices of connections accepted but not yet classified (gRPC
  // or attach): the successor classifies them.
  std::vector<uint32_t> pending;
  bool activated = false;     // it came from systemd
  bool bound = false;         // psmd created its file (and removes it at stop)
  uint64_t frozen_at_ns = 0;  // CLOCK_MONOTONIC when the old one stopped
  uint32_t old_pid = 0;
  uint64_t generation = 0;  // handovers so far, this one included
  std::string old_version;  // the old psmd's version, for the log
  void Write(StateWriter& w) const;
  bool Read(StateReader& r);
};

// The fabric's part (docs/design.md, "Handover with a fabric"): the sessions
// the old psmd's fabric exported (hw::Fabric::ExportSessions), to resume
// with their peers under the same incarnation, from the same listen
// addresses and ports (the host description the peers' tables name).
struct CarriedFabric {
  bool present = false;  // the old psmd served a fabric
  uint64_t incarnation = 0;
  std::string host_description;
  std::vector<hw::CarriedSession> sessions;
  void Write(StateWriter& w) const;
  // Checks what a successor relies on before AdoptSessions checks the rest:
  // a non-zero incarnation, a host description that parses, sessions
  // bounded, each with a node, an id, and at most kMaxHostAddresses
  // addresses that parse as a host description's.
  bool Read(StateReader& r);
};

// An inbox arena's state (shm::SendArena::Save) in a section; Read bounds
// the counts only: SendArena::Adopt checks the rest.
void WriteArenaState(StateWriter& w, const shm::SendArena::State& s);
bool ReadArenaState(StateReader& r, shm::SendArena::State* s);

// CLOCK_MONOTONIC in ns: one clock for the whole machine, so the successor
// measures the blackout from the old process's stop.
uint64_t MonotonicNs();

// Wraps the body, `pieces` one after the other, in the envelope (magic,
// kFormatVersion, length, checksum, the writer's version) in a sealed memfd
// without close-on-exec; -1 and *error on failure. In pieces so that a
// large part (the engines') is written where it was built, not copied.
int WriteStateFile(std::initializer_list<std::string_view> pieces,
                   const std::string& version, std::string* error);

// A state file's body as read: in place, in a read-only mapping, when the
// file is sealed against every change (as WriteStateFile leaves it), else
// copied (a file another program passed, which could change, or shrink
// under a mapping, while it is read). Move-only; unmaps when destroyed.
class StateFileBody {
 public:
  StateFileBody() = default;
  ~StateFileBody();
  StateFileBody(StateFileBody&& other) noexcept { *this = std::move(other); }
  StateFileBody& operator=(StateFileBody&& other) noexcept;
  StateFileBody(const StateFileBody&) = delete;
  StateFileBody& operator=(const StateFileBody&) = delete;

  const char* data() const {
    return (map_ != nullptr ? static_cast<const char*>(map_) : copy_.data()) +
           at_;
  }
  size_t size() const { return size_; }
  bool mapped() const { return map_ != nullptr; }

 private:
  friend Status ReadStateFile(int fd, StateFileBody* body);
  void* map_ = nullptr;  // the whole file, or null (copy_ holds it)
  size_t map_bytes_ = 0;
  std::string copy_;
  size_t at_ = 0;  // where the body starts in the file
  size_t size_ = 0;
};

// Reads the state file `fd` and checks its envelope (a format other than
// kFormatVersion, a length or checksum that does not match: refused with
// the reason). Closes fd.
Status ReadStateFile(int fd, StateFileBody* body);

// In the successor: the state file's descriptor if this process was handed
// over to (PSMD_HANDOVER_FD, which it removes from the environment), else
// -1. A malformed variable is -2.
int TakeStateFd();

// What systemd passed at start (sd_listen_fds_with_names; the environment
// is cleared): the socket unit's listening sockets, and what a predecessor
// stored in the service's file-descriptor store (StoreWithServiceManager).
//
// systemd keeps what is stored until it is removed (FDSTOREREMOVE=1) or the
// unit stops for good, and hands all of it to every start: a store that is
// not emptied would give the next psmd this state again beside its own
// successor's, and systemd's copies of the attach connections would keep
// every client from seeing a crash (its connection never hangs up). So the
// state leaves the store as it is taken (before anything acts on it: a psmd
// killed after that is a crash, never a second adoption of one state), and
// the table's entries once the endpoints are adopted or ended
// (ForgetStoredFds).
struct ServiceManagerFds {
  std::vector<int> activated;  // socket activation (psmd.socket)
  int state_fd = -1;           // kStateFdName; -1: nothing stored
  std::vector<int> handed;     // the table's entries by index (-1: none)
  // More than one state in the store (left by a psmd that did not empty it):
  // which entries go with which cannot be told, so none is adopted.
  uint32_t states = 0;
  std::vector<std::string> table_names;  // the entries' names, to forget
  int error = 0;                         // sd_listen_fds' negative errno
};
ServiceManagerFds TakeServiceManagerFds();
// The table's entries without a state beside them (a psmd took the state
// and ended before it took them: killed in its adoption).
bool OrphanedTable(const ServiceManagerFds& fds);
// Ends the table's entries (EndInherited) when they are not adopted.
void EndStored(const ServiceManagerFds& fds, const std::string& reason);
// Removes the table's entries `fds.table_names` from systemd's store (their
// descriptors are this process's now, or closed), and waits (at most 1 s,
// sd_notify_barrier) until systemd has done so: until then its copy of a
// listening socket on psmd's path answers connects, and psmd would find its
// own socket in use. Returns how many removals the notify socket refused.
int ForgetStoredFds(const ServiceManagerFds& fds);

// Under systemd: stores the state file and the table's descriptors in the
// service's file-descriptor store (FDSTORE=1, each with its own name; unit
// setting FileDescriptorStoreMax=), which systemd hands to the next psmd it
// starts: at `systemctl restart`, or at once after a stop, when it
// discards them, which ends the endpoints. False (errno's text in *error)
// when the notify socket refused a message.
bool StoreWithServiceManager(int state_fd, const std::vector<int>& fds,
                             std::string* error);

// Execs `path` with `argv` and PSMD_HANDOVER_FD=state_fd in the environment,
// after clearing close-on-exec on `keep` and state_fd. Returns only on
// failure (errno's text in *error).
void Exec(const std::string& path, const std::vector<std::string>& argv,
          int state_fd, const std::vector<int>& keep, std::string* error);

// The descriptors this process holds beyond 0-2: called first thing in a
// successor, before logging or anything else opens one, they are what it
// inherited.
std::vector<int> InheritedFds();
// The successor refused what it was handed (or could not read it): each of
// `inherited` is closed; a connected Unix stream socket among them (an
// attach connection) is first told `reason`, which the client's library
// prints as it reports the lost psmd. Returns how many were told.
int EndInherited(const std::string& reason, const std::vector<int>& inherited);

}  // namespace psmd::handover

#endif  // PSMD_DAEMON_HANDOVER_HANDOVER_H_
