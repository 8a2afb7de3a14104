#include "hw/link_fabric.h"

#include <spdlog/spdlog.h>
#include <time.h>

#include <algorithm>
#include <cstring>

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
  incarnation_ = rng_() | 1;
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
  if (c->tx_app_frames >= opt_.max_send_frames ||
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

void LinkFabric::FlushDirty() {
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
  PayloadPosted(c);
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
  // Back-pressure: a frame waits until a receive is posted for it.
  if (c->state == LinkState::kOpen && c->recvs.empty()) {
    return FrameStart::kWait;
  }
  FrameHeader h;
  FrameError e = DecodeFrameHeader(p, avail, opt_.limits, &h);
  if (e != FrameError::kOk) {
    BadFrame(c, std::string("bad frame header: ") + FrameErrorName(e));
    return FrameStart::kStop;
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
      return FrameStart::kAwaitPayload;
    }
    StatsOf(c->peer_node).frames_received++;
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
}

LinkConn* LinkFabric::FindLive(ConnId id) {
  auto it = by_id_.find(id);
  if (it == by_id_.end() || it->second->closing) return nullptr;
  return it->second;
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
  if (c->visible) {
    ErrorClass op_error = c->close_error;
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

void LinkFabric::OpenLink(LinkConn* c) {
  c->state = LinkState::kOpen;
  c->opened = true;
  StatsOf(c->peer_node).connects++;
  if (c->counted_handshake) {
    c->counted_handshake = false;
    handshakes_--;
  }
  FlushSends(c);
  PumpRx(c);
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
  uint64_t node = c->hello.node;
  auto it = by_node_.find(node);
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
      c->peer_incarnation = ch.incarnation;
      std::memcpy(c->challenge, ch.nonce, kNonceSize);
      for (auto& b : c->nonce) b = static_cast<uint8_t>(rng_());
      if (opt_.auth == AuthMode::kNone) {
        QueueControl(c, FrameType::kHello,
                     EncodeHello({opt_.node_id, incarnation_, c->peer_node,
                                  AuthMode::kNone, ""}));
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
      OpenLink(c);
      Emit(EventType::kConnected, c, ErrorClass::kOk, c->cookie);
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
      QueueControl(c, FrameType::kHello,
                   EncodeHello({opt_.node_id, incarnation_, c->peer_node,
                                AuthMode::kMunge, r.data}));
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
