// Remote: peers and liveness. Connections to other nodes' daemons come
// and go here (connect on a query, accept, a lost or silent peer failing
// everything that waits on it), the fabric's events are dispatched, and
// heartbeats keep a quiet connection known to be alive.
#include "daemon/remote/remote_state.h"

#include <psm2.h>

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include <spdlog/spdlog.h>

#include "daemon/log.h"
#include "shm/epid.h"

namespace psmd {

Remote::Remote(MqEngine* engine, std::unique_ptr<hw::Fabric> fabric,
               uint16_t node_id, uint16_t boot_nonce, std::string nodes_file,
               uint32_t timeout_ms)
    : engine_(engine),
      fabric_(std::move(fabric)),
      node_id_(node_id),
      boot_nonce_(boot_nonce),
      timeout_ms_(timeout_ms),
      nodes_(std::move(nodes_file)) {}

Remote::~Remote() {
  // The fabric goes first (no more events), then the chunks still lent.
  fabric_.reset();
  for (auto& [cookie, f] : in_flight_) f->ReleaseChunk();
  for (auto& [id, piece] : out_pieces_) piece.chunk->ReleaseChunk();
  for (auto& [id, c] : converted_) c.payload->ReleaseChunk();
  for (auto& [node, p] : peers_) {
    for (auto& f : p->queue) f->ReleaseChunk();
    for (auto& [dst, frames] : p->deferred) {
      for (auto& f : frames) f->ReleaseChunk();
    }
  }
}

Remote::Peer* Remote::PeerOf(uint16_t node) {
  auto it = peers_.find(node);
  return it == peers_.end() ? nullptr : it->second.get();
}

Remote::Peer* Remote::PeerOfConn(hw::ConnId conn) {
  auto it = node_of_conn_.find(conn);
  if (it == node_of_conn_.end()) return nullptr;
  Peer* p = PeerOf(it->second);
  return p != nullptr && p->conn == conn ? p : nullptr;
}

void Remote::Query(const Endpoint& ep, uint64_t epid, QueryDone done) {
  const uint16_t node = shm::NodeIdOf(epid);
  Peer* p = PeerOf(node);
  if (p == nullptr) {
    nodes_.Reload();
    const NodeEntry* entry = nodes_.Find(node);
    if (entry == nullptr) {
      done(PSM2_EPID_UNREACHABLE, "node " + std::to_string(node) +
                                      " is not in the node table " +
                                      nodes_.file());
      return;
    }
    hw::ConnId conn = 0;
    hw::ErrorClass e = fabric_->Connect(entry->description, node, &conn);
    if (e != hw::ErrorClass::kOk && e != hw::ErrorClass::kAlreadyConnected) {
      done(PSM2_EPID_UNREACHABLE, "cannot connect to " + nodes_.NodeName(node) +
                                      ": " + hw::ErrorClassName(e));
      return;
    }
    auto peer = std::make_unique<Peer>();
    peer->node = node;
    peer->conn = conn;
    peer->open = e == hw::ErrorClass::kAlreadyConnected;
    p = peer.get();
    peers_[node] = std::move(peer);
    node_of_conn_[conn] = node;
    if (p->open) RecvNext(*p);
  }
  const uint64_t id = next_query_++;
  queries_[id] = std::make_unique<QueryState>(QueryState{
      node, NowMs() + timeout_ms_, std::move(done), SenderOf(ep), epid});
  Post(*p, wire::PrepQuery(SenderOf(ep), epid, id));
}

void Remote::FailPeer(uint16_t node, hw::ErrorClass why) {
  auto it = peers_.find(node);
  if (it == peers_.end()) return;
  nodes_.Reload();  // the host name kNodeLost carries, as the table is now
  std::unique_ptr<Peer> p = std::move(it->second);
  peers_.erase(it);
  node_of_conn_.erase(p->conn);
  const int error = ErrorOf(why);
  spdlog::warn("fabric: connection to node {} ended ({}); {} requests fail",
               node, p->dropped ? "dropped by us" : hw::ErrorClassName(why),
               p->awaiting.size());
  for (const auto& [id, req] : p->awaiting) {
    if (Endpoint* ep = engine_->FindAny(id))
      engine_->PostErrorFor(*ep, req, error);
  }
  for (auto& f : p->queue) f->ReleaseChunk();
  for (auto& [dst, frames] : p->deferred) {
    for (auto& f : frames) f->ReleaseChunk();
  }
  // (A synchronous one failed with awaiting.)
  DropConverted([node](const Converted& c) { return c.node == node; });
  if (p->expect_payload && p->pending.job) {
    shm::ReleaseChunk(p->pending.job->pool().base(), p->pending.chunk);
  }
  // Receives already matched to a message that will not arrive now.
  auto fail_recv = [&](uint32_t id, uint64_t req) {
    if (Endpoint* r = engine_->FindAny(id))
      engine_->PostErrorFor(*r, req, error);
  };
  if (p->expect_payload && p->pending.matched && p->pending.receiver != 0) {
    fail_recv(p->pending.receiver, p->pending.recv.req);
  }
  if (p->has_held) fail_recv(p->held_receiver, p->held_recv.req);
  for (const auto& [dst, frames] : p->parked) {
    for (const Parked& e : frames) {
      if (e.has_held) fail_recv(e.held_receiver, e.held_recv.req);
    }
  }
  if (p->rx == Peer::Rx::kChunk && p->chunk_job) {
    shm::ReleaseChunk(p->chunk_job->pool().base(), p->chunk_offset);
  }
  for (auto t = in_transfers_.begin(); t != in_transfers_.end();) {
    if (t->second->node != node) {
      ++t;
      continue;
    }
    if (t->second->receiver != 0) {
      if (Endpoint* r = engine_->FindAny(t->second->receiver)) {
        engine_->PostErrorFor(*r, t->second->recv_req, error);
      }
    }
    EndReads(*t->second, error, /*tell=*/false);
    t = in_transfers_.erase(t);
  }
  // Pieces that node was to read: it will not say it is done with them.
  for (auto piece = out_pieces_.begin(); piece != out_pieces_.end();) {
    if (piece->second.node != node) {
      ++piece;
      continue;
    }
    piece->second.chunk->ReleaseChunk();
    piece = out_pieces_.erase(piece);
  }
  proxies_.DropNode(node);
  // Nothing more comes from that node's endpoints (what they sent went
  // with the connection): receives naming them fail now (mq_engine.h
  // invariant 8); a later psm2_ep_connect to an epid there re-arms its
  // link. A receive from any source stays posted, and messages in flight
  // are lost, so each endpoint that had connected to one there is told
  // (kNodeLost: its library reports it through the error handler, which
  // for an MPI job ends it instead of leaving a rank waiting forever).
  // On every shard (MqEngine::NodeLost): each endpoint gets one kNodeLost
  // counting its links there.
  shm::CompletionDesc lost{};
  lost.op = shm::CompleteOp::kNodeLost;
  lost.error = error;
  lost.tag[0] = node;
  nodes_.HostName(node).copy(reinterpret_cast<char*>(lost.body.inline_data),
                             shm::kInlineMax - 1);
  engine_->NodeLost(lost);
  for (auto& [id, t] : out_transfers_) {
    if (t->node != node || t->dead) continue;
    t->dead = true;
    // As when a local receiver leaves: the sender learns at once.
    if (Endpoint* s = engine_->FindAny(t->sender)) {
      engine_->PostErrorFor(*s, t->sender_req, error);
    }
  }
  for (auto q = queries_.begin(); q != queries_.end();) {
    if (q->second->node != node) {
      ++q;
      continue;
    }
    QueryDone done = std::move(q->second->done);
    q = queries_.erase(q);
    done(error, nodes_.NodeName(node) +
                    " cannot be reached: " + hw::ErrorClassName(why));
  }
  engine_->NotifyClients();
}

void Remote::HandleEvent(const hw::Event& e) {
  switch (e.type) {
    case hw::EventType::kConnected: {
      Peer* p = PeerOfConn(e.conn);
      if (p == nullptr) return;
      if (e.error != hw::ErrorClass::kOk) {
        FailPeer(p->node, e.error);
        return;
      }
      p->open = true;
      p->last_sent_ms = p->last_recv_ms = NowMs();
      spdlog::info("fabric: connected to node {}", p->node);
      RecvNext(*p);
      Flush(*p);
      return;
    }
    case hw::EventType::kAccepted: {
      const uint16_t node = static_cast<uint16_t>(e.peer_node);
      if (e.peer_node > 0xffff || e.peer_node == 0) {
        fabric_->Close(e.conn);
        return;
      }
      // The peer restarted. Queries asked of its previous run went with
      // that connection unanswered (over an RDM fabric nothing told us it
      // died: a psm2_ep_connect made just after the restart rode it), so
      // they are asked again of this run; an epid of the previous run is
      // refused by it.
      std::vector<std::pair<uint64_t, std::unique_ptr<QueryState>>> again;
      if (Peer* old = PeerOf(node); old != nullptr && old->conn != e.conn) {
        for (auto q = queries_.begin(); q != queries_.end();) {
          if (q->second->node != node) {
            ++q;
            continue;
          }
          again.emplace_back(q->first, std::move(q->second));
          q = queries_.erase(q);
        }
        FailPeer(node, hw::ErrorClass::kConnReset);
      }
      auto peer = std::make_unique<Peer>();
      peer->node = node;
      peer->conn = e.conn;
      peer->open = true;
      Peer* p = peer.get();
      peers_[node] = std::move(peer);
      node_of_conn_[e.conn] = node;
      spdlog::info("fabric: node {} connected", node);
      RecvNext(*p);
      for (auto& [id, q] : again) {
        Post(*p, wire::PrepQuery(q->from, q->epid, id));
        queries_[id] = std::move(q);
      }
      return;
    }
    case hw::EventType::kSendDone: {
      auto it = in_flight_.find(e.cookie);
      if (it == in_flight_.end()) return;
      std::unique_ptr<OutFrame> f = std::move(it->second);
      in_flight_.erase(it);
      f->ReleaseChunk();
      if (Peer* p = PeerOf(f->node)) Flush(*p);
      return;
    }
    case hw::EventType::kHeader: {
      Peer* p = PeerOfConn(e.conn);
      if (p == nullptr) return;
      if (e.error != hw::ErrorClass::kOk) return;  // kClosed follows
      OnHeader(*p, e);
      return;
    }
    case hw::EventType::kRecvDone: {
      Peer* p = PeerOfConn(e.conn);
      if (p == nullptr) return;
      OnRecvDone(*p, e);
      return;
    }
    case hw::EventType::kClosed: {
      Peer* p = PeerOfConn(e.conn);
      node_of_conn_.erase(e.conn);
      if (p != nullptr) FailPeer(p->node, e.error);
      return;
    }
    case hw::EventType::kReadDone:
      OnReadDone(e);
      return;
  }
}

void Remote::RecvNext(Peer& p) {
  if (p.dropped) return;
  p.rx = Peer::Rx::kHeader;
  if (fabric_->PostRecvHeader(p.conn, p.node) != hw::ErrorClass::kOk) {
    p.rx = Peer::Rx::kIdle;  // the connection is going; kClosed follows
  }
}

void Remote::Drop(Peer& p, const char* why) {
  if (!p.bad_logged) {  // once per connection
    counts_by_node_[p.node].malformed++;
    spdlog::warn(
        "fabric: node {} sent a frame the engine refuses ({}); dropping the "
        "connection",
        p.node, why);
    p.bad_logged = true;
  }
  p.rx = Peer::Rx::kIdle;
  p.dropped = true;
  fabric_->Close(p.conn);
}

void Remote::CheckDeadlines() {
  const uint64_t now = NowMs();
  for (auto q = queries_.begin(); q != queries_.end();) {
    if (q->second->deadline_ms > now) {
      ++q;
      continue;
    }
    QueryDone done = std::move(q->second->done);
    const uint16_t node = q->second->node;
    q = queries_.erase(q);
    done(PSM2_TIMEOUT, nodes_.NodeName(node) +
                           "'s daemon did not answer within " +
                           std::to_string(timeout_ms_) + " ms");
  }
}

bool Remote::Poll() {
  bool did = false;
  hw::Event events[64];
  int n = fabric_->Poll(events, 64);
  for (int i = 0; i < n; i++) HandleEvent(events[i]);
  did = n > 0;
  // Only a handover's drain asks what moved (LastActivity).
  if (did && holding_) last_event_ = events[n - 1];
  // Parked and paused frames: retried each pass (their receiver may have
  // posted receives, released inbox chunks, drained its completions).
  did |= PumpReads();  // reads that wait for inbox space or a slot
  for (auto& [node, peer] : peers_) {
    Peer& p = *peer;
    did |= RetryParked(p);
    if (p.rx != Peer::Rx::kPaused) continue;
    if (wire::OpOf(p.f) == wire::Op::kRndvData) {
      hw::Event e;
      e.conn = p.conn;
      e.fields = p.f;
      e.length = p.length;
      OnHeader(p, e);
      if (p.rx != Peer::Rx::kPaused) did = true;
    } else if (Admit(p, p.in) == Verdict::kDone) {
      Consumed(p, p.in.f, WindowBytes(p.in.f, p.length));
      did = true;
      if (p.rx == Peer::Rx::kPaused) RecvNext(p);
    } else if (Park(p, /*chunk=*/false)) {
      did = true;
      if (p.rx == Peer::Rx::kPaused) RecvNext(p);
    }
  }
  if (++passes_ % 256 == 0) {
    if (!queries_.empty()) CheckDeadlines();
    if (NowMs() - last_liveness_ms_ >= 100) {
      CheckLiveness();
      if (!registrations_.empty()) SweepRegistrations();
    }
  }
  if (did) {
    last_poll_had_events_ = n > 0;
    engine_->NotifyClients();
  }
  return did;
}

void Remote::CheckLiveness() {
  const uint64_t now = NowMs();
  if (peers_.empty()) {  // the worker may sleep for good: no baseline
    last_liveness_ms_ = 0;
    return;
  }
  const uint64_t ping_ms = std::max<uint64_t>(timeout_ms_ / 3, 1);
  // Checks come every 100 ms while busy and every sixth of the timeout while
  // idle (SleepLimitMs). A gap over a third of the timeout means this worker
  // did not run (the host paused the VM, or the machine starved us), and a
  // peer cannot be blamed for silence nobody was listening to: its pings may
  // be waiting in our socket. Only the idle period of the gap counts against
  // it, so a worker starved for good still finds a dead peer, within about
  // seven such checks.
  const uint64_t gap = now - last_liveness_ms_;
  const uint64_t period_ms = std::max<uint64_t>(timeout_ms_ / 6, 1);
  const bool stalled = last_liveness_ms_ != 0 && gap > ping_ms;
  if (stalled) {
    spdlog::info(
        "fabric: liveness checked after {} ms (the worker did not "
        "run); {} ms of it not counted against peers",
        gap, gap - period_ms);
  }
  last_liveness_ms_ = now;
  std::vector<uint16_t> dead;
  for (auto& [node, peer] : peers_) {
    Peer& p = *peer;
    if (!p.open || p.dropped) continue;
    if (stalled) {
      p.last_recv_ms = std::min(now, p.last_recv_ms + (gap - period_ms));
    }
    if (p.rx != Peer::Rx::kPaused && now - p.last_recv_ms > timeout_ms_) {
      dead.push_back(node);
      continue;
    }
    // Behind queued frames a ping adds nothing (the peer hears those).
    if (now - p.last_sent_ms >= ping_ms && p.queue.empty()) {
      Post(p, wire::PrepPing());
    }
  }
  for (uint16_t node : dead) {
    spdlog::warn("fabric: node {} silent for {} ms; closing its connection",
                 node, timeout_ms_);
    Peer* p = PeerOf(node);
    const hw::ConnId conn = p->conn;
    FailPeer(node, hw::ErrorClass::kTimeout);
    fabric_->Close(conn);
  }
}

int Remote::SleepLimitMs() {
  for (const auto& [node, p] : peers_) {
    if (p->rx == Peer::Rx::kPaused || !p->parked.empty() ||
        !p->gone_after.empty() || !p->kept_chunks.empty()) {
      return 1;
    }
  }
  // Reads wait for inbox space its client gives back (ringing nobody).
  if (!rma_waiting_.empty()) return 1;
  CheckLiveness();
  if (!registrations_.empty()) SweepRegistrations();
  if (!queries_.empty()) {
    CheckDeadlines();
    return 50;
  }
  // A broken connection's session is being resumed.
  if (int ms = fabric_->NextWakeMs(); ms >= 0) return ms;
  // Wake to send and check heartbeats.
  return peers_.empty() ? -1 : static_cast<int>(std::max(timeout_ms_ / 6, 1u));
}

std::vector<Remote::PeerRow> Remote::Stats() const {
  std::vector<PeerRow> rows;
  for (const hw::PeerStats& p : fabric_->Stats()) {
    PeerRow row;
    row.fabric = p;
    if (p.node <= 0xffff) {
      auto counts = counts_by_node_.find(static_cast<uint16_t>(p.node));
      if (counts != counts_by_node_.end()) row.counts = counts->second;
    }
    rows.push_back(row);
  }
  return rows;
}

void Remote::Refused(uint16_t node, const hw::FrameFields& f,
                     const char* what) {
  refused_++;
  counts_by_node_[node].refused++;
  WarnClient(f.uid,
             "fabric: {} from epid {:#x} (node {}) for epid {:#x}: no such "
             "endpoint of that job and uid here ({} refused so far)",
             what, f.src, shm::NodeIdOf(f.src), f.dst, refused_);
}

}  // namespace psmd
