// The endpoint journal (issue 33): a file beside psmd's control socket
// (SOCKET.journal, mode 0600) holding a header that names the psmd process
// keeping it, and one record per attached endpoint, written when the
// endpoint is attached and cleared when it is removed. A psmd that stops
// removes the file; a handover's successor (psmctl upgrade, systemctl
// restart) takes it over. So a journal found by a psmd that succeeds no one
// is what a psmd that was killed or crashed left: the new one reports which
// endpoints (jobs, processes) ended with it and counts the crash (psmctl
// stats). It is the first piece of surviving a crash (docs/design.md, "Not
// built: a crash"), whose recovery will adopt only what matches these
// records.
//
// Crash consistency: the header and each record are written by one pwrite
// of 64 bytes at a 64-byte offset (within one page), which the kernel
// copies whole before a kill of the writer takes effect; each also carries
// a checksum, and the reader (Load) takes nothing it has not checked:
// psmd's own file in its own directory, but read after a crash, which is
// when a file is least to be trusted.
//
// Thread-safety: none; the registry calls Record and Clear under its mutex,
// main the rest before the registry serves and after it stopped.
#ifndef PSMD_DAEMON_CONTROL_ENDPOINT_JOURNAL_H_
#define PSMD_DAEMON_CONTROL_ENDPOINT_JOURNAL_H_

#include <array>
#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "shm/status.h"

namespace psmd {

class EndpointJournal {
 public:
  // How the process that wrote a journal left it.
  enum class Ending : uint32_t {
    kServing = 1,  // it was serving: it did not stop (a kill, a crash)
    kInStore = 2,  // its endpoints went to systemd's file-descriptor store
  };
  // One attached endpoint.
  struct Entry {
    uint32_t id = 0;
    uint64_t epid = 0;
    uint32_t uid = 0;
    uint32_t pid = 0;  // the process that opened it
    std::array<uint8_t, 16> job{};
    uint64_t attached_unix_ns = 0;
  };
  // What Load found.
  struct Previous {
    bool found = false;  // a journal was there
    std::string damage;  // why it was not read ("" : it was)
    Ending ending = Ending::kServing;
    uint32_t pid = 0;  // the psmd that kept it
    uint64_t started_unix_ns = 0;
    uint64_t generation = 0;
    uint64_t crash_restarts = 0;
    std::vector<Entry> entries;  // its live records, by slot
  };

  // The most records a journal is read for: a file longer than that is
  // damaged (no psmd serves more endpoints).
  static constexpr uint32_t kMaxRecords = 1u << 20;

  EndpointJournal() = default;
  ~EndpointJournal();
  EndpointJournal(const EndpointJournal&) = delete;
  EndpointJournal& operator=(const EndpointJournal&) = delete;

  // Opens (or creates) the journal at `path` and reads what is in it into
  // *previous. A path of a symbolic link or of no regular file is refused.
  Status Load(const std::string& path, Previous* previous);
  // Empties it and writes this process's header (kServing). Until Start,
  // Record and Clear do nothing.
  Status Start(uint32_t pid, uint64_t started_unix_ns, uint64_t generation,
               uint64_t crash_restarts);
  // The endpoint is attached: its record (in a free slot).
  void Record(const Entry& e);
  // The endpoint `id` is removed: its record is cleared.
  void Clear(uint32_t id);
  // Marks the header: the endpoints are going to systemd's store.
  void MarkInStore();
  // psmd stopped: the file goes (nothing ended without being told).
  void Remove();

  const std::string& path() const { return path_; }

 private:
  void WriteHeader(Ending ending);
  // Writes one 64-byte unit (0: the header, n: slot n - 1's record); a
  // failure is logged once.
  void WriteUnit(const void* unit, uint32_t index);

  std::string path_;
  int fd_ = -1;
  bool started_ = false;
  uint32_t pid_ = 0;
  uint64_t started_unix_ns_ = 0;
  uint64_t generation_ = 0;
  uint64_t crash_restarts_ = 0;
  std::unordered_map<uint32_t, uint32_t> slot_of_;  // endpoint id -> slot
  std::vector<uint32_t> free_slots_;
  uint32_t slots_ = 0;   // slots ever used (the file's records)
  bool failed_ = false;  // a write failed (logged once)
};

// A start that succeeds no psmd found `previous` at `path`: logs what ended
// with the psmd before it (a crash, or a store systemd discarded) and
// returns the starts that followed a crash since psmd last started after a
// clean stop, this one included (the journal's count, plus one for a
// crash). `successor_ended`: the store still held the endpoints of a
// journal that says they went there, so the psmd started to take them over
// ended first (a crash, whose own journal it did not yet keep). *lost: the
// endpoints that ended with the psmd before.
uint64_t ReportPrevious(const std::string& path,
                        const EndpointJournal::Previous& previous,
                        bool successor_ended, uint32_t* lost);

}  // namespace psmd

#endif  // PSMD_DAEMON_CONTROL_ENDPOINT_JOURNAL_H_
