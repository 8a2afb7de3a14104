#include "hw/link_fabric.h"

#include <spdlog/spdlog.h>
#include <time.h>

#include <algorithm>
#include <cstring>
#include <unordered_set>

namespace psmd::hw {

int64_t MonotonicNs() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);  // vDSO: no syscall
  return int64_t{ts.tv_sec} * 1'000'000'000 + ts.tv_nsec;
}

LinkFabric::LinkFabric(const FabricOptions& options) : opt_(options) {}

bool LinkFabric::CheckOptions(std::vector<ListenAddress>* listen,
                              std::string* error) {
  if (opt_.node_id == 0) {
    *error = "the fabric needs a non-zero node id";
    return false;
  }
  if (opt_.listen.empty()) {
    *error = "the fabric needs at least one listen address";
    return false;
  }
  if (opt_.max_send_bytes < opt_.limits.max_payload + kFrameHeaderSize ||
      opt_.max_send_frames == 0 || opt_.max_iov == 0 || opt_.max_iov > 255) {
    *error =
        "fabric limits: max_send_bytes must hold one largest frame, and "
        "max_iov must be 1-255";
    return false;
  }
  for (const std::string& text : opt_.listen) {
    ListenAddress a;
    if (!ParseListenAddress(text, &a, error)) {
      *error = "fabric listen address " + *error;
      return false;
    }
    if (opt_.auth == AuthMode::kNone && !IsLoopback(a.host)) {
      *error =
          "fabric auth 'none' is only allowed when every address is "
          "loopback; '" +
          text + "' is not (use MUNGE authentication)";
      return false;
    }
    if (a.host == "0.0.0.0" || a.host == "::") {
      *error = "fabric listen address '" + text +
               "': give each interface's own address, not a wildcard (the "
               "host description must name addresses peers can reach)";
      return false;
    }
    listen->push_back(a);
  }
  std::random_device rd;
  rng_.seed((uint64_t{rd()} << 32) ^ rd() ^
            static_cast<uint64_t>(MonotonicNs()));
  // A successor carrying sessions (AdoptSessions) keeps its predecessor's:
  // the peers resume a session only with the incarnation it opened with.
  incarnation_ = opt_.incarnation != 0 ? opt_.incarnation : rng_() | 1;
  return true;
}

LinkConn* LinkFabric::Track(std::unique_ptr<LinkConn> conn, bool outgoing) {
  LinkConn* c = conn.get();
  c->outgoing = outgoing;
  c->serial = next_serial_++;
  c->deadline_ns = MonotonicNs() + int64_t{opt_.timeout_ms} * 1'000'000;
  owned_[c] = std::move(conn);
  by_serial_[c->serial] = c;
  return c;
}

ErrorClass LinkFabric::Connect(const std::string& host_description,
                               uint64_t cookie, ConnId* conn) {
  if (handed_over_) return ErrorClass::kBadConn;
  psmd::hw::HostDescription parsed;
  psmd::hw::HostDescription* d = &parsed;
  std::string error;
  if (!ParseHostDescription(host_description, d, &error)) {
    spdlog::warn("fabric: connect: {}", error);
    return ErrorClass::kBadHost;
  }
  if (d->node == opt_.node_id) {
    spdlog::warn("fabric: connect: '{}' is this node", host_description);
    return ErrorClass::kBadHost;
  }
  if (opt_.auth == AuthMode::kNone) {
    for (const HostAddress& a : d->addresses) {
      if (!IsLoopback(a.host)) {
        spdlog::warn(
            "fabric: connect: auth 'none' reaches loopback peers only, "
            "not {}",
            a.host);
        return ErrorClass::kBadHost;
      }
    }
  }
  if (auto it = by_node_.find(d->node); it != by_node_.end()) {
    *conn = it->second->id;
    return ErrorClass::kAlreadyConnected;
  }
  if (owned_.size() >= opt_.max_connections) return ErrorClass::kLimit;
  LinkConn* c = NewLink(true);
  c->id = next_id_++;
  c->visible = true;
  c->cookie = cookie;
  c->peer_node = d->node;
  c->addresses = d->addresses;
  by_id_[c->id] = c;
  by_node_[d->node] = c;
  *conn = c->id;
  StartAttempt(c);
  Kick();
  return ErrorClass::kOk;
}

ErrorClass LinkFabric::QueueData(LinkConn* c, const FrameFields& fields,
                                 const iovec* iov, int iovcnt,
                                 uint64_t cookie) {
  if (iovcnt < 0 || static_cast<uint32_t>(iovcnt) > opt_.max_iov ||
      (iovcnt > 0 && iov == nullptr)) {
    return ErrorClass::kBadArg;
  }
  size_t length = 0;
  for (int i = 0; i < iovcnt; i++) length += iov[i].iov_len;
  if (length > opt_.limits.max_payload ||
      fields.offset > opt_.limits.max_offset ||
      length > opt_.limits.max_offset - fields.offset) {
    return ErrorClass::kBadArg;
  }
  // Frames not yet sent are bounded as before sessions; those sent and
  // waiting for their ack by a window kUnackedWindow times as large (a
  // window as small as the first would cap a stream at one window per
  // round trip); bytes, sent or not, by max_send_bytes.
  if (c->tx_app_frames >= opt_.max_send_frames ||
      c->unacked.size() >= kUnackedWindow * size_t{opt_.max_send_frames} ||
      c->tx_app_bytes + length + kFrameHeaderSize > opt_.max_send_bytes) {
    return ErrorClass::kBusy;
  }
  LinkSend& s = c->tx.emplace_back();
  FrameHeader h;
  h.type = FrameType::kData;
  h.length = static_cast<uint32_t>(length);
  h.fields = fields;
  EncodeFrameHeader(h, s.header);
  s.iov.push_back({s.header, kFrameHeaderSize});
  for (int i = 0; i < iovcnt; i++) {
    if (iov[i].iov_len > 0) s.iov.push_back(iov[i]);
  }
  s.total = kFrameHeaderSize + length;
  s.cookie = cookie;
  s.seq = ++c->tx_seq;
  c->tx_app_frames++;
  c->tx_app_bytes += s.total;
  return ErrorClass::kOk;
}

ErrorClass LinkFabric::PostSend(ConnId id, const FrameFields& fields,
                                const iovec* iov, int iovcnt, uint64_t cookie) {
  LinkConn* c = FindLive(id);
  if (c == nullptr) return ErrorClass::kBadConn;
  if (ErrorClass e = QueueData(c, fields, iov, iovcnt, cookie);
      e != ErrorClass::kOk) {
    return e;
  }
  // Flushed by the next Poll: the frames the engine posts in one pass (an
  // envelope and its payload, say) then leave together rather than the
  // second waiting for the first's completion.
  if (!c->tx_dirty) {
    c->tx_dirty = true;
    dirty_.push_back(c->id);
  }
  return ErrorClass::kOk;
}

void LinkFabric::FlushDirty(int64_t now) {
  SendAcks(now);
  std::vector<ConnId> dirty;
  dirty.swap(dirty_);
  for (ConnId id : dirty) {
    // By id: a connection may have closed since it was marked.
    if (LinkConn* c = FindLive(id)) {
      c->tx_dirty = false;
      FlushSends(c);
    }
  }
}

ErrorClass LinkFabric::PostPayload(ConnId id, const iovec* iov, int iovcnt,
                                   uint64_t cookie) {
  LinkConn* c = FindLive(id);
  if (c == nullptr) return ErrorClass::kBadConn;
  LinkRecv r;
  if (!c->await_payload || !MakeRecv(iov, iovcnt, cookie, &r)) {
    return ErrorClass::kBadArg;
  }
  c->recvs.push_front(std::move(r));
  c->await_payload = false;
  c->rx_take = std::min<size_t>(c->rx_header.length, c->recvs.front().capacity);
  c->rx_got = 0;
  // Resumed before this frame's payload came: its header comes again
  // first, and StartFrame reads it, then the payload (sessions, 5).
  if (!c->rx_skip_header) PayloadPosted(c);
  PumpRx(c);
  Kick();
  return ErrorClass::kOk;
}

// Re-entrant calls (a handshake frame that opens the link) only ask the
// running parse to go once more.
void LinkFabric::PumpRx(LinkConn* c) {
  if (c->rx_parsing) {
    c->rx_reparse = true;
    return;
  }
  c->rx_parsing = true;
  do {
    c->rx_reparse = false;
    ParseRx(c);
  } while (c->rx_reparse && !c->closing);
  c->rx_parsing = false;
  AfterRx(c);
}

LinkFabric::FrameStart LinkFabric::StartFrame(LinkConn* c, const uint8_t* p,
                                              size_t avail) {
  if (avail < kFrameHeaderSize) return FrameStart::kWait;
  const bool open = c->state == LinkState::kOpen;
  // Back-pressure: a frame waits until a receive is posted for it. An ack
  // needs none (it frees our sends), nor the header of a frame whose header
  // a receive already took before the connection broke.
  if (open && c->recvs.empty() && !c->rx_skip_header &&
      p[5] != static_cast<uint8_t>(FrameType::kAck) &&
      p[5] != static_cast<uint8_t>(FrameType::kClose)) {
    return FrameStart::kWait;
  }
  FrameHeader h;
  FrameError e = DecodeFrameHeader(p, avail, opt_.limits, &h);
  if (e != FrameError::kOk) {
    BadFrame(c, e == FrameError::kBadVersion
                    ? "bad frame header: another fabric protocol version "
                      "(every node needs a psmd of the same fabric version)"
                    : std::string("bad frame header: ") + FrameErrorName(e));
    return FrameStart::kStop;
  }
  if (open && h.type == FrameType::kAck) {
    if (avail < kFrameHeaderSize + h.length) return FrameStart::kWait;
    uint64_t delivered = 0;
    if (DecodeAck(p + kFrameHeaderSize, h.length, &delivered) !=
        FrameError::kOk) {
      BadFrame(c, "malformed ack");
      return FrameStart::kStop;
    }
    Consume(c, kFrameHeaderSize + h.length);
    return OnAck(c, delivered) ? FrameStart::kNext : FrameStart::kStop;
  }
  if (open && h.type == FrameType::kClose) {
    if (h.length != 0) {
      BadFrame(c, "malformed close");
      return FrameStart::kStop;
    }
    Consume(c, kFrameHeaderSize);
    c->session_lost = true;  // its end of file is final
    return FrameStart::kNext;
  }
  if (open && c->rx_skip_header) {
    // The frame the header-only receive took before the break, sent again.
    const FrameFields& was = c->rx_header.fields;
    if (h.type != FrameType::kData || h.length != c->rx_header.length ||
        h.fields.op != was.op || h.fields.src != was.src ||
        h.fields.dst != was.dst || h.fields.offset != was.offset ||
        h.fields.aux != was.aux) {
      BadFrame(c, "a resumed session's first frame is not the one it cut");
      return FrameStart::kStop;
    }
    Consume(c, kFrameHeaderSize);
    c->rx_skip_header = false;
    if (c->await_payload) return FrameStart::kAwaitPayload;
    c->rx_take = std::min<size_t>(h.length, c->recvs.front().capacity);
    c->rx_got = 0;
    return FrameStart::kPayload;
  }
  const bool data = h.type == FrameType::kData;
  if (data != (c->state == LinkState::kOpen)) {
    BadFrame(c, data ? "data frame before the handshake finished"
                     : "handshake frame on an open connection");
    return FrameStart::kStop;
  }
  if (!data) {  // whole (at most 64 + 1024 bytes), then handled
    if (avail < kFrameHeaderSize + h.length) return FrameStart::kWait;
    const std::string payload(
        reinterpret_cast<const char*>(p) + kFrameHeaderSize, h.length);
    Consume(c, kFrameHeaderSize + h.length);
    OnControl(c, h.type, reinterpret_cast<const uint8_t*>(payload.data()),
              payload.size());
    return c->closing ? FrameStart::kStop : FrameStart::kNext;
  }
  Consume(c, kFrameHeaderSize);
  c->rx_header = h;
  if (c->recvs.front().header_only) {
    LinkRecv r = std::move(c->recvs.front());
    c->recvs.pop_front();
    Event ev;
    ev.type = EventType::kHeader;
    ev.conn = c->id;
    ev.cookie = r.cookie;
    ev.peer_node = c->peer_node;
    ev.length = h.length;
    ev.fields = h.fields;
    events_.push_back(ev);
    if (h.length > 0) {
      c->await_payload = true;
      c->rx_header_out = true;
      return FrameStart::kAwaitPayload;
    }
    StatsOf(c->peer_node).frames_received++;
    NoteDelivered(c, 0);
    return FrameStart::kNext;
  }
  c->rx_take = std::min<size_t>(h.length, c->recvs.front().capacity);
  c->rx_got = 0;
  return FrameStart::kPayload;
}

void LinkFabric::DeliverData(LinkConn* c, ErrorClass error) {
  LinkRecv r = std::move(c->recvs.front());
  c->recvs.pop_front();
  Event e;
  e.type = EventType::kRecvDone;
  e.conn = c->id;
  e.error = error;
  e.cookie = r.cookie;
  e.peer_node = c->peer_node;
  e.length = static_cast<uint32_t>(c->rx_take);
  e.fields = c->rx_header.fields;
  events_.push_back(e);
  PeerStats& st = StatsOf(c->peer_node);
  st.frames_received++;
  st.bytes_received += c->rx_header.length;
  c->rx_got = 0;
  c->rx_header_out = false;
  NoteDelivered(c, c->rx_header.length);
}

LinkConn* LinkFabric::FindLive(ConnId id) {
  if (handed_over_) return nullptr;
  auto it = by_id_.find(id);
  if (it == by_id_.end()) return nullptr;
  // A connection that broke and waits for its release keeps taking the
  // user's frames and receives (the backend does nothing with them while
  // it closes): Release hands them to the session's stand-in.
  if (it->second->closing && !Resumable(it->second)) return nullptr;
  return it->second;
}

bool LinkFabric::Resumable(const LinkConn* c) const {
  if (!opt_.sessions || !c->visible || !c->opened || c->local_close ||
      c->session_lost) {
    return false;
  }
  switch (c->close_error) {
    case ErrorClass::kPeerClosed:
    case ErrorClass::kConnReset:
    case ErrorClass::kConnFailed:
    case ErrorClass::kLimit:
    case ErrorClass::kFail:
      break;
    default:  // past the timeout, a bad frame or a refusal: final
      return false;
  }
  return c->session_deadline_ns == 0 || MonotonicNs() < c->session_deadline_ns;
}

ErrorClass LinkFabric::PostRecv(ConnId id, const iovec* iov, int iovcnt,
                                uint64_t cookie) {
  LinkConn* c = FindLive(id);
  if (c == nullptr) return ErrorClass::kBadConn;
  LinkRecv r;
  if (!MakeRecv(iov, iovcnt, cookie, &r)) return ErrorClass::kBadArg;
  c->recvs.push_back(std::move(r));
  PumpRx(c);
  Kick();
  return ErrorClass::kOk;
}

ErrorClass LinkFabric::PostRecvHeader(ConnId id, uint64_t cookie) {
  LinkConn* c = FindLive(id);
  if (c == nullptr) return ErrorClass::kBadConn;
  LinkRecv& r = c->recvs.emplace_back();
  r.cookie = cookie;
  r.header_only = true;
  PumpRx(c);
  Kick();
  return ErrorClass::kOk;
}

bool LinkFabric::MakeRecv(const iovec* iov, int iovcnt, uint64_t cookie,
                          LinkRecv* r) const {
  if (iovcnt < 0 || static_cast<uint32_t>(iovcnt) > opt_.max_iov ||
      (iovcnt > 0 && iov == nullptr)) {
    return false;
  }
  for (int i = 0; i < iovcnt; i++) {
    if (iov[i].iov_len > 0) r->iov.push_back(iov[i]);
    r->capacity += iov[i].iov_len;
  }
  r->cookie = cookie;
  return true;
}

ErrorClass LinkFabric::Close(ConnId id) {
  LinkConn* c = FindLive(id);
  if (c == nullptr) return ErrorClass::kBadConn;
  c->local_close = true;
  if (c->state == LinkState::kOpen) Goodbye(c);
  Fail(c, ErrorClass::kCanceled);
  Kick();
  return ErrorClass::kOk;
}

std::vector<PeerStats> LinkFabric::Stats() const {
  std::vector<PeerStats> rows;
  for (const auto& [node, row] : stats_) rows.push_back(row);
  return rows;
}

void LinkFabric::Emit(EventType type, const LinkConn* c, ErrorClass error,
                      uint64_t cookie) {
  Event e;
  e.type = type;
  e.conn = c->id;
  e.error = error;
  e.cookie = cookie;
  e.peer_node = c->peer_node;
  events_.push_back(e);
}

void LinkFabric::Unlink(LinkConn* c) {
  if (auto it = by_node_.find(c->peer_node);
      it != by_node_.end() && it->second == c) {
    by_node_.erase(it);
  }
}

void LinkFabric::Release(LinkConn* c) {
  if (c->counted_handshake) handshakes_--;
  if (c->visible && Suspend(c)) c->visible = false;
  if (c->visible) {
    ErrorClass op_error = c->close_error;
    if (c->session_deadline_ns != 0) {
      spdlog::warn(
          "fabric: the session with node {} ended: not resumed within {} ms "
          "of the break; {} frames sent and not delivered are lost",
          c->peer_node, opt_.timeout_ms, c->unacked.size());
    }
    for (LinkSend& s : c->unacked) {
      Emit(EventType::kSendDone, c, op_error, s.cookie);
    }
    for (LinkSend& s : c->tx) {
      if (!s.internal) Emit(EventType::kSendDone, c, op_error, s.cookie);
    }
    for (LinkRecv& r : c->recvs) {
      Emit(r.header_only ? EventType::kHeader : EventType::kRecvDone, c,
           op_error, r.cookie);
    }
    if (c->opened) {
      if (!c->local_close) StatsOf(c->peer_node).disconnects++;
      Emit(EventType::kClosed, c,
           c->local_close ? ErrorClass::kOk : c->close_error, 0);
    } else {
      if (!c->local_close) StatsOf(c->peer_node).connect_failures++;
      Emit(EventType::kConnected, c, c->close_error, c->cookie);
    }
    if (auto it = by_id_.find(c->id); it != by_id_.end() && it->second == c) {
      by_id_.erase(it);
    }
  }
  by_serial_.erase(c->serial);
  owned_.erase(c);
}

void LinkFabric::OpenLink(LinkConn* c, uint64_t peer_delivered) {
  c->state = LinkState::kOpen;
  c->opened = true;
  StatsOf(c->peer_node).connects++;
  if (c->counted_handshake) {
    c->counted_handshake = false;
    handshakes_--;
  }
  if (c->resuming) {
    if (!Resume(c, peer_delivered)) return;
  } else {
    c->session_incarnation = c->peer_incarnation;
  }
  FlushSends(c);
  PumpRx(c);
}

// ---- sessions (see link_fabric.h) ----

bool LinkFabric::FrontSent(LinkConn* c) {
  LinkSend& s = c->tx.front();
  const bool close_after = s.close_after;
  if (s.internal) {
    if (&s == c->queued_ack) c->queued_ack = nullptr;
    c->tx.pop_front();
    return close_after;
  }
  PeerStats& st = StatsOf(c->peer_node);
  st.frames_sent++;
  st.bytes_sent += s.total - kFrameHeaderSize;
  if (!opt_.sessions) {  // the caller's buffers are free
    Emit(EventType::kSendDone, c, ErrorClass::kOk, s.cookie);
    c->tx_app_frames--;
    c->tx_app_bytes -= s.total;
    c->tx.pop_front();
    return close_after;
  }
  // Kept (with the user's buffers) until the peer says it delivered it:
  // out of the window of frames to send, in that of frames to be
  // acknowledged (QueueData).
  c->tx_app_frames--;
  c->unacked.splice(c->unacked.end(), c->tx, c->tx.begin());
  return close_after;
}

void LinkFabric::NoteDelivered(LinkConn* c, size_t bytes) {
  if (!opt_.sessions) return;
  c->rx_delivered++;
  c->rx_unacked_bytes += bytes;
  if (!c->ack_due) {
    c->ack_due = true;
    c->rx_unacked_since_ns = MonotonicNs();
    ack_due_.push_back(c->id);
  }
}

// At each flush (each Poll). An ack alone costs us a sendmsg and the peer a
// wake-up, so one goes out: with data we send anyway (in the same sendmsg:
// a ping-pong's acks ride on its replies), when a quarter of the peer's
// window is unacknowledged, or kAckDelayNs after the first delivery it
// covers (NextWakeMs wakes a sleeping worker for it).
void LinkFabric::SendAcks(int64_t now) {
  if (ack_due_.empty()) return;
  std::vector<ConnId> due;
  due.swap(ack_due_);
  for (ConnId id : due) {
    LinkConn* c = FindLive(id);
    if (c == nullptr || !c->ack_due) continue;
    if (c->state != LinkState::kOpen) {
      // A resume tells the peer what was delivered.
      c->ack_due = false;
      continue;
    }
    const uint64_t frames = c->rx_delivered - c->rx_acked;
    if (c->tx_dirty || frames >= kUnackedWindow * opt_.max_send_frames / 4 ||
        c->rx_unacked_bytes >= opt_.max_send_bytes / 4 ||
        now - c->rx_unacked_since_ns >= kAckDelayNs) {
      QueueAck(c);
      c->ack_due = false;
    } else {
      ack_due_.push_back(id);
    }
  }
}

void LinkFabric::QueueAck(LinkConn* c) {
  c->rx_acked = c->rx_delivered;
  c->rx_unacked_bytes = 0;
  const std::string payload = EncodeAck(c->rx_delivered);
  // One ack waiting in tx at most: a peer that does not read cannot make
  // us queue one per delivery.
  if (c->queued_ack != nullptr && c->queued_ack->sent == 0) {
    c->queued_ack->control = payload;
    c->queued_ack->iov[1] = {c->queued_ack->control.data(), kAckSize};
    return;
  }
  LinkSend& s = c->tx.emplace_back();  // behind what is in flight
  FrameHeader h;
  h.type = FrameType::kAck;
  h.length = kAckSize;
  EncodeFrameHeader(h, s.header);
  s.control = payload;
  s.iov.push_back({s.header, kFrameHeaderSize});
  s.iov.push_back({s.control.data(), s.control.size()});
  s.total = kFrameHeaderSize + kAckSize;
  s.internal = true;
  c->queued_ack = &s;
  if (!c->tx_dirty) {
    c->tx_dirty = true;
    dirty_.push_back(c->id);
  }
}

bool LinkFabric::OnAck(LinkConn* c, uint64_t delivered) {
  if (!opt_.sessions || delivered < c->tx_acked ||
      delivered - c->tx_acked > c->unacked.size()) {
    BadFrame(c, "an ack of frames never sent");
    return false;
  }
  ReleaseAcked(c, delivered);
  return true;
}

void LinkFabric::ReleaseAcked(LinkConn* c, uint64_t delivered) {
  while (c->tx_acked < delivered) {
    LinkSend& s = c->unacked.front();
    Emit(EventType::kSendDone, c, ErrorClass::kOk, s.cookie);
    c->tx_app_bytes -= s.total;
    c->tx_acked++;
    c->unacked.pop_front();
  }
}

bool LinkFabric::Suspend(LinkConn* c) {
  if (!Resumable(c)) return false;
  const int64_t now = MonotonicNs();
  if (c->session_deadline_ns == 0) {
    c->broke_at_ns = now;
    c->session_deadline_ns = now + int64_t{opt_.timeout_ms} * 1'000'000;
    spdlog::info(
        "fabric: the connection to node {} broke ({}); resuming its session "
        "(within {} ms)",
        c->peer_node, ErrorClassName(c->close_error), opt_.timeout_ms);
  }
  if (now >= c->session_deadline_ns) return false;
  LinkConn* n = NewLink(c->outgoing);
  MoveSession(c, n);
  // The dialler tries at once after the break, then every 20 ms.
  AwaitResume(n, c->resuming ? now + 20'000'000 : now);
  return true;
}

void LinkFabric::AwaitResume(LinkConn* n, int64_t redial_at_ns) {
  n->state = LinkState::kWaitPeer;
  n->deadline_ns = n->session_deadline_ns;
  if (n->outgoing) n->redial_at_ns = redial_at_ns;
}

void LinkFabric::MoveSession(LinkConn* from, LinkConn* to) {
  to->id = from->id;
  to->cookie = from->cookie;
  to->visible = true;
  to->opened = true;
  to->resuming = true;
  to->peer_node = from->peer_node;
  to->session_incarnation = from->session_incarnation;
  to->addresses = from->addresses;
  to->next_address = 0;
  to->broke_at_ns = from->broke_at_ns;
  to->session_deadline_ns = from->session_deadline_ns;
  // Frames: the unacknowledged first, then the unsent; whatever part of
  // one the old connection carried goes again whole. Its handshake and
  // ack frames stay behind.
  to->unacked.splice(to->unacked.end(), from->unacked);
  for (auto it = from->tx.begin(); it != from->tx.end();) {
    auto next = std::next(it);
    if (!it->internal) {
      it->sent = 0;
      to->tx.splice(to->tx.end(), from->tx, it);
    }
    it = next;
  }
  to->tx_app_frames = from->tx_app_frames;
  to->tx_app_bytes = from->tx_app_bytes;
  to->tx_seq = from->tx_seq;
  to->tx_acked = from->tx_acked;
  to->recvs = std::move(from->recvs);
  from->recvs.clear();
  to->rx_delivered = from->rx_delivered;
  to->rx_acked = from->rx_acked;
  to->rx_unacked_bytes = from->rx_unacked_bytes;
  to->ack_due = from->ack_due;
  to->rx_header = from->rx_header;
  to->await_payload = from->await_payload;
  to->rx_header_out = from->rx_header_out;
  to->rx_skip_header = from->rx_header_out;
  from->visible = false;
  by_id_[to->id] = to;
  by_node_[to->peer_node] = to;
}

bool LinkFabric::Resume(LinkConn* c, uint64_t peer_delivered) {
  if (peer_delivered < c->tx_acked ||
      peer_delivered - c->tx_acked > c->unacked.size()) {
    BadFrame(c, "a resume naming frames never sent");
    return false;
  }
  ReleaseAcked(c, peer_delivered);
  const size_t again = c->unacked.size();
  // Before anything queued since, behind this connection's handshake.
  auto first_data = std::find_if(c->tx.begin(), c->tx.end(),
                                 [](const LinkSend& s) { return !s.internal; });
  for (LinkSend& s : c->unacked) s.sent = 0;
  c->tx_app_frames += static_cast<uint32_t>(again);
  c->tx.splice(first_data, c->unacked);
  // The peer learnt what we delivered from the handshake.
  c->rx_acked = c->rx_delivered;
  c->rx_unacked_bytes = 0;
  c->resuming = false;
  PeerStats& st = StatsOf(c->peer_node);
  st.resumes++;
  st.frames_replayed += again;
  spdlog::info(
      "fabric: the session with node {} resumed {:.1f} ms after its "
      "connection broke: {} frames sent again (of {} sent; {} of theirs "
      "delivered here)",
      c->peer_node, (MonotonicNs() - c->broke_at_ns) / 1e6, again, c->tx_seq,
      c->rx_delivered);
  c->broke_at_ns = 0;
  c->session_deadline_ns = 0;
  return true;
}

// ---- handover (hw/fabric.h; sessions, 6) ----

std::string LinkFabric::CarryObstacle(const LinkConn* c) const {
  const std::string node = "node " + std::to_string(c->peer_node) + ": ";
  if (c->closing) return node + "its connection is closing";
  // A stand-in in any state: a resume it has under way is begun again by
  // the successor (the peer replays by the counters either way). Anything
  // else not open is a connection the user asked for, still being made.
  if (c->state != LinkState::kOpen && !c->resuming) {
    return node + "a connection is being made";
  }
  const size_t queued =
      std::count_if(c->tx.begin(), c->tx.end(),
                    [](const LinkSend& s) { return !s.internal; });
  if (queued > 0) return node + std::to_string(queued) + " frames queued";
  if (!c->unacked.empty()) {
    return node + std::to_string(c->unacked.size()) +
           " frames sent and not yet acknowledged";
  }
  if (c->await_payload || c->rx_header_out) {
    return node + "a header was delivered and its payload waits";
  }
  return {};
}

bool LinkFabric::ExportSessions(std::vector<CarriedSession>* out,
                                std::string* why) {
  if (handed_over_) {
    *why = "the sessions were handed over already";
    return false;
  }
  if (!opt_.sessions) {
    *why = "sessions are off (fabric_sessions): there are none to carry";
    return false;
  }
  if (!events_.empty()) {
    *why = std::to_string(events_.size()) + " events not yet polled";
    return false;
  }
  std::vector<CarriedSession> carried;
  for (const auto& [link, owner] : owned_) {
    // Incoming connections the user does not know of yet are dropped: the
    // peer dials again (to the successor), and connections a stand-in
    // replaced are gone already.
    if (!link->visible) continue;
    if (std::string obstacle = CarryObstacle(link); !obstacle.empty()) {
      *why = obstacle;
      return false;
    }
    CarriedSession& s = carried.emplace_back();
    s.id = link->id;
    s.node = link->peer_node;
    s.outgoing = link->outgoing;
    s.addresses = link->addresses;
    s.peer_incarnation = link->session_incarnation;
    s.tx_seq = link->tx_seq;
    // Delivered means an event the user took (events_ is empty): frames
    // the backend read and not yet delivered, the peer sends again.
    s.rx_delivered = link->rx_delivered;
  }
  std::sort(carried.begin(), carried.end(),
            [](const CarriedSession& x, const CarriedSession& y) {
              return x.id < y.id;
            });
  *out = std::move(carried);
  handed_over_ = true;
  StopListening();
  spdlog::info("fabric: {} sessions handed over (incarnation {:x})",
               out->size(), incarnation_);
  return true;
}

bool LinkFabric::AdoptSessions(const std::vector<CarriedSession>& sessions,
                               std::string* why) {
  if (!opt_.sessions) {
    *why = "sessions are off (fabric_sessions): none can be adopted";
    return false;
  }
  if (opt_.incarnation == 0) {
    *why =
        "the fabric was opened without the predecessor's incarnation "
        "(FabricOptions::incarnation): the peers would not resume";
    return false;
  }
  if (handed_over_ || !owned_.empty() || next_id_ != 1) {
    *why = "sessions are adopted before any connection exists";
    return false;
  }
  if (sessions.size() > opt_.max_connections) {
    *why = std::to_string(sessions.size()) + " sessions, more than " +
           std::to_string(opt_.max_connections) + " connections allowed";
    return false;
  }
  std::unordered_set<ConnId> ids;
  std::unordered_set<uint64_t> nodes;
  ConnId last_id = 0;
  for (const CarriedSession& s : sessions) {
    const std::string which = "session " + std::to_string(s.id) +
                              " with node " + std::to_string(s.node) + ": ";
    if (s.id == 0 || !ids.insert(s.id).second) {
      *why = which + "its id is zero or not unique";
      return false;
    }
    if (s.node == 0 || s.node == opt_.node_id || !nodes.insert(s.node).second) {
      *why = which + "its node is zero, this node, or not unique";
      return false;
    }
    if (s.peer_incarnation == 0) {
      *why = which + "no peer incarnation";
      return false;
    }
    if (s.outgoing &&
        (s.addresses.empty() || s.addresses.size() > kMaxHostAddresses)) {
      *why = which + "we dialled it, but it has no (or too many) addresses";
      return false;
    }
    last_id = std::max(last_id, s.id);
  }
  const int64_t now = MonotonicNs();
  for (const CarriedSession& s : sessions) {
    // As Suspend leaves a broken session: the peer sees ours break when
    // the predecessor's connections close.
    LinkConn* n = NewLink(s.outgoing);
    n->id = s.id;
    n->visible = true;
    n->opened = true;
    n->resuming = true;
    n->peer_node = s.node;
    n->session_incarnation = s.peer_incarnation;
    n->addresses = s.addresses;
    n->tx_seq = n->tx_acked = s.tx_seq;
    n->rx_delivered = n->rx_acked = s.rx_delivered;
    n->broke_at_ns = now;
    n->session_deadline_ns = now + int64_t{opt_.timeout_ms} * 1'000'000;
    AwaitResume(n, now);
    by_id_[n->id] = n;
    by_node_[n->peer_node] = n;
  }
  next_id_ = last_id + 1;
  spdlog::info("fabric: adopted {} sessions (incarnation {:x})",
               sessions.size(), incarnation_);
  return true;
}

void LinkFabric::CheckSessions(int64_t now) {
  std::vector<LinkConn*> due;
  for (auto& [link, owner] : owned_) {
    if (link->closing || link->redial_at_ns == 0) continue;
    const LinkState waiting =
        link->resuming ? LinkState::kWaitPeer : LinkState::kConnecting;
    if (link->state != waiting) {
      link->redial_at_ns = 0;  // a late answer got it going meanwhile
    } else if (now >= link->redial_at_ns) {
      due.push_back(link);
    }
  }
  for (LinkConn* c : due) {
    c->redial_at_ns = 0;
    c->next_address = 0;
    StartAttempt(c);
  }
}

bool LinkFabric::RedialLater(LinkConn* c) {
  const int64_t now = MonotonicNs();
  if (c->resuming || c->closing || !c->outgoing ||
      now + kRedialNs >= c->deadline_ns) {
    return false;
  }
  if (c->dial_rounds++ == 0) {
    spdlog::info(
        "fabric: node {} unreachable at every address; trying again every "
        "{} ms for up to {} ms",
        c->peer_node, kRedialNs / 1'000'000, opt_.timeout_ms);
  }
  c->next_address = 0;
  c->redial_at_ns = now + kRedialNs;
  return true;
}

ErrorClass LinkFabric::LateConnectError(const LinkConn* c) const {
  // An incoming handshake that stalls is not logged: anyone who can reach
  // the listen address could make lines of them.
  if (c->dial_rounds > 0) {
    spdlog::warn(
        "fabric: node {} unreachable at every address, {} times in {} ms",
        c->peer_node, c->dial_rounds, opt_.timeout_ms);
    return ErrorClass::kConnFailed;
  }
  if (c->outgoing) {
    const char* stage = "";
    switch (c->state) {
      case LinkState::kConnecting:
        stage = "no answer from its address";
        break;
      case LinkState::kHandshake:
        stage = "its handshake stalled";
        break;
      case LinkState::kAuth:
        stage = "waiting for MUNGE (is munged running?)";
        break;
      case LinkState::kWaitPeer:
        stage = "its own connection to us, which wins, did not come";
        break;
      default:
        break;
    }
    spdlog::warn("fabric: connection to node {} not established in {} ms: {}",
                 c->peer_node, opt_.timeout_ms, stage);
  }
  return ErrorClass::kTimeout;
}

int LinkFabric::NextWakeMs() const {
  if (!ack_due_.empty()) return 1;  // kAckDelayNs
  // Stand-ins, and new connections between two rounds of attempts, wait
  // for CheckSessions.
  for (const auto& [link, owner] : owned_) {
    if (!link->closing && (link->resuming || link->redial_at_ns != 0)) {
      return 10;
    }
  }
  return -1;
}

void LinkFabric::QueueControl(LinkConn* c, FrameType type, std::string payload,
                              bool close_after) {
  // Handshake frames go before the user's frames queued while connecting.
  auto pos = std::find_if(c->tx.begin(), c->tx.end(),
                          [](const LinkSend& s) { return !s.internal; });
  LinkSend& s = *c->tx.emplace(pos);
  FrameHeader h;
  h.type = type;
  h.length = static_cast<uint32_t>(payload.size());
  EncodeFrameHeader(h, s.header);
  s.control = std::move(payload);
  s.iov.push_back({s.header, kFrameHeaderSize});
  if (!s.control.empty()) s.iov.push_back({s.control.data(), s.control.size()});
  s.total = kFrameHeaderSize + s.control.size();
  s.internal = true;
  s.close_after = close_after;
  FlushSends(c);
}

void LinkFabric::Refuse(LinkConn* c, RefuseReason reason, const char* why) {
  spdlog::warn("fabric: refused connection from node {}: {}", c->hello.node,
               why);
  if (reason == RefuseReason::kAuth) UntrustedStatsOf(c).auth_failures++;
  c->state = LinkState::kRefusing;
  QueueControl(c, FrameType::kRefuse, EncodeRefuse(reason), true);
}

void LinkFabric::BadFrame(LinkConn* c, const std::string& what) {
  UntrustedStatsOf(c).bad_frames++;
  if (!c->bad_frame_logged) {
    c->bad_frame_logged = true;
    if (c->visible) {
      spdlog::warn("fabric: dropping connection {} to node {}: {}", c->id,
                   c->peer_node, what);
    } else {
      spdlog::warn("fabric: dropping a connection before authentication: {}",
                   what);
    }
  }
  Fail(c, ErrorClass::kBadFrame);
}

void LinkFabric::Challenge(LinkConn* c) {
  c->state = LinkState::kHandshake;
  c->counted_handshake = true;
  handshakes_++;
  for (auto& b : c->challenge) b = static_cast<uint8_t>(rng_());
  ChallengePayload ch;
  ch.node = opt_.node_id;
  ch.incarnation = incarnation_;
  std::memcpy(ch.nonce, c->challenge, kNonceSize);
  QueueControl(c, FrameType::kChallenge, EncodeChallenge(ch));
}

// One connection per node pair: see hw/fabric.h for the rule.
void LinkFabric::Admit(LinkConn* c) {
  if (c->hello.sessions != opt_.sessions) {
    Refuse(c, RefuseReason::kSessions,
           opt_.sessions ? "it runs without sessions (fabric_sessions differs)"
                         : "it runs sessions (fabric_sessions differs)");
    return;
  }
  if (c->hello.resume) {
    AdmitResume(c);
    return;
  }
  uint64_t node = c->hello.node;
  auto it = by_node_.find(node);
  if (it != by_node_.end() && it->second->resuming) {
    // The peer connects afresh: it gave the session up, or it restarted.
    spdlog::info(
        "fabric: node {} connected afresh; its broken session cannot resume",
        node);
    it->second->session_lost = true;
    Fail(it->second, ErrorClass::kConnReset);
    it = by_node_.end();
  }
  if (it != by_node_.end() && it->second->state == LinkState::kOpen) {
    if (it->second->peer_incarnation == c->hello.incarnation) {
      Refuse(c, RefuseReason::kDuplicate, "already connected");
      return;
    }
    spdlog::info("fabric: node {} restarted; replacing its connection", node);
    Fail(it->second, ErrorClass::kConnReset);
    it = by_node_.end();
  }
  c->peer_node = node;
  c->peer_incarnation = c->hello.incarnation;
  if (it != by_node_.end()) {
    if (node > opt_.node_id) {
      Refuse(c, RefuseReason::kDuplicate, "our own connection to it wins");
      return;
    }
    QueueControl(c, FrameType::kWelcome,
                 EncodeWelcome({opt_.node_id, incarnation_}));
    Adopt(c, it->second);
    return;
  }
  if (owned_.size() > opt_.max_connections) {
    Refuse(c, RefuseReason::kBusy, "too many connections");
    return;
  }
  QueueControl(c, FrameType::kWelcome,
               EncodeWelcome({opt_.node_id, incarnation_}));
  c->id = next_id_++;
  c->visible = true;
  by_id_[c->id] = c;
  by_node_[node] = c;
  OpenLink(c);
  Emit(EventType::kAccepted, c, ErrorClass::kOk, 0);
}

void LinkFabric::AdmitResume(LinkConn* c) {
  const uint64_t node = c->hello.node;
  auto it = by_node_.find(node);
  LinkConn* s = it == by_node_.end() ? nullptr : it->second;
  if (s != nullptr && s->state == LinkState::kOpen &&
      s->session_incarnation == c->hello.incarnation) {
    // The break has not reached us yet: end our side (Release makes the
    // stand-in) and let the connector come again.
    Fail(s, ErrorClass::kConnReset);
    Refuse(c, RefuseReason::kRetry, "its session's old connection is closing");
    return;
  }
  if (s == nullptr) {
    // Failed (so unlinked) and not yet released: a stand-in soon.
    for (const auto& [link, owner] : owned_) {
      if (link->closing && link->peer_node == node &&
          link->session_incarnation == c->hello.incarnation &&
          Resumable(link)) {
        Refuse(c, RefuseReason::kRetry,
               "its session's old connection is closing");
        return;
      }
    }
  }
  if (s != nullptr && s->resuming &&
      s->session_incarnation != c->hello.incarnation) {
    // The peer restarted (or a successor came under a new incarnation):
    // what it had of the session is gone, so ours ends now, not at the
    // session's deadline.
    spdlog::warn(
        "fabric: node {} came back as another incarnation: the session with "
        "it cannot resume",
        node);
    s->session_lost = true;
    Fail(s, ErrorClass::kConnReset);
    s = nullptr;
  }
  if (s == nullptr || !s->resuming || s->outgoing) {
    Refuse(c, RefuseReason::kNoSession, "no session to resume");
    return;
  }
  c->peer_node = node;
  c->peer_incarnation = c->hello.incarnation;
  QueueControl(c, FrameType::kWelcome,
               EncodeWelcome({opt_.node_id, incarnation_, s->rx_delivered}));
  MoveSession(s, c);
  Fail(s, ErrorClass::kCanceled);  // invisible now: no events
  OpenLink(c, c->hello.delivered);
}

// The peer's connection (`incoming`) takes over the user's pending Connect
// handle; the handle itself is closed without events.
void LinkFabric::Adopt(LinkConn* incoming, LinkConn* handle) {
  incoming->id = handle->id;
  incoming->cookie = handle->cookie;
  incoming->visible = true;
  auto first_app = std::find_if(handle->tx.begin(), handle->tx.end(),
                                [](const LinkSend& s) { return !s.internal; });
  incoming->tx.splice(incoming->tx.end(), handle->tx, first_app,
                      handle->tx.end());
  incoming->tx_app_frames = handle->tx_app_frames;
  incoming->tx_app_bytes = handle->tx_app_bytes;
  incoming->tx_seq = handle->tx_seq;
  incoming->recvs = std::move(handle->recvs);
  handle->recvs.clear();
  handle->visible = false;
  Fail(handle, ErrorClass::kCanceled);
  by_id_[incoming->id] = incoming;
  by_node_[incoming->peer_node] = incoming;
  OpenLink(incoming);
  Emit(EventType::kConnected, incoming, ErrorClass::kOk, incoming->cookie);
}

void LinkFabric::OnControl(LinkConn* c, FrameType type, const uint8_t* p,
                           size_t n) {
  FrameError e = FrameError::kBadPayload;
  if (c->outgoing && type == FrameType::kChallenge &&
      c->peer_incarnation == 0) {
    ChallengePayload ch;
    e = DecodeChallenge(p, n, &ch);
    if (e == FrameError::kOk) {
      if (ch.node != c->peer_node) {
        spdlog::warn("fabric: {} is node {}, not node {}",
                     c->addresses[c->next_address - 1].host, ch.node,
                     c->peer_node);
        Fail(c, ErrorClass::kBadHost);
        return;
      }
      if (c->resuming && ch.incarnation != c->session_incarnation) {
        spdlog::warn(
            "fabric: node {} restarted: the session with it cannot resume",
            c->peer_node);
        c->session_lost = true;
        Fail(c, ErrorClass::kConnReset);
        return;
      }
      c->peer_incarnation = ch.incarnation;
      std::memcpy(c->challenge, ch.nonce, kNonceSize);
      for (auto& b : c->nonce) b = static_cast<uint8_t>(rng_());
      if (opt_.auth == AuthMode::kNone) {
        QueueControl(
            c, FrameType::kHello,
            EncodeHello({opt_.node_id, incarnation_, c->peer_node,
                         AuthMode::kNone, "", c->resuming,
                         c->resuming ? c->rx_delivered : 0, opt_.sessions}));
      } else {
        CredentialPayload cp;
        std::memcpy(cp.challenge, c->challenge, kNonceSize);
        std::memcpy(cp.nonce, c->nonce, kNonceSize);
        cp.connector_node = opt_.node_id;
        cp.acceptor_node = c->peer_node;
        c->state = LinkState::kAuth;
        auth_waiting_++;
        auth_->Encode(c->serial, EncodeCredentialPayload(cp));
        return;
      }
    }
  } else if (c->outgoing && type == FrameType::kWelcome &&
             c->peer_incarnation != 0) {
    WelcomePayload w;
    e = DecodeWelcome(p, n, &w);
    if (e == FrameError::kOk) {
      if (w.node != c->peer_node || w.incarnation != c->peer_incarnation) {
        BadFrame(c, "welcome from another node than the challenge");
        return;
      }
      const bool resumed = c->resuming;
      OpenLink(c, w.delivered);
      if (!resumed) Emit(EventType::kConnected, c, ErrorClass::kOk, c->cookie);
      return;
    }
  } else if (c->outgoing && type == FrameType::kRefuse) {
    RefuseReason reason;
    e = DecodeRefuse(p, n, &reason);
    if (e == FrameError::kOk) {
      switch (reason) {
        case RefuseReason::kDuplicate:
          // The peer's connection to us is the one that survives.
          c->state = LinkState::kWaitPeer;
          return;
        case RefuseReason::kAuth:
          spdlog::warn("fabric: node {} refused our credential", c->peer_node);
          StatsOf(c->peer_node).auth_failures++;
          Fail(c, ErrorClass::kAuthFailed);
          return;
        case RefuseReason::kWrongNode:
          Fail(c, ErrorClass::kBadHost);
          return;
        case RefuseReason::kBusy:
          Fail(c, ErrorClass::kLimit);
          return;
        case RefuseReason::kNoSession:
          spdlog::warn("fabric: node {} holds no session to resume",
                       c->peer_node);
          c->session_lost = true;
          Fail(c, ErrorClass::kConnReset);
          return;
        case RefuseReason::kRetry:  // a stand-in tries again shortly
          Fail(c, ErrorClass::kConnFailed);
          return;
        case RefuseReason::kSessions:
          spdlog::error(
              "fabric: node {} refused us: fabric_sessions is {} here and not "
              "there; set the same on every node",
              c->peer_node, opt_.sessions ? "on" : "off");
          Fail(c, ErrorClass::kConnFailed);
          return;
      }
    }
  } else if (!c->outgoing && type == FrameType::kHello && c->hello.node == 0) {
    e = DecodeHello(p, n, &c->hello);
    if (e == FrameError::kOk) {
      if (c->hello.target_node != opt_.node_id) {
        Refuse(c, RefuseReason::kWrongNode, "it meant another node");
        return;
      }
      if (c->hello.node == opt_.node_id) {
        Refuse(c, RefuseReason::kWrongNode, "it claims our own node id");
        return;
      }
      if (c->hello.auth != opt_.auth) {
        Refuse(c, RefuseReason::kAuth, "authentication mode differs");
        return;
      }
      if (opt_.auth == AuthMode::kNone) {
        Admit(c);
        return;
      }
      c->state = LinkState::kAuth;
      auth_waiting_++;
      auth_->Decode(c->serial, c->hello.credential);
      return;
    }
  } else {
    BadFrame(c, "unexpected handshake frame");
    return;
  }
  if (e != FrameError::kOk) {
    BadFrame(c, std::string("handshake: ") + FrameErrorName(e));
  }
}

bool LinkFabric::RememberNonce(const uint8_t nonce[kNonceSize], int64_t now) {
  std::string key(reinterpret_cast<const char*>(nonce), kNonceSize);
  if (nonces_.size() >= 65536) {
    for (auto it = nonces_.begin(); it != nonces_.end();) {
      it = it->second <= now ? nonces_.erase(it) : std::next(it);
    }
    if (nonces_.size() >= 65536) return false;  // bounded: refuse instead
  }
  auto [it, fresh] = nonces_.try_emplace(
      key, now + int64_t{opt_.credential_ttl_s} * 1'000'000'000);
  if (!fresh && it->second <= now) {
    it->second = now + int64_t{opt_.credential_ttl_s} * 1'000'000'000;
    return true;
  }
  return fresh;
}

void LinkFabric::OnAuthResults() {
  std::vector<MungeAuth::Result> results;
  auth_->TakeResults(&results);
  auth_waiting_ -= std::min<uint32_t>(auth_waiting_, results.size());
  for (MungeAuth::Result& r : results) {
    auto it = by_serial_.find(r.token);
    if (it == by_serial_.end()) continue;
    LinkConn* c = it->second;
    if (c->closing || c->state != LinkState::kAuth) continue;
    if (c->outgoing) {
      if (!r.ok) {
        spdlog::error("fabric: MUNGE cannot encode a credential: {}", r.error);
        Fail(c, ErrorClass::kAuthFailed);
        continue;
      }
      c->state = LinkState::kHandshake;
      QueueControl(
          c, FrameType::kHello,
          EncodeHello({opt_.node_id, incarnation_, c->peer_node,
                       AuthMode::kMunge, r.data, c->resuming,
                       c->resuming ? c->rx_delivered : 0, opt_.sessions}));
      PumpRx(c);
      continue;
    }
    CredentialPayload cp;
    if (!r.ok) {
      Refuse(c, RefuseReason::kAuth, r.error.c_str());
    } else if (r.uid != opt_.required_uid) {
      Refuse(c, RefuseReason::kAuth, "credential of the wrong uid");
    } else if (DecodeCredentialPayload(
                   reinterpret_cast<const uint8_t*>(r.data.data()),
                   r.data.size(), &cp) != FrameError::kOk ||
               std::memcmp(cp.challenge, c->challenge, kNonceSize) != 0 ||
               cp.connector_node != c->hello.node ||
               cp.acceptor_node != opt_.node_id) {
      Refuse(c, RefuseReason::kAuth,
             "credential not made for this connection (replayed?)");
    } else if (!RememberNonce(cp.nonce, MonotonicNs())) {
      Refuse(c, RefuseReason::kAuth, "credential nonce seen before");
    } else {
      Admit(c);
    }
  }
}

}  // namespace psmd::hw
