// What the byte-stream backends of hw::Fabric (hw/socket/, hw/ofi/) share:
// the connection table (ids, one connection per node pair, incoming
// connections adopting a pending Connect), the handshake of frame.h with
// MUNGE authentication (docs/design.md, "Between nodes: the fabric"),
// queueing of the user's frames and receives, and the events and per-peer
// counters these produce. A backend derives from LinkFabric, keeps its
// transport state in a LinkConn subclass, and supplies the hooks below.
//
// Sessions (docs/design.md, "Sessions: a broken connection resumes"). The
// user's connection id names a session, which outlives the transport
// connection under it:
//  1. Data frames are numbered per direction by their order (1, 2, ...);
//     the number is implied by the stream, never sent.
//  2. The receiver counts the data frames it delivered to its user and
//     tells the sender in ack frames (cumulative); a sender's kSendDone
//     waits for that ack, so the user's buffers are the replay buffer:
//     max_send_bytes bounds it with the frames not yet sent, and at most
//     kUnackedWindow x max_send_frames frames wait for an ack.
//     Acks ride on data when there is some, else go alone after
//     kAckDelayNs or a quarter of the unacknowledged window (in frames or
//     max_send_bytes).
//  3. A connection that breaks while open (not closed by the user, not a
//     bad frame, not a timeout) is replaced by a stand-in that keeps the id,
//     the frames and the posted receives; the side that dialled dials
//     again, the other waits. The hello says "resume" and what the connector
//     delivered, the welcome what the acceptor delivered; each side then
//     sends again, in order, exactly the frames the other had not delivered.
//  4. A session ends as a connection did before (every pending operation's
//     event with the error, then kClosed) when it cannot resume within
//     timeout_ms of the break, or the peer is another incarnation (it
//     restarted: what it had is gone).
//  5. A frame whose header a header-only receive delivered before the break
//     is not delivered twice: its replayed header is read and dropped, and
//     its payload lands where PostPayload said.
//  6. A handover (hw/fabric.h, ExportSessions) carries sessions with nothing
//     of ours in flight to a successor process under the same incarnation;
//     each becomes a stand-in there (AdoptSessions), and the peer, which saw
//     the old process's connections break (over ofi: was told so, the
//     backend's kClose without "final"), resumes it as after any break.
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
// Sessions: how long a delivery may wait for an ack that rides on data,
// and how many windows of frames may wait for acks.
inline constexpr int64_t kAckDelayNs = 500'000;
inline constexpr size_t kUnackedWindow = 16;
// A connection the user asked for whose every address failed tries them
// all again after this pause, until its deadline (timeout_ms): a peer
// daemon that is starting, restarting or slow to answer under load is not
// gone. Short against a daemon's start (hundreds of ms), long against a
// refused TCP connect (tens of µs), so a node that is down costs a connect
// per address every 50 ms.
inline constexpr int64_t kRedialNs = 50'000'000;

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
  uint64_t seq = 0;          // a data frame's number in its session
  bool internal = false;     // a handshake or ack frame: no event
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
  uint32_t dial_rounds = 0;  // times every address failed (RedialLater)
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
  uint32_t tx_app_frames = 0;  // data frames not yet sent whole
  uint64_t tx_app_bytes = 0;   // ... and their bytes with the unacked's
  bool tx_dirty = false;       // frames posted since the last flush (dirty_)

  // ---- the session (see the top of this file) ----
  uint64_t tx_seq = 0;          // data frames queued, ever
  uint64_t tx_acked = 0;        // ... of which the peer delivered
  std::list<LinkSend> unacked;  // sent whole, waiting for the ack
  uint64_t rx_delivered = 0;    // the peer's data frames we delivered
  uint64_t rx_acked = 0;        // rx_delivered as last told to the peer
  uint64_t rx_unacked_bytes = 0;
  int64_t rx_unacked_since_ns = 0;   // the first delivery not acked
  bool ack_due = false;              // listed in ack_due_
  LinkSend* queued_ack = nullptr;    // an ack in tx not yet sent
  bool rx_header_out = false;        // a kHeader went out for the frame at hand
  bool rx_skip_header = false;       // resumed: that frame's header comes again
  bool resuming = false;             // a broken session's stand-in
  bool session_lost = false;         // the peer cannot resume: failure is final
  uint64_t session_incarnation = 0;  // the peer's, when the session opened
  int64_t broke_at_ns = 0;           // when its connection broke
  int64_t session_deadline_ns = 0;   // resumed before this, or it ends
  int64_t redial_at_ns = 0;          // a dialler's next attempt (a stand-in's,
                                     // or a new connection's: RedialLater)
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
  uint64_t Incarnation() const override { return incarnation_; }
  bool ExportSessions(std::vector<CarriedSession>* out,
                      std::string* why) override;
  bool AdoptSessions(const std::vector<CarriedSession>& sessions,
                     std::string* why) override;

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
  // The user closes open connection c: tell the peer, where that cannot
  // cut a frame in two, that the session ends (a kClose frame), so that it
  // does not wait to resume it.
  virtual void Goodbye(LinkConn* /*c*/) {}
  // ExportSessions succeeded: stop listening now, so that the successor can
  // listen at the same ports at once (an exec closes our sockets, but
  // whatever still holds them, such as io_uring's requests in flight, may
  // let them go a moment later).
  virtual void StopListening() {}

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
  // The transport took all of c->tx.front(): a data frame now waits for
  // the peer's ack, anything else is done. Pops it; true when the
  // connection is to close after it (a refusal).
  bool FrontSent(LinkConn* c);
  // Starts the attempts that are due, of broken sessions and of new
  // connections waiting to try their addresses again (the backends call it
  // from their deadline checks).
  void CheckSessions(int64_t now);
  // A backend's StartAttempt found no address left to try. A connection the
  // user asked for (not a stand-in: Suspend retries those) tries them all
  // again kRedialNs later if its deadline allows; false: fail it.
  bool RedialLater(LinkConn* c);
  // The error of a connection not open by its deadline: kConnFailed once
  // every address failed at least once (the peer is not there), else
  // kTimeout (an attempt was still waiting for an answer). Logs it for a
  // connection the user asked for.
  ErrorClass LateConnectError(const LinkConn* c) const;
  int NextWakeMs() const override;
  // FlushSends for the connections PostSend marked, after the acks due at
  // `now` (MonotonicNs, which the caller's Poll reads once for all).
  void FlushDirty(int64_t now);
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
  // c's handshake is done; a resuming session first takes back what the
  // peer had not delivered (`peer_delivered`, from its hello or welcome).
  void OpenLink(LinkConn* c, uint64_t peer_delivered = 0);
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
  // c, closing, broke in a way its session survives (Suspend will take it).
  bool Resumable(const LinkConn* c) const;

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
  // ExportSessions succeeded: the user's calls fail, Poll returns nothing,
  // and the connections close without telling the peers the sessions end.
  bool handed_over_ = false;

 private:
  void Admit(LinkConn* c);
  void Adopt(LinkConn* incoming, LinkConn* handle);
  // A resuming hello on an incoming connection (Admit's part).
  void AdmitResume(LinkConn* c);
  // Sessions: see the top of this file.
  void NoteDelivered(LinkConn* c, size_t bytes);
  void SendAcks(int64_t now);
  void QueueAck(LinkConn* c);
  bool OnAck(LinkConn* c, uint64_t delivered);
  void ReleaseAcked(LinkConn* c, uint64_t delivered);
  // In Release: c broke while open; a stand-in takes its session. False
  // when the session ends instead.
  bool Suspend(LinkConn* c);
  void MoveSession(LinkConn* from, LinkConn* to);
  // Stand-in n waits for its session to resume until its session deadline;
  // a dialler first dials at redial_at_ns.
  void AwaitResume(LinkConn* n, int64_t redial_at_ns);
  // Why c's session cannot be carried now (empty: it can); ExportSessions.
  std::string CarryObstacle(const LinkConn* c) const;
  bool Resume(LinkConn* c, uint64_t peer_delivered);
  bool RememberNonce(const uint8_t nonce[kNonceSize], int64_t now);

  ConnId next_id_ = 1;
  uint64_t next_serial_ = 1;
  std::vector<ConnId> ack_due_;  // delivered frames not yet acknowledged
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
