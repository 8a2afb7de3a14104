#include "daemon/handover/handover.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <systemd/sd-daemon.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <set>

namespace psmd::handover {

namespace {

constexpr char kMagic[8] = {'p', 's', 'm', 'd', '-', 'h', 'o', 'v'};
// The most a state file may hold: far above what max_endpoints endpoints
// with full queues write, far below what would exhaust a node.
constexpr uint64_t kMaxBody = uint64_t{4} << 30;

// FNV-1a, 64 bits: the file is psmd's own, sealed, and passed between two
// processes of root; the checksum is against damage and misreading, not
// against an adversary.
constexpr uint64_t kChecksumStart = 0xcbf29ce484222325ull;
uint64_t Checksum(std::string_view s, uint64_t h = kChecksumStart) {
  for (unsigned char c : s) {
    h ^= c;
    h *= 0x100000001b3ull;
  }
  return h;
}

bool WriteAll(int fd, const char* p, size_t n) {
  while (n > 0) {
    ssize_t w = write(fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
    p += w;
    n -= static_cast<size_t>(w);
  }
  return true;
}

}  // namespace

void FdTable::Write(StateWriter& w) const {
  w.U32(static_cast<uint32_t>(fds_.size()));
  for (int fd : fds_) w.U32(static_cast<uint32_t>(fd));
}

bool FdTable::Read(StateReader& r, const std::vector<int>* handed) {
  uint32_t n = 0;
  if (!r.Count(&n, 4, 1u << 22, "descriptor count")) return false;
  fds_.clear();
  std::set<int> seen;
  for (uint32_t i = 0; i < n; ++i) {
    uint32_t recorded = 0;
    if (!r.U32(&recorded, "descriptor")) return false;
    int fd = recorded > INT32_MAX ? -1 : static_cast<int>(recorded);
    if (handed != nullptr) fd = i < handed->size() ? (*handed)[i] : -1;
    if (fd == -1 && handed != nullptr) {
      fds_.push_back(-1);  // not given back: Take says so
      continue;
    }
    if (fd < 3 || fcntl(fd, F_GETFD) < 0) {
      return r.Fail("descriptor", std::to_string(fd) + " is not open here");
    }
    if (!seen.insert(fd).second) {
      return r.Fail("descriptor", std::to_string(fd) + " is named twice");
    }
    fds_.push_back(fd);
  }
  taken_.assign(fds_.size(), false);
  return true;
}

bool FdTable::Take(uint32_t index, int* fd, StateReader& r, const char* what) {
  if (index >= fds_.size()) {
    return r.Fail(what, "names descriptor " + std::to_string(index) + " of " +
                            std::to_string(fds_.size()));
  }
  if (taken_[index]) {
    return r.Fail(what, "names descriptor " + std::to_string(index) +
                            ", which another entry took");
  }
  if (fds_[index] < 0) {
    return r.Fail(what, "descriptor " + std::to_string(index) +
                            " was not given back by the service manager "
                            "(is its FileDescriptorStoreMax= too small?)");
  }
  taken_[index] = true;
  *fd = fds_[index];
  return true;
}

bool FdTable::TakeIfHanded(uint32_t index, int* fd, StateReader& r,
                           const char* what) {
  if (index < fds_.size() && fds_[index] < 0 && !taken_[index]) {
    taken_[index] = true;
    *fd = -1;
    return true;
  }
  return Take(index, fd, r, what);
}

void FdTable::CloseUntaken() {
  taken_.resize(fds_.size(), false);
  for (size_t i = 0; i < fds_.size(); ++i) {
    if (!taken_[i] && fds_[i] >= 0) close(fds_[i]);
    taken_[i] = true;
  }
}

std::vector<int> FdTable::TakeRest() {
  std::vector<int> rest;
  taken_.resize(fds_.size(), false);
  for (size_t i = 0; i < fds_.size(); ++i) {
    if (!taken_[i] && fds_[i] >= 0) rest.push_back(fds_[i]);
    taken_[i] = true;
  }
  return rest;
}

void ProcessState::Write(StateWriter& w) const {
  w.U16(node_id);
  w.U16(boot_nonce);
  w.Str(socket_path);
  w.U32(workers);
  w.U32(listen_fd);
  w.U32(static_cast<uint32_t>(pending.size()));
  for (uint32_t p : pending) w.U32(p);
  w.Bool(activated);
  w.Bool(bound);
  w.U64(frozen_at_ns);
  w.U32(old_pid);
  w.U64(generation);
  w.Str(old_version);
}

bool ProcessState::Read(StateReader& r) {
  uint32_t n = 0;
  if (!r.U16(&node_id, "node id") || !r.U16(&boot_nonce, "boot nonce") ||
      !r.Str(&socket_path, 4096, "socket path") ||
      !r.U32(&workers, "workers") || !r.U32(&listen_fd, "control socket") ||
      !r.Count(&n, 4, 1u << 20, "pending connections")) {
    return false;
  }
  pending.resize(n);
  for (uint32_t& p : pending) {
    if (!r.U32(&p, "pending connection")) return false;
  }
  return r.Bool(&activated, "socket activated") && r.Bool(&bound, "bound") &&
         r.U64(&frozen_at_ns, "stop time") && r.U32(&old_pid, "old pid") &&
         r.U64(&generation, "generation") &&
         r.Str(&old_version, 256, "old version");
}

void CarriedFabric::Write(StateWriter& w) const {
  w.Bool(present);
  if (!present) return;
  w.U64(incarnation);
  w.Str(host_description);
  w.U32(static_cast<uint32_t>(sessions.size()));
  for (const hw::CarriedSession& s : sessions) {
    w.U64(s.id);
    w.U64(s.node);
    w.Bool(s.outgoing);
    hw::HostDescription d;
    d.node = s.node;
    d.addresses = s.addresses;
    w.Str(s.addresses.empty() ? "" : hw::FormatHostDescription(d));
    w.U64(s.peer_incarnation);
    w.U64(s.tx_seq);
    w.U64(s.rx_delivered);
  }
}

bool CarriedFabric::Read(StateReader& r) {
  if (!r.Bool(&present, "fabric carried")) return false;
  if (!present) return true;
  uint32_t n = 0;
  std::string error;
  hw::HostDescription self;
  if (!r.U64(&incarnation, "fabric incarnation") ||
      !r.Str(&host_description, 4096, "fabric host description")) {
    return false;
  }
  if (incarnation == 0) return r.Fail("fabric incarnation", "is 0");
  if (!hw::ParseHostDescription(host_description, &self, &error)) {
    return r.Fail("fabric host description", error);
  }
  if (!r.Count(&n, 8 + 8 + 1 + 4 + 24, 0xffff, "fabric sessions")) return false;
  sessions.resize(n);
  for (hw::CarriedSession& s : sessions) {
    std::string peer;
    if (!r.U64(&s.id, "session id") || !r.U64(&s.node, "session node") ||
        !r.Bool(&s.outgoing, "session dialled") ||
        !r.Str(&peer, 4096, "session peer") ||
        !r.U64(&s.peer_incarnation, "session peer incarnation") ||
        !r.U64(&s.tx_seq, "session frames sent") ||
        !r.U64(&s.rx_delivered, "session frames delivered")) {
      return false;
    }
    if (s.id == 0 || s.node == 0 || s.node == self.node) {
      return r.Fail("session", "names no id, no node, or this node");
    }
    if (!peer.empty()) {
      hw::HostDescription d;
      if (!hw::ParseHostDescription(peer, &d, &error) || d.node != s.node) {
        return r.Fail("session peer", error.empty() ? "another node" : error);
      }
      s.addresses = d.addresses;
    }
  }
  return true;
}

void WriteArenaState(StateWriter& w, const shm::SendArena::State& s) {
  w.U64(s.head);
  w.U64(s.tail);
  w.U64(s.refused_since_ns);
  w.U64(s.share_refused_since_ns);
  w.U64(s.sweep_from);
  for (const auto* pieces : {&s.ring, &s.set_aside}) {
    w.U32(static_cast<uint32_t>(pieces->size()));
    for (const auto& piece : *pieces) {
      w.U64(piece.at);
      w.U64(piece.bytes);
      w.Bool(piece.is_padding);
      w.Bool(piece.lingers);
    }
  }
}

bool ReadArenaState(StateReader& r, shm::SendArena::State* s) {
  if (!r.U64(&s->head, "arena head") || !r.U64(&s->tail, "arena tail") ||
      !r.U64(&s->refused_since_ns, "arena refusal") ||
      !r.U64(&s->share_refused_since_ns, "arena share refusal") ||
      !r.U64(&s->sweep_from, "arena sweep")) {
    return false;
  }
  for (auto* pieces : {&s->ring, &s->set_aside}) {
    uint32_t n = 0;
    if (!r.Count(&n, 18, 1u << 24, "arena pieces")) return false;
    pieces->resize(n);
    for (auto& piece : *pieces) {
      if (!r.U64(&piece.at, "arena piece offset") ||
          !r.U64(&piece.bytes, "arena piece bytes") ||
          !r.Bool(&piece.is_padding, "arena piece padding") ||
          !r.Bool(&piece.lingers, "arena piece lingering")) {
        return false;
      }
    }
  }
  return true;
}

uint64_t MonotonicNs() {
  timespec t{};
  clock_gettime(CLOCK_MONOTONIC, &t);
  return uint64_t(t.tv_sec) * 1'000'000'000u + uint64_t(t.tv_nsec);
}

int WriteStateFile(std::initializer_list<std::string_view> pieces,
                   const std::string& version, std::string* error) {
  int fd = memfd_create("psmd-handover", MFD_ALLOW_SEALING);
  if (fd < 0) {
    *error = std::string("memfd_create: ") + strerror(errno);
    return -1;
  }
  uint64_t bytes = 0;
  uint64_t sum = kChecksumStart;
  for (std::string_view piece : pieces) {
    bytes += piece.size();
    sum = Checksum(piece, sum);
  }
  StateWriter head;
  for (char c : kMagic) head.U8(static_cast<uint8_t>(c));
  head.U32(kFormatVersion);
  head.U32(0);
  head.U64(bytes);
  head.U64(sum);
  head.Str(version);
  bool written = WriteAll(fd, head.bytes().data(), head.bytes().size());
  for (std::string_view piece : pieces) {
    written = written && WriteAll(fd, piece.data(), piece.size());
  }
  if (!written) {
    *error = std::string("writing the state file: ") + strerror(errno);
    close(fd);
    return -1;
  }
  // Sealed: nothing may change it between the two processes, and the
  // successor reads it in place (ReadStateFile).
  fcntl(fd, F_ADD_SEALS,
        F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_WRITE | F_SEAL_SEAL);
  return fd;
}

StateFileBody::~StateFileBody() {
  if (map_ != nullptr) munmap(map_, map_bytes_);
}

StateFileBody& StateFileBody::operator=(StateFileBody&& other) noexcept {
  if (this != &other) {
    if (map_ != nullptr) munmap(map_, map_bytes_);
    map_ = std::exchange(other.map_, nullptr);
    map_bytes_ = std::exchange(other.map_bytes_, 0);
    copy_ = std::move(other.copy_);
    at_ = std::exchange(other.at_, 0);
    size_ = std::exchange(other.size_, 0);
  }
  return *this;
}

Status ReadStateFile(int fd, StateFileBody* body) {
  *body = StateFileBody();
  struct stat st {};
  bool read_ok = fstat(fd, &st) == 0 && st.st_size >= 0 &&
                 static_cast<uint64_t>(st.st_size) <= kMaxBody + 4096;
  const size_t file_bytes = read_ok ? static_cast<size_t>(st.st_size) : 0;
  // Sealed against every change: its bytes stay what they are while read
  // in place (a mapped file that shrank would fault the reader).
  constexpr int kSealed = F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_WRITE;
  const int seals = read_ok ? fcntl(fd, F_GET_SEALS) : -1;
  if (read_ok && file_bytes > 0 && seals >= 0 && (seals & kSealed) == kSealed) {
    // Populated: one system call maps the file's pages, not a fault each.
    void* map =
        mmap(nullptr, file_bytes, PROT_READ, MAP_SHARED | MAP_POPULATE, fd, 0);
    if (map != MAP_FAILED) {
      body->map_ = map;
      body->map_bytes_ = file_bytes;
    }
  }
  if (read_ok && body->map_ == nullptr) {
    std::string& file = body->copy_;
    file.resize(file_bytes);
    size_t got = 0;
    while (got < file.size()) {
      ssize_t n = pread(fd, &file[got], file.size() - got, off_t(got));
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) break;
      got += static_cast<size_t>(n);
    }
    read_ok = got == file.size();
  }
  close(fd);
  if (!read_ok) {
    *body = StateFileBody();
    return {PSM2_INTERNAL_ERR, "cannot read the state file (size " +
                                   std::to_string(st.st_size) + ")"};
  }
  const char* file = body->map_ != nullptr
                         ? static_cast<const char*>(body->map_)
                         : body->copy_.data();
  StateReader r(file, file_bytes);
  uint8_t magic[sizeof(kMagic)];
  for (auto& m : magic) r.U8(&m, "magic");
  uint32_t format = 0, flags = 0;
  uint64_t len = 0, sum = 0;
  std::string writer;
  const auto refuse = [body](std::string why) -> Status {
    *body = StateFileBody();
    return {PSM2_INTERNAL_ERR, std::move(why)};
  };
  if (!r.ok() || std::memcmp(magic, kMagic, sizeof(kMagic)) != 0) {
    return refuse("not a psmd state file (wrong magic)");
  }
  if (!r.U32(&format, "format")) return refuse(r.error());
  if (format != kFormatVersion) {
    return refuse("state format " + std::to_string(format) +
                  ", this psmd reads " + std::to_string(kFormatVersion) +
                  " only");
  }
  if (!r.U32(&flags, "flags") || !r.U64(&len, "length") ||
      !r.U64(&sum, "checksum") || !r.Str(&writer, 256, "writer version")) {
    return refuse(r.error());
  }
  if (flags != 0) {
    return refuse("state flags " + std::to_string(flags) +
                  " unknown to this psmd");
  }
  if (len != r.Left()) {
    return refuse("state length " + std::to_string(len) +
                  " where the file holds " + std::to_string(r.Left()) +
                  " bytes");
  }
  body->at_ = file_bytes - r.Left();
  body->size_ = r.Left();
  if (Checksum(std::string_view(body->data(), body->size())) != sum) {
    return refuse("state checksum mismatch (written by psmd " + writer +
                  "): the file is damaged");
  }
  return {};
}

int TakeStateFd() {
  const char* env = getenv(kEnvFd);
  if (env == nullptr) return -1;
  char* end = nullptr;
  long fd = strtol(env, &end, 10);
  const bool valid = *env != '\0' && *end == '\0' && fd >= 3 &&
                     fd < INT32_MAX &&
                     fcntl(static_cast<int>(fd), F_GETFD) >= 0;
  unsetenv(kEnvFd);
  if (!valid) return -2;
  fcntl(static_cast<int>(fd), F_SETFD, FD_CLOEXEC);
  return static_cast<int>(fd);
}

namespace {

constexpr char kStateFdName[] = "psmd-state";
constexpr char kTableFdPrefix[] = "psmd-fd-";

// FDSTOREREMOVE=1 of every descriptor named `name`: false if the notify
// socket refused it (no service manager: nothing was stored either).
bool ForgetStored(const std::string& name) {
  const std::string msg = "FDSTOREREMOVE=1\nFDNAME=" + name;
  return sd_pid_notify(0, 0, msg.c_str()) > 0;
}

}  // namespace

ServiceManagerFds TakeServiceManagerFds() {
  ServiceManagerFds out;
  char** names = nullptr;
  const int n = sd_listen_fds_with_names(1, &names);
  if (n < 0) {
    out.error = n;
    return out;
  }
  const size_t prefix = sizeof(kTableFdPrefix) - 1;
  for (int i = 0; i < n; i++) {
    const int fd = SD_LISTEN_FDS_START + i;
    const std::string name = names != nullptr && names[i] ? names[i] : "";
    if (name == kStateFdName) {
      out.states++;
      if (out.state_fd >= 0) close(out.state_fd);
      out.state_fd = fd;
    } else if (name.compare(0, prefix, kTableFdPrefix) == 0) {
      out.table_names.push_back(name);
      char* end = nullptr;
      const unsigned long index = strtoul(name.c_str() + prefix, &end, 10);
      if (*end != '\0' || index >= (1u << 22)) {
        close(fd);
        continue;
      }
      if (out.handed.size() <= index) out.handed.resize(index + 1, -1);
      if (out.handed[index] >= 0) close(out.handed[index]);
      out.handed[index] = fd;
    } else {
      out.activated.push_back(fd);
    }
    fcntl(fd, F_SETFD, FD_CLOEXEC);
  }
  if (names != nullptr) {
    for (int i = 0; i < n; i++) free(names[i]);
    free(names);
  }
  if (out.states > 0) ForgetStored(kStateFdName);
  if (out.states > 1) {
    close(out.state_fd);
    out.state_fd = -1;
  }
  // A name given twice (the same reason) leaves one removal to send.
  std::sort(out.table_names.begin(), out.table_names.end());
  out.table_names.erase(
      std::unique(out.table_names.begin(), out.table_names.end()),
      out.table_names.end());
  return out;
}

bool OrphanedTable(const ServiceManagerFds& fds) {
  return fds.states == 0 && std::any_of(fds.handed.begin(), fds.handed.end(),
                                        [](int fd) { return fd >= 0; });
}

void EndStored(const ServiceManagerFds& fds, const std::string& reason) {
  std::vector<int> stored;
  for (int fd : fds.handed) {
    if (fd >= 0) stored.push_back(fd);
  }
  EndInherited(reason, stored);
}

int ForgetStoredFds(const ServiceManagerFds& fds) {
  int refused = 0;
  for (const std::string& name : fds.table_names) {
    if (!ForgetStored(name)) refused++;
  }
  // systemd reads its notify socket in order: past the barrier, every
  // removal above is done.
  constexpr uint64_t kBarrierUs = 1000000;
  if (!fds.table_names.empty() && sd_notify_barrier(0, kBarrierUs) < 0) {
    refused = static_cast<int>(fds.table_names.size());
  }
  return refused;
}

bool StoreWithServiceManager(int state_fd, const std::vector<int>& fds,
                             std::string* error) {
  // One message per descriptor: a name applies to every descriptor of its
  // message, and the names carry the table's order (systemd may hand them
  // back in another).
  auto store = [&](int fd, const std::string& name) {
    const std::string msg = "FDSTORE=1\nFDNAME=" + name;
    const int rc = sd_pid_notify_with_fds(0, 0, msg.c_str(), &fd, 1);
    if (rc <= 0) {
      *error = rc == 0
                   ? "no service manager (NOTIFY_SOCKET unset)"
                   : std::string("sd_pid_notify_with_fds: ") + strerror(-rc);
      return false;
    }
    return true;
  };
  for (size_t i = 0; i < fds.size(); i++) {
    if (!store(fds[i], kTableFdPrefix + std::to_string(i))) return false;
  }
  // The state last: a successor that finds it finds the rest too.
  return store(state_fd, kStateFdName);
}

void Exec(const std::string& path, const std::vector<std::string>& argv,
          int state_fd, const std::vector<int>& keep, std::string* error) {
  for (int fd : keep) fcntl(fd, F_SETFD, 0);
  fcntl(state_fd, F_SETFD, 0);
  setenv(kEnvFd, std::to_string(state_fd).c_str(), 1);
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  execv(path.c_str(), args.data());
  *error = "exec " + path + ": " + strerror(errno);
  unsetenv(kEnvFd);
  for (int fd : keep) fcntl(fd, F_SETFD, FD_CLOEXEC);
  fcntl(state_fd, F_SETFD, FD_CLOEXEC);
}

std::vector<int> InheritedFds() {
  std::vector<int> fds;
  DIR* dir = opendir("/proc/self/fd");
  if (dir == nullptr) return fds;
  const int own = dirfd(dir);
  while (dirent* e = readdir(dir)) {
    char* end = nullptr;
    long fd = strtol(e->d_name, &end, 10);
    if (*end != '\0' || e->d_name[0] == '.' || fd < 3 || fd == own) continue;
    fds.push_back(static_cast<int>(fd));
  }
  closedir(dir);
  return fds;
}

int EndInherited(const std::string& reason, const std::vector<int>& inherited) {
  int told = 0;
  for (int fd : inherited) {
    int type = 0, listening = 0;
    socklen_t len = sizeof(type);
    sockaddr_storage peer{};
    socklen_t peer_len = sizeof(peer);
    if (getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &len) == 0 &&
        type == SOCK_STREAM &&
        getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &listening, &len) == 0 &&
        !listening &&
        getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &peer_len) == 0 &&
        peer.ss_family == AF_UNIX) {
      const std::string line = reason + "\n";
      if (send(fd, line.data(), line.size(), MSG_DONTWAIT | MSG_NOSIGNAL) > 0) {
        told++;
      }
      shutdown(fd, SHUT_RDWR);
    }
    close(fd);
  }
  return told;
}

}  // namespace psmd::handover
