// Remote: its part of a handover (docs/design.md, "Handover with a fabric").
// The workers are frozen: no client ring is read, so no new operation
// starts, while the drain keeps polling the fabric (Workers::FreezeAndSave):
// what this daemon sent is acknowledged, what arrives is handled, and what
// waits on other nodes' answers stays. Carriable says when what is left is
// plain data the successor can take: per peer its session's id and the
// flow-control sets, the frames set aside for its endpoints that are off
// (a data frame's bytes stay in its sender's pool chunk), the requests
// awaiting an answer, the rendezvous transfers both ways, the eager sends
// converted to rendezvous (their payloads stay in the senders' pool
// chunks), the frames parked and the payloads kept in daemon memory for
// receivers here, the proxies and watchers, and each job's inbox arena.
// Anything else in flight (frames queued or unacknowledged, connect
// queries, RMA reads, a frame half read) is waited for, or the handover is
// refused and psmd serves on.
// The frames peers sent after the last poll were not delivered here: their
// sessions replay them to the successor.
#include <psm2.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstring>
#include <set>
#include <string>
#include <utility>

#include "daemon/engine/validate.h"
#include "daemon/handover/handover.h"
#include "daemon/handover/state_codec.h"
#include "daemon/remote/remote_state.h"
#include "shm/epid.h"

namespace psmd {

namespace {

// Bounds on what a state may name before anything is built (the reader also
// bounds every count by the bytes left).
constexpr uint64_t kMaxPeers = 0xffff;
constexpr uint64_t kMaxEntries = 1u << 20;

}  // namespace

void Remote::HoldPeers(bool hold) {
  holding_ = hold;
  for (const auto& [id, nodes] : watchers_) {
    const Endpoint* ep = engine_->FindAny(id);
    if (ep == nullptr) continue;
    for (uint16_t node : nodes) {
      Peer* p = PeerOf(node);
      if (p == nullptr || !p->open) continue;
      // An endpoint with frames parked from that node stays off: its kXon
      // comes when they are taken (RetryParked). Released now, its sender
      // would fill the park, and the connection would pause for everyone.
      if (!hold && p->parked.count(ep->epid()) != 0) continue;
      uint64_t credit = 0;
      if (!hold) {
        if (auto c = p->consumed.find(ep->epid()); c != p->consumed.end()) {
          credit = c->second;
          p->consumed.erase(c);
        }
      }
      Post(*p, wire::PrepFlow(hold ? wire::Op::kXoff : wire::Op::kXon,
                              SenderOf(*ep), credit));
    }
  }
}

bool Remote::PeersHeld() const {
  auto is_xoff = [](const std::unique_ptr<OutFrame>& f) {
    return f->msg.op() == wire::Op::kXoff;
  };
  for (const auto& [cookie, f] : in_flight_) {
    if (is_xoff(f)) return false;
  }
  const uint64_t now = NowMs();
  for (const auto& [node, p] : peers_) {
    if (std::any_of(p->queue.begin(), p->queue.end(), is_xoff) ||
        now - p->last_recv_ms < kHeldQuietMs) {
      return false;
    }
  }
  return true;
}

bool Remote::Carriable(std::string* why) const {
  auto busy = [why](uint16_t node, const std::string& what) {
    *why = (node != 0 ? "node " + std::to_string(node) + ": " : "") + what;
    return false;
  };
  if (!in_flight_.empty()) {
    const OutFrame& f = *in_flight_.begin()->second;
    return busy(f.node, std::to_string(in_flight_.size()) +
                            " frames sent and not yet acknowledged (op " +
                            std::to_string(static_cast<int>(f.msg.op())) +
                            " among them)");
  }
  if (!queries_.empty()) return busy(0, "connect queries awaiting an answer");
  if (!out_pieces_.empty() || !rma_waiting_.empty() || !rma_posted_.empty() ||
      !registrations_.empty()) {
    return busy(0, "RMA reads (fabric_rma) are not carried");
  }
  for (const auto& [node, p] : peers_) {
    if (!p->open || p->dropped) return busy(node, "its connection is not open");
    if (p->rx != Peer::Rx::kHeader || p->expect_payload || p->has_held) {
      return busy(node, "a frame half read");
    }
    // (Frames set aside for its endpoints that are off are carried; a data
    // frame's pool chunk by its sender, which must be one the successor
    // takes over: one that left waits to be sent.)
    if (!p->queue.empty() || p->defer_payload) {
      return busy(node, "frames queued to it");
    }
    for (const auto& [dst, frames] : p->deferred) {
      for (const auto& f : frames) {
        if (wire::TraitsOf(f->msg.f.op).shape == wire::Shape::kEnvelope)
          continue;
        const Endpoint* sender =
            engine_->FindAny(shm::EndpointIdOf(f->msg.f.src));
        if (f->chunk_base == nullptr || sender == nullptr ||
            sender->epid() != f->msg.f.src)
          return busy(node, "frames set aside from an endpoint that left");
      }
    }
  }
  for (const auto& [id, t] : in_transfers_) {
    if (t->rma || !t->reads.empty()) return busy(t->node, "an RMA transfer");
  }
  for (const auto& [id, t] : out_transfers_) {
    if (t->rma) return busy(t->node, "an RMA transfer");
  }
  return true;
}

std::string Remote::LastActivity() {
  if (!last_poll_had_events_) return "parked or paused frames moving";
  const Peer* p = PeerOfConn(last_event_.conn);
  const std::string node = p == nullptr ? "a connection with no peer"
                                        : "node " + std::to_string(p->node);
  switch (last_event_.type) {
    case hw::EventType::kHeader:
    case hw::EventType::kRecvDone:
      return "a frame of op " + std::to_string(last_event_.fields.op) +
             " from " + node;
    case hw::EventType::kSendDone:
      return "a send to " + node + " completing";
    default:
      return "a connection event of " + node;
  }
}

void Remote::SaveState(handover::StateWriter& w) const {
  w.U32(static_cast<uint32_t>(peers_.size()));
  for (const auto& [node, p] : peers_) {
    w.U16(node);
    w.U64(p->conn);
    w.U32(static_cast<uint32_t>(p->awaiting.size()));
    for (const auto& [id, req] : p->awaiting) {
      w.U32(id);
      w.U64(req);
    }
    for (const std::set<uint64_t>* set : {&p->off, &p->eager_off}) {
      w.U32(static_cast<uint32_t>(set->size()));
      for (uint64_t epid : *set) w.U64(epid);
    }
    for (const auto* map : {&p->unconsumed, &p->consumed}) {
      w.U32(static_cast<uint32_t>(map->size()));
      for (const auto& [epid, bytes] : *map) {
        w.U64(epid);
        w.U64(bytes);
      }
    }
    w.U32(static_cast<uint32_t>(p->kept.size()));
    for (const auto& [id, k] : p->kept) {
      w.U32(id);
      w.U32(k.f.uid);
      w.U64(k.f.src);
      w.U64(k.f.dst);
      w.Pod(k.f.job);
      w.Bool(k.waiting);
      w.Str(k.bytes);
    }
    w.U32(static_cast<uint32_t>(p->kept_chunks.size()));
    for (const auto& [transfer, bytes] : p->kept_chunks) {
      w.U64(transfer);
      w.Str(bytes);
    }
    // Frames set aside for its endpoints that are off (or beyond their
    // window), each list in queue order, then the kGones behind them: an
    // envelope as the wire carries it, a data frame by its fields and the
    // pool chunk it sends from (every data frame this psmd sends does).
    auto write_envelope = [&w](const wire::Envelope& e) {
      w.Pod(e.f);
      uint8_t bytes[wire::kEnvelopeMax];
      const uint32_t len = wire::Encode(e, bytes);
      w.Str(std::string(reinterpret_cast<const char*>(bytes), len));
    };
    auto write_frame = [&](const OutFrame& f) {
      if (wire::TraitsOf(f.msg.f.op).shape == wire::Shape::kEnvelope) {
        write_envelope(f.msg);
      } else {
        w.Pod(f.msg.f);
        w.U64(f.chunk_offset);
        w.U32(static_cast<uint32_t>(f.iov.iov_len));
      }
    };
    w.U32(static_cast<uint32_t>(p->deferred.size()));
    for (const auto& [dst, frames] : p->deferred) {
      w.U64(dst);
      w.U32(static_cast<uint32_t>(frames.size()));
      for (const auto& f : frames) write_frame(*f);
    }
    w.U32(static_cast<uint32_t>(p->gone_aside.size()));
    for (const auto& f : p->gone_aside) write_frame(*f);
    // Frames parked here for its receivers, each list in arrival order: an
    // envelope as the wire carried it, with its payload frame's bytes and
    // the receive it had taken off the posted queue; a chunk by its header
    // and bytes. Then the kGones waiting behind them.
    w.U32(static_cast<uint32_t>(p->parked.size()));
    for (const auto& [dst, frames] : p->parked) {
      w.U64(dst);
      w.U32(static_cast<uint32_t>(frames.size()));
      for (const Parked& e : frames) {
        w.Bool(e.chunk);
        if (e.chunk) {
          w.Pod(e.env.f);
        } else {
          write_envelope(e.env);
        }
        w.Str(e.payload);
        w.Bool(e.has_held);
        if (e.has_held) {
          w.U32(e.held_receiver);
          w.U64(e.held_recv.req);
          w.U32(e.held_recv.capacity);
          w.U64(e.held_recv.source);
          w.U64(e.held_recv.addr);
        }
      }
    }
    w.U32(static_cast<uint32_t>(p->gone_after.size()));
    for (const wire::Envelope& g : p->gone_after) write_envelope(g);
  }
  w.U32(next_kept_);
  w.U64(next_in_transfer_);
  w.U32(static_cast<uint32_t>(in_transfers_.size()));
  for (const auto& [id, t] : in_transfers_) {
    w.U64(id);
    w.U16(t->node);
    w.U32(t->receiver);
    w.U64(t->recv_req);
    w.U64(t->src);
    w.U32(t->send_bytes);
    w.U32(t->received);
    w.U64(t->sender_req);
    w.U32(t->accepted);
  }
  w.U32(static_cast<uint32_t>(out_transfers_.size()));
  for (const auto& [id, t] : out_transfers_) {
    w.U64(id);
    w.U16(t->node);
    w.U32(t->sender);
    w.U64(t->dst);
    w.U64(t->remote_transfer);
    w.U32(t->send_bytes);
    w.U32(t->forwarded);
    w.Bool(t->dead);
    w.U64(t->sender_req);
    w.Pod(t->from);
  }
  w.U64(next_converted_);
  w.U32(static_cast<uint32_t>(converted_.size()));
  for (const auto& [id, c] : converted_) {
    w.U64(id);
    w.U16(c.node);
    w.U32(c.sender);
    w.U64(c.req);
    w.Bool(c.sync);
    w.U64(c.payload->msg.f.dst);
    w.U64(c.payload->chunk_offset);
    w.U32(static_cast<uint32_t>(c.payload->iov.iov_len));
  }
  w.U32(static_cast<uint32_t>(watchers_.size()));
  for (const auto& [id, nodes] : watchers_) {
    w.U32(id);
    w.U32(static_cast<uint32_t>(nodes.size()));
    for (uint16_t node : nodes) w.U16(node);
  }
  proxies_.SaveState(w);
  // The inboxes of jobs this psmd still serves (one without an endpoint
  // here is not carried by the registry either).
  std::vector<std::pair<JobKey, shm::SendArena::State>> inboxes;
  for (const auto& [job, pages] : job_pages_) {
    std::shared_ptr<Job> live = pages->job.lock();
    if (!live || !pages->inbox || engine_->FindJob(live->key()) != live) {
      continue;
    }
    inboxes.emplace_back(live->key(), pages->inbox->Save());
  }
  w.U32(static_cast<uint32_t>(inboxes.size()));
  for (const auto& [key, s] : inboxes) {
    w.Pod(key.uuid);
    w.U32(static_cast<uint32_t>(key.uid));
    handover::WriteArenaState(w, s);
  }
}

Status Remote::LoadState(handover::StateReader& r,
                         const std::map<hw::ConnId, uint64_t>& sessions) {
  // Read and checked whole into `next` before anything here changes, so a
  // refusal leaves this Remote as it was (empty: a successor's).
  struct Loaded {
    std::unordered_map<uint16_t, std::unique_ptr<Peer>> peers;
    std::unordered_map<hw::ConnId, uint16_t> node_of_conn;
    uint64_t next_in_transfer = 1;
    std::unordered_map<uint64_t, std::unique_ptr<InTransfer>> in;
    std::unordered_map<uint64_t, std::unique_ptr<OutTransfer>> out;
    // Converted sends, as read: their frames are made once all is checked.
    struct ConvertedSend {
      uint64_t id = 0;
      Converted c;
      uint64_t dst = 0;
      uint64_t offset = 0;
      uint32_t len = 0;
    };
    uint64_t next_converted = 1;
    std::vector<ConvertedSend> converted;
    // Frames set aside, as read: a data frame's chunk is taken once all is
    // checked (`sender` 0: an envelope).
    struct SetAside {
      uint16_t node = 0;
      bool gone = false;  // to gone_aside, else to deferred[msg.f.dst]
      wire::Envelope msg;
      uint32_t sender = 0;
      uint64_t offset = 0;
      uint32_t len = 0;
    };
    std::vector<SetAside> set_aside;
    uint32_t next_kept = 1;
    std::unordered_map<uint32_t, std::set<uint16_t>> watchers;
    ProxyIds proxies;
    std::vector<std::pair<std::shared_ptr<Job>, shm::SendArena>> inboxes;
  } next;
  auto fail = [&r](const char* what, const std::string& why) {
    r.Fail(what, why);
    return Status{PSM2_INTERNAL_ERR, "the fabric's engine: " + r.error()};
  };
  auto read_error = [&r] {
    return Status{PSM2_INTERNAL_ERR, "the fabric's engine: " + r.error()};
  };
  auto of_node = [](uint64_t epid, uint16_t node) {
    return shm::NodeIdOf(epid) == node;
  };
  // An endpoint of this psmd (any shard) by id.
  auto here = [this](uint32_t id) { return engine_->FindAny(id) != nullptr; };

  uint32_t n = 0;
  if (!r.Count(&n, 2 + 8 + 4 * 5, kMaxPeers, "peer count")) return read_error();
  for (uint32_t i = 0; i < n; i++) {
    auto p = std::make_unique<Peer>();
    uint64_t conn = 0;
    if (!r.U16(&p->node, "peer node") || !r.U64(&conn, "peer session"))
      return read_error();
    p->conn = conn;
    if (p->node == 0 || p->node == node_id_)
      return fail("peer node", "is 0 or this node");
    auto s = sessions.find(p->conn);
    if (s == sessions.end() || s->second != p->node)
      return fail("peer session", "is not a session to that node adopted");
    if (next.node_of_conn.count(p->conn) != 0 || next.peers.count(p->node))
      return fail("peer node", "appears twice");
    uint32_t k = 0;
    if (!r.Count(&k, 12, kMaxEntries, "awaiting count")) return read_error();
    for (uint32_t j = 0; j < k; j++) {
      uint32_t id = 0;
      uint64_t req = 0;
      if (!r.U32(&id, "awaiting endpoint") || !r.U64(&req, "awaiting request"))
        return read_error();
      if (!here(id)) return fail("awaiting endpoint", "is not an endpoint");
      p->awaiting.emplace(id, req);
    }
    for (std::set<uint64_t>* set : {&p->off, &p->eager_off}) {
      if (!r.Count(&k, 8, kMaxEntries, "receivers off count"))
        return read_error();
      for (uint32_t j = 0; j < k; j++) {
        uint64_t epid = 0;
        if (!r.U64(&epid, "receiver off")) return read_error();
        if (!of_node(epid, p->node))
          return fail("receiver off", "is not an endpoint of that node");
        set->insert(epid);
      }
    }
    // Sending: that node's receivers, within a window and a frame;
    // receiving: ours, below the next credit.
    const std::pair<std::unordered_map<uint64_t, uint64_t>*, uint16_t>
        windows[] = {{&p->unconsumed, p->node}, {&p->consumed, node_id_}};
    for (const auto& [map, owner] : windows) {
      if (!r.Count(&k, 16, kMaxEntries, "window count")) return read_error();
      for (uint32_t j = 0; j < k; j++) {
        uint64_t epid = 0, bytes = 0;
        if (!r.U64(&epid, "window endpoint") || !r.U64(&bytes, "window bytes"))
          return read_error();
        if (!of_node(epid, owner) || bytes > 2 * kReceiverWindow)
          return fail("window", "names another node's endpoint or too much");
        (*map)[epid] = bytes;
      }
    }
    // Payloads kept for unexpected messages to endpoints here (the engine
    // carries the messages naming them), within the connection's cap as
    // when they were kept.
    if (!r.Count(&k, 4 * 3 + 8 * 2 + 16 + 1, kMaxEntries, "kept count"))
      return read_error();
    for (uint32_t j = 0; j < k; j++) {
      uint32_t id = 0;
      Kept kept;
      if (!r.U32(&id, "kept id") || !r.U32(&kept.f.uid, "kept uid") ||
          !r.U64(&kept.f.src, "kept sender") ||
          !r.U64(&kept.f.dst, "kept receiver") ||
          !r.Pod(&kept.f.job, "kept job") ||
          !r.Bool(&kept.waiting, "kept waiting") ||
          !r.Str(&kept.bytes, kParkMax, "kept payload"))
        return read_error();
      if (!of_node(kept.f.src, p->node) || !of_node(kept.f.dst, node_id_))
        return fail("kept payload", "is not from that node to this one");
      kept.charged = sizeof(Kept) + kept.bytes.size();
      p->parked_bytes += kept.charged;
      if (kept.waiting) p->kept_waiting[kept.f.dst]++;
      if (id == 0 || !p->kept.emplace(id, std::move(kept)).second)
        return fail("kept id", "is 0 or appears twice");
    }
    if (!r.Count(&k, 8 + 4, kMaxEntries, "kept chunk count"))
      return read_error();
    for (uint32_t j = 0; j < k; j++) {
      uint64_t transfer = 0;
      std::vector<uint8_t> bytes;
      if (!r.U64(&transfer, "kept chunk transfer") ||
          !r.Str(&bytes, kParkMax, "kept chunk"))
        return read_error();
      p->parked_bytes += bytes.size();
      p->kept_chunks.emplace_back(transfer, std::move(bytes));
    }
    if (p->parked_bytes > kParkMax)
      return fail("kept payloads", "exceed the connection's cap");
    // Frames set aside: each one this psmd could have sent that node, as
    // its peer's decoder would take it (from this node), of an op that is
    // set aside, a data frame's bytes a chunk of its sender's region as
    // the sender's descriptor placed it (checked with the converted sends'
    // chunks below: each released once).
    uint32_t lists = 0;
    if (!r.Count(&lists, 8 + 4, kMaxEntries, "set-aside receivers"))
      return read_error();
    std::set<uint64_t> set_aside_dsts;
    for (uint32_t j = 0; j <= lists; j++) {
      const bool gone = j == lists;  // the kGones, last
      uint64_t dst = 0;
      if (!gone) {
        if (!r.U64(&dst, "set-aside receiver")) return read_error();
        if (!of_node(dst, p->node) || !set_aside_dsts.insert(dst).second)
          return fail("set-aside receiver",
                      "is not an endpoint of that node, or twice");
      }
      if (!r.Count(&k, sizeof(hw::FrameFields) + 4, kMaxEntries,
                   "set-aside frames"))
        return read_error();
      if (!gone && k == 0) return fail("set-aside frames", "are none");
      for (uint32_t m = 0; m < k; m++) {
        Loaded::SetAside s;
        s.node = p->node;
        s.gone = gone;
        if (!r.Pod(&s.msg.f, "set-aside frame fields")) return read_error();
        const wire::Op op = wire::OpOf(s.msg.f);
        if (wire::TraitsOf(s.msg.f.op).shape == wire::Shape::kEnvelope) {
          std::string bytes;
          if (!r.Str(&bytes, wire::kEnvelopeMax, "set-aside envelope"))
            return read_error();
          if (wire::DecodeEnvelope(
                  node_id_, s.msg.f,
                  reinterpret_cast<const uint8_t*>(bytes.data()),
                  static_cast<uint32_t>(bytes.size()),
                  &s.msg) != wire::Error::kOk)
            return fail("set-aside envelope", "is not a valid frame");
        } else {
          if (!r.U64(&s.offset, "set-aside chunk") ||
              !r.U32(&s.len, "set-aside length"))
            return read_error();
          if (wire::CheckHeader(node_id_, s.msg.f, s.len) != wire::Error::kOk)
            return fail("set-aside frame fields", "are not a valid frame");
          s.sender = shm::EndpointIdOf(s.msg.f.src);
          const Endpoint* sender = engine_->FindAny(s.sender);
          if (sender == nullptr || sender->epid() != s.msg.f.src ||
              sender->job()->key().uid != s.msg.f.uid ||
              std::memcmp(sender->job()->key().uuid.data(), s.msg.f.job,
                          sizeof(s.msg.f.job)) != 0)
            return fail("set-aside frame fields", "name no endpoint here");
          if (s.len == 0 ||
              ValidatePoolRange(s.offset, s.len, sender->region()) !=
                  Rejection::kNone)
            return fail("set-aside chunk",
                        "is not a chunk of the sender's pool region");
        }
        // What Defer sets aside, and where.
        const bool fits =
            gone ? op == wire::Op::kGone
                 : (op == wire::Op::kEnvelope || op == wire::Op::kAmRequest ||
                    op == wire::Op::kAmReply || op == wire::Op::kPayload ||
                    op == wire::Op::kRndvData || op == wire::Op::kAbort) &&
                       s.msg.f.dst == dst;
        if (!fits)
          return fail("set-aside frame fields", "are not of a frame set aside");
        next.set_aside.push_back(s);
      }
    }
    // Frames parked here: each as this psmd's decoder takes it from that
    // node, to an endpoint here (the list's), of an op that parks, with its
    // payload frame's bytes if one follows; a chunk's transfer is checked
    // with the transfers below. A receive an envelope took off the posted
    // queue is its receiver's, on this shard (OnMessage takes one only
    // there): its request and buffer are what the client posted, checked
    // then and as little trusted now (a completion names them).
    if (!r.Count(&lists, 8 + 4, kMaxEntries, "parked receivers"))
      return read_error();
    std::set<uint64_t> parked_dsts;
    auto read_envelope = [&](wire::Envelope* e, uint32_t* length,
                             const char* what) {
      std::string bytes;
      if (!r.Pod(&e->f, what) || !r.Str(&bytes, wire::kEnvelopeMax, what))
        return false;
      *length = static_cast<uint32_t>(bytes.size());
      if (wire::DecodeEnvelope(p->node, e->f,
                               reinterpret_cast<const uint8_t*>(bytes.data()),
                               *length, e) != wire::Error::kOk) {
        r.Fail(what, "is not a valid frame from that node");
        return false;
      }
      return true;
    };
    for (uint32_t j = 0; j < lists; j++) {
      uint64_t dst = 0;
      if (!r.U64(&dst, "parked receiver")) return read_error();
      if (!of_node(dst, node_id_) || !parked_dsts.insert(dst).second)
        return fail("parked receiver", "is not an endpoint here, or twice");
      if (!r.Count(&k, 1 + sizeof(hw::FrameFields) + 4 + 1, kMaxEntries,
                   "parked frames"))
        return read_error();
      if (k == 0) return fail("parked frames", "are none");
      std::deque<Parked>& frames = p->parked[dst];
      for (uint32_t m = 0; m < k; m++) {
        Parked& e = frames.emplace_back();
        uint32_t length = 0;  // the envelope's, as it came
        if (!r.Bool(&e.chunk, "parked chunk")) return read_error();
        if (e.chunk ? !r.Pod(&e.env.f, "parked chunk header")
                    : !read_envelope(&e.env, &length, "parked envelope"))
          return read_error();
        if (!r.Str(&e.payload, kParkMax, "parked payload") ||
            !r.Bool(&e.has_held, "parked held receive"))
          return read_error();
        const wire::Op op = wire::OpOf(e.env.f);
        const uint32_t payload = static_cast<uint32_t>(e.payload.size());
        if (e.chunk) {
          if (op != wire::Op::kRndvData || payload == 0 ||
              wire::CheckHeader(p->node, e.env.f, payload) != wire::Error::kOk)
            return fail("parked chunk header", "is not a valid chunk");
        } else {
          const bool parks = op == wire::Op::kEnvelope ||
                             op == wire::Op::kAmRequest ||
                             op == wire::Op::kAmReply;
          if (!parks ||
              payload != (wire::PayloadFollows(e.env) ? e.env.r.len : 0))
            return fail("parked envelope",
                        "is not of an op that parks, or its payload's length "
                        "is not the envelope's");
        }
        if (e.env.f.dst != dst)
          return fail("parked frame", "is not to its list's receiver");
        if (e.has_held) {
          PostedRecv& v = e.held_recv;
          if (!r.U32(&e.held_receiver, "held receive endpoint") ||
              !r.U64(&v.req, "held receive request") ||
              !r.U32(&v.capacity, "held receive capacity") ||
              !r.U64(&v.source, "held receive source") ||
              !r.U64(&v.addr, "held receive buffer"))
            return read_error();
          const Endpoint* receiver = engine_->FindAny(e.held_receiver);
          if (op != wire::Op::kEnvelope || !wire::PayloadFollows(e.env) ||
              receiver == nullptr || !engine_->IsLocal(*receiver) ||
              receiver->epid() != dst ||
              receiver->job()->key().uid != e.env.f.uid ||
              std::memcmp(receiver->job()->key().uuid.data(), e.env.f.job,
                          sizeof(e.env.f.job)) != 0)
            return fail("held receive endpoint",
                        "is not the receiver of an eager message here");
        }
        // As Park counted them.
        e.bytes = sizeof(Parked) + length + payload;
        e.window =
            WindowBytes(e.env.f, payload) +
            (payload > 0 && !e.chunk ? hw::kFrameHeaderSize + payload : 0);
        p->parked_bytes += e.bytes;
        p->parked_from[e.env.f.src]++;
      }
    }
    if (!r.Count(&k, sizeof(hw::FrameFields) + 4, kMaxEntries, "parked kGones"))
      return read_error();
    for (uint32_t j = 0; j < k; j++) {
      wire::Envelope& g = p->gone_after.emplace_back();
      uint32_t length = 0;
      if (!read_envelope(&g, &length, "parked kGone")) return read_error();
      if (wire::OpOf(g.f) != wire::Op::kGone)
        return fail("parked kGone", "is not a kGone");
      p->parked_bytes += sizeof(Parked);
    }
    if (p->parked_bytes > kParkMax)
      return fail("parked frames", "exceed the connection's cap");
    p->open = true;
    next.node_of_conn[p->conn] = p->node;
    next.peers[p->node] = std::move(p);
  }

  if (!r.U32(&next.next_kept, "next kept id") ||
      !r.U64(&next.next_in_transfer, "next transfer id") ||
      !r.Count(&n, 48, kMaxEntries, "transfers in"))
    return read_error();
  // Ids handed out later must not carry the RMA offer's bit.
  if (next.next_in_transfer & wire::kRmaOfferBit)
    return fail("next transfer id", "has the RMA offer's bit");
  // Kept chunks name their transfers, read next: checked there and after.
  std::set<uint64_t> kept_transfers;
  for (const auto& [node, p] : next.peers) {
    for (const auto& [transfer, bytes] : p->kept_chunks) {
      if (!kept_transfers.insert(transfer).second)
        return fail("kept chunk transfer", "appears twice");
    }
  }
  for (uint32_t i = 0; i < n; i++) {
    uint64_t id = 0;
    auto t = std::make_unique<InTransfer>();
    if (!r.U64(&id, "transfer in id") || !r.U16(&t->node, "transfer in node") ||
        !r.U32(&t->receiver, "transfer in receiver") ||
        !r.U64(&t->recv_req, "transfer in request") ||
        !r.U64(&t->src, "transfer in sender") ||
        !r.U32(&t->send_bytes, "transfer in bytes") ||
        !r.U32(&t->received, "transfer in received") ||
        !r.U64(&t->sender_req, "transfer in sender request") ||
        !r.U32(&t->accepted, "transfer in accepted"))
      return read_error();
    if (id == 0 || id >= next.next_in_transfer || (id & wire::kRmaOfferBit) ||
        next.in.count(id) != 0)
      return fail("transfer in id", "was not handed out, or appears twice");
    if (next.peers.count(t->node) == 0 || !of_node(t->src, t->node))
      return fail("transfer in node", "is not a peer, or not its sender's");
    if (t->receiver != 0 && !here(t->receiver))
      return fail("transfer in receiver", "is not an endpoint");
    // One that received all its bytes ended: received < send_bytes, and
    // accepted <= send_bytes (what it accepted and parked: below). The
    // exception is a transfer a kept payload's receive started
    // (DeliverKept): it accepted all its bytes, which wait in its one kept
    // chunk, and delivered none.
    if (t->send_bytes == 0 ||
        (kept_transfers.count(id) != 0
             ? t->accepted != t->send_bytes || t->received != 0
             : t->accepted > t->send_bytes || t->received >= t->send_bytes ||
                   t->received > t->accepted))
      return fail("transfer in received",
                  "is not what it accepted, or not within the transfer");
    if (t->receiver != 0) t->to = SenderOf(*engine_->FindAny(t->receiver));
    next.in[id] = std::move(t);
  }
  // A kept chunk is the whole of a transfer from its node.
  for (const auto& [node, p] : next.peers) {
    for (const auto& [transfer, bytes] : p->kept_chunks) {
      auto t = next.in.find(transfer);
      if (t == next.in.end() || t->second->node != node ||
          bytes.size() != t->second->send_bytes)
        return fail("kept chunk",
                    "is not the whole of a transfer from its node");
    }
  }
  // Parked chunks are the next bytes of transfers from their node, each
  // where the one before it ended (the chunks of a transfer park for one
  // receiver, in order), to its receiver while it has one.
  std::map<uint64_t, uint64_t> parked_next;  // transfer: the next offset
  for (const auto& [node, p] : next.peers) {
    for (const auto& [dst, frames] : p->parked) {
      for (const Parked& e : frames) {
        if (!e.chunk) continue;
        auto t = next.in.find(e.env.f.aux);
        if (t == next.in.end() || t->second->node != node ||
            t->second->src != e.env.f.src ||
            (t->second->receiver != 0 && t->second->to.epid != dst))
          return fail("parked chunk", "is of no transfer from its node");
        auto at = parked_next.try_emplace(e.env.f.aux, t->second->received);
        if (e.env.f.offset != at.first->second)
          return fail("parked chunk", "is not where its transfer went on");
        at.first->second += e.payload.size();
      }
    }
  }
  // What a carried transfer accepted it delivered or parked (Carriable:
  // nothing half read): received + parked == accepted. A transfer with less
  // delivered than that would never end (OnChunk counts what it delivers
  // against send_bytes; its receiver would wait for good). A kept payload's
  // transfer delivers from its kept chunk, and parks none.
  for (const auto& [id, t] : next.in) {
    const auto at = parked_next.find(id);
    if (kept_transfers.count(id) != 0
            ? at != parked_next.end()
            : (at == parked_next.end() ? t->received : at->second) !=
                  t->accepted)
      return fail("transfer in received", "is not what it accepted and parked");
  }
  if (!r.Count(&n, 2 + 4 + 8 * 4 + 4 * 2 + 1 + sizeof(wire::Sender),
               kMaxEntries, "transfers out"))
    return read_error();
  for (uint32_t i = 0; i < n; i++) {
    uint64_t id = 0;
    auto t = std::make_unique<OutTransfer>();
    if (!r.U64(&id, "transfer out id") ||
        !r.U16(&t->node, "transfer out node") ||
        !r.U32(&t->sender, "transfer out sender") ||
        !r.U64(&t->dst, "transfer out receiver") ||
        !r.U64(&t->remote_transfer, "transfer out remote id") ||
        !r.U32(&t->send_bytes, "transfer out bytes") ||
        !r.U32(&t->forwarded, "transfer out forwarded") ||
        !r.Bool(&t->dead, "transfer out dead") ||
        !r.U64(&t->sender_req, "transfer out request") ||
        !r.Pod(&t->from, "transfer out sender identity"))
      return read_error();
    if (id == 0 || next.out.count(id) != 0)
      return fail("transfer out id", "is 0 or appears twice");
    if (!of_node(t->dst, t->node) ||
        (!t->dead && next.peers.count(t->node) == 0))
      return fail("transfer out node", "is not its receiver's, or no peer");
    const Endpoint* sender = engine_->FindAny(t->sender);
    if (sender == nullptr || t->from.epid != sender->epid())
      return fail("transfer out sender", "is not that endpoint");
    if (t->forwarded >= t->send_bytes)
      return fail("transfer out forwarded", "is not within the transfer");
    next.out[id] = std::move(t);
  }
  if (!r.U64(&next.next_converted, "next converted id") ||
      !r.Count(&n, 8 + 2 + 4 + 8 + 1 + 8 * 2 + 4, kMaxEntries,
               "converted sends"))
    return read_error();
  std::set<uint64_t> converted_ids;
  std::set<uint64_t> converted_chunks;  // each released once, when taken
  for (uint32_t i = 0; i < n; i++) {
    Loaded::ConvertedSend s;
    if (!r.U64(&s.id, "converted id") || !r.U16(&s.c.node, "converted node") ||
        !r.U32(&s.c.sender, "converted sender") ||
        !r.U64(&s.c.req, "converted request") ||
        !r.Bool(&s.c.sync, "converted sync") ||
        !r.U64(&s.dst, "converted receiver") ||
        !r.U64(&s.offset, "converted payload offset") ||
        !r.U32(&s.len, "converted length"))
      return read_error();
    const uint64_t serial = s.id & ~wire::kConvertedBit;
    if (!(s.id & wire::kConvertedBit) || serial == 0 ||
        serial >= next.next_converted || !converted_ids.insert(s.id).second)
      return fail("converted id", "was not handed out, or appears twice");
    if (next.peers.count(s.c.node) == 0 || !of_node(s.dst, s.c.node))
      return fail("converted node", "is not a peer, or not its receiver's");
    // Its payload is where the sender's descriptor placed it (checked
    // then): a pool chunk of the sender's region, too long to be inline.
    const Endpoint* sender = engine_->FindAny(s.c.sender);
    if (sender == nullptr)
      return fail("converted sender", "is not an endpoint");
    if (shm::IsInline(s.len) ||
        ValidatePoolRange(s.offset, s.len, sender->region()) !=
            Rejection::kNone ||
        !converted_chunks.insert(s.offset).second)
      return fail("converted payload offset",
                  "is not a chunk of the sender's pool region, or twice");
    next.converted.push_back(std::move(s));
  }
  for (const Loaded::SetAside& s : next.set_aside) {
    if (s.sender != 0 && !converted_chunks.insert(s.offset).second)
      return fail("set-aside chunk", "is named twice");
  }
  if (!r.Count(&n, 8, kMaxEntries, "watched endpoints")) return read_error();
  for (uint32_t i = 0; i < n; i++) {
    uint32_t id = 0, k = 0;
    if (!r.U32(&id, "watched endpoint") ||
        !r.Count(&k, 2, kMaxPeers, "watchers"))
      return read_error();
    if (!here(id) || next.watchers.count(id) != 0)
      return fail("watched endpoint", "is not an endpoint, or appears twice");
    std::set<uint16_t>& nodes = next.watchers[id];
    for (uint32_t j = 0; j < k; j++) {
      uint16_t node = 0;
      if (!r.U16(&node, "watcher")) return read_error();
      if (node == 0 || node == node_id_)
        return fail("watcher", "is 0 or this node");
      nodes.insert(node);
    }
  }
  if (!next.proxies.LoadState(r, node_id_)) return read_error();
  if (!r.Count(&n, 16 + 4 + 8 * 5 + 8, kMaxEntries, "inboxes"))
    return read_error();
  std::set<const Job*> seen;
  for (uint32_t i = 0; i < n; i++) {
    JobKey key{};
    uint32_t uid = 0;
    shm::SendArena::State s;
    if (!r.Pod(&key.uuid, "inbox job") || !r.U32(&uid, "inbox uid") ||
        !handover::ReadArenaState(r, &s))
      return read_error();
    key.uid = uid;
    std::shared_ptr<Job> job = engine_->FindJob(key);
    if (!job || !job->InboxRegion() || !seen.insert(job.get()).second)
      return fail("inbox job", "is no job here with an inbox, or twice");
    const SendRegion region = *job->InboxRegion();
    shm::SendArena arena(job->pool().base(), region.offset, region.bytes);
    std::string why;
    if (!arena.Adopt(s, &why)) return fail("inbox", why);
    next.inboxes.emplace_back(std::move(job), std::move(arena));
  }

  peers_ = std::move(next.peers);
  node_of_conn_ = std::move(next.node_of_conn);
  next_in_transfer_ = next.next_in_transfer;
  in_transfers_ = std::move(next.in);
  out_transfers_ = std::move(next.out);
  next_converted_ = next.next_converted;
  next_kept_ = next.next_kept;
  for (Loaded::ConvertedSend& s : next.converted) {
    Endpoint& sender = *engine_->FindAny(s.c.sender);
    // The chunk stays held, as in the old psmd, until the send is taken.
    shm::PoolPayload payload(sender.job()->pool().base(), s.offset);
    s.c.payload =
        ChunkFrame(sender, wire::PrepPayload(SenderOf(sender), s.dst, s.c.req),
                   &payload, s.len);
    converted_[s.id] = std::move(s.c);
  }
  for (const Loaded::SetAside& s : next.set_aside) {
    Peer& p = *peers_.at(s.node);
    std::unique_ptr<OutFrame> f;
    if (s.sender != 0) {
      // The chunk stays held, as in the old psmd, until the frame is sent.
      Endpoint& sender = *engine_->FindAny(s.sender);
      shm::PoolPayload payload(sender.job()->pool().base(), s.offset);
      f = ChunkFrame(sender, s.msg.f, &payload, s.len);
    } else {
      f = std::make_unique<OutFrame>();
      f->msg = s.msg;
    }
    f->node = s.node;
    if (s.gone) {
      p.gone_aside.push_back(std::move(f));
    } else {
      p.deferred[s.msg.f.dst].push_back(std::move(f));
    }
  }
  watchers_ = std::move(next.watchers);
  proxies_ = std::move(next.proxies);
  for (auto& [job, arena] : next.inboxes) {
    PagesOf(job).inbox = std::move(arena);
  }
  std::vector<uint16_t> lost;  // sessions that ended before the load
  for (auto& [node, p] : peers_) {
    RecvNext(*p);
    if (p->rx != Peer::Rx::kHeader) lost.push_back(node);
  }
  size_t kept = 0, parked = 0;
  for (const auto& [node, p] : peers_) {
    kept += p->kept.size();
    parked += p->gone_after.size();
    for (const auto& [dst, frames] : p->parked) parked += frames.size();
  }
  spdlog::info(
      "handover: took over {} peer nodes, {} rendezvous transfers in and {} "
      "out, {} eager sends converted to rendezvous, {} payloads kept for "
      "receivers here, {} frames set aside for receivers there, {} frames "
      "parked for receivers here",
      peers_.size(), in_transfers_.size(), out_transfers_.size(),
      converted_.size(), kept, next.set_aside.size(), parked);
  for (uint16_t node : lost) FailPeer(node, hw::ErrorClass::kConnReset);
  // The old psmd held the peers (HoldPeers): they send to its endpoints
  // again, with the credits it kept.
  HoldPeers(false);
  return {};
}

}  // namespace psmd
