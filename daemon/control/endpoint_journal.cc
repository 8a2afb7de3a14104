#include "daemon/control/endpoint_journal.h"

#include <errno.h>
#include <fcntl.h>
#include <psm2.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstddef>
#include <cstring>
#include <ctime>
#include <type_traits>

#include <spdlog/spdlog.h>

#include "daemon/engine/job.h"
#include "daemon/log.h"

namespace psmd {
namespace {

constexpr uint64_t kMagic = 0x4c4e524a444d5350ull;  // "PSMDJRNL"
constexpr uint32_t kVersion = 1;
constexpr uint32_t kLive = 1;

// Both are one pwrite each (the header's comment says why).
struct DiskHeader {
  uint64_t magic;
  uint32_t version;
  uint32_t ending;  // EndpointJournal::Ending
  uint32_t pid;
  uint32_t reserved0;
  uint64_t started_unix_ns;
  uint64_t generation;
  uint64_t crash_restarts;
  uint8_t reserved[12];
  uint32_t checksum;  // of the bytes before it
};
struct DiskRecord {
  uint32_t live;  // kLive, or 0: a free slot
  uint32_t id;
  uint64_t epid;
  uint32_t uid;
  uint32_t pid;
  uint8_t job[16];
  uint64_t attached_unix_ns;
  uint8_t reserved[12];
  uint32_t checksum;  // of the bytes before it
};
static_assert(sizeof(DiskHeader) == 64 && sizeof(DiskRecord) == 64);
static_assert(std::is_trivially_copyable_v<DiskHeader> &&
              std::is_trivially_copyable_v<DiskRecord>);
constexpr size_t kUnit = 64;

// FNV-1a, 32 bits: against damage and misreading, not an adversary (the
// file is psmd's own).
template <typename T>
uint32_t ChecksumOf(const T& t) {
  const auto* p = reinterpret_cast<const uint8_t*>(&t);
  uint32_t h = 2166136261u;
  for (size_t i = 0; i < offsetof(T, checksum); i++) {
    h = (h ^ p[i]) * 16777619u;
  }
  return h;
}

std::string Errno(const char* what, const std::string& path) {
  return std::string(what) + " " + Escaped(path) + ": " + strerror(errno);
}

}  // namespace

EndpointJournal::~EndpointJournal() {
  if (fd_ >= 0) close(fd_);
}

Status EndpointJournal::Load(const std::string& path, Previous* previous) {
  *previous = Previous{};
  path_ = path;
  // Not through a link another user could have planted (the directory is
  // psmd's own; this is the second line).
  fd_ = open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (fd_ < 0) {
    return {PSM2_INTERNAL_ERR, Errno("cannot open the endpoint journal", path) +
                                   " (psmd needs to write beside its socket)"};
  }
  struct stat st {};
  if (fstat(fd_, &st) != 0 || !S_ISREG(st.st_mode)) {
    return {PSM2_INTERNAL_ERR,
            "the endpoint journal " + Escaped(path) +
                " is not a regular file: remove it and start psmd again"};
  }
  // One another user made (beside a socket in a shared directory) could be
  // read by them and written with false records.
  if (st.st_uid != geteuid() || (st.st_mode & 077) != 0) {
    return {PSM2_INTERNAL_ERR,
            "the endpoint journal " + Escaped(path) +
                (st.st_uid != geteuid()
                     ? " belongs to uid " + std::to_string(st.st_uid)
                     : std::string(" is one others may read")) +
                ": remove it, or give psmd a --socket in a directory of "
                "its own"};
  }
  if (st.st_size == 0) return {};  // a new file: nothing before
  previous->found = true;
  DiskHeader h{};
  if (st.st_size < static_cast<off_t>(kUnit) ||
      pread(fd_, &h, sizeof(h), 0) != static_cast<ssize_t>(sizeof(h))) {
    previous->damage = "shorter than its header";
    return {};
  }
  if (h.magic != kMagic) {
    previous->damage = "not an endpoint journal (magic)";
    return {};
  }
  if (h.version != kVersion) {
    previous->damage = "format " + std::to_string(h.version) +
                       ", this psmd reads format " + std::to_string(kVersion);
    return {};
  }
  if (h.checksum != ChecksumOf(h) ||
      (h.ending != static_cast<uint32_t>(Ending::kServing) &&
       h.ending != static_cast<uint32_t>(Ending::kInStore))) {
    previous->damage = "header damaged (checksum)";
    return {};
  }
  const uint64_t records = static_cast<uint64_t>(st.st_size) / kUnit - 1;
  if (records > kMaxRecords) {
    previous->damage = std::to_string(records) + " records, more than " +
                       std::to_string(kMaxRecords);
    return {};
  }
  previous->ending = static_cast<Ending>(h.ending);
  previous->pid = h.pid;
  previous->started_unix_ns = h.started_unix_ns;
  previous->generation = h.generation;
  previous->crash_restarts = h.crash_restarts;
  uint64_t damaged = 0;
  for (uint64_t i = 0; i < records; i++) {
    DiskRecord r{};
    if (pread(fd_, &r, sizeof(r), static_cast<off_t>((i + 1) * kUnit)) !=
        static_cast<ssize_t>(sizeof(r))) {
      damaged++;
      continue;
    }
    if (r.live == 0) continue;
    if (r.live != kLive || r.checksum != ChecksumOf(r)) {
      damaged++;
      continue;
    }
    Entry e;
    e.id = r.id;
    e.epid = r.epid;
    e.uid = r.uid;
    e.pid = r.pid;
    std::memcpy(e.job.data(), r.job, sizeof(r.job));
    e.attached_unix_ns = r.attached_unix_ns;
    previous->entries.push_back(e);
  }
  if (damaged > 0) {
    previous->damage = std::to_string(damaged) + " of " +
                       std::to_string(records) + " records damaged";
  }
  return {};
}

Status EndpointJournal::Start(uint32_t pid, uint64_t started_unix_ns,
                              uint64_t generation, uint64_t crash_restarts) {
  if (fd_ < 0) return {PSM2_INTERNAL_ERR, "endpoint journal not loaded"};
  if (ftruncate(fd_, 0) != 0) {
    return {PSM2_INTERNAL_ERR, Errno("cannot empty", path_)};
  }
  pid_ = pid;
  started_unix_ns_ = started_unix_ns;
  generation_ = generation;
  crash_restarts_ = crash_restarts;
  slot_of_.clear();
  free_slots_.clear();
  slots_ = 0;
  started_ = true;
  WriteHeader(Ending::kServing);
  if (failed_) return {PSM2_INTERNAL_ERR, Errno("cannot write", path_)};
  return {};
}

void EndpointJournal::WriteHeader(Ending ending) {
  DiskHeader h{};
  h.magic = kMagic;
  h.version = kVersion;
  h.ending = static_cast<uint32_t>(ending);
  h.pid = pid_;
  h.started_unix_ns = started_unix_ns_;
  h.generation = generation_;
  h.crash_restarts = crash_restarts_;
  h.checksum = ChecksumOf(h);
  WriteUnit(&h, 0);
}

void EndpointJournal::WriteUnit(const void* unit, uint32_t index) {
  if (pwrite(fd_, unit, kUnit, static_cast<off_t>(index) * kUnit) ==
          static_cast<ssize_t>(kUnit) ||
      failed_) {
    return;
  }
  // Once: what a crash report names may be wrong from now on.
  failed_ = true;
  spdlog::error("{}; a crash of this psmd will not be reported in full",
                Errno("cannot write the endpoint journal", path_));
}

void EndpointJournal::Record(const Entry& e) {
  if (!started_ || slot_of_.count(e.id) != 0) return;
  uint32_t slot;
  if (!free_slots_.empty()) {
    slot = free_slots_.back();
    free_slots_.pop_back();
  } else {
    slot = slots_++;
  }
  slot_of_[e.id] = slot;
  DiskRecord r{};
  r.live = kLive;
  r.id = e.id;
  r.epid = e.epid;
  r.uid = e.uid;
  r.pid = e.pid;
  std::memcpy(r.job, e.job.data(), sizeof(r.job));
  r.attached_unix_ns = e.attached_unix_ns;
  r.checksum = ChecksumOf(r);
  WriteUnit(&r, slot + 1);
}

void EndpointJournal::Clear(uint32_t id) {
  auto it = slot_of_.find(id);
  if (!started_ || it == slot_of_.end()) return;
  const uint32_t slot = it->second;
  slot_of_.erase(it);
  free_slots_.push_back(slot);
  const DiskRecord free{};
  WriteUnit(&free, slot + 1);
}

void EndpointJournal::MarkInStore() {
  if (started_) WriteHeader(Ending::kInStore);
}

void EndpointJournal::Remove() {
  if (fd_ < 0) return;
  if (unlink(path_.c_str()) != 0 && errno != ENOENT) {
    spdlog::warn("{}", Errno("cannot remove the endpoint journal", path_));
  }
  close(fd_);
  fd_ = -1;
  started_ = false;
}

uint64_t ReportPrevious(const std::string& path,
                        const EndpointJournal::Previous& previous,
                        bool successor_ended, uint32_t* lost) {
  *lost = 0;
  if (!previous.found) return 0;
  if (!previous.damage.empty()) {
    spdlog::warn(
        "the psmd before this one on this socket ended without stopping "
        "(killed or crashed), but its endpoint journal {} cannot be read "
        "({}): which endpoints ended with it is not known",
        Escaped(path), previous.damage);
    return 1;
  }
  *lost = static_cast<uint32_t>(previous.entries.size());
  std::string list;
  constexpr size_t kNamed = 8;  // one line, however many ended
  for (size_t i = 0; i < previous.entries.size() && i < kNamed; i++) {
    const EndpointJournal::Entry& e = previous.entries[i];
    char text[200];
    snprintf(text, sizeof(text),
             "%sendpoint %u (epid %#llx, pid %u, uid %u, "
             "job %s)",
             i == 0 ? "" : ", ", e.id, static_cast<unsigned long long>(e.epid),
             e.pid, e.uid, UuidToString(e.job).c_str());
    list += text;
  }
  if (previous.entries.size() > kNamed) {
    list +=
        " and " + std::to_string(previous.entries.size() - kNamed) + " more";
  }
  if (previous.ending == EndpointJournal::Ending::kInStore && successor_ended) {
    spdlog::warn(
        "psmd pid {} put {} endpoints into systemd's file-descriptor store, "
        "and the psmd started to take them over ended before it had (killed "
        "or crashed): they ended{}{}; their processes see \"lost psmd\". "
        "Restart {} after a crash since psmd last started clean (psmctl "
        "stats); the journal says why it ended",
        previous.pid, previous.entries.size(), list.empty() ? "" : ": ", list,
        previous.crash_restarts + 1);
    return previous.crash_restarts + 1;
  }
  if (previous.ending == EndpointJournal::Ending::kInStore) {
    // systemctl stop after a psmd stored its endpoints: an ordinary end.
    spdlog::info(
        "psmd pid {} put {} endpoints into systemd's file-descriptor store, "
        "which did not pass them on (systemctl stop): they ended{}{}",
        previous.pid, previous.entries.size(), list.empty() ? "" : ": ", list);
    return previous.crash_restarts;
  }
  const uint64_t restarts = previous.crash_restarts + 1;
  const time_t started =
      static_cast<time_t>(previous.started_unix_ns / 1000000000);
  char when[32] = "?";
  tm utc{};
  if (gmtime_r(&started, &utc) != nullptr) {
    strftime(when, sizeof(when), "%Y-%m-%dT%H:%M:%SZ", &utc);
  }
  spdlog::warn(
      "psmd pid {} (started {}, generation {}) ended without stopping "
      "(killed or crashed): "
      "the {} endpoints it served ended with it{}{}; their processes see "
      "\"lost psmd\". Restart {} after a crash since psmd last started "
      "clean (psmctl stats); its log says why it ended",
      previous.pid, when, previous.generation, previous.entries.size(),
      list.empty() ? "" : ": ", list, restarts);
  return restarts;
}

}  // namespace psmd
