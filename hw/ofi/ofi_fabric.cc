#include "hw/ofi/ofi_fabric.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <rdma/fabric.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_eq.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_rma.h>
#include <spdlog/spdlog.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <string>
#include <string_view>
#include <vector>

#include "hw/link_fabric.h"
#include "hw/ofi/ofi_wire.h"

namespace psmd::hw {
namespace {

// What psmd needs of a provider, and the strictest modes it can honour: it
// registers every buffer it hands the provider (FI_MR_LOCAL), allocates
// them itself (FI_MR_ALLOCATED), binds the registration to the endpoint
// when asked (FI_MR_ENDPOINT), and gives every operation an fi_context2.
// For RMA it names a remote region by the address the provider wants
// (FI_MR_VIRT_ADDR or an offset) and the key it hands out (FI_MR_PROV_KEY).
// `rma`: reads too (FI_RMA|FI_READ|FI_REMOTE_READ), which Open asks for
// first and goes without where the provider has none.
// `provider`: libfabric's provider syntax, or "" for any;
// `addr_format`: FI_FORMAT_UNSPEC for any.
fi_info* PsmdHints(const std::string& provider, uint32_t addr_format,
                   bool rma) {
  fi_info* hints = fi_allocinfo();
  hints->caps = FI_MSG;
  if (rma) hints->caps |= FI_RMA | FI_READ | FI_REMOTE_READ;
  hints->mode = FI_CONTEXT | FI_CONTEXT2;
  hints->ep_attr->type = FI_EP_RDM;
  hints->domain_attr->mr_mode = FI_MR_LOCAL | FI_MR_ALLOCATED | FI_MR_ENDPOINT |
                                FI_MR_VIRT_ADDR | FI_MR_PROV_KEY;
  hints->domain_attr->threading = FI_THREAD_DOMAIN;
  hints->addr_format = addr_format;
  if (!provider.empty())
    hints->fabric_attr->prov_name = strdup(provider.c_str());
  return hints;
}

// The messages' format: ofi_wire.h.
using ofi::kAccept;
using ofi::kClose;
using ofi::kContact;
using ofi::kCredit;
using ofi::kKeepalive;
using ofi::kMaxName;
using ofi::kPrefix;
using ofi::kStream;
// A kClose's payload when the session ends with the connection (the user
// closed it, or the daemon exits); none when the session may resume.
constexpr std::string_view kFinalClose = "final";
using ofi::MsgKind;
using ofi::Prefix;

// One message is at most this long (less if the provider's max_msg_size
// is smaller): large frames go as several messages. Under 16 KiB because
// ofi_rxm sends what exceeds its eager buffer (FI_OFI_RXM_BUFFER_SIZE,
// 16 KiB with its header) by rendezvous, a round trip more per message;
// with 64 KiB messages the fabric test's bystander exchange (200 messages
// of 100 kB) missed its deadline on this machine.
constexpr size_t kChunkCap = 16384 - 256;
constexpr uint32_t kMaxSlots = 64;    // registered send buffers
constexpr uint32_t kMaxRecvs = 64;    // registered receive buffers
constexpr uint32_t kListenRecvs = 8;  // the listen endpoint's
// Stream bytes a sender may have beyond what the receiver consumed: what
// one connection can make its receiver hold.
constexpr uint64_t kWindow = 2u << 20;
// RMA: one read is at most this long (less if max_msg_size is), and at
// most this many are outstanding (less if the transmit queue is shorter):
// a reader cannot hold more of its provider's queue than that.
constexpr size_t kMaxRead = 4u << 20;
constexpr uint32_t kMaxReads = 32;
constexpr size_t kMaxRegions = 1024;

// A completion error (a positive FI_E* value) as what the user acts on.
ErrorClass FromFiError(int err, bool opened) {
  switch (err) {
    case FI_ECONNREFUSED:
    case FI_EHOSTUNREACH:
    case FI_ENETUNREACH:
    case FI_EADDRNOTAVAIL:
      return opened ? ErrorClass::kConnReset : ErrorClass::kConnFailed;
    case FI_ETIMEDOUT:
      return ErrorClass::kTimeout;
    case FI_ECONNRESET:
    case FI_ECONNABORTED:
    case EPIPE:  // FI_E* values are errno values
    case FI_ENOTCONN:
    case FI_EIO:
      return ErrorClass::kConnReset;
    case FI_ECANCELED:
      return ErrorClass::kCanceled;
    default:
      return ErrorClass::kFail;
  }
}

// What every operation hands libfabric as its context: FI_CONTEXT and
// FI_CONTEXT2 providers own the first member while it is in flight.
enum class OpKind : uint8_t { kRecv, kSend, kRead };
struct Op {
  fi_context2 ctx;
  OpKind kind = OpKind::kRecv;
  uint32_t index = 0;
};
static_assert(offsetof(Op, ctx) == 0);

class OfiFabric final : public LinkFabric {
 public:
  explicit OfiFabric(const FabricOptions& options) : LinkFabric(options) {}
  ~OfiFabric() override;

  bool Open(std::string* error);

  int event_fd() const override { return epoll_fd_; }
  std::string Provider() const override { return provider_; }
  int Poll(Event* events, int max) override;
  int Wait(Event* events, int max, int timeout_ms) override;

  bool CanRead() const override { return rma_; }
  size_t MaxReadLength() const override { return rma_ ? max_read_ : 0; }
  ErrorClass RegisterRegion(void* base, size_t length, RegionId* id,
                            RemoteRegion* remote) override;
  ErrorClass DeregisterRegion(RegionId id) override;
  bool RegionBusy(RegionId id) const override;
  ErrorClass PostRead(ConnId conn, RegionId local, size_t local_offset,
                      const RemoteRegion& remote, uint64_t remote_offset,
                      size_t length, uint64_t cookie) override;
  // LinkFabric's export, then LeaveToSuccessor.
  bool ExportSessions(std::vector<CarriedSession>* out,
                      std::string* why) override;

 private:
  using State = LinkState;
  // kStage: parse frames from the stream buffer; kPayload: the current
  // frame's payload goes to the front receive (past its capacity:
  // discarded). While await_payload nothing more is parsed.
  enum class RxPhase { kStage, kPayload };

  struct Conn : LinkConn {
    uint64_t key = 0;       // ours: the peer's messages carry it
    uint64_t peer_key = 0;  // 0 until the peer's first message
    // The peer's data endpoint once addr_known; before (kConnecting), its
    // listen endpoint, which only contact_ep sends to.
    fi_addr_t addr = FI_ADDR_NOTAVAIL;
    bool addr_known = false;
    // kConnecting: the throwaway endpoint the contact goes from (see
    // ofi_fabric.h), and whether the contact still waits for
    // the provider to take it (-FI_EAGAIN).
    fid_ep* contact_ep = nullptr;
    bool contact_pending = false;
    int64_t attempt_ns = 0;  // kConnecting: this address
    int64_t last_rx_ns = 0;
    int64_t last_tx_ns = 0;
    bool peer_closed = false;
    uint64_t close_at = 0;

    // Receive side: the stream in order up to rx_off; segments ahead of
    // it wait in `ahead`.
    std::string in;
    size_t in_begin = 0;
    uint64_t rx_off = 0;
    std::map<uint64_t, std::string> ahead;
    uint64_t consumed = 0;     // stream bytes parsed
    uint64_t credit_sent = 0;  // `consumed` last told to the peer
    RxPhase rx_phase = RxPhase::kStage;

    // Send side.
    uint64_t tx_off = 0;         // stream bytes handed to the provider
    uint32_t slots_out = 0;      // send buffers the provider holds for it
    uint64_t peer_consumed = 0;  // the peer's last credit
    bool close_after_tx = false;
  };
  struct Slot {
    Op op;
    uint8_t* buf = nullptr;
    size_t len = 0;
    uint64_t conn_key = 0;
    fi_addr_t addr = FI_ADDR_NOTAVAIL;
  };
  struct Recv {
    Op op;
    uint8_t* buf = nullptr;
    size_t size = 0;
    fid_ep* ep = nullptr;  // the data or the listen endpoint
    void* desc = nullptr;
    bool listen = false;
  };
  struct AvEntry {
    fi_addr_t addr = FI_ADDR_NOTAVAIL;
    int refs = 0;
  };
  struct Region {
    fid_mr* mr = nullptr;
    uint8_t* base = nullptr;
    size_t length = 0;
  };
  // A read in flight (or waiting for the provider to take it: -FI_EAGAIN).
  struct Read {
    Op op;
    ConnId conn = 0;
    uint64_t peer_node = 0;
    uint64_t cookie = 0;
    RegionId local = 0;  // the region buf is in
    uint8_t* buf = nullptr;
    void* desc = nullptr;
    size_t length = 0;
    fi_addr_t addr = FI_ADDR_NOTAVAIL;
    uint64_t remote_addr = 0;
    uint64_t key = 0;
    // A read the provider has not completed within timeout_ms, or whose
    // connection went, ended for the user (kReadDone with the error) but
    // its slot is the provider's until the completion comes.
    int64_t deadline_ns = 0;
    bool orphaned = false;
  };

  // LinkFabric's hooks.
  void Fail(LinkConn* c, ErrorClass error) override;
  void FlushSends(LinkConn* c) override;
  void ParseRx(LinkConn* c) override;
  void AfterRx(LinkConn* c) override;
  void Consume(LinkConn* c, size_t n) override;
  void PayloadPosted(LinkConn* c) override {
    static_cast<Conn*>(c)->rx_phase = RxPhase::kPayload;
  }
  void Kick() override {
    if (!events_.empty() || !finish_.empty()) Signal();
  }
  // Before the peers are told (LeaveToSuccessor): one that dials again at
  // once must find no one at the listen address (refused or unanswered, so
  // its provider tries again until the successor listens), not this
  // process, whose endpoints would take its contact and close unanswered
  // (the peer then waits out a whole connect attempt).
  void StopListening() override {
    if (listen_ep_ == nullptr) return;
    fi_close(&listen_ep_->fid);
    listen_ep_ = nullptr;
    for (Recv& r : recvs_) {
      if (r.listen) r.ep = nullptr;  // never posted again
    }
  }

  bool TryPort(const ListenAddress& a, uint16_t port, bool* in_use,
               std::string* error);
  // An endpoint of info bound to the AV and `cq` and enabled; 0 or -FI_E*.
  int OpenEndpoint(fi_info* info, fid_cq* cq, fid_ep** ep);
  void CloseFabric();
  bool Resolve(const HostAddress& a, std::string* name);
  bool AvRef(const std::string& name, fi_addr_t* addr);
  void AvUnref(fi_addr_t addr);
  void PostRecvBuffer(uint32_t i);
  void Signal();

  LinkConn* NewLink(bool outgoing) override { return NewConn(outgoing); }
  void StartAttempt(LinkConn* c) override;
  Conn* NewConn(bool outgoing);
  void Rekey(Conn* c);
  void Finish(Conn* c);
  // Opens c's contact endpoint and sends the contact from it; false when
  // the provider refuses (the next address is tried).
  bool SendContact(Conn* c);
  void InjectContact(Conn* c);
  void CloseContact(Conn* c);

  // Sends one message of `kind` (control: no stream bytes) to c's peer.
  // `confirmed`: from a send buffer, never injected, so that its completion
  // says the provider sent it (an injected message may still wait in the
  // provider's queue when the endpoint closes).
  void SendControl(Conn* c, MsgKind kind, uint64_t seq,
                   const std::string& payload = {}, bool confirmed = false);
  bool TakeSlot(uint32_t* i);
  void PostSlot(uint32_t i);

  // Handles what the completion queue holds; how many completions.
  int ReadCq();
  // Handed over: frees the buffers of what completes and acts on nothing
  // (no event, no failure: the sessions are the successor's); how many
  // completions.
  int SettleCq();
  // After ExportSessions: tells every peer that its connection broke and
  // may resume, waits until those messages have left, then closes every
  // endpoint and the domain (see ExportSessions in the .cc).
  void LeaveToSuccessor();
  // `listen`: it came to the listen endpoint, where only contacts go.
  void OnMessage(const uint8_t* p, size_t n, bool listen);
  void OnContact(const Prefix& m, const uint8_t* p, size_t n);
  void OnAccept(Conn* c, const uint8_t* p, size_t n);
  void OnSegment(Conn* c, uint64_t seq, const uint8_t* p, size_t n);
  void OnSendDone(uint32_t i, int err);
  // Hands read i to the provider; false when it must wait (-FI_EAGAIN).
  bool IssueRead(uint32_t i);
  void OnReadDone(uint32_t i, int err);
  // Ends for the user the reads past their deadline or connection.
  void ExpireReads(int64_t now);
  void LogReadFailure(const Read& r, const char* why);
  void CheckDeadlines(int64_t now);
  void DropUnknown(const char* what);

  Conn* Find(ConnId id) { return static_cast<Conn*>(FindLive(id)); }
  Conn* ByKey(uint64_t key) {
    auto it = by_key_.find(key);
    return it == by_key_.end() ? nullptr : it->second;
  }

  fi_info* hints_ = nullptr;
  fi_info* info_ = nullptr;
  std::string provider_;  // info_'s, which a handover closes
  fid_fabric* fabric_ = nullptr;
  fid_domain* domain_ = nullptr;
  fid_cq* cq_ = nullptr;
  fid_cq* contact_cq_ = nullptr;
  int contact_eps_ = 0;       // open contact endpoints
  fid_wait* wait_ = nullptr;  // only where the CQ has no wait fd of its own
  fid_av* av_ = nullptr;
  // The long-lived endpoints (see ofi_fabric.h): the data endpoint carries
  // every connection, the listen endpoint only receives contacts.
  fid_ep* ep_ = nullptr;
  fid_ep* listen_ep_ = nullptr;
  fi_info* ephemeral_info_ = nullptr;  // info_ at port 0
  fid_mr* mr_ = nullptr;
  fid_mr* listen_mr_ = nullptr;  // its own: FI_MR_ENDPOINT binds one to one
  void* desc_ = nullptr;
  std::unique_ptr<uint8_t[]> buffers_;
  std::unique_ptr<uint8_t[]> listen_buffers_;
  size_t buf_size_ = 0;  // one send or receive buffer: prefix + chunk
  size_t chunk_ = 0;     // stream bytes per message
  size_t inject_size_ = 0;
  std::string name_;  // our data endpoint's libfabric address
  int cq_fd_ = -1;
  int epoll_fd_ = -1;
  int signal_fd_ = -1;
  bool signaled_ = false;
  bool armed_ = false;  // fi_trywait said the wait fd will fire
  int auth_fd_ = -1;

  std::vector<Slot> slots_;
  uint32_t conn_slots_ = 0;  // what one connection may hold of them
  std::vector<uint32_t> free_slots_;
  std::deque<uint32_t> unposted_slots_;  // -FI_EAGAIN: post again
  std::vector<Recv> recvs_;
  std::vector<uint32_t> unposted_recvs_;
  std::map<std::string, AvEntry> av_entries_;
  std::unordered_map<fi_addr_t, std::string> av_names_;
  std::map<std::string, std::string> resolved_;  // "host|port" -> name

  std::unordered_map<uint64_t, Conn*> by_key_;
  std::vector<Conn*> finish_;
  int64_t next_check_ns_ = 0;
  int64_t next_limit_log_ns_ = 0;
  bool unknown_logged_ = false;

  // RMA (CanRead): the provider granted FI_RMA|FI_READ|FI_REMOTE_READ.
  bool rma_ = false;
  size_t max_read_ = 0;
  uint64_t next_region_ = 1;  // RegionId; also its key without PROV_KEY
  std::unordered_map<RegionId, Region> regions_;
  std::vector<Read> reads_;
  std::vector<uint32_t> free_reads_;
  std::deque<uint32_t> unposted_reads_;  // -FI_EAGAIN: post again
  int64_t next_read_log_ns_ = 0;
  uint64_t reads_unlogged_ = 0;
  uint32_t leave_failures_ = 0;  // LeaveToSuccessor's sends that failed
};

// ---- opening and closing ----

OfiFabric::~OfiFabric() {
  // Tell the peers, as a closed socket would; give the provider a moment
  // to send it (its progress is ours).
  if (ep_ != nullptr) {
    for (auto& [link, owner] : owned_) {
      auto* c = static_cast<Conn*>(link);
      if (!c->closing && c->peer_key != 0) {
        SendControl(c, kClose, c->tx_off, std::string(kFinalClose));
      }
    }
    const int64_t end = MonotonicNs() + 200'000'000;
    while (free_slots_.size() < slots_.size() && MonotonicNs() < end) {
      for (uint32_t i : std::deque<uint32_t>(std::move(unposted_slots_))) {
        PostSlot(i);
      }
      ReadCq();
      if (free_slots_.size() < slots_.size()) usleep(1000);
    }
  }
  for (auto& [link, owner] : owned_) CloseContact(static_cast<Conn*>(link));
  auth_.reset();
  CloseFabric();
  if (hints_ != nullptr) fi_freeinfo(hints_);
  if (epoll_fd_ >= 0) close(epoll_fd_);
  if (signal_fd_ >= 0) close(signal_fd_);
  if (auth_fd_ >= 0) close(auth_fd_);
}

void OfiFabric::CloseFabric() {
  if (ep_ != nullptr) fi_close(&ep_->fid);
  if (listen_ep_ != nullptr) fi_close(&listen_ep_->fid);
  for (auto& [id, r] : regions_) fi_close(&r.mr->fid);
  regions_.clear();
  if (mr_ != nullptr) fi_close(&mr_->fid);
  if (listen_mr_ != nullptr) fi_close(&listen_mr_->fid);
  if (av_ != nullptr) fi_close(&av_->fid);
  if (cq_ != nullptr) fi_close(&cq_->fid);
  if (contact_cq_ != nullptr) fi_close(&contact_cq_->fid);
  if (wait_ != nullptr) fi_close(&wait_->fid);
  if (domain_ != nullptr) fi_close(&domain_->fid);
  if (fabric_ != nullptr) fi_close(&fabric_->fid);
  if (info_ != nullptr) fi_freeinfo(info_);
  if (ephemeral_info_ != nullptr) fi_freeinfo(ephemeral_info_);
  ep_ = nullptr;
  listen_ep_ = nullptr;
  ephemeral_info_ = nullptr;
  mr_ = nullptr;
  listen_mr_ = nullptr;
  av_ = nullptr;
  cq_ = nullptr;
  contact_cq_ = nullptr;
  wait_ = nullptr;
  domain_ = nullptr;
  fabric_ = nullptr;
  info_ = nullptr;
}

bool OfiFabric::Open(std::string* error) {
  std::vector<ListenAddress> listen;
  if (!CheckOptions(&listen, error)) return false;
  if (listen.size() != 1) {
    *error =
        "the ofi fabric listens on exactly one address (one endpoint); "
        "give one --fabric-listen";
    return false;
  }
  const ListenAddress& a = listen[0];
  const uint32_t format =
      a.host.find(':') != std::string::npos ? FI_SOCKADDR_IN6 : FI_SOCKADDR_IN;
  // Reads if the provider has them at this address; messages alone if not
  // (rendezvous then streams, as over sockets).
  hints_ = PsmdHints(opt_.provider, format, opt_.rma);
  fi_info* probe = nullptr;
  if (opt_.rma && fi_getinfo(FI_VERSION(1, 17), a.host.c_str(), nullptr,
                             FI_SOURCE, hints_, &probe) == 0) {
    rma_ = true;
    fi_freeinfo(probe);
  } else {
    fi_freeinfo(hints_);
    hints_ = PsmdHints(opt_.provider, format, false);
  }
  const uint32_t lo = a.port_lo, hi = a.port_hi;
  for (uint32_t port = lo; port <= hi; port++) {
    bool in_use = false;
    if (TryPort(a, static_cast<uint16_t>(port), &in_use, error)) break;
    if (!in_use) return false;
    if (port == hi) {
      *error = "fabric listen address '" + opt_.listen[0] +
               "': no free port in the range";
      return false;
    }
  }
  provider_ = info_->fabric_attr->prov_name;

  signal_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  epoll_fd_ = epoll_create1(EPOLL_CLOEXEC);
  if (signal_fd_ < 0 || epoll_fd_ < 0) {
    *error = std::string("eventfd/epoll: ") + std::strerror(errno);
    return false;
  }
  epoll_event ev{};
  ev.events = EPOLLIN;
  epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, cq_fd_, &ev);
  epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, signal_fd_, &ev);
  if (opt_.auth == AuthMode::kMunge) {
    auth_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, auth_fd_, &ev);
    auth_ = std::make_unique<MungeAuth>(opt_.munge_socket, auth_fd_);
  }
  for (uint32_t i = 0; i < recvs_.size(); i++) PostRecvBuffer(i);
  return true;
}

bool OfiFabric::TryPort(const ListenAddress& a, uint16_t port, bool* in_use,
                        std::string* error) {
  const std::string service = std::to_string(port);
  const std::string prov =
      opt_.provider.empty() ? std::string("any provider") : opt_.provider;
  int rc = fi_getinfo(FI_VERSION(1, 17), a.host.c_str(), service.c_str(),
                      FI_SOURCE, hints_, &info_);
  if (rc != 0) {
    *error = "libfabric: " + prov +
             " offers no FI_EP_RDM endpoint with "
             "FI_MSG at " +
             a.host + " (fi_getinfo: " + fi_strerror(-rc) +
             "); see `psmd --help` and `fi_info -l`";
    info_ = nullptr;
    return false;
  }
  // fi_getinfo lists the best match first.
  if (info_->addr_format != FI_SOCKADDR_IN &&
      info_->addr_format != FI_SOCKADDR_IN6) {
    *error = "libfabric provider " +
             std::string(info_->fabric_attr->prov_name) +
             " is not addressed by IP address and port, which the node "
             "table names (see hw/README.md)";
    CloseFabric();
    return false;
  }
  auto fail = [&](const char* what, int err) {
    *in_use = err == -FI_EADDRINUSE;
    *error = std::string("libfabric ") + info_->fabric_attr->prov_name + ": " +
             what + ": " + fi_strerror(-err);
    CloseFabric();
    return false;
  };
  if ((rc = fi_fabric(info_->fabric_attr, &fabric_, nullptr)) != 0) {
    return fail("fi_fabric", rc);
  }
  if ((rc = fi_domain(fabric_, info_, &domain_, nullptr)) != 0) {
    return fail("fi_domain", rc);
  }
  const size_t max_msg = info_->ep_attr->max_msg_size;
  if (max_msg < kPrefix + kMaxName) {
    return fail("max_msg_size too small", -FI_EMSGSIZE);
  }
  buf_size_ = std::min(max_msg, kChunkCap);
  max_read_ = std::min(max_msg, kMaxRead);
  if (rma_) {
    reads_.resize(std::clamp<size_t>(info_->tx_attr->size / 4, 1, kMaxReads));
    for (uint32_t i = 0; i < reads_.size(); i++) {
      reads_[i].op.kind = OpKind::kRead;
      reads_[i].op.index = i;
      free_reads_.push_back(static_cast<uint32_t>(reads_.size()) - 1 - i);
    }
  }
  chunk_ = buf_size_ - kPrefix;
  inject_size_ = info_->tx_attr->inject_size;
  const uint32_t nslots = static_cast<uint32_t>(
      std::clamp<size_t>(info_->tx_attr->size / 2, 4, kMaxSlots));
  const uint32_t nrecvs = static_cast<uint32_t>(
      std::clamp<size_t>(info_->rx_attr->size / 2, 4, kMaxRecvs));

  // The completion queue's wait object is a file descriptor the worker's
  // epoll sleeps on: the queue's own (FI_GETWAIT on it), or, where the
  // provider's queue does not hand it out (ofi_rxd), a wait set's.
  fi_cq_attr cq_attr{};
  cq_attr.format = FI_CQ_FORMAT_MSG;
  cq_attr.size = nslots + nrecvs + kListenRecvs + 16;
  cq_attr.wait_obj = FI_WAIT_FD;
  if ((rc = fi_cq_open(domain_, &cq_attr, &cq_, nullptr)) != 0) {
    return fail("fi_cq_open with a wait fd", rc);
  }
  if (fi_control(&cq_->fid, FI_GETWAIT, &cq_fd_) != 0) {
    fi_close(&cq_->fid);
    cq_ = nullptr;
    fi_wait_attr wait_attr{};
    wait_attr.wait_obj = FI_WAIT_FD;
    if ((rc = fi_wait_open(fabric_, &wait_attr, &wait_)) != 0) {
      return fail("the completion queue has no wait fd, nor fi_wait_open", rc);
    }
    cq_attr.wait_obj = FI_WAIT_SET;
    cq_attr.wait_set = wait_;
    if ((rc = fi_cq_open(domain_, &cq_attr, &cq_, nullptr)) != 0) {
      return fail("fi_cq_open on a wait set", rc);
    }
    if ((rc = fi_control(&wait_->fid, FI_GETWAIT, &cq_fd_)) != 0) {
      return fail("fi_control(FI_GETWAIT) on the wait set", rc);
    }
  }
  fi_av_attr av_attr{};
  av_attr.type = info_->domain_attr->av_type;
  if ((rc = fi_av_open(domain_, &av_attr, &av_, nullptr)) != 0) {
    return fail("fi_av_open", rc);
  }
  // The contact endpoints' queue has no wait object: ofi_rxd (1.17) adds
  // an endpoint's fd to its CQ's wait object and leaves it there when the
  // endpoint closes, and the next fi_trywait calls into the freed
  // endpoint. Nothing completes there (contacts are injected); Poll reads
  // it only to drive the provider's progress for them.
  fi_cq_attr contact_attr{};
  contact_attr.format = FI_CQ_FORMAT_MSG;
  contact_attr.wait_obj = FI_WAIT_NONE;
  if ((rc = fi_cq_open(domain_, &contact_attr, &contact_cq_, nullptr)) != 0) {
    return fail("fi_cq_open for contacts", rc);
  }
  // The listen endpoint first: it is the one bound to the port asked for
  // (FI_EADDRINUSE: the next port is tried).
  if ((rc = OpenEndpoint(info_, cq_, &listen_ep_)) != 0) {
    return fail("the listen endpoint", rc);
  }
  // The data endpoint at a port the system picks, so a new one at every
  // start: see ofi_fabric.h.
  ephemeral_info_ = fi_dupinfo(info_);
  if (ephemeral_info_ == nullptr || ephemeral_info_->src_addr == nullptr) {
    return fail("fi_dupinfo", -FI_ENOMEM);
  }
  auto* src = static_cast<sockaddr*>(ephemeral_info_->src_addr);
  if (src->sa_family == AF_INET6) {
    reinterpret_cast<sockaddr_in6*>(src)->sin6_port = 0;
  } else {
    reinterpret_cast<sockaddr_in*>(src)->sin_port = 0;
  }
  if ((rc = OpenEndpoint(ephemeral_info_, cq_, &ep_)) != 0) {
    return fail("the data endpoint", rc);
  }

  // One registration for every buffer of each endpoint, done once.
  const bool per_ep = (info_->domain_attr->mr_mode & FI_MR_ENDPOINT) != 0;
  // Keys differ: without FI_MR_PROV_KEY the provider takes ours, unique
  // in the domain (FI_ENOKEY otherwise).
  auto reg = [&](uint8_t* buf, size_t len, fid_ep* ep, fid_mr** mr,
                 uint64_t key) {
    int r =
        fi_mr_reg(domain_, buf, len, FI_SEND | FI_RECV, 0, key, 0, mr, nullptr);
    if (r == 0 && per_ep && (r = fi_mr_bind(*mr, &ep->fid, 0)) == 0) {
      r = fi_mr_enable(*mr);
    }
    return r;
  };
  const size_t total = buf_size_ * (nslots + nrecvs);
  buffers_.reset(new uint8_t[total]);
  if ((rc = reg(buffers_.get(), total, ep_, &mr_, 0)) != 0) {
    return fail("registering the data endpoint's buffers", rc);
  }
  // Contacts are small: the listen endpoint's buffers are a prefix and an
  // address long, and a byte more: ofi_rxd hands a longer message over
  // cut to the buffer's length, not as FI_ETRUNC, and one that fills the
  // buffer is thus too long (DecodeAddress refuses it).
  const size_t listen_size = kPrefix + kMaxName + 1;
  listen_buffers_.reset(new uint8_t[listen_size * kListenRecvs]);
  if ((rc = reg(listen_buffers_.get(), listen_size * kListenRecvs, listen_ep_,
                &listen_mr_, 1)) != 0) {
    return fail("registering the listen endpoint's buffers", rc);
  }
  desc_ = fi_mr_desc(mr_);
  slots_.resize(nslots);
  conn_slots_ = std::max<uint32_t>(2, nslots / 2);
  for (uint32_t i = 0; i < nslots; i++) {
    slots_[i].op.kind = OpKind::kSend;
    slots_[i].op.index = i;
    slots_[i].buf = buffers_.get() + buf_size_ * i;
    free_slots_.push_back(nslots - 1 - i);
  }
  recvs_.resize(nrecvs + kListenRecvs);
  for (uint32_t i = 0; i < recvs_.size(); i++) {
    Recv& r = recvs_[i];
    r.op.index = i;
    r.listen = i >= nrecvs;
    r.buf = r.listen ? listen_buffers_.get() + listen_size * (i - nrecvs)
                     : buffers_.get() + buf_size_ * (nslots + i);
    r.size = r.listen ? listen_size : buf_size_;
    r.ep = r.listen ? listen_ep_ : ep_;
    r.desc = r.listen ? fi_mr_desc(listen_mr_) : desc_;
  }

  auto port_of = [](fid_ep* ep, std::string* name) -> int {
    char buf[kMaxName];
    size_t len = sizeof buf;
    if (fi_getname(&ep->fid, buf, &len) != 0) return -1;
    if (name != nullptr) name->assign(buf, len);
    const auto* sa = reinterpret_cast<const sockaddr*>(buf);
    if (sa->sa_family == AF_INET && len >= sizeof(sockaddr_in)) {
      return ntohs(reinterpret_cast<const sockaddr_in*>(buf)->sin_port);
    }
    if (sa->sa_family == AF_INET6 && len >= sizeof(sockaddr_in6)) {
      return ntohs(reinterpret_cast<const sockaddr_in6*>(buf)->sin6_port);
    }
    return 0;
  };
  const int bound = port_of(listen_ep_, nullptr);
  const int data_port = port_of(ep_, &name_);
  if (bound < 0 || data_port < 0) return fail("fi_getname", -FI_EINVAL);
  // A contact goes by fi_inject from an endpoint that has no registered
  // buffers (SendContact).
  if (kPrefix + name_.size() > inject_size_) {
    return fail("inject_size is smaller than a contact message", -FI_EMSGSIZE);
  }
  self_.node = opt_.node_id;
  self_.addresses = {{a.host, static_cast<uint16_t>(bound ? bound : port)}};
  spdlog::info(
      "fabric: libfabric {} {} at {}:{} (data endpoint port {}), max message "
      "{}, inject {}, RMA reads {}",
      info_->fabric_attr->prov_name, info_->fabric_attr->name, a.host,
      bound ? bound : port, data_port, max_msg, inject_size_,
      rma_       ? "on"
      : opt_.rma ? "not offered (FI_RMA|FI_READ)"
                 : "off (fabric_rma)");
  return true;
}

int OfiFabric::OpenEndpoint(fi_info* info, fid_cq* cq, fid_ep** ep) {
  int rc = fi_endpoint(domain_, info, ep, nullptr);
  if (rc != 0) {
    *ep = nullptr;
    return rc;
  }
  if ((rc = fi_ep_bind(*ep, &av_->fid, 0)) != 0 ||
      (rc = fi_ep_bind(*ep, &cq->fid, FI_TRANSMIT | FI_RECV)) != 0 ||
      (rc = fi_enable(*ep)) != 0) {
    fi_close(&(*ep)->fid);
    *ep = nullptr;
  }
  return rc;
}

bool OfiFabric::Resolve(const HostAddress& a, std::string* name) {
  const std::string key = a.host + "|" + std::to_string(a.port);
  if (auto it = resolved_.find(key); it != resolved_.end()) {
    *name = it->second;
    return true;
  }
  fi_info* r = nullptr;
  int rc = fi_getinfo(FI_VERSION(1, 17), a.host.c_str(),
                      std::to_string(a.port).c_str(), 0, hints_, &r);
  if (rc != 0 || r->dest_addr == nullptr) {
    spdlog::warn("fabric: {}:{} not reachable through {}: {}", a.host, a.port,
                 info_->fabric_attr->prov_name, fi_strerror(-rc));
    if (r != nullptr) fi_freeinfo(r);
    return false;
  }
  name->assign(static_cast<const char*>(r->dest_addr), r->dest_addrlen);
  fi_freeinfo(r);
  resolved_[key] = *name;
  return true;
}

bool OfiFabric::AvRef(const std::string& name, fi_addr_t* addr) {
  auto it = av_entries_.find(name);
  if (it == av_entries_.end()) {
    fi_addr_t fa = FI_ADDR_NOTAVAIL;
    int rc = fi_av_insert(av_, name.data(), 1, &fa, 0, nullptr);
    // The caller says what the address was (a peer's is no reason to
    // log each time).
    if (rc != 1 || fa == FI_ADDR_NOTAVAIL) return false;
    it = av_entries_.emplace(name, AvEntry{fa, 0}).first;
    av_names_[fa] = name;
  }
  it->second.refs++;
  *addr = it->second.addr;
  return true;
}

void OfiFabric::AvUnref(fi_addr_t addr) {
  auto n = av_names_.find(addr);
  if (n == av_names_.end()) return;
  auto it = av_entries_.find(n->second);
  if (--it->second.refs > 0) return;
  fi_addr_t fa = addr;
  fi_av_remove(av_, &fa, 1, 0);
  av_entries_.erase(it);
  av_names_.erase(n);
}

void OfiFabric::PostRecvBuffer(uint32_t i) {
  Recv& r = recvs_[i];
  if (r.ep == nullptr) return;  // its endpoint closed (StopListening)
  ssize_t rc = fi_recv(r.ep, r.buf, r.size, r.desc, FI_ADDR_UNSPEC, &r.op);
  if (rc == -FI_EAGAIN) {
    unposted_recvs_.push_back(i);
  } else if (rc != 0) {
    spdlog::error("fabric: fi_recv: {}", fi_strerror(static_cast<int>(-rc)));
    unposted_recvs_.push_back(i);
  }
}

void OfiFabric::Signal() {
  if (signaled_ || handed_over_) return;
  signaled_ = true;
  const uint64_t one = 1;
  (void)!write(signal_fd_, &one, sizeof one);
}

// ---- the user's calls ----

OfiFabric::Conn* OfiFabric::NewConn(bool outgoing) {
  auto* c = static_cast<Conn*>(Track(std::make_unique<Conn>(), outgoing));
  c->last_rx_ns = c->last_tx_ns = MonotonicNs();
  Rekey(c);
  return c;
}

void OfiFabric::Rekey(Conn* c) {
  if (c->key != 0) by_key_.erase(c->key);
  do {
    c->key = rng_();
  } while (c->key == 0 || by_key_.count(c->key) != 0);
  by_key_[c->key] = c;
}

// ---- connection life ----

void OfiFabric::StartAttempt(LinkConn* link) {
  auto* c = static_cast<Conn*>(link);
  while (c->next_address < c->addresses.size()) {
    const HostAddress& a = c->addresses[c->next_address++];
    std::string name;
    fi_addr_t addr;
    if (!Resolve(a, &name)) continue;
    if (!AvRef(name, &addr)) {
      spdlog::warn("fabric: {}:{}: the address vector refuses its address",
                   a.host, a.port);
      continue;
    }
    if (c->addr != FI_ADDR_NOTAVAIL) AvUnref(c->addr);
    c->addr = addr;
    c->addr_known = false;
    // A new key per attempt: a late answer from the address tried before
    // names a key that is gone.
    Rekey(c);
    c->peer_key = 0;
    c->state = State::kConnecting;
    // A contact's answer takes the peer daemon's worker: each round of
    // attempts waits twice as long as the one before (up to 4x), so a peer
    // slow under load is not asked again just before it answers.
    c->attempt_ns = MonotonicNs() + (int64_t{opt_.connect_attempt_ms}
                                     << std::min<uint32_t>(c->dial_rounds, 2)) *
                                        1'000'000;
    if (SendContact(c)) return;
  }
  // Between rounds the last contact stays open: its late answer still
  // connects.
  if (RedialLater(c)) return;
  spdlog::warn("fabric: node {} unreachable at every address", c->peer_node);
  Fail(c, ErrorClass::kConnFailed);
}

bool OfiFabric::SendContact(Conn* c) {
  CloseContact(c);
  // A long-lived endpoint must never send to a listen address: a provider
  // may keep per-address state for as long as the endpoint lives (ofi_rxd
  // keeps its sequence numbers, whatever the AV), and the daemon at that
  // address restarts at the same address, where the stale state makes the
  // new one drop what we send. So each attempt sends from an endpoint of
  // its own, closed once answered.
  int rc = OpenEndpoint(ephemeral_info_, contact_cq_, &c->contact_ep);
  if (rc != 0) {
    spdlog::warn("fabric: no endpoint to contact node {} from: {}",
                 c->peer_node, fi_strerror(-rc));
    return false;
  }
  contact_eps_++;
  c->contact_pending = true;
  InjectContact(c);
  return true;
}

void OfiFabric::InjectContact(Conn* c) {
  if (!c->contact_pending || c->contact_ep == nullptr) return;
  Prefix m;
  m.kind = kContact;
  m.src = c->key;
  uint8_t msg[kPrefix + kMaxName];
  ofi::EncodePrefix(m, msg);
  std::memcpy(msg + kPrefix, name_.data(), name_.size());
  ssize_t rc = fi_inject(c->contact_ep, msg, kPrefix + name_.size(), c->addr);
  if (rc == -FI_EAGAIN) return;  // CheckDeadlines tries again
  c->contact_pending = false;
  if (rc != 0) {
    spdlog::info("fabric: contacting node {}: {}", c->peer_node,
                 fi_strerror(static_cast<int>(-rc)));
  }
}

void OfiFabric::CloseContact(Conn* c) {
  if (c->contact_ep == nullptr) return;
  fi_close(&c->contact_ep->fid);
  contact_eps_--;
  c->contact_ep = nullptr;
  c->contact_pending = false;
}

void OfiFabric::Fail(LinkConn* link, ErrorClass error) {
  auto* c = static_cast<Conn*>(link);
  if (c->closing) return;
  c->closing = true;
  c->close_error = error;
  Unlink(c);
  // The peer learns at once (a closed socket's FIN), unless it told us;
  // and whether it may resume the session: not after our user's Close.
  if (c->peer_key != 0 && !c->peer_closed) {
    SendControl(c, kClose, c->tx_off,
                c->local_close || c->session_lost ? std::string(kFinalClose)
                                                  : std::string());
  }
  finish_.push_back(c);
}

void OfiFabric::Finish(Conn* c) {
  CloseContact(c);
  if (c->addr != FI_ADDR_NOTAVAIL) AvUnref(c->addr);
  by_key_.erase(c->key);
  Release(c);
}

// ---- receiving ----

void OfiFabric::AfterRx(LinkConn* link) {
  auto* c = static_cast<Conn*>(link);
  if (c->closing) return;
  if (c->in_begin == c->in.size()) {
    c->in.clear();
    c->in_begin = 0;
  } else if (c->in_begin > 65536 && c->in_begin > c->in.size() / 2) {
    c->in.erase(0, c->in_begin);
    c->in_begin = 0;
  }
  // The window moves once a quarter of it was consumed.
  if (c->peer_key != 0 && c->consumed - c->credit_sent >= kWindow / 4) {
    c->credit_sent = c->consumed;
    SendControl(c, kCredit, c->consumed);
  }
  // The peer closed: seen once its last bytes are here, no whole frame
  // waits and a receive is posted (as a socket's EOF is read only after the
  // data before it, and only when the user reads). A close the session
  // survives (no "final": a handover's) needs no receive, only that no
  // frame's header waits for one: it makes no event, and waiting for the
  // user's next receive only delayed the resume (a peer whose user had
  // taken every frame did not resume a handover's session until its
  // silence deadline, when the session ended).
  const size_t avail = c->in.size() - c->in_begin;
  const bool stage_clear =
      c->rx_phase == RxPhase::kStage && avail < kFrameHeaderSize;
  const bool survives = opt_.sessions && !c->session_lost && !c->await_payload;
  if (c->peer_closed && c->rx_off >= c->close_at &&
      c->state != State::kWaitPeer &&
      (c->state != State::kOpen ||
       (!c->recvs.empty() && (avail == 0 || stage_clear)) ||
       (survives && stage_clear))) {
    Fail(c, c->state == State::kOpen ? ErrorClass::kPeerClosed
                                     : ErrorClass::kConnFailed);
  }
}

void OfiFabric::Consume(LinkConn* link, size_t n) {
  auto* c = static_cast<Conn*>(link);
  c->in_begin += n;
  c->consumed += n;
}

void OfiFabric::ParseRx(LinkConn* link) {
  auto* c = static_cast<Conn*>(link);
  while (!c->closing && !c->await_payload &&
         (c->state == State::kHandshake || c->state == State::kOpen)) {
    const size_t avail = c->in.size() - c->in_begin;
    const auto* p =
        reinterpret_cast<const uint8_t*>(c->in.data()) + c->in_begin;
    if (c->rx_phase == RxPhase::kStage) {
      const FrameStart f = StartFrame(c, p, avail);
      if (f == FrameStart::kPayload) c->rx_phase = RxPhase::kPayload;
      if (f == FrameStart::kNext || f == FrameStart::kPayload) continue;
      return;
    }
    const size_t n = std::min(avail, c->rx_header.length - c->rx_got);
    if (n == 0 && c->rx_got < c->rx_header.length) return;
    // The part of [rx_got, rx_got + n) below rx_take lands in the iovecs.
    size_t skip = c->rx_got, copied = 0;
    const size_t want =
        c->rx_got < c->rx_take ? std::min(n, c->rx_take - c->rx_got) : 0;
    for (const iovec& v : c->recvs.front().iov) {
      if (copied == want) break;
      if (skip >= v.iov_len) {
        skip -= v.iov_len;
        continue;
      }
      const size_t k = std::min(v.iov_len - skip, want - copied);
      std::memcpy(static_cast<char*>(v.iov_base) + skip, p + copied, k);
      copied += k;
      skip = 0;
    }
    Consume(c, n);
    c->rx_got += n;
    if (c->rx_got == c->rx_header.length) {
      c->rx_phase = RxPhase::kStage;
      DeliverData(c, c->rx_take == c->rx_header.length
                         ? ErrorClass::kOk
                         : ErrorClass::kTruncated);
    }
  }
}

// ---- sending ----

bool OfiFabric::TakeSlot(uint32_t* i) {
  if (free_slots_.empty()) return false;
  *i = free_slots_.back();
  free_slots_.pop_back();
  return true;
}

void OfiFabric::PostSlot(uint32_t i) {
  Slot& s = slots_[i];
  ssize_t rc = fi_send(ep_, s.buf, s.len, desc_, s.addr, &s.op);
  if (rc == 0) return;
  if (rc == -FI_EAGAIN) {  // the provider's queue is full: after progress
    unposted_slots_.push_back(i);
    return;
  }
  OnSendDone(i, static_cast<int>(-rc));
}

void OfiFabric::SendControl(Conn* c, MsgKind kind, uint64_t seq,
                            const std::string& payload, bool confirmed) {
  if (!c->addr_known) return;  // lost as in flight: keepalives repeat
  c->last_tx_ns = MonotonicNs();
  Prefix m;
  m.kind = kind;
  m.dst = c->peer_key;
  m.src = c->key;
  m.seq = seq;
  uint8_t small[kPrefix + kMaxName];
  const size_t len = kPrefix + payload.size();
  // Small enough to inject: no buffer held, no completion.
  if (!confirmed && len <= inject_size_ && len <= sizeof small) {
    ofi::EncodePrefix(m, small);
    std::memcpy(small + kPrefix, payload.data(), payload.size());
    if (fi_inject(ep_, small, len, c->addr) == 0) return;
  }
  uint32_t i;
  if (!TakeSlot(&i)) {
    // Every buffer is in flight; control messages are rare, so wait for
    // one by progressing the provider (bounded: it completes or fails).
    const int64_t end = MonotonicNs() + 100'000'000;
    while (free_slots_.empty() && MonotonicNs() < end) {
      if (handed_over_) {
        SettleCq();
      } else {
        ReadCq();
      }
    }
    if (!TakeSlot(&i)) {
      // Lost: a close or keepalive matters little, a credit is repeated by
      // the next keepalive.
      spdlog::warn("fabric: no send buffer for a control message to node {}",
                   c->peer_node);
      return;
    }
  }
  Slot& s = slots_[i];
  ofi::EncodePrefix(m, s.buf);
  std::memcpy(s.buf + kPrefix, payload.data(), payload.size());
  s.len = len;
  s.conn_key = c->key;
  s.addr = c->addr;
  av_entries_[av_names_[c->addr]].refs++;  // the buffer holds the address
  c->slots_out++;
  PostSlot(i);
}

void OfiFabric::FlushSends(LinkConn* link) {
  auto* c = static_cast<Conn*>(link);
  if (c->closing || c->peer_key == 0 || !c->addr_known) return;
  while (!c->tx.empty()) {
    if (c->state != State::kOpen && !c->tx.front().internal) break;
    const uint64_t in_flight = c->tx_off - c->peer_consumed;
    if (in_flight >= kWindow) break;  // the peer's credit moves it on
    uint32_t i;
    // A share of the buffers at most: sends to a peer that died complete
    // only when the provider gives up (ofi_rxd: after minutes), and until
    // then they must not hold every buffer, or no other node is sent to
    // (nor the peer's next incarnation answered).
    if (c->slots_out >= conn_slots_ || !TakeSlot(&i)) {
      // Resumed when a send completes (OnSendDone marks it dirty).
      if (!c->tx_dirty) {
        c->tx_dirty = true;
        dirty_.push_back(c->id);
      }
      break;
    }
    Slot& s = slots_[i];
    const size_t cap = std::min<uint64_t>(chunk_, kWindow - in_flight);
    size_t n = 0;
    while (!c->tx.empty() && n < cap) {
      LinkSend& f = c->tx.front();
      if (c->state != State::kOpen && !f.internal) break;
      // Copy from f's iovecs, starting f.sent bytes in.
      size_t skip = f.sent;
      for (const iovec& v : f.iov) {
        if (n == cap) break;
        if (skip >= v.iov_len) {
          skip -= v.iov_len;
          continue;
        }
        const size_t k = std::min(v.iov_len - skip, cap - n);
        std::memcpy(s.buf + kPrefix + n,
                    static_cast<const char*>(v.iov_base) + skip, k);
        n += k;
        f.sent += k;
        skip = 0;
      }
      if (f.sent < f.total) break;
      // Its bytes are all with the provider; the caller's buffers wait for
      // the peer's ack all the same (a session may send them again).
      if (FrontSent(c)) c->close_after_tx = true;
    }
    Prefix m;
    m.kind = kStream;
    m.dst = c->peer_key;
    m.src = c->key;
    m.seq = c->tx_off;
    ofi::EncodePrefix(m, s.buf);
    s.len = kPrefix + n;
    s.conn_key = c->key;
    s.addr = c->addr;
    av_entries_[av_names_[c->addr]].refs++;
    c->slots_out++;
    c->tx_off += n;
    c->last_tx_ns = MonotonicNs();
    PostSlot(i);
    if (c->closing) return;  // the post failed
  }
  if (c->close_after_tx && c->tx.empty()) {
    c->close_after_tx = false;
    Fail(c, ErrorClass::kConnFailed);  // invisible: a refused connector
  }
}

void OfiFabric::OnSendDone(uint32_t i, int err) {
  Slot& s = slots_[i];
  AvUnref(s.addr);
  s.addr = FI_ADDR_NOTAVAIL;
  free_slots_.push_back(i);
  Conn* c = ByKey(s.conn_key);
  if (c != nullptr) c->slots_out--;
  if (handed_over_) {  // LeaveToSuccessor counts; the successor acts
    if (err != 0) leave_failures_++;
    return;
  }
  if (c == nullptr || c->closing) return;
  if (err != 0) {
    if (c->state == State::kConnecting) {
      spdlog::info("fabric: node {} at {}: {}", c->peer_node,
                   c->addresses[c->next_address - 1].host, fi_strerror(err));
      StartAttempt(c);
      return;
    }
    spdlog::warn("fabric: send to node {}: {}", c->peer_node, fi_strerror(err));
    c->peer_closed = true;  // it cannot be told
    Fail(c, FromFiError(err, c->opened));
    return;
  }
  if (!c->tx.empty() && !c->tx_dirty) {
    c->tx_dirty = true;
    dirty_.push_back(c->id);
  }
}

// ---- completions ----

void OfiFabric::DropUnknown(const char* what) {
  StatsOf(0).bad_frames++;
  if (!unknown_logged_) {
    unknown_logged_ = true;
    spdlog::warn(
        "fabric: dropping a message from an unknown sender: {} "
        "(logged once)",
        what);
  }
}

void OfiFabric::OnMessage(const uint8_t* p, size_t n, bool listen) {
  Prefix m;
  if (!ofi::DecodePrefix(p, n, &m)) {
    DropUnknown("bad prefix");
    return;
  }
  if (listen != (m.kind == kContact)) {
    DropUnknown(listen ? "not a contact" : "a contact at the data endpoint");
    return;
  }
  if (m.kind == kContact) {
    OnContact(m, p + kPrefix, n - kPrefix);
    return;
  }
  Conn* c = ByKey(m.dst);
  // A message for a connection that is gone is late, not bad.
  if (c == nullptr || c->closing) return;
  if (c->peer_key == 0) {
    if (c->state != State::kConnecting ||
        (m.kind != kStream && m.kind != kAccept)) {
      return;
    }
    // The acceptor's first message names its key (its kAccept and its
    // first stream bytes may come in either order).
    c->peer_key = m.src;
    c->state = State::kHandshake;
  } else if (m.src != c->peer_key) {
    DropUnknown("wrong sender key");
    return;
  }
  c->last_rx_ns = MonotonicNs();
  switch (m.kind) {
    case kAccept:
      OnAccept(c, p + kPrefix, n - kPrefix);
      return;
    case kStream:
      OnSegment(c, m.seq, p + kPrefix, n - kPrefix);
      return;
    case kCredit:
    case kKeepalive:  // carries the credit too
      if (m.seq > c->tx_off) {
        BadFrame(c, "credit beyond what was sent");
        return;
      }
      if (m.seq > c->peer_consumed) {
        c->peer_consumed = m.seq;
        FlushSends(c);
      }
      return;
    case kClose:
      if (m.seq < c->rx_off) {
        BadFrame(c, "close before bytes already received");
        return;
      }
      c->peer_closed = true;
      c->close_at = m.seq;
      if (n - kPrefix == kFinalClose.size() &&
          std::memcmp(p + kPrefix, kFinalClose.data(), kFinalClose.size()) ==
              0) {
        c->session_lost = true;
      }
      PumpRx(c);
      return;
    default:
      return;
  }
}

void OfiFabric::OnContact(const Prefix& m, const uint8_t* p, size_t n) {
  std::string name;
  if (!ofi::DecodeAddress(p, n, &name)) {
    DropUnknown("contact without an address");
    return;
  }
  const int64_t now = MonotonicNs();
  if (handshakes_ >= opt_.max_handshakes ||
      owned_.size() > opt_.max_connections) {
    if (now >= next_limit_log_ns_) {
      spdlog::warn("fabric: too many connections being set up; ignoring one");
      next_limit_log_ns_ = now + 10'000'000'000;
    }
    return;
  }
  fi_addr_t addr;
  if (!AvRef(name, &addr)) {
    DropUnknown("contact with an address the provider refuses");
    return;
  }
  Conn* c = NewConn(false);
  c->peer_key = m.src;
  c->addr = addr;
  c->addr_known = true;
  SendControl(c, kAccept, 0, name_);
  Challenge(c);
}

void OfiFabric::OnAccept(Conn* c, const uint8_t* p, size_t n) {
  if (!c->outgoing || c->addr_known) {
    BadFrame(c, "an accept it did not wait for");
    return;
  }
  fi_addr_t addr;
  std::string name;
  if (!ofi::DecodeAddress(p, n, &name) || !AvRef(name, &addr)) {
    BadFrame(c, "an accept without a usable address");
    return;
  }
  // From now on everything goes to the peer's data endpoint; the contact
  // was delivered, so its endpoint goes.
  AvUnref(c->addr);
  c->addr = addr;
  c->addr_known = true;
  CloseContact(c);
  FlushSends(c);  // what the handshake queued meanwhile
}

void OfiFabric::OnSegment(Conn* c, uint64_t seq, const uint8_t* p, size_t n) {
  if (n == 0) return;
  // The window bounds what one connection makes us hold.
  const ofi::Segment place =
      ofi::PlaceSegment(seq, n, c->rx_off, c->consumed, kWindow);
  if (place == ofi::Segment::kRefused || c->ahead.count(seq) != 0) {
    BadFrame(c, "stream bytes outside the window");
    return;
  }
  if (place == ofi::Segment::kAhead) {  // the provider reordered: hold it
    c->ahead.emplace(seq, std::string(reinterpret_cast<const char*>(p), n));
    return;
  }
  c->in.append(reinterpret_cast<const char*>(p), n);
  c->rx_off += n;
  while (!c->ahead.empty() && c->ahead.begin()->first <= c->rx_off) {
    auto it = c->ahead.begin();
    if (it->first != c->rx_off) {
      BadFrame(c, "overlapping stream bytes");
      return;
    }
    c->in += it->second;
    c->rx_off += it->second.size();
    c->ahead.erase(it);
  }
  PumpRx(c);
}

int OfiFabric::ReadCq() {
  fi_cq_msg_entry entries[32];
  int total = 0;
  for (int round = 0; round < 8; round++) {
    ssize_t n = fi_cq_read(cq_, entries, 32);
    if (n == -FI_EAGAIN) return total;
    if (n == -FI_EAVAIL) {
      fi_cq_err_entry err{};
      if (fi_cq_readerr(cq_, &err, 0) < 0) return total;
      total++;
      auto* op = static_cast<Op*>(err.op_context);
      if (op == nullptr) continue;
      if (op->kind == OpKind::kSend) {
        OnSendDone(op->index, err.err != 0 ? err.err : FI_EIO);
      } else if (op->kind == OpKind::kRead) {
        OnReadDone(op->index, err.err != 0 ? err.err : FI_EIO);
      } else {
        // A message longer than our buffers (FI_ETRUNC) is no psmd's.
        if (err.err != FI_ECANCELED) DropUnknown(fi_strerror(err.err));
        if (ep_ != nullptr && err.err != FI_ECANCELED) {
          PostRecvBuffer(op->index);
        }
      }
      continue;
    }
    if (n < 0) {
      spdlog::error("fabric: fi_cq_read: {}",
                    fi_strerror(static_cast<int>(-n)));
      return total;
    }
    total += static_cast<int>(n);
    for (ssize_t k = 0; k < n; k++) {
      auto* op = static_cast<Op*>(entries[k].op_context);
      if (op->kind == OpKind::kSend) {
        OnSendDone(op->index, 0);
      } else if (op->kind == OpKind::kRead) {
        OnReadDone(op->index, 0);
      } else {
        OnMessage(recvs_[op->index].buf, entries[k].len,
                  recvs_[op->index].listen);
        PostRecvBuffer(op->index);
      }
    }
    if (n < 32) return total;
  }
  return total;
}

// ---- handover ----

int OfiFabric::SettleCq() {
  fi_cq_msg_entry entries[32];
  int total = 0;
  auto settle = [&](void* context, int err) {
    const auto* op = static_cast<const Op*>(context);
    if (op == nullptr) return;
    if (op->kind == OpKind::kSend) {
      OnSendDone(op->index, err);
    } else if (op->kind == OpKind::kRead) {
      OnReadDone(op->index, err);
    }
    // A receive is not posted again: its endpoint closes.
  };
  for (int round = 0; round < 8; round++) {
    const ssize_t n = fi_cq_read(cq_, entries, 32);
    if (n == -FI_EAVAIL) {
      fi_cq_err_entry err{};
      if (fi_cq_readerr(cq_, &err, 0) < 0) return total;
      total++;
      settle(err.op_context, err.err != 0 ? err.err : FI_EIO);
      continue;
    }
    if (n <= 0) return total;
    total += static_cast<int>(n);
    for (ssize_t k = 0; k < n; k++) settle(entries[k].op_context, 0);
  }
  return total;
}

// Over RDM nothing tells a peer that this process went (ofi_rxm reconnects
// quietly, UDP has nothing to see): left alone, it would learn of the break
// only when its heartbeats miss, at fabric_timeout_ms, which is when its
// side of the session ends too. So each peer is told now, by the kClose a
// broken connection sends (no payload: the session may resume), and the
// export returns once those messages have left: the peer that dialled dials
// the listen address again, closed already (StopListening), until the
// successor listens there, and the other waits for the successor to dial
// it. Where the data endpoints were does not matter: a resume is a new
// connection, whose contact and accept name the successor's data endpoint
// and the peer's. Then every endpoint and the domain close: nothing of
// libfabric's, whose descriptors are not close-on-exec, is left to the exec
// (the tcp provider sets SO_REUSEADDR, so its connections' TIME_WAIT does
// not keep the successor from binding the listen port; UDP leaves nothing).
bool OfiFabric::ExportSessions(std::vector<CarriedSession>* out,
                               std::string* why) {
  if (!LinkFabric::ExportSessions(out, why)) return false;
  LeaveToSuccessor();
  return true;
}

void OfiFabric::LeaveToSuccessor() {
  const int64_t start = MonotonicNs();
  std::vector<Conn*> sessions;  // the carried ones told: waited for
  int told = 0;
  for (auto& [link, owner] : owned_) {
    auto* c = static_cast<Conn*>(link);
    CloseContact(c);
    if (c->closing || c->peer_key == 0 || !c->addr_known) continue;
    // The peer acts on a close once every stream byte before it came, and
    // only between two frames: what the stream still holds of ours (an ack)
    // goes first.
    FlushSends(c);
    if (c->closing) continue;
    // Incoming connections not yet admitted are told too, without waiting:
    // a peer resuming through one tries again (at the successor) rather
    // than wait for its handshake's deadline; but one may be a late
    // contact's, from a process of the peer's gone since, whose messages
    // never complete.
    SendControl(c, kClose, c->tx_off, {}, /*confirmed=*/c->visible);
    told++;
    if (c->visible) sessions.push_back(c);
  }
  // Sent means, over ofi_rxd, that the peer's provider acknowledged it; over
  // ofi_rxm, that the TCP connection took it. Bounded: a peer that died
  // meanwhile must not hold the handover (ofi_rxd retries for minutes).
  constexpr int64_t kLeaveNs = 500'000'000;
  auto unsent = [&] {
    return static_cast<size_t>(
        std::count_if(sessions.begin(), sessions.end(),
                      [](const Conn* c) { return c->slots_out > 0; }));
  };
  while (unsent() > 0 && MonotonicNs() - start < kLeaveNs) {
    std::deque<uint32_t> again;
    again.swap(unposted_slots_);
    for (uint32_t i : again) PostSlot(i);
    if (SettleCq() == 0) usleep(200);
  }
  const size_t not_confirmed = unsent();
  // What has arrived is taken in before the endpoints close: a TCP socket
  // closed with bytes unread resets its connection instead of ending it,
  // and a reset may discard what was still on its way to the peer.
  for (int idle = 0;
       idle < 2 && MonotonicNs() - start < kLeaveNs + 10'000'000;) {
    if (SettleCq() > 0) {
      idle = 0;
    } else {
      idle++;
      usleep(1000);
    }
  }
  if (not_confirmed > 0 || leave_failures_ > 0) {
    spdlog::warn(
        "fabric: handover: {} messages telling peers of the break not "
        "confirmed sent within {} ms, {} failed; a peer not told sees the "
        "break only at its heartbeats' deadline",
        not_confirmed, kLeaveNs / 1'000'000, leave_failures_);
  }
  for (auto& [link, owner] : owned_) CloseContact(static_cast<Conn*>(link));
  CloseFabric();
  cq_fd_ = -1;
  rma_ = false;  // RegisterRegion refuses; RegionBusy says false
  // Poll reads nothing from now on: nothing may keep event_fd readable (a
  // worker that serves on after a failed exec would spin on it).
  if (auth_fd_ >= 0) epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, auth_fd_, nullptr);
  if (signaled_) {
    signaled_ = false;
    uint64_t drained;
    (void)!read(signal_fd_, &drained, sizeof drained);
  }
  spdlog::info(
      "fabric: told the peers of {} connections that they break for a "
      "successor, and closed the endpoints, in {:.1f} ms",
      told, (MonotonicNs() - start) / 1e6);
}

void OfiFabric::CheckDeadlines(int64_t now) {
  CheckSessions(now);
  ExpireReads(now);
  const int64_t timeout = int64_t{opt_.timeout_ms} * 1'000'000;
  const int64_t user_timeout =
      opt_.user_timeout_ms == FabricOptions::kNoUserTimeout ? 0
      : opt_.user_timeout_ms == 0                           ? timeout
                                  : int64_t{opt_.user_timeout_ms} * 1'000'000;
  std::vector<Conn*> all;
  all.reserve(owned_.size());
  for (auto& [link, owner] : owned_) all.push_back(static_cast<Conn*>(link));
  for (Conn* c : all) {
    if (c->closing) continue;
    if (c->state != State::kOpen) {
      if (now >= c->deadline_ns) {
        Fail(c, LateConnectError(c));
      } else if (c->state == State::kConnecting && c->redial_at_ns == 0 &&
                 now >= c->attempt_ns) {
        StartAttempt(c);
      } else {
        InjectContact(c);
      }
      continue;
    }
    // Liveness, whatever the user reads: keepalives both ways, and a peer
    // silent for user_timeout_ms is gone (TCP_USER_TIMEOUT's part in the
    // socket backend). kNoUserTimeout leaves it to the user's heartbeats,
    // which know when the silence was their own (a stopped daemon).
    if (user_timeout > 0 && now - c->last_rx_ns > user_timeout) {
      spdlog::warn("fabric: node {} silent for {} ms", c->peer_node,
                   user_timeout / 1'000'000);
      Fail(c, ErrorClass::kTimeout);
    } else if (now - c->last_tx_ns >= timeout / 4) {
      // With the credit: one that could not be sent is repaired here.
      SendControl(c, kKeepalive, c->credit_sent);
    }
  }
}

int OfiFabric::Poll(Event* events, int max) {
  if (handed_over_) return 0;  // the successor serves the sessions
  // The eventfd is drained only by an idle pass (below), not by every one:
  // while the worker is busy it stays readable, and the Kick of each
  // PostRecvHeader and PostPayload finds it signalled already. Draining it
  // here cost a read, and the next Kick a write, per frame (a third of the
  // receiving daemon's time in an 8 B stream, perf).
  if (ReadCq() > 0) armed_ = false;
  if (contact_eps_ > 0) {
    fi_cq_msg_entry ignored[4];
    fi_cq_err_entry err{};
    if (fi_cq_read(contact_cq_, ignored, 4) == -FI_EAVAIL) {
      fi_cq_readerr(contact_cq_, &err, 0);
    }
  }
  for (size_t k = unposted_recvs_.size(); k > 0; k--) {
    const uint32_t i = unposted_recvs_.front();
    unposted_recvs_.erase(unposted_recvs_.begin());
    PostRecvBuffer(i);
  }
  for (size_t k = unposted_slots_.size(); k > 0; k--) {
    const uint32_t i = unposted_slots_.front();
    unposted_slots_.pop_front();
    PostSlot(i);
  }
  while (!unposted_reads_.empty() && IssueRead(unposted_reads_.front())) {
    unposted_reads_.pop_front();
  }
  if (auth_waiting_ > 0) {
    uint64_t drained;
    (void)!read(auth_fd_, &drained, sizeof drained);
    OnAuthResults();
  }
  const int64_t now = MonotonicNs();
  FlushDirty(now);
  if (now >= next_check_ns_) {
    next_check_ns_ = now + kLinkCheckNs;
    CheckDeadlines(now);
  }
  while (!finish_.empty()) {
    std::vector<Conn*> done;
    done.swap(finish_);
    for (Conn* c : done) Finish(c);
  }
  int n = 0;
  while (n < max && !events_.empty()) {
    events[n++] = events_.front();
    events_.pop_front();
  }
  if (!events_.empty() || !unposted_slots_.empty() ||
      !unposted_recvs_.empty() || !dirty_.empty()) {
    Signal();  // more to do: the worker comes back at once
    armed_ = false;
  } else if (n > 0) {
    armed_ = false;
  } else {
    // Idle: nothing is pending, so the eventfd may be rearmed (a Kick
    // after this signals it again).
    if (signaled_) {
      signaled_ = false;
      uint64_t drained;
      (void)!read(signal_fd_, &drained, sizeof drained);
    }
    // Before the worker sleeps on the wait fd, the provider must arm it (a
    // verbs CQ needs its notification requested).
    fid* fids[1] = {&cq_->fid};
    if (!armed_) {
      if (fi_trywait(fabric_, fids, 1) == FI_SUCCESS) {
        armed_ = true;
      } else {
        Signal();
      }
    }
  }
  return n;
}

int OfiFabric::Wait(Event* events, int max, int timeout_ms) {
  int n = Poll(events, max);
  if (n > 0 || handed_over_) return n;
  // Deadlines and keepalives are checked by Poll: wake for them.
  if (!owned_.empty() && (timeout_ms < 0 || timeout_ms > 10)) timeout_ms = 10;
  epoll_event ev[4];
  epoll_wait(epoll_fd_, ev, 4, timeout_ms);
  armed_ = false;
  return Poll(events, max);
}

}  // namespace

// ---- RMA ----

ErrorClass OfiFabric::RegisterRegion(void* base, size_t length, RegionId* id,
                                     RemoteRegion* remote) {
  if (!rma_ || base == nullptr || length == 0) return ErrorClass::kBadArg;
  if (regions_.size() >= kMaxRegions) return ErrorClass::kLimit;
  const RegionId rid = next_region_++;
  Region r;
  r.base = static_cast<uint8_t*>(base);
  r.length = length;
  // Without FI_MR_PROV_KEY the provider takes our key, and the key is all a
  // reader needs (without FI_MR_VIRT_ADDR the address is an offset): from
  // the kernel's random source, so that only who sees a kRndvRead frame
  // learns it (a counter was guessed at once; rng_'s keys can be predicted
  // from the connection keys it gave out). Keys 0 and 1 are the endpoints'
  // buffers (Open); a key taken already is drawn again.
  int rc = -FI_ENOKEY;
  for (int attempt = 0; attempt < 4 && rc == -FI_ENOKEY; attempt++) {
    uint64_t requested = 0;
    if (getrandom(&requested, sizeof requested, 0) != sizeof requested) {
      spdlog::error("fabric: getrandom for an RMA key: {}", strerror(errno));
      return ErrorClass::kFail;
    }
    if (requested <= 1) continue;
    rc = fi_mr_reg(domain_, base, length, FI_READ | FI_REMOTE_READ, 0,
                   requested, 0, &r.mr, nullptr);
  }
  if (rc == 0 && (info_->domain_attr->mr_mode & FI_MR_ENDPOINT) != 0 &&
      (rc = fi_mr_bind(r.mr, &ep_->fid, 0)) == 0) {
    rc = fi_mr_enable(r.mr);
  }
  if (rc != 0) {
    if (r.mr != nullptr) fi_close(&r.mr->fid);
    spdlog::error("fabric: registering {} bytes for RMA with {}: {}", length,
                  info_->fabric_attr->prov_name, fi_strerror(-rc));
    return ErrorClass::kFail;
  }
  remote->addr = (info_->domain_attr->mr_mode & FI_MR_VIRT_ADDR) != 0
                     ? reinterpret_cast<uint64_t>(base)
                     : 0;
  remote->key = fi_mr_key(r.mr);
  remote->length = length;
  regions_.emplace(rid, r);
  *id = rid;
  return ErrorClass::kOk;
}

ErrorClass OfiFabric::DeregisterRegion(RegionId id) {
  // Handed over: every registration went with the domain.
  if (handed_over_) return ErrorClass::kOk;
  auto it = regions_.find(id);
  if (it == regions_.end()) return ErrorClass::kBadArg;
  // Not while the provider may still write into it, even for a read the
  // user saw end (ExpireReads).
  if (RegionBusy(id)) return ErrorClass::kBusy;
  fi_close(&it->second.mr->fid);
  regions_.erase(it);
  return ErrorClass::kOk;
}

bool OfiFabric::RegionBusy(RegionId id) const {
  if (handed_over_) return false;  // the domain is closed: nothing writes
  for (const Read& r : reads_) {
    if (r.addr != FI_ADDR_NOTAVAIL && r.local == id) return true;
  }
  return false;
}

ErrorClass OfiFabric::PostRead(ConnId conn, RegionId local, size_t local_offset,
                               const RemoteRegion& remote,
                               uint64_t remote_offset, size_t length,
                               uint64_t cookie) {
  if (!rma_) return ErrorClass::kBadArg;
  Conn* c = Find(conn);
  if (c == nullptr || c->state != State::kOpen || !c->addr_known) {
    return ErrorClass::kBadConn;
  }
  auto it = regions_.find(local);
  // Every range is checked without a sum that could wrap: the remote one
  // comes from a peer.
  if (it == regions_.end() || length == 0 || length > max_read_ ||
      local_offset > it->second.length ||
      length > it->second.length - local_offset ||
      remote_offset > remote.length || length > remote.length - remote_offset ||
      remote.addr > UINT64_MAX - remote.length) {
    return ErrorClass::kBadArg;
  }
  if (free_reads_.empty()) return ErrorClass::kBusy;
  const uint32_t i = free_reads_.back();
  free_reads_.pop_back();
  Read& r = reads_[i];
  r.conn = conn;
  r.peer_node = c->peer_node;
  r.cookie = cookie;
  r.local = local;
  r.buf = it->second.base + local_offset;
  r.desc = fi_mr_desc(it->second.mr);
  r.length = length;
  r.addr = c->addr;
  av_entries_[av_names_[c->addr]].refs++;  // the read holds the address
  r.remote_addr = remote.addr + remote_offset;
  r.key = remote.key;
  r.deadline_ns = MonotonicNs() + int64_t{opt_.timeout_ms} * 1'000'000;
  r.orphaned = false;
  if (!IssueRead(i)) unposted_reads_.push_back(i);
  return ErrorClass::kOk;
}

bool OfiFabric::IssueRead(uint32_t i) {
  Read& r = reads_[i];
  const ssize_t rc = fi_read(ep_, r.buf, r.length, r.desc, r.addr,
                             r.remote_addr, r.key, &r.op.ctx);
  if (rc == -FI_EAGAIN) return false;  // after progress: Poll tries again
  if (rc != 0) OnReadDone(i, static_cast<int>(-rc));
  return true;
}

void OfiFabric::LogReadFailure(const Read& r, const char* why) {
  // Reads fail together (a peer gone fails all of its): one line a second.
  const int64_t now = MonotonicNs();
  if (now < next_read_log_ns_) {
    reads_unlogged_++;
    return;
  }
  spdlog::warn(
      "fabric: an RMA read of {} bytes from node {} failed: {} ({} more "
      "failed reads not logged since the last line)",
      r.length, r.peer_node, why, reads_unlogged_);
  reads_unlogged_ = 0;
  next_read_log_ns_ = now + 1'000'000'000;
}

void OfiFabric::ExpireReads(int64_t now) {
  for (uint32_t i = 0; i < reads_.size(); i++) {
    Read& r = reads_[i];
    if (r.addr == FI_ADDR_NOTAVAIL || r.orphaned) continue;
    const bool gone = Find(r.conn) == nullptr;
    if (!gone && now < r.deadline_ns) continue;
    LogReadFailure(r, gone ? "its connection is gone"
                           : "it did not finish within the fabric timeout");
    Event e;
    e.type = EventType::kReadDone;
    e.conn = r.conn;
    e.cookie = r.cookie;
    e.peer_node = r.peer_node;
    e.error = gone ? ErrorClass::kConnReset : ErrorClass::kTimeout;
    events_.push_back(e);
    r.orphaned = true;
    // One the provider never took is simply freed.
    auto q = std::find(unposted_reads_.begin(), unposted_reads_.end(), i);
    if (q != unposted_reads_.end()) {
      unposted_reads_.erase(q);
      OnReadDone(i, FI_ECANCELED);
    }
  }
}

void OfiFabric::OnReadDone(uint32_t i, int err) {
  Read& r = reads_[i];
  AvUnref(r.addr);
  r.addr = FI_ADDR_NOTAVAIL;
  free_reads_.push_back(i);
  // The user had its kReadDone (ExpireReads), or takes no more events.
  if (r.orphaned || handed_over_) return;
  Event e;
  e.type = EventType::kReadDone;
  e.conn = r.conn;
  e.cookie = r.cookie;
  e.peer_node = r.peer_node;
  if (err == 0) {
    e.length = static_cast<uint32_t>(r.length);
  } else {
    // Reads are never canceled here: FI_ECANCELED is the provider ending
    // them with their peer. A refused key or range (FI_EACCES, FI_EINVAL)
    // is the announcing peer's fault: the caller decides what it costs.
    e.error =
        err == FI_ECANCELED ? ErrorClass::kConnReset : FromFiError(err, true);
    LogReadFailure(r, fi_strerror(err));
  }
  events_.push_back(e);
}

std::unique_ptr<Fabric> OpenOfiFabric(const FabricOptions& options,
                                      std::string* error) {
  return OpenLinkFabric<OfiFabric>(options, error);
}

int DescribeOfiProviders(const std::string& provider, std::string* out) {
  fi_info* hints = PsmdHints(provider, FI_FORMAT_UNSPEC, false);
  fi_info* list = nullptr;
  const int rc =
      fi_getinfo(FI_VERSION(1, 17), nullptr, nullptr, 0, hints, &list);
  fi_freeinfo(hints);
  if (rc != 0) {
    *out = "no libfabric provider" +
           (provider.empty() ? std::string() : " matching " + provider) +
           " offers psmd an FI_EP_RDM endpoint with FI_MSG (fi_getinfo: " +
           fi_strerror(-rc) + ")\n";
    return 0;
  }
  char line[512];
  snprintf(line, sizeof(line), "%-18s %-22s %-10s %-16s %20s %8s  %s\n",
           "provider", "fabric", "domain", "address", "max msg", "inject",
           "psmd");
  *out = line;
  std::vector<std::string> seen;
  int usable = 0;
  for (fi_info* i = list; i != nullptr; i = i->next) {
    const bool ip =
        i->addr_format == FI_SOCKADDR_IN || i->addr_format == FI_SOCKADDR_IN6;
    snprintf(line, sizeof(line), "%-18s %-22s %-10s %-16s %20zu %8zu  %s\n",
             i->fabric_attr->prov_name, i->fabric_attr->name,
             i->domain_attr->name,
             i->addr_format == FI_SOCKADDR_IN    ? "FI_SOCKADDR_IN"
             : i->addr_format == FI_SOCKADDR_IN6 ? "FI_SOCKADDR_IN6"
                                                 : "other",
             i->ep_attr->max_msg_size, i->tx_attr->inject_size,
             ip ? "usable (--fabric-provider "
                : "no: not addressed by IP and "
                  "port, which the node table "
                  "names");
    std::string row = line;
    if (ip) {
      row.pop_back();
      row += std::string(i->fabric_attr->prov_name) + ")\n";
    }
    if (std::find(seen.begin(), seen.end(), row) != seen.end()) continue;
    seen.push_back(row);
    *out += row;
    usable += ip;
  }
  fi_freeinfo(list);
  return usable;
}

}  // namespace psmd::hw
