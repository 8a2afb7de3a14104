// What the byte-stream backends of hw::Fabric (hw/socket/, hw/ofi/) share:
// the connection table (ids, one connection per node pair, incoming
// connections adopting a pending Connect), the handshake of frame.h with
// MUNGE authentication (docs/design.md, "Between nodes: the fabric"),
// queueing of the user's frames and receives, and the events and per-peer
// counters these produce. A backend derives from LinkFabric, keeps its
// transport state in a LinkConn subclass, and supplies the hooks below.
//
// Thread-safety: as hw::Fabric (one thread); the MUNGE helper thread is
// MungeAuth's, whose results the backend collects by OnAuthResults.
#ifndef PSMD_HW_LINK_FABRIC_H_
#define PSMD_HW_LINK_FABRIC_H_

#include <sys/uio.h>

#include <cstdint>
#include <deque>
#include <list>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <unordered_map>
#include <vector>

#include "hw/fabric.h"
#include "hw/frame.h"
#include "hw/munge_auth.h"

namespace psmd::hw {

// CLOCK_MONOTONIC in ns (through the vDSO: no syscall).
int64_t MonotonicNs();
// How often the backends check deadlines while polled.
inline constexpr int64_t kLinkCheckNs = 10'000'000;

enum class LinkState {
  kConnecting,  // outgoing: reaching the peer's address
  kHandshake,   // reading handshake frames
  kAuth,        // waiting for the MUNGE helper
  kWaitPeer,    // outgoing refused as a duplicate: the peer's own
                // connection to us will be bound to this handle
  kRefusing,    // incoming: a Refuse is being sent, then close
  kOpen,
};

struct LinkSend {
  uint8_t header[kFrameHeaderSize];
  std::string control;  // handshake payload (owned here)
  std::vector<iovec> iov;
  size_t total = 0;
  size_t sent = 0;  // bytes the backend has taken
  uint64_t cookie = 0;
  bool internal = false;     // a handshake frame: no event
  bool close_after = false;  // close the connection once sent
};

struct LinkRecv {
  std::vector<iovec> iov;
  size_t capacity = 0;
  uint64_t cookie = 0;
  bool header_only = false;
};

struct LinkConn {
  virtual ~LinkConn() = default;
  ConnId id = 0;        // the user's handle (0 until visible)
  uint64_t serial = 0;  // never changes; names it to the MUNGE helper
  bool outgoing = false;
  bool visible = false;  // the user knows it: events are delivered
  bool opened = false;   // reached kOpen once
  LinkState state = LinkState::kConnecting;
  uint64_t cookie = 0;  // Connect's
  uint64_t peer_node = 0;
  uint64_t peer_incarnation = 0;
  int64_t deadline_ns = 0;  // for every state before kOpen
  bool closing = false;
  bool local_close = false;
  bool counted_handshake = false;
  ErrorClass close_error = ErrorClass::kOk;
  bool bad_frame_logged = false;
  std::vector<HostAddress> addresses;
  size_t next_address = 0;
  uint8_t challenge[kNonceSize] = {};  // incoming: ours; outgoing: theirs
  uint8_t nonce[kNonceSize] = {};      // outgoing: our credential nonce
  HelloPayload hello;                  // incoming: what the peer said
  std::deque<LinkRecv> recvs;
  // The frame being received: its header, the payload bytes going into the
  // front receive (rx_take) and those consumed so far (rx_got).
  FrameHeader rx_header;
  size_t rx_take = 0;
  size_t rx_got = 0;
  bool await_payload = false;  // a header-only receive got rx_header
  bool rx_parsing = false;     // ParseRx is on the stack
  bool rx_reparse = false;     // ... and should run once more
  std::list<LinkSend> tx;
  uint32_t tx_app_frames = 0;
  uint64_t tx_app_bytes = 0;
  bool tx_dirty = false;  // frames posted since the last flush (dirty_)
};

class LinkFabric : public Fabric {
 public:
  explicit LinkFabric(const FabricOptions& options);

  std::string HostDescription() const override {
    return FormatHostDescription(self_);
  }
  ErrorClass Connect(const std::string& host_description, uint64_t cookie,
                     ConnId* conn) override;
  // Queues the frame; it leaves at the next Poll (FlushDirty), together
  // with the frames posted before that.
  ErrorClass PostSend(ConnId conn, const FrameFields& fields, const iovec* iov,
                      int iovcnt, uint64_t cookie) override;
  ErrorClass PostRecv(ConnId conn, const iovec* iov, int iovcnt,
                      uint64_t cookie) override;
  ErrorClass PostRecvHeader(ConnId conn, uint64_t cookie) override;
  ErrorClass PostPayload(ConnId conn, const iovec* iov, int iovcnt,
                         uint64_t cookie) override;
  ErrorClass Close(ConnId conn) override;
  std::vector<PeerStats> Stats() const override;

 protected:
  // ---- the backend's hooks ----
  // Ends c (idempotent): marks it closing with `error`; the backend
  // releases it later with Release.
  virtual void Fail(LinkConn* c, ErrorClass error) = 0;
  // A new connection of the backend's kind (registered with Track).
  virtual LinkConn* NewLink(bool outgoing) = 0;
  // Starts reaching c's next address (or fails it: none left).
  virtual void StartAttempt(LinkConn* c) = 0;
  // Sends what c->tx holds, as far as the transport lets it.
  virtual void FlushSends(LinkConn* c) = 0;
  // Delivers what has arrived on c into its posted receives (PumpRx runs
  // it, once more whenever it was asked to while running).
  virtual void ParseRx(LinkConn* c) = 0;
  // After ParseRx: ask the transport for more, return credit, ...
  virtual void AfterRx(LinkConn* c) = 0;
  // Drops n bytes of what has arrived on c (they were parsed).
  virtual void Consume(LinkConn* c, size_t n) = 0;
  // PostPayload gave the front receive for c->rx_header's payload.
  virtual void PayloadPosted(LinkConn* c) = 0;
  // After a user call that may have made events (PostRecv, Close): a
  // backend whose event_fd would not fire by itself signals it.
  virtual void Kick() {}

  // ---- shared ----
  void PumpRx(LinkConn* c);
  // What StartFrame did with the bytes at hand.
  enum class FrameStart {
    kWait,          // not a whole header (or handshake frame) yet, or no
                    // receive posted: nothing consumed
    kStop,          // the connection failed (a bad frame)
    kNext,          // a handshake frame or a header-only receive's frame
                    // without payload was consumed: parse on
    kAwaitPayload,  // a header went to a header-only receive
    kPayload,       // c->rx_header's payload goes to c->recvs.front()
  };
  // Parses the frame starting at p (avail bytes have arrived), consuming
  // its header (and a handshake frame whole).
  FrameStart StartFrame(LinkConn* c, const uint8_t* p, size_t avail);
  // The front receive got c->rx_take bytes of the current frame.
  void DeliverData(LinkConn* c, ErrorClass error);
  // FlushSends for the connections PostSend marked.
  void FlushDirty();
  // Checks the options every backend needs and parses the listen
  // addresses into *listen; seeds the random state.
  bool CheckOptions(std::vector<ListenAddress>* listen, std::string* error);
  // Registers a new connection (owned here from now on).
  LinkConn* Track(std::unique_ptr<LinkConn> conn, bool outgoing);
  // PostSend's checks and queueing (the backend then flushes).
  ErrorClass QueueData(LinkConn* c, const FrameFields& fields, const iovec* iov,
                       int iovcnt, uint64_t cookie);
  bool MakeRecv(const iovec* iov, int iovcnt, uint64_t cookie,
                LinkRecv* r) const;
  // Unlinks c from the node table (the first step of Fail).
  void Unlink(LinkConn* c);
  // The end of a connection: its pending operations' events and kClosed
  // (or a failed kConnected), then it is forgotten.
  void Release(LinkConn* c);
  void OpenLink(LinkConn* c);
  void QueueControl(LinkConn* c, FrameType type, std::string payload,
                    bool close_after = false);
  void Refuse(LinkConn* c, RefuseReason reason, const char* why);
  void BadFrame(LinkConn* c, const std::string& what);
  // An incoming connection: its first handshake frame (the challenge).
  void Challenge(LinkConn* c);
  void OnControl(LinkConn* c, FrameType type, const uint8_t* p, size_t n);
  void OnAuthResults();
  void Emit(EventType type, const LinkConn* c, ErrorClass error,
            uint64_t cookie);
  // The user's connection `id` if it is open for operations.
  LinkConn* FindLive(ConnId id);

  PeerStats& StatsOf(uint64_t node) {
    PeerStats& p = stats_[node];
    p.node = node;
    return p;
  }
  // The row for a peer that may not have authenticated.
  PeerStats& UntrustedStatsOf(const LinkConn* c) {
    return StatsOf(c->visible ? c->peer_node : 0);
  }

  const FabricOptions opt_;
  psmd::hw::HostDescription self_;
  uint64_t incarnation_ = 0;
  std::mt19937_64 rng_;
  std::unique_ptr<MungeAuth> auth_;
  uint32_t auth_waiting_ = 0;  // requests given to the helper
  std::unordered_map<LinkConn*, std::unique_ptr<LinkConn>> owned_;
  std::unordered_map<ConnId, LinkConn*> by_id_;
  std::unordered_map<uint64_t, LinkConn*> by_serial_;
  // The one connection (pending outgoing or open) to each node.
  std::unordered_map<uint64_t, LinkConn*> by_node_;
  uint32_t handshakes_ = 0;    // incoming, not yet authenticated
  std::vector<ConnId> dirty_;  // with frames PostSend queued since a flush
  std::deque<Event> events_;
  std::map<uint64_t, PeerStats> stats_;

 private:
  void Admit(LinkConn* c);
  void Adopt(LinkConn* incoming, LinkConn* handle);
  bool RememberNonce(const uint8_t nonce[kNonceSize], int64_t now);

  ConnId next_id_ = 1;
  uint64_t next_serial_ = 1;
  // Connector nonces seen within the credential TTL (replay defence).
  std::unordered_map<std::string, int64_t> nonces_;
};

// A backend's Open... function: null with *error when Open fails.
template <class Backend>
std::unique_ptr<Fabric> OpenLinkFabric(const FabricOptions& options,
                                       std::string* error) {
  auto f = std::make_unique<Backend>(options);
  if (!f->Open(error)) return nullptr;
  return f;
}

}  // namespace psmd::hw

#endif  // PSMD_HW_LINK_FABRIC_H_
