#include "daemon/control/admission.h"

#include <fcntl.h>
#include <grpcpp/server.h>
#include <grpcpp/server_posix.h>
#include <poll.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <systemd/sd-daemon.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include <spdlog/spdlog.h>

#include "daemon/engine/cross_copy.h"
#include "daemon/log.h"
#include "shm/attach.h"
#include "shm/doorbell.h"

namespace psmd {

namespace {

// The /proc/PID/cgroup of the process that connected on `fd` (its pid from
// SO_PEERCRED), or "" when it cannot be told. The pid is that process's
// only while it lives: the file is read between taking a pidfd of the
// connecting process (SO_PEERPIDFD) and seeing that pidfd still alive
// afterwards, so it is the connecting process's, not a successor's under
// a reused pid. Without SO_PEERPIDFD (a kernel before 6.5) it is "".
std::string PeerCgroup(int fd, pid_t pid) {
  const int pidfd = CrossCopier::PeerPidfd(fd);
  if (pidfd < 0) return "";
  std::ifstream in("/proc/" + std::to_string(pid) + "/cgroup");
  std::stringstream text;
  text << in.rdbuf();
  // Readable once the process has exited.
  pollfd p{pidfd, POLLIN, 0};
  const bool alive = poll(&p, 1, 0) == 0;
  close(pidfd);
  return alive && in ? text.str() : "";
}

enum Kind : uint32_t { kListen = 1, kStop = 2, kPending = 3, kLiveness = 4 };

uint64_t Tag(Kind kind, int fd) {
  return (uint64_t{kind} << 32) | static_cast<uint32_t>(fd);
}

constexpr char kHttp2Preface[] = "PRI * HTTP/2.0";
constexpr auto kClassifyDeadline = std::chrono::seconds(2);

bool PeerCredentials(int fd, Credentials* out) {
  struct ucred cred;
  socklen_t len = sizeof(cred);
  if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) return false;
  out->pid = cred.pid;
  out->uid = cred.uid;
  out->gid = cred.gid;
  return true;
}

bool MakeParentDir(const std::string& path) {
  auto slash = path.rfind('/');
  if (slash == std::string::npos || slash == 0) return true;
  std::string dir = path.substr(0, slash);
  if (mkdir(dir.c_str(), 0755) == 0 || errno == EEXIST) return true;
  return false;
}

}  // namespace

Admission::Admission(const Config& config, Registry* registry)
    : config_(config), registry_(registry) {}

Admission::~Admission() { Stop(); }

bool Admission::Bind(const std::vector<int>& activated, int activation_error,
                     std::string* error) {
  if (activation_error < 0) {
    *error = std::string("socket activation: ") + strerror(-activation_error);
    return false;
  }
  if (activated.size() > 1) {
    *error = "systemd passed " + std::to_string(activated.size()) +
             " sockets; psmd.socket must have exactly one ListenStream=";
    return false;
  }
  if (!(activated.size() == 1 ? TakeActivatedSocket(activated[0], error)
                              : CreateSocket(error))) {
    return false;
  }
  PrepareFdNumbers();
  return true;
}

void Admission::Adopt(int listen_fd, bool activated, bool bound,
                      const std::vector<std::pair<int, uint32_t>>& liveness,
                      const std::vector<int>& pending) {
  listen_fd_ = listen_fd;
  activated_ = activated;
  bound_ = bound;
  fcntl(listen_fd_, F_SETFD, FD_CLOEXEC);
  // O_NONBLOCK belongs to the open socket, which systemd shares: it clears
  // the flag on psmd.socket's descriptor at every start (NonBlocking=no),
  // and a blocking accept would hold the admission thread for good.
  fcntl(listen_fd_, F_SETFL, fcntl(listen_fd_, F_GETFL) | O_NONBLOCK);
  for (const auto& [fd, id] : liveness) {
    fcntl(fd, F_SETFD, FD_CLOEXEC);
    liveness_[fd] = id;
  }
  for (int fd : pending) {
    Pending p;
    fcntl(fd, F_SETFD, FD_CLOEXEC);
    if (!PeerCredentials(fd, &p.creds)) {
      close(fd);
      continue;
    }
    p.since = std::chrono::steady_clock::now();
    pending_[fd] = p;
  }
  PrepareFdNumbers();
}

void Admission::Freeze(std::vector<int>* pending) {
  if (thread_.joinable()) {
    shm::RingEventFd(stop_fd_);
    thread_.join();
  }
  pending->clear();
  for (auto& [fd, p] : pending_) pending->push_back(fd);
  // liveness_ stays: the registry names those connections to the
  // successor, and Start watches them again if psmd serves on.
  if (epoll_fd_ >= 0) close(epoll_fd_);
  if (stop_fd_ >= 0) close(stop_fd_);
  epoll_fd_ = stop_fd_ = -1;
}

void Admission::PrepareFdNumbers() {
  // Room for the round-robin gRPC fd numbers (see the header comment).
  struct rlimit lim;
  if (getrlimit(RLIMIT_NOFILE, &lim) == 0 && lim.rlim_cur < lim.rlim_max) {
    lim.rlim_cur = lim.rlim_max;
    setrlimit(RLIMIT_NOFILE, &lim);
  }
  getrlimit(RLIMIT_NOFILE, &lim);
  high_fd_floor_ =
      lim.rlim_cur > 4096 ? 1024 : static_cast<int>(lim.rlim_cur / 2);
  next_high_fd_ = high_fd_floor_;
}

bool Admission::TakeActivatedSocket(int fd, std::string* error) {
  if (sd_is_socket_unix(fd, SOCK_STREAM, 1, config_.socket_path.c_str(), 0) <=
      0) {
    *error =
        "the socket systemd passed is not a listening Unix stream "
        "socket on " +
        config_.socket_path +
        "; make ListenStream= in psmd.socket and socket in psmd.toml "
        "the same path";
    return false;
  }
  fcntl(fd, F_SETFD, FD_CLOEXEC);
  fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
  // systemd owns the file (and its mode, SocketMode=): it is never unlinked
  // here, so clients may connect while psmd restarts.
  listen_fd_ = fd;
  activated_ = true;
  return true;
}

bool Admission::CreateSocket(std::string* error) {
  const std::string& path = config_.socket_path;
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (path.size() >= sizeof(addr.sun_path)) {
    *error = "socket path '" + path +
             "' is longer than 107 bytes; choose a shorter --socket";
    return false;
  }
  std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
  if (!MakeParentDir(path)) {
    *error = "cannot create the directory of " + path + ": " + strerror(errno);
    return false;
  }
  if (!RemoveStaleSocket(addr, error)) return false;
  listen_fd_ = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (listen_fd_ < 0 ||
      bind(listen_fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    *error = "cannot bind " + path + ": " + strerror(errno);
    return false;
  }
  bound_ = true;
  // Every user may connect; what they may do is decided per call from their
  // kernel-reported credentials.
  chmod(path.c_str(), 0666);
  if (listen(listen_fd_, 128) != 0) {
    *error = "cannot listen on " + path + ": " + strerror(errno);
    return false;
  }
  return true;
}

bool Admission::RemoveStaleSocket(const sockaddr_un& addr, std::string* error) {
  const std::string& path = config_.socket_path;
  struct stat st;
  if (lstat(path.c_str(), &st) != 0) {
    if (errno == ENOENT) return true;
    *error = "cannot examine " + path + ": " + strerror(errno);
    return false;
  }
  if (!S_ISSOCK(st.st_mode)) {
    *error = path +
             " exists and is not a socket; psmd will not remove it. Move it "
             "away or pass another --socket";
    return false;
  }
  // A live daemon on this path answers a connect; a stale socket refuses.
  int probe = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  int rc =
      connect(probe, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr));
  int connect_errno = errno;
  close(probe);
  if (rc == 0) {
    *error = "another process (a running psmd?) is serving " + path +
             "; stop it or pass another --socket";
    return false;
  }
  if (connect_errno != ECONNREFUSED) {
    *error = "cannot tell whether the socket " + path +
             " is in use (connect: " + strerror(connect_errno) +
             "); remove it if nothing serves it, or pass another --socket";
    return false;
  }
  if (unlink(path.c_str()) != 0 && errno != ENOENT) {
    *error = "cannot remove the stale socket " + path + ": " + strerror(errno);
    return false;
  }
  return true;
}

void Admission::Start(grpc::Server* server) {
  server_ = server;
  epoll_fd_ = epoll_create1(EPOLL_CLOEXEC);
  stop_fd_ = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.u64 = Tag(kListen, listen_fd_);
  epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, listen_fd_, &ev);
  ev.data.u64 = Tag(kStop, stop_fd_);
  epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, stop_fd_, &ev);
  // Adopted (Adopt), or kept by a handover that failed (Freeze).
  for (const auto& [fd, id] : liveness_) {
    epoll_event lev{};
    lev.events = EPOLLIN | EPOLLRDHUP;
    lev.data.u64 = Tag(kLiveness, fd);
    epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, fd, &lev);
  }
  // The fds first: Classify erases what it hands on from pending_, which
  // would end an iteration over it (a handover while a client attached).
  std::vector<int> pending;
  for (const auto& [fd, p] : pending_) pending.push_back(fd);
  for (int fd : pending) {
    epoll_event pev{};
    pev.events = EPOLLIN | EPOLLRDHUP | EPOLLET;
    pev.data.u64 = Tag(kPending, fd);
    epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, fd, &pev);
    Classify(fd);  // what arrived meanwhile raises no new edge
  }
  thread_ = std::thread([this] { Loop(); });
}

void Admission::Stop() {
  if (thread_.joinable()) {
    shm::RingEventFd(stop_fd_);
    thread_.join();
  }
  for (auto& [fd, p] : pending_) close(fd);
  pending_.clear();
  for (auto& [fd, id] : liveness_) close(fd);
  liveness_.clear();
  if (listen_fd_ >= 0) close(listen_fd_);
  listen_fd_ = -1;
  if (bound_) unlink(config_.socket_path.c_str());
  bound_ = false;
  if (epoll_fd_ >= 0) close(epoll_fd_);
  if (stop_fd_ >= 0) close(stop_fd_);
  epoll_fd_ = stop_fd_ = -1;
}

void Admission::Loop() {
  for (;;) {
    epoll_event events[32];
    // Short waits while accepting is paused, so that it resumes on time.
    int n = epoll_wait(epoll_fd_, events, 32, accept_paused_until_ ? 50 : 500);
    if (n < 0 && errno != EINTR) {
      spdlog::error("admission: epoll_wait: {}", strerror(errno));
      return;
    }
    for (int i = 0; i < n; i++) {
      Kind kind = static_cast<Kind>(events[i].data.u64 >> 32);
      int fd = static_cast<int>(events[i].data.u64 & 0xffffffffu);
      switch (kind) {
        case kStop:
          return;
        case kListen:
          Accept();
          break;
        case kPending:
          Classify(fd);
          break;
        case kLiveness: {
          // The client never writes on this line: any event is a hang-up (or
          // a misbehaving client, which we treat the same way).
          auto it = liveness_.find(fd);
          if (it == liveness_.end()) break;
          uint32_t id = it->second;
          liveness_.erase(it);
          epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, fd, nullptr);
          registry_->ConnectionLost(id);
          close(fd);
          break;
        }
      }
    }
    SweepPending();
    registry_->ExpireUnattached();
    ResumeAcceptingIfDue();
  }
}

void Admission::PauseAccepting() {
  refused_while_full_++;
  if (accept_paused_until_) return;
  accept_paused_until_ =
      std::chrono::steady_clock::now() + std::chrono::milliseconds(100);
  epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, listen_fd_, nullptr);
}

void Admission::ResumeAcceptingIfDue() {
  if (!accept_paused_until_ ||
      std::chrono::steady_clock::now() < *accept_paused_until_)
    return;
  accept_paused_until_.reset();
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.u64 = Tag(kListen, listen_fd_);
  epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, listen_fd_, &ev);
}

void Admission::Accept() {
  for (;;) {
    int fd =
        accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0) {
      if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS ||
          errno == ENOMEM) {
        // Connections wait in the backlog meanwhile. One line per second at
        // most, with what was refused since.
        static auto last_logged = std::chrono::steady_clock::time_point{};
        auto now = std::chrono::steady_clock::now();
        if (now - last_logged >= std::chrono::seconds(1)) {
          last_logged = now;
          spdlog::warn(
              "control socket: cannot accept connections: {} ({} times since "
              "the last "
              "report); pausing 100 ms. Raise psmd's file limit (LimitNOFILE) "
              "if "
              "clients are legitimate",
              strerror(errno), refused_while_full_ + 1);
          refused_while_full_ = 0;
        }
        PauseAccepting();
      } else if (errno != EAGAIN && errno != EINTR) {
        spdlog::warn("accept: {}", strerror(errno));
      }
      return;
    }
    Pending p;
    if (!PeerCredentials(fd, &p.creds)) {
      close(fd);
      continue;
    }
    // Connections still being classified count too: a tenant could
    // otherwise hold any number by sending half a preface every 2 s.
    if (p.creds.uid != 0 && !UnderConnectionLimit(p.creds.uid)) {
      RefuseConnection(fd, p.creds);
      continue;
    }
    p.since = std::chrono::steady_clock::now();
    pending_[fd] = p;
    epoll_event ev{};
    // Edge-triggered: Classify only peeks, so a connection that sent part of
    // a request (3 bytes, say) would stay readable and spin this thread until
    // SweepPending dropped it; an edge comes again when more data arrives.
    ev.events = EPOLLIN | EPOLLRDHUP | EPOLLET;
    ev.data.u64 = Tag(kPending, fd);
    epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, fd, &ev);
  }
}

void Admission::Classify(int fd) {
  auto it = pending_.find(fd);
  if (it == pending_.end()) return;
  char head[sizeof(shm::AttachRequest)];
  ssize_t n = recv(fd, head, sizeof(head), MSG_PEEK);
  if (n <= 0) {
    if (n < 0 && errno == EAGAIN) return;
    DropPending(fd);
    return;
  }
  size_t got = static_cast<size_t>(n);
  const size_t preface_len = sizeof(kHttp2Preface) - 1;
  if (std::memcmp(head, kHttp2Preface, std::min(got, preface_len)) == 0) {
    if (got < preface_len) return;  // wait for the rest of the preface
    Credentials creds = it->second.creds;
    pending_.erase(it);
    epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, fd, nullptr);
    HandOverToGrpc(fd, creds);
    return;
  }
  if (std::memcmp(head, shm::kAttachMagic,
                  std::min(got, sizeof(shm::kAttachMagic))) == 0) {
    if (got < sizeof(shm::AttachRequest)) return;  // wait for the token
    Credentials creds = it->second.creds;
    pending_.erase(it);
    epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, fd, nullptr);
    HandleAttach(fd, creds);
    return;
  }
  WarnClient(it->second.creds.uid,
             "control socket: pid {} uid {} sent neither gRPC nor an attach "
             "request; closed",
             it->second.creds.pid, it->second.creds.uid);
  DropPending(fd);
}

void Admission::RefuseConnection(int fd, const Credentials& creds) {
  WarnClient(creds.uid,
             "control socket: pid {} uid {} refused: the uid holds {} "
             "control connections already (max_control_connections_per_uid, "
             "psmd --max-control-connections-per-uid)",
             creds.pid, creds.uid, config_.max_control_connections_per_uid);
  registry_->refusals().Count(creds.uid,
                              refusals::k_control_connections_refused);
  close(fd);
}

void Admission::HandOverToGrpc(int fd, const Credentials& peer) {
  // Read once, here: what a Slurm step's job key is checked against
  // (Registry::RegisterSlurmStep), for every call on this connection.
  Credentials creds = peer;
  creds.cgroup = PeerCgroup(fd, creds.pid);
  fd = MoveToHighFd(fd);
  struct stat st {};
  fstat(fd, &st);
  {
    MutexLock lock(&creds_mu_);
    grpc_peers_[fd] = GrpcPeer{creds, st.st_ino};
  }
  grpc::AddInsecureChannelFromFd(server_, fd);
}

bool Admission::UnderConnectionLimit(uid_t uid) {
  uint32_t held = 0;
  for (const auto& [fd, p] : pending_) held += p.creds.uid == uid;
  MutexLock lock(&creds_mu_);
  for (auto it = grpc_peers_.begin(); it != grpc_peers_.end();) {
    struct stat st {};
    if (fstat(it->first, &st) != 0 || st.st_ino != it->second.inode) {
      it = grpc_peers_.erase(it);  // gRPC closed it
      continue;
    }
    if (it->second.creds.uid == uid) held++;
    ++it;
  }
  return held < config_.max_control_connections_per_uid;
}

void Admission::HandleAttach(int fd, const Credentials& creds) {
  shm::AttachRequest req;
  ssize_t n = recv(fd, &req, sizeof(req), 0);
  shm::AttachReply reply{};
  int fds[shm::kAttachFdCount];
  uint32_t endpoint_id = 0;
  Status err;
  if (n != static_cast<ssize_t>(sizeof(req))) {
    err = {PSM2_PARAM_ERR, "short attach request"};
  } else {
    AttachToken token;
    std::memcpy(token.data(), req.token, token.size());
    err = registry_->Attach(token, creds, fd, fds, &endpoint_id);
  }
  if (!err.ok()) {
    registry_->refusals().Count(creds.uid, refusals::k_attaches_refused);
    WarnClient(creds.uid, "attach from pid {} uid {} refused: {}", creds.pid,
               creds.uid, err.message);
    reply.status = err.code;
    shm::SendWithFds(fd, &reply, sizeof(reply), nullptr, 0);
    close(fd);
    return;
  }
  reply.nfds = shm::kAttachFdCount;
  if (!shm::SendWithFds(fd, &reply, sizeof(reply), fds, shm::kAttachFdCount)) {
    registry_->ConnectionLost(endpoint_id);
    close(fd);
    return;
  }
  liveness_[fd] = endpoint_id;
  epoll_event ev{};
  ev.events = EPOLLIN | EPOLLRDHUP;
  ev.data.u64 = Tag(kLiveness, fd);
  epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, fd, &ev);
}

void Admission::DropPending(int fd) {
  pending_.erase(fd);
  epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, fd, nullptr);
  close(fd);
}

void Admission::SweepPending() {
  auto now = std::chrono::steady_clock::now();
  std::vector<int> stale;
  for (auto& [fd, p] : pending_) {
    if (now - p.since > kClassifyDeadline) stale.push_back(fd);
  }
  for (int fd : stale) DropPending(fd);
}

int Admission::MoveToHighFd(int fd) {
  // F_DUPFD picks the lowest free number >= the hint, atomically, so this
  // never clobbers a descriptor another thread just opened.
  int moved = fcntl(fd, F_DUPFD_CLOEXEC, next_high_fd_);
  if (moved < 0) {
    next_high_fd_ = high_fd_floor_;  // hint past the limit: wrap around
    moved = fcntl(fd, F_DUPFD_CLOEXEC, next_high_fd_);
  }
  if (moved < 0) return fd;  // table full: keep the original number
  close(fd);
  next_high_fd_ = moved + 1;
  return moved;
}

bool Admission::CredentialsOf(const std::string& peer, Credentials* out) {
  if (peer.rfind("fd:", 0) != 0) return false;
  int fd = atoi(peer.c_str() + 3);
  MutexLock lock(&creds_mu_);
  auto it = grpc_peers_.find(fd);
  if (it == grpc_peers_.end()) return false;
  *out = it->second.creds;
  return true;
}

}  // namespace psmd
