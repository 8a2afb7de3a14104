#include "hw/loopback_fabric.h"

#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>

namespace psmd::hw {

std::unique_ptr<LoopbackFabric> LoopbackNetwork::Create(uint64_t node_id) {
  std::unique_ptr<LoopbackFabric> f(new LoopbackFabric(this, node_id));
  nodes_[node_id] = f.get();
  return f;
}

LoopbackFabric::LoopbackFabric(LoopbackNetwork* net, uint64_t node_id)
    : net_(net),
      node_id_(node_id),
      event_fd_(eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)) {}

LoopbackFabric::~LoopbackFabric() {
  net_->nodes_.erase(node_id_);
  // The peers see this node go as a peer that closed (it died).
  for (auto& [id, c] : conns_) {
    auto peer = net_->nodes_.find(c.peer_node);
    if (peer != net_->nodes_.end()) {
      peer->second->Drop(id, ErrorClass::kPeerClosed);
    }
  }
  if (event_fd_ >= 0) close(event_fd_);
}

std::string LoopbackFabric::HostDescription() const {
  return FormatHostDescription(
      {node_id_, {{"127.0.0.1", static_cast<uint16_t>(node_id_)}}});
}

void LoopbackFabric::Push(const Event& e) {
  events_.push_back(e);
  const uint64_t one = 1;
  (void)!write(event_fd_, &one, sizeof(one));
}

ErrorClass LoopbackFabric::Connect(const std::string& host_description,
                                   uint64_t cookie, ConnId* conn) {
  struct HostDescription d;
  std::string error;
  if (!ParseHostDescription(host_description, &d, &error)) {
    return ErrorClass::kBadHost;
  }
  for (const auto& [id, c] : conns_) {
    if (c.peer_node == d.node) {
      *conn = id;
      return ErrorClass::kAlreadyConnected;
    }
  }
  auto peer = net_->nodes_.find(d.node);
  if (peer == net_->nodes_.end() || d.node == node_id_) {
    stats_[d.node].connect_failures++;
    return ErrorClass::kConnFailed;
  }
  // One id names the connection at both ends (ids are never reused in the
  // network, so never within one fabric either).
  const ConnId id = net_->next_conn_++;
  conns_[id].peer_node = d.node;
  peer->second->conns_[id].peer_node = node_id_;
  stats_[d.node].connects++;
  peer->second->stats_[node_id_].connects++;
  *conn = id;
  Event done;
  done.type = EventType::kConnected;
  done.conn = id;
  done.cookie = cookie;
  done.peer_node = d.node;
  Push(done);
  Event accepted;
  accepted.type = EventType::kAccepted;
  accepted.conn = id;
  accepted.peer_node = node_id_;
  peer->second->Push(accepted);
  return ErrorClass::kOk;
}

ErrorClass LoopbackFabric::PostSend(ConnId conn, const FrameFields& fields,
                                    const iovec* iov, int iovcnt,
                                    uint64_t cookie) {
  auto it = conns_.find(conn);
  if (it == conns_.end()) return ErrorClass::kBadConn;
  auto peer = net_->nodes_.find(it->second.peer_node);
  if (peer == net_->nodes_.end()) return ErrorClass::kBadConn;
  Frame f;
  f.fields = fields;
  for (int i = 0; i < iovcnt; i++) {
    const auto* b = static_cast<const uint8_t*>(iov[i].iov_base);
    f.payload.insert(f.payload.end(), b, b + iov[i].iov_len);
  }
  PeerStats& s = stats_[it->second.peer_node];
  s.frames_sent++;
  s.bytes_sent += f.payload.size();
  peer->second->conns_[conn].inbound.push_back(std::move(f));
  peer->second->Pump();
  Event done;
  done.type = EventType::kSendDone;
  done.conn = conn;
  done.cookie = cookie;
  Push(done);
  return ErrorClass::kOk;
}

ErrorClass LoopbackFabric::PostRecv(ConnId conn, const iovec* iov, int iovcnt,
                                    uint64_t cookie) {
  auto it = conns_.find(conn);
  if (it == conns_.end()) return ErrorClass::kBadConn;
  if (it->second.rx != Rx::kNone) return ErrorClass::kBadArg;
  it->second.rx = Rx::kWhole;
  it->second.rx_cookie = cookie;
  it->second.rx_iov.assign(iov, iov + iovcnt);
  Pump();
  return ErrorClass::kOk;
}

ErrorClass LoopbackFabric::PostRecvHeader(ConnId conn, uint64_t cookie) {
  auto it = conns_.find(conn);
  if (it == conns_.end()) return ErrorClass::kBadConn;
  if (it->second.rx != Rx::kNone) return ErrorClass::kBadArg;
  it->second.rx = Rx::kHeader;
  it->second.rx_cookie = cookie;
  Pump();
  return ErrorClass::kOk;
}

ErrorClass LoopbackFabric::PostPayload(ConnId conn, const iovec* iov,
                                       int iovcnt, uint64_t cookie) {
  auto it = conns_.find(conn);
  if (it == conns_.end()) return ErrorClass::kBadConn;
  Conn& c = it->second;
  if (c.rx != Rx::kPayloadDue) return ErrorClass::kBadArg;
  Frame f = std::move(c.inbound.front());
  c.inbound.pop_front();
  c.rx = Rx::kNone;
  Event e;
  e.type = EventType::kRecvDone;
  e.conn = conn;
  e.cookie = cookie;
  e.fields = f.fields;
  e.length = CopyOut(f.payload, iov, iovcnt);
  if (e.length < f.payload.size()) e.error = ErrorClass::kTruncated;
  PeerStats& s = stats_[c.peer_node];
  s.frames_received++;
  s.bytes_received += f.payload.size();
  Push(e);
  return ErrorClass::kOk;
}

uint32_t LoopbackFabric::CopyOut(const std::vector<uint8_t>& from,
                                 const iovec* iov, int iovcnt) {
  size_t done = 0;
  for (int i = 0; i < iovcnt && done < from.size(); i++) {
    const size_t n = std::min(iov[i].iov_len, from.size() - done);
    std::memcpy(iov[i].iov_base, from.data() + done, n);
    done += n;
  }
  return static_cast<uint32_t>(done);
}

void LoopbackFabric::Pump() {
  for (auto& [id, c] : conns_) {
    if (c.inbound.empty()) continue;
    if (c.rx == Rx::kWhole) {
      Frame f = std::move(c.inbound.front());
      c.inbound.pop_front();
      c.rx = Rx::kNone;
      Event e;
      e.type = EventType::kRecvDone;
      e.conn = id;
      e.cookie = c.rx_cookie;
      e.fields = f.fields;
      e.length = CopyOut(f.payload, c.rx_iov.data(),
                         static_cast<int>(c.rx_iov.size()));
      if (e.length < f.payload.size()) e.error = ErrorClass::kTruncated;
      PeerStats& s = stats_[c.peer_node];
      s.frames_received++;
      s.bytes_received += f.payload.size();
      Push(e);
    } else if (c.rx == Rx::kHeader) {
      Event e;
      e.type = EventType::kHeader;
      e.conn = id;
      e.cookie = c.rx_cookie;
      e.fields = c.inbound.front().fields;
      e.length = static_cast<uint32_t>(c.inbound.front().payload.size());
      if (e.length == 0) {
        c.inbound.pop_front();
        c.rx = Rx::kNone;
        stats_[c.peer_node].frames_received++;
      } else {
        c.rx = Rx::kPayloadDue;
      }
      Push(e);
    }
  }
}

void LoopbackFabric::Drop(ConnId conn, ErrorClass error) {
  auto it = conns_.find(conn);
  if (it == conns_.end()) return;
  if (error != ErrorClass::kCanceled)
    stats_[it->second.peer_node].disconnects++;
  conns_.erase(it);
  Event e;
  e.type = EventType::kClosed;
  e.conn = conn;
  e.error = error;
  Push(e);
}

ErrorClass LoopbackFabric::Close(ConnId conn) {
  auto it = conns_.find(conn);
  if (it == conns_.end()) return ErrorClass::kBadConn;
  const uint64_t peer_node = it->second.peer_node;
  Drop(conn, ErrorClass::kCanceled);
  auto peer = net_->nodes_.find(peer_node);
  if (peer != net_->nodes_.end()) {
    peer->second->Drop(conn, ErrorClass::kPeerClosed);
  }
  return ErrorClass::kOk;
}

void LoopbackFabric::Sever(uint64_t node) {
  for (auto it = conns_.begin(); it != conns_.end(); ++it) {
    if (it->second.peer_node != node) continue;
    const ConnId conn = it->first;
    Drop(conn, ErrorClass::kConnReset);
    auto peer = net_->nodes_.find(node);
    if (peer != net_->nodes_.end()) {
      peer->second->Drop(conn, ErrorClass::kConnReset);
    }
    return;
  }
}

size_t LoopbackFabric::frames_waiting() const {
  size_t n = 0;
  for (const auto& [id, c] : conns_) n += c.inbound.size();
  return n;
}

int LoopbackFabric::Poll(Event* events, int max) {
  Pump();
  uint64_t drained;
  (void)!read(event_fd_, &drained, sizeof(drained));
  int n = 0;
  while (n < max && !events_.empty()) {
    events[n++] = events_.front();
    events_.pop_front();
  }
  if (!events_.empty()) {  // still readable: more to poll
    const uint64_t one = 1;
    (void)!write(event_fd_, &one, sizeof(one));
  }
  return n;
}

int LoopbackFabric::Wait(Event* events, int max, int /*timeout_ms*/) {
  // Nothing arrives while the one thread sleeps: waiting cannot help.
  return Poll(events, max);
}

std::vector<PeerStats> LoopbackFabric::Stats() const {
  std::vector<PeerStats> out;
  for (const auto& [node, s] : stats_) {
    out.push_back(s);
    out.back().node = node;
  }
  return out;
}

}  // namespace psmd::hw
