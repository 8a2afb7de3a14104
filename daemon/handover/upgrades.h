// psmctl upgrade's side of a handover (issue 33): the request the Upgrade
// call leaves for the main thread, after asking the new binary whether it
// reads this psmd's state format, and what the handovers so far cost
// (Health's generation, blackout, endpoints carried).
//
// Thread-safety: any thread (a mutex guards the request; stats are atomics).
#ifndef PSMD_DAEMON_HANDOVER_UPGRADES_H_
#define PSMD_DAEMON_HANDOVER_UPGRADES_H_

#include <atomic>
#include <cstdint>
#include <optional>
#include <string>

#include "base/mutex.h"
#include "shm/status.h"

namespace psmd::handover {

class Upgrades {
 public:
  // `started_from`: the binary's path when psmd started (/proc/self/exe
  // then), the default of an upgrade: after a package upgrade it holds the
  // new binary.
  explicit Upgrades(std::string started_from)
      : started_from_(std::move(started_from)) {}

  // The Upgrade call: `exec_path` (or the default) must be an executable
  // that only psmd's own identity can change (TrustedBinary) and that
  // answers --handover-format with kFormatVersion within 5 s; then the
  // request waits for the main thread, which SIGUSR2 wakes. One at a time.
  // *resolved is the path without symbolic links, which the exec uses.
  Status Request(const std::string& exec_path, std::string* resolved);
  // The main thread: the path asked for, if a request waits.
  std::optional<std::string> Take();
  // The main thread: the handover failed before the exec (`why`); psmd
  // serves on and another request may come.
  void Failed(const std::string& why);
  // Handovers that failed so far, and why the last one did (Health's, for
  // psmctl upgrade to report at once).
  std::atomic<uint64_t> failed{0};
  std::string LastFailure();

  // What the successor records once it serves (any thread reads).
  std::atomic<uint64_t> generation{0};
  std::atomic<uint64_t> last_blackout_ns{0};
  std::atomic<uint32_t> last_carried{0};
  // Starts after a crash (the endpoint journal's count: ReportPrevious in
  // daemon/control/endpoint_journal.h), and the endpoints that ended with
  // the last crashed psmd; set by main before the server starts.
  std::atomic<uint64_t> crash_restarts{0};
  std::atomic<uint32_t> last_crash_lost{0};

 private:
  void Release();  // another request may come

  const std::string started_from_;
  Mutex mu_;
  bool busy_ PSMD_GUARDED_BY(mu_) = false;
  std::optional<std::string> pending_ PSMD_GUARDED_BY(mu_);
  std::string last_failure_ PSMD_GUARDED_BY(mu_);
};

// Whether psmd may hand its endpoints over to the binary at absolute path
// `path` (issue 33, item 6: only to a binary that no one but root, or
// psmd's own user, can change): *real is `path` with its symbolic links
// resolved; that file is regular, and it and every directory above it are
// owned by root or psmd's effective uid and writable by no one else. A
// directory writable by others passes only with its sticky bit (as /tmp),
// where they can neither remove nor rename the entry below it, whose owner
// is checked in turn. No one else can then swap the file between the check
// and the exec. The reason otherwise, naming the path and the fix.
Status TrustedBinary(const std::string& path, std::string* real);

// Runs `path --handover-format` and returns the format it prints, or -1
// (with the reason in *why).
int AskFormat(const std::string& path, std::string* why);

}  // namespace psmd::handover

#endif  // PSMD_DAEMON_HANDOVER_UPGRADES_H_
