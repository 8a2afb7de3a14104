#include "hw/socket/socket_fabric.h"

#include <arpa/inet.h>
#include <liburing.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <spdlog/spdlog.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "hw/link_fabric.h"

namespace psmd::hw {
namespace {

// The low bits of an io_uring user_data name the operation; the rest is
// the Conn or Listener it belongs to (both 8-byte aligned).
enum OpKind : uint64_t {
  kOpConnect = 1,
  kOpLinkTimeout = 2,
  kOpRecv = 3,
  kOpSend = 4,
  kOpCancel = 5,
  kOpAccept = 6,
  kOpAuthNotify = 7,
};
constexpr uint64_t kOpMask = 7;
constexpr size_t kMaxSendIov = 256;  // per sendmsg, well under IOV_MAX
// Per connection: one read takes up to this much, so many small frames
// arrive with one completion. It bounds what a connection with no receive
// posted holds (the rest waits in the kernel, holding the sender back).
// A stream of 16 KiB messages needed two reads per message with a 16 KiB
// stage (headers and the first bytes, then the rest of the payload) and
// moved 0.84-1.07 GB/s between two daemons; with 64 KiB, 1.0-2.5 GB/s, and
// with 256 KiB, 1.4-2.9 GB/s (the payloads are copied out of the stage; a
// read costs more here than a 16 KiB copy: the kernel's TCP receive path
// and the acknowledgement it sends).
constexpr size_t kStageSize = 131072;
// But a frame's payload larger than this is read straight into its receive
// as far as it is not in the stage already, so after such a frame reads ask
// for only kStageAfterLarge bytes: a rendezvous stream (256 KiB chunks) is
// not copied through the stage. (With the whole 256 KiB stage read every
// time, streaming 256 KiB messages fell from 2.1-4.1 to 2.0-3.1 GB/s.)
constexpr size_t kLargePayload = 65536;
constexpr size_t kStageAfterLarge = 16384;
constexpr int64_t kDeadlineCheckNs = kLinkCheckNs;

ErrorClass FromErrno(int err) {
  switch (err) {
    case ECONNRESET:
    case EPIPE:
    case ECONNABORTED:
      return ErrorClass::kConnReset;
    case ETIMEDOUT:
      return ErrorClass::kTimeout;
    case ECONNREFUSED:
    case EHOSTUNREACH:
    case ENETUNREACH:
    case EADDRNOTAVAIL:
      return ErrorClass::kConnFailed;
    case ECANCELED:
      return ErrorClass::kCanceled;
    default:
      return ErrorClass::kFail;
  }
}

bool MakeSockaddr(const std::string& host, uint16_t port, sockaddr_storage* ss,
                  socklen_t* len) {
  std::memset(ss, 0, sizeof *ss);
  auto* s4 = reinterpret_cast<sockaddr_in*>(ss);
  if (inet_pton(AF_INET, host.c_str(), &s4->sin_addr) == 1) {
    s4->sin_family = AF_INET;
    s4->sin_port = htons(port);
    *len = sizeof *s4;
    return true;
  }
  auto* s6 = reinterpret_cast<sockaddr_in6*>(ss);
  if (inet_pton(AF_INET6, host.c_str(), &s6->sin6_addr) == 1) {
    s6->sin6_family = AF_INET6;
    s6->sin6_port = htons(port);
    *len = sizeof *s6;
    return true;
  }
  return false;
}

class SocketFabric final : public LinkFabric {
 public:
  explicit SocketFabric(const FabricOptions& options) : LinkFabric(options) {}
  ~SocketFabric() override;

  bool Open(std::string* error);

  int event_fd() const override { return event_fd_; }
  int Poll(Event* events, int max) override;
  int Wait(Event* events, int max, int timeout_ms) override;

 private:
  using State = LinkState;  // kConnecting: the TCP connect is in progress
  // kStage: frames are parsed from the staging buffer (small payloads are
  // copied out of it); kPayload: the rest of a large payload is received
  // straight into the posted receive; kDrain: the rest of a truncated one
  // is discarded.
  // kAwaitPayload: a header went to a header-only receive; nothing is
  // read until PostPayload says where its payload goes.
  enum class RxPhase { kStage, kPayload, kDrain, kAwaitPayload };

  using PendingSend = LinkSend;
  using PostedRecv = LinkRecv;

  struct alignas(8) Conn : LinkConn {
    int fd = -1;
    int inflight = 0;  // io_uring operations not yet completed
    sockaddr_storage addr;
    socklen_t addr_len = 0;

    // Receive side.
    RxPhase rx_phase = RxPhase::kStage;
    bool rx_inflight = false;
    std::unique_ptr<uint8_t[]> stage;  // kStageSize bytes, from the first read
    bool rx_after_large = false;       // the last data frame > kLargePayload
    size_t stage_begin = 0;
    size_t stage_end = 0;
    std::vector<iovec> rx_iov;
    msghdr rx_msg{};

    // Send side.
    bool tx_inflight = false;
    std::vector<iovec> tx_iov;
    msghdr tx_msg{};
  };

  struct alignas(8) Listener {
    int fd = -1;
    std::string host;
    uint16_t port = 0;
    bool paused = false;  // out of fds: accepting resumes at the next check
  };

  io_uring_sqe* Sqe();
  void Submit();
  void ArmAccept(Listener* l);
  void ArmAuthNotify();
  // LinkFabric's hooks.
  void Fail(LinkConn* c, ErrorClass error) override;
  void Goodbye(LinkConn* c) override;
  void StopListening() override {
    // Leaves the listening state at once, whoever holds the socket: the
    // successor's bind to the port (SO_REUSEADDR) then succeeds.
    for (auto& l : listeners_) shutdown(l->fd, SHUT_RDWR);
  }
  void FlushSends(LinkConn* c) override;
  void ParseRx(LinkConn* c) override;
  void AfterRx(LinkConn* c) override { ArmRecv(static_cast<Conn*>(c)); }
  void Consume(LinkConn* c, size_t n) override {
    static_cast<Conn*>(c)->stage_begin += n;
  }
  void PayloadPosted(LinkConn* c) override;

  LinkConn* NewLink(bool outgoing) override { return NewConn(outgoing); }
  void StartAttempt(LinkConn* c) override;
  Conn* NewConn(bool outgoing);
  void SetLinkOptions(int fd);
  void StartPayload(Conn* c);
  void ArmRecv(Conn* c);
  void Finish(Conn* c);

  void HandleCqe(const io_uring_cqe* cqe);
  void OnConnect(Conn* c, int res);
  void OnAccept(Listener* l, int res);
  void OnRecv(Conn* c, int res);
  void OnSend(Conn* c, int res);
  void OnData(Conn* c, ErrorClass error);
  void CheckDeadlines(int64_t now);
  void Collect(Event* events, int max, int* n);

  Conn* Find(ConnId id) { return static_cast<Conn*>(FindLive(id)); }

  io_uring ring_{};
  bool ring_ok_ = false;
  int event_fd_ = -1;
  int auth_fd_ = -1;
  uint64_t auth_buf_ = 0;
  __kernel_timespec attempt_ts_{};  // per-address connect timeout
  std::vector<std::unique_ptr<Listener>> listeners_;

  std::vector<Conn*> finish_;  // closing: check whether they can go
  int64_t next_check_ns_ = 0;
  int64_t next_limit_log_ns_ = 0;
  uint8_t drain_[16384];
};

SocketFabric::~SocketFabric() {
  for (auto& [link, owner] : owned_) {
    auto* c = static_cast<Conn*>(link);
    // Handed over: the sessions go on in the successor, so the peers see
    // the connections break (as at a process exit), not end.
    if (!handed_over_ && !c->closing && c->state == State::kOpen) Goodbye(c);
    if (c->fd >= 0) shutdown(c->fd, SHUT_RDWR);
  }
  // Tear the ring down before the buffers its operations point into.
  if (ring_ok_) io_uring_queue_exit(&ring_);
  auth_.reset();
  for (auto& [link, owner] : owned_) {
    auto* c = static_cast<Conn*>(link);
    if (c->fd >= 0) close(c->fd);
  }
  for (auto& l : listeners_) close(l->fd);
  if (event_fd_ >= 0) close(event_fd_);
  if (auth_fd_ >= 0) close(auth_fd_);
}

bool SocketFabric::Open(std::string* error) {
  // LinkFabric bounds max_iov to 255: one sendmsg holds a frame's iovecs.
  static_assert(kMaxSendIov - 1 >= 255);
  std::vector<ListenAddress> addresses;
  if (!CheckOptions(&addresses, error)) return false;
  attempt_ts_.tv_sec = opt_.connect_attempt_ms / 1000;
  attempt_ts_.tv_nsec = (opt_.connect_attempt_ms % 1000) * 1'000'000ll;

  // The completion queue holds every operation that can be in flight (a
  // few per connection, one per listener), so it never overflows.
  //
  // Cooperative task running: a receive that data completes finishes in
  // task work on our thread. By default the kernel interrupts the thread
  // for it (an IPI) wherever it runs; on this VM that made a spinning
  // io_uring ping-pong over loopback TCP take 28.6 us per half round trip
  // against 6.6-8.1 us with COOP_TASKRUN, where the kernel only raises
  // IORING_SQ_TASKRUN (TASKRUN_FLAG) and Poll enters the kernel when it
  // sees it (docs/design.md, "Between nodes"). A sleeping thread is still
  // woken. Kernels before 5.19 refuse the flags: then without them.
  io_uring_params params{};
  params.flags = IORING_SETUP_CQSIZE | IORING_SETUP_COOP_TASKRUN |
                 IORING_SETUP_TASKRUN_FLAG;
  params.cq_entries = std::min<uint32_t>(
      65536, std::max<uint32_t>(opt_.ring_entries * 2,
                                4 * opt_.max_connections + 256));
  const io_uring_params wanted = params;
  int err = io_uring_queue_init_params(opt_.ring_entries, &ring_, &params);
  if (err == -EINVAL) {
    params = wanted;
    params.flags = IORING_SETUP_CQSIZE;
    err = io_uring_queue_init_params(opt_.ring_entries, &ring_, &params);
  }
  if (err < 0) {
    *error = std::string("io_uring is not available: ") + std::strerror(-err);
    return false;
  }
  ring_ok_ = true;
  event_fd_ = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  auth_fd_ = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (event_fd_ < 0 || auth_fd_ < 0 ||
      io_uring_register_eventfd(&ring_, event_fd_) < 0) {
    *error = std::string("fabric eventfd: ") + std::strerror(errno);
    return false;
  }

  self_.node = opt_.node_id;
  for (const ListenAddress& a : addresses) {
    auto l = std::make_unique<Listener>();
    l->host = a.host;
    int last_errno = 0;
    for (uint32_t port = a.port_lo; port <= a.port_hi; port++) {
      sockaddr_storage ss;
      socklen_t len;
      MakeSockaddr(a.host, static_cast<uint16_t>(port), &ss, &len);
      int fd = socket(ss.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
      if (fd < 0) {
        last_errno = errno;
        break;
      }
      int one = 1;
      setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
      if (bind(fd, reinterpret_cast<sockaddr*>(&ss), len) == 0 &&
          listen(fd, 128) == 0) {
        getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &len);
        l->port = ntohs(reinterpret_cast<sockaddr_in*>(&ss)->sin_port);
        l->fd = fd;
        break;
      }
      last_errno = errno;
      close(fd);
    }
    if (l->fd < 0) {
      *error = "fabric: cannot listen on " + a.host + " ports " +
               std::to_string(a.port_lo) + "-" + std::to_string(a.port_hi) +
               ": " + std::strerror(last_errno) +
               " (give a free port or a wider range)";
      return false;
    }
    self_.addresses.push_back({l->host, l->port});
    listeners_.push_back(std::move(l));
  }
  if (opt_.auth == AuthMode::kMunge) {
    auth_ = std::make_unique<MungeAuth>(opt_.munge_socket, auth_fd_);
  }
  for (auto& l : listeners_) ArmAccept(l.get());
  ArmAuthNotify();
  Submit();
  spdlog::info("fabric: node {} listening at {} (auth {})", opt_.node_id,
               HostDescription(),
               opt_.auth == AuthMode::kMunge ? "munge" : "none");
  return true;
}

// ---- submissions ----

io_uring_sqe* SocketFabric::Sqe() {
  io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
  while (sqe == nullptr) {  // the queue is full: hand the batch over
    io_uring_submit(&ring_);
    sqe = io_uring_get_sqe(&ring_);
  }
  return sqe;
}

void SocketFabric::Submit() {
  if (io_uring_sq_ready(&ring_) > 0) io_uring_submit(&ring_);
}

void SocketFabric::ArmAccept(Listener* l) {
  io_uring_sqe* sqe = Sqe();
  io_uring_prep_accept(sqe, l->fd, nullptr, nullptr,
                       SOCK_NONBLOCK | SOCK_CLOEXEC);
  io_uring_sqe_set_data64(sqe, reinterpret_cast<uint64_t>(l) | kOpAccept);
}

void SocketFabric::ArmAuthNotify() {
  io_uring_sqe* sqe = Sqe();
  io_uring_prep_read(sqe, auth_fd_, &auth_buf_, sizeof auth_buf_, 0);
  io_uring_sqe_set_data64(sqe, kOpAuthNotify);
}

SocketFabric::Conn* SocketFabric::NewConn(bool outgoing) {
  return static_cast<Conn*>(Track(std::make_unique<Conn>(), outgoing));
}

void SocketFabric::SetLinkOptions(int fd) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  // A dead peer or link is noticed within about timeout_ms: unacknowledged
  // data by TCP_USER_TIMEOUT, an idle link by keepalive probes.
  if (opt_.user_timeout_ms != FabricOptions::kNoUserTimeout) {
    unsigned int user_timeout =
        opt_.user_timeout_ms != 0 ? opt_.user_timeout_ms : opt_.timeout_ms;
    setsockopt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &user_timeout,
               sizeof user_timeout);
  }
  int idle = std::max(1u, opt_.timeout_ms / 2000);
  int count = std::max(1u, opt_.timeout_ms / 2000);
  setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof one);
  setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof idle);
  setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &one, sizeof one);
  setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &count, sizeof count);
}

// ---- the user's calls ----

// ---- connection life ----

void SocketFabric::StartAttempt(LinkConn* link) {
  auto* c = static_cast<Conn*>(link);
  while (c->next_address < c->addresses.size()) {
    const HostAddress& a = c->addresses[c->next_address++];
    if (!MakeSockaddr(a.host, a.port, &c->addr, &c->addr_len)) continue;
    c->fd = socket(c->addr.ss_family,
                   SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (c->fd < 0) {
      spdlog::warn("fabric: socket for {}: {}", a.host, std::strerror(errno));
      continue;
    }
    io_uring_sqe* sqe = Sqe();
    io_uring_prep_connect(sqe, c->fd, reinterpret_cast<sockaddr*>(&c->addr),
                          c->addr_len);
    io_uring_sqe_set_data64(sqe, reinterpret_cast<uint64_t>(c) | kOpConnect);
    sqe->flags |= IOSQE_IO_LINK;
    sqe = Sqe();
    io_uring_prep_link_timeout(sqe, &attempt_ts_, 0);
    io_uring_sqe_set_data64(sqe,
                            reinterpret_cast<uint64_t>(c) | kOpLinkTimeout);
    c->inflight += 2;
    return;
  }
  if (RedialLater(c)) return;
  spdlog::warn("fabric: node {} unreachable at every address", c->peer_node);
  Fail(c, ErrorClass::kConnFailed);
}

void SocketFabric::Fail(LinkConn* link, ErrorClass error) {
  auto* c = static_cast<Conn*>(link);
  if (c->closing) return;
  c->closing = true;
  c->close_error = error;
  Unlink(c);
  if (c->fd >= 0) {
    // Ends the operations in flight on the socket; their completions
    // arrive before the connection is released.
    shutdown(c->fd, SHUT_RDWR);
    io_uring_sqe* sqe = Sqe();
    io_uring_prep_cancel_fd(sqe, c->fd, IORING_ASYNC_CANCEL_ALL);
    io_uring_sqe_set_data64(sqe, reinterpret_cast<uint64_t>(c) | kOpCancel);
    c->inflight++;
  }
  finish_.push_back(c);
}

// Written at once, and only between two frames: with no sendmsg in flight
// and nothing of the front frame sent, the stream is at a frame boundary.
// Otherwise (or if the socket buffer is full) the peer is not told, and
// finds that out when it tries to resume (kNoSession) or at the timeout.
void SocketFabric::Goodbye(LinkConn* link) {
  auto* c = static_cast<Conn*>(link);
  if (c->fd < 0 || c->tx_inflight ||
      (!c->tx.empty() && c->tx.front().sent > 0)) {
    return;
  }
  FrameHeader h;
  h.type = FrameType::kClose;
  uint8_t bytes[kFrameHeaderSize];
  EncodeFrameHeader(h, bytes);
  (void)!send(c->fd, bytes, sizeof bytes, MSG_DONTWAIT | MSG_NOSIGNAL);
}

void SocketFabric::Finish(Conn* c) {
  if (c->fd >= 0) close(c->fd);
  c->fd = -1;
  Release(c);
}

// ---- receiving ----

void SocketFabric::ParseRx(LinkConn* link) {
  auto* c = static_cast<Conn*>(link);
  // A read into the stage is only in flight when what it holds is not a
  // whole frame; its completion parses again.
  if (c->rx_inflight) return;
  while (!c->closing && c->rx_phase == RxPhase::kStage &&
         (c->state == State::kHandshake || c->state == State::kOpen)) {
    const FrameStart f = StartFrame(c, c->stage.get() + c->stage_begin,
                                    c->stage_end - c->stage_begin);
    if (f == FrameStart::kAwaitPayload || f == FrameStart::kPayload) {
      c->rx_after_large = c->rx_header.length > kLargePayload;
    }
    if (f == FrameStart::kAwaitPayload) c->rx_phase = RxPhase::kAwaitPayload;
    if (f == FrameStart::kPayload) StartPayload(c);
    if (f != FrameStart::kNext && f != FrameStart::kPayload) return;
  }
}

void SocketFabric::PayloadPosted(LinkConn* link) {
  auto* c = static_cast<Conn*>(link);
  c->rx_phase = RxPhase::kStage;
  StartPayload(c);
}

// The current frame's payload goes to the front posted receive: what the
// stage holds is copied, the rest is read straight into the iovecs (or
// discarded past their capacity).
void SocketFabric::StartPayload(Conn* c) {
  const FrameHeader& h = c->rx_header;
  size_t n = std::min(c->stage_end - c->stage_begin, c->rx_take);
  const uint8_t* src = c->stage.get() + c->stage_begin;
  for (const iovec& v : c->recvs.front().iov) {
    if (c->rx_got == n) break;
    size_t k = std::min(v.iov_len, n - c->rx_got);
    std::memcpy(v.iov_base, src + c->rx_got, k);
    c->rx_got += k;
  }
  c->stage_begin += n;
  if (c->rx_got < c->rx_take) {
    c->rx_phase = RxPhase::kPayload;
    return;
  }
  size_t extra =
      std::min(c->stage_end - c->stage_begin, size_t{h.length} - c->rx_got);
  c->stage_begin += extra;
  c->rx_got += extra;
  if (c->rx_got < h.length) {
    c->rx_phase = RxPhase::kDrain;
    return;
  }
  OnData(c, c->rx_take == h.length ? ErrorClass::kOk : ErrorClass::kTruncated);
}

void SocketFabric::ArmRecv(Conn* c) {
  if (c->closing || c->rx_inflight || c->fd < 0) return;
  if (c->state != State::kHandshake && c->state != State::kOpen) return;
  io_uring_sqe* sqe = nullptr;
  switch (c->rx_phase) {
    case RxPhase::kStage: {
      // With no receive posted, frames are still read up to the first
      // data frame's header: acks and a close need no receive. Then nothing
      // more is read (back-pressure), which keeps ParseRx's premise: a read
      // is in flight only while the stage holds no whole frame.
      if (c->state == State::kOpen && c->recvs.empty() &&
          c->stage_end - c->stage_begin >= kFrameHeaderSize) {
        return;
      }
      if (c->stage == nullptr) c->stage.reset(new uint8_t[kStageSize]);
      // What is left is less than one frame (ParseStage took the rest),
      // so moving it to the front is cheap.
      size_t left = c->stage_end - c->stage_begin;
      std::memmove(c->stage.get(), c->stage.get() + c->stage_begin, left);
      c->stage_begin = 0;
      c->stage_end = left;
      const size_t want = c->rx_after_large ? kStageAfterLarge : kStageSize;
      sqe = Sqe();
      io_uring_prep_recv(sqe, c->fd, c->stage.get() + left,
                         want > left ? want - left : kStageSize - left, 0);
      break;
    }
    case RxPhase::kPayload: {
      // The posted iovecs, past what has arrived, up to rx_take bytes.
      c->rx_iov.clear();
      size_t skip = c->rx_got;
      size_t want = c->rx_take - c->rx_got;
      for (const iovec& v : c->recvs.front().iov) {
        if (want == 0) break;
        if (skip >= v.iov_len) {
          skip -= v.iov_len;
          continue;
        }
        size_t n = std::min(v.iov_len - skip, want);
        c->rx_iov.push_back({static_cast<char*>(v.iov_base) + skip, n});
        want -= n;
        skip = 0;
      }
      c->rx_msg = {};
      c->rx_msg.msg_iov = c->rx_iov.data();
      c->rx_msg.msg_iovlen = c->rx_iov.size();
      sqe = Sqe();
      // MSG_WAITALL: io_uring retries a short read itself, so a 256 KiB
      // rendezvous chunk that arrives in pieces completes once, not once
      // per piece with a re-arm each time (docs/perf.md, "2026-12-05:
      // whole payload reads"). The connection reads nothing else meanwhile
      // either way.
      io_uring_prep_recvmsg(sqe, c->fd, &c->rx_msg, MSG_WAITALL);
      break;
    }
    case RxPhase::kAwaitPayload:
      return;
    case RxPhase::kDrain:
      sqe = Sqe();
      io_uring_prep_recv(
          sqe, c->fd, drain_,
          std::min(sizeof drain_, c->rx_header.length - c->rx_got), 0);
      break;
  }
  io_uring_sqe_set_data64(sqe, reinterpret_cast<uint64_t>(c) | kOpRecv);
  c->rx_inflight = true;
  c->inflight++;
}

void SocketFabric::OnRecv(Conn* c, int res) {
  c->rx_inflight = false;
  if (c->closing) return;
  if (res == 0) {
    Fail(c, c->state == State::kOpen ? ErrorClass::kPeerClosed
                                     : ErrorClass::kConnFailed);
    return;
  }
  if (res < 0) {
    Fail(c, FromErrno(-res));
    return;
  }
  switch (c->rx_phase) {
    case RxPhase::kStage:
      c->stage_end += res;
      break;
    case RxPhase::kPayload:
      c->rx_got += res;
      if (c->rx_got < c->rx_take) break;
      if (c->rx_take == c->rx_header.length) {
        OnData(c, ErrorClass::kOk);
      } else {
        c->rx_phase = RxPhase::kDrain;
      }
      break;
    case RxPhase::kDrain:
      c->rx_got += res;
      if (c->rx_got == c->rx_header.length) OnData(c, ErrorClass::kTruncated);
      break;
    case RxPhase::kAwaitPayload:  // nothing is read in this phase
      break;
  }
  PumpRx(c);
}

void SocketFabric::OnData(Conn* c, ErrorClass error) {
  c->rx_phase = RxPhase::kStage;
  DeliverData(c, error);
}

// ---- sending ----

void SocketFabric::FlushSends(LinkConn* link) {
  auto* c = static_cast<Conn*>(link);
  if (c->closing || c->fd < 0 || c->tx_inflight || c->tx.empty()) return;
  if (c->state == State::kConnecting) return;
  c->tx_iov.clear();
  for (const PendingSend& s : c->tx) {
    if (!s.internal && c->state != State::kOpen) break;
    size_t skip = s.sent;
    for (const iovec& v : s.iov) {
      if (skip >= v.iov_len) {
        skip -= v.iov_len;
        continue;
      }
      c->tx_iov.push_back(
          {static_cast<char*>(v.iov_base) + skip, v.iov_len - skip});
      skip = 0;
    }
    if (c->tx_iov.size() + opt_.max_iov + 1 > kMaxSendIov) break;
  }
  if (c->tx_iov.empty()) return;
  c->tx_msg = {};
  c->tx_msg.msg_iov = c->tx_iov.data();
  c->tx_msg.msg_iovlen = c->tx_iov.size();
  io_uring_sqe* sqe = Sqe();
  io_uring_prep_sendmsg(sqe, c->fd, &c->tx_msg, MSG_NOSIGNAL);
  io_uring_sqe_set_data64(sqe, reinterpret_cast<uint64_t>(c) | kOpSend);
  c->tx_inflight = true;
  c->inflight++;
}

void SocketFabric::OnSend(Conn* c, int res) {
  c->tx_inflight = false;
  if (c->closing) return;
  if (res <= 0) {
    Fail(c, res == 0 ? ErrorClass::kConnReset : FromErrno(-res));
    return;
  }
  size_t left = res;
  bool close_after = false;
  while (left > 0 && !c->tx.empty()) {
    PendingSend& s = c->tx.front();
    size_t n = std::min(left, s.total - s.sent);
    s.sent += n;
    left -= n;
    if (s.sent < s.total) break;
    close_after |= FrontSent(c);
  }
  if (close_after) {
    Fail(c, ErrorClass::kAuthFailed);
    return;
  }
  FlushSends(c);
}

// ---- completions ----

void SocketFabric::OnConnect(Conn* c, int res) {
  if (c->closing) return;
  if (res < 0) {
    const HostAddress& a = c->addresses[c->next_address - 1];
    spdlog::info("fabric: node {} at {}:{}: {}", c->peer_node, a.host, a.port,
                 res == -ECANCELED ? "no answer in time" : std::strerror(-res));
    close(c->fd);
    c->fd = -1;
    StartAttempt(c);
    return;
  }
  SetLinkOptions(c->fd);
  c->state = State::kHandshake;
  PumpRx(c);
}

void SocketFabric::OnAccept(Listener* l, int res) {
  if (res < 0) {
    if (res == -EMFILE || res == -ENFILE || res == -ENOBUFS || res == -ENOMEM) {
      spdlog::warn("fabric: accept on {}:{}: {}; pausing", l->host, l->port,
                   std::strerror(-res));
      l->paused = true;  // CheckDeadlines resumes it
      return;
    }
    ArmAccept(l);
    return;
  }
  ArmAccept(l);
  if (handshakes_ >= opt_.max_handshakes ||
      owned_.size() >= opt_.max_connections) {
    close(res);
    int64_t now = MonotonicNs();
    if (now >= next_limit_log_ns_) {  // at most one line a second
      next_limit_log_ns_ = now + 1'000'000'000;
      spdlog::warn(
          "fabric: refusing connections on {}:{}: {} handshakes, {} "
          "connections (limits {}, {})",
          l->host, l->port, handshakes_, owned_.size(), opt_.max_handshakes,
          opt_.max_connections);
    }
    return;
  }
  Conn* c = NewConn(false);
  c->fd = res;
  SetLinkOptions(c->fd);
  Challenge(c);
  PumpRx(c);
}

void SocketFabric::HandleCqe(const io_uring_cqe* cqe) {
  uint64_t data = io_uring_cqe_get_data64(cqe);
  uint64_t kind = data & kOpMask;
  if (kind == kOpAuthNotify) {
    ArmAuthNotify();
    if (auth_ != nullptr) OnAuthResults();
    return;
  }
  if (kind == kOpAccept) {
    OnAccept(reinterpret_cast<Listener*>(data & ~kOpMask), cqe->res);
    return;
  }
  Conn* c = reinterpret_cast<Conn*>(data & ~kOpMask);
  c->inflight--;
  switch (kind) {
    case kOpConnect:
      OnConnect(c, cqe->res);
      break;
    case kOpRecv:
      OnRecv(c, cqe->res);
      break;
    case kOpSend:
      OnSend(c, cqe->res);
      break;
    default:  // link timeouts and cancels only count
      break;
  }
}

void SocketFabric::CheckDeadlines(int64_t now) {
  next_check_ns_ = now + kDeadlineCheckNs;
  CheckSessions(now);
  for (auto& l : listeners_) {
    if (l->paused) {
      l->paused = false;
      ArmAccept(l.get());
    }
  }
  std::vector<Conn*> late;
  for (auto& [link, owner] : owned_) {
    auto* c = static_cast<Conn*>(link);
    if (!c->closing && c->state != State::kOpen && c->deadline_ns <= now) {
      late.push_back(c);
    }
  }
  for (Conn* c : late) Fail(c, LateConnectError(c));
}

void SocketFabric::Collect(Event* events, int max, int* n) {
  while (*n < max && !events_.empty()) {
    events[(*n)++] = events_.front();
    events_.pop_front();
  }
}

int SocketFabric::Poll(Event* events, int max) {
  if (handed_over_) return 0;  // the successor serves the sessions
  const int64_t now = MonotonicNs();
  FlushDirty(now);
  Submit();
  if (now >= next_check_ns_) CheckDeadlines(now);
  // Completions waiting for task work (COOP_TASKRUN, Open): run it.
  if (IO_URING_READ_ONCE(*ring_.sq.kflags) & IORING_SQ_TASKRUN) {
    io_uring_get_events(&ring_);
  }
  io_uring_cqe* cqe;
  unsigned head, seen = 0;
  // Completions are read from the shared ring: no syscall when idle.
  io_uring_for_each_cqe(&ring_, head, cqe) {
    HandleCqe(cqe);
    seen++;
  }
  io_uring_cq_advance(&ring_, seen);
  // Connections whose last operation has completed can go now.
  if (!finish_.empty()) {
    std::vector<Conn*> closing;
    closing.swap(finish_);
    for (Conn* c : closing) {
      if (c->inflight == 0) {
        Finish(c);
      } else {
        finish_.push_back(c);
      }
    }
  }
  Submit();
  int n = 0;
  Collect(events, max, &n);
  return n;
}

int SocketFabric::Wait(Event* events, int max, int timeout_ms) {
  int n = Poll(events, max);
  if (n > 0 || timeout_ms == 0 || handed_over_) return n;
  int64_t limit_ns =
      timeout_ms < 0 ? INT64_MAX / 2 : int64_t{timeout_ms} * 1'000'000;
  int64_t end = MonotonicNs() + limit_ns;
  while (n == 0) {
    int64_t now = MonotonicNs();
    if (now >= end) break;
    // Wake for deadlines while connections are being set up.
    int64_t sleep_ns = std::min(end - now, kDeadlineCheckNs * 10);
    __kernel_timespec ts;
    ts.tv_sec = sleep_ns / 1'000'000'000;
    ts.tv_nsec = sleep_ns % 1'000'000'000;
    io_uring_cqe* cqe;
    io_uring_wait_cqe_timeout(&ring_, &cqe, &ts);
    n = Poll(events, max);
  }
  return n;
}

}  // namespace

std::unique_ptr<Fabric> OpenSocketFabric(const FabricOptions& options,
                                         std::string* error) {
  return OpenLinkFabric<SocketFabric>(options, error);
}

}  // namespace psmd::hw
