// Remote: flow control, back-pressure rules 1-4 of remote.h: frames parked
// for a slow receiver and retried, kXoff/kXon, payloads kept in daemon
// memory and sends converted to rendezvous (kEagerOff/kEagerOn), the
// per-connection cap.
#include "daemon/remote/remote_state.h"

#include <psm2.h>

#include <algorithm>

#include <spdlog/spdlog.h>

#include "shm/epid.h"

namespace psmd {

bool Remote::Held(const Peer& p, uint64_t dst) {
  if (!p.off.empty() && p.off.count(dst) != 0) return true;
  if (!p.deferred.empty() && p.deferred.count(dst) != 0) return true;
  if (p.unconsumed.empty()) return false;
  auto it = p.unconsumed.find(dst);
  return it != p.unconsumed.end() && it->second >= kReceiverWindow;
}

void Remote::Charge(Peer& p, const OutFrame& f) {
  const uint64_t bytes = WindowBytes(f.msg.f, f.iov.iov_len);
  if (bytes > 0) p.unconsumed[f.msg.f.dst] += bytes;
}

bool Remote::Defer(Peer& p, const OutFrame& f) {
  switch (f.msg.op()) {
    case wire::Op::kPayload:
      // With its envelope, wherever that went (they are adjacent in the
      // queue, and on the wire).
      return std::exchange(p.defer_payload, false);
    case wire::Op::kEnvelope:
    case wire::Op::kAmRequest:
    case wire::Op::kAmReply: {
      const bool held = Held(p, f.msg.f.dst);
      p.defer_payload = held && wire::PayloadFollows(f.msg);
      return held;
    }
    case wire::Op::kRndvData:
      return Held(p, f.msg.f.dst);
    case wire::Op::kAbort:
      // Behind the chunks of its transfer that wait (a chunk after it
      // would name no transfer there).
      return !p.deferred.empty() && p.deferred.count(f.msg.f.dst) != 0;
    case wire::Op::kGone:
      // Behind what its endpoint sent that waits (a receive naming it
      // there would fail, and the message arrive for nobody).
      return SetAsideFrom(p, f.msg.f.src);
    default:
      return false;
  }
}

bool Remote::SetAsideFrom(const Peer& p, uint64_t src) {
  // Rare (an endpoint's kGone meeting frames set aside): a walk will do.
  for (const auto& [dst, frames] : p.deferred) {
    for (const auto& f : frames) {
      if (f->msg.f.src == src) return true;
    }
  }
  return false;
}

void Remote::Resume(Peer& p, uint64_t dst) {
  auto set_aside = p.deferred.find(dst);
  if (set_aside == p.deferred.end()) return;
  if (p.off.count(dst) != 0) return;
  if (auto it = p.unconsumed.find(dst);
      it != p.unconsumed.end() && it->second >= kReceiverWindow) {
    return;
  }
  // Back to the front of the queue, in their order; after a payload whose
  // envelope is already on the wire. (Flush sets aside again those beyond
  // the window.)
  auto at = p.queue.begin();
  if (at != p.queue.end() && (*at)->msg.op() == wire::Op::kPayload) ++at;
  p.queue.insert(at, std::make_move_iterator(set_aside->second.begin()),
                 std::make_move_iterator(set_aside->second.end()));
  p.deferred.erase(set_aside);
  // After them, the kGones that waited for them (Flush checks again).
  for (auto it = p.gone_aside.begin(); it != p.gone_aside.end();) {
    if (SetAsideFrom(p, (*it)->msg.f.src)) {
      ++it;
      continue;
    }
    p.queue.push_back(std::move(*it));
    it = p.gone_aside.erase(it);
  }
  Flush(p);
}

void Remote::Consumed(Peer& p, const hw::FrameFields& f, uint64_t bytes) {
  // (A kXon names an endpoint of this node, or the peer refuses it.)
  if (bytes == 0 || shm::NodeIdOf(f.dst) != node_id_) return;
  auto [it, fresh] = p.consumed.try_emplace(f.dst, 0);
  it->second += bytes;
  // While frames to it are parked, the credit waits for the kXon that ends
  // the park (RetryParked): a kXon says "on".
  if (!p.parked.empty() && p.parked.count(f.dst) != 0) return;
  // Likewise while a handover holds the peers (HoldPeers).
  if (holding_) return;
  // No endpoint of that epid here (frames refused): credited at once, so
  // the map holds live endpoints only (EndpointRemoved forgets them).
  if (it->second < kCreditEvery && !(fresh && Target(f) == nullptr)) return;
  const uint64_t credit = it->second;
  p.consumed.erase(it);
  Post(p, wire::PrepFlow(wire::Op::kXon, wire::ReceiverOf(f), credit));
}

uint64_t Remote::Convert(Peer& p, uint32_t sender, uint64_t req,
                         wire::Record* r, std::unique_ptr<OutFrame> payload) {
  const uint64_t id = wire::kConvertedBit | next_converted_++;
  r->flags |= wire::kFlagRndv;
  Converted& c = converted_[id];
  c.node = p.node;
  c.sender = sender;
  c.req = req;
  c.sync = (r->flags & shm::kSendSync) != 0;
  c.payload = std::move(payload);
  return id;
}

void Remote::ConvertQueued(Peer& p,
                           std::deque<std::unique_ptr<OutFrame>>& queue,
                           uint64_t dst) {
  // An eager envelope's payload frame is right behind it; a payload at the
  // front whose envelope is already on the wire stays.
  std::deque<std::unique_ptr<OutFrame>> out;
  for (size_t i = 0; i < queue.size(); i++) {
    wire::Envelope& env = queue[i]->msg;
    if (env.op() == wire::Op::kEnvelope && env.f.dst == dst &&
        i + 1 < queue.size() && queue[i + 1]->msg.op() == wire::Op::kPayload) {
      env.f.aux = Convert(p, shm::EndpointIdOf(env.f.src), env.f.aux, &env.r,
                          std::move(queue[i + 1]));
      out.push_back(std::move(queue[i]));
      i++;
      continue;
    }
    out.push_back(std::move(queue[i]));
  }
  queue.swap(out);
}

void Remote::DropConverted(const std::function<bool(const Converted&)>& drop) {
  for (auto it = converted_.begin(); it != converted_.end();) {
    if (!drop(it->second)) {
      ++it;
      continue;
    }
    it->second.payload->ReleaseChunk();
    it = converted_.erase(it);
  }
}

void Remote::OnConverted(Peer& p, const wire::Envelope& in, Endpoint& t) {
  const hw::FrameFields& f = in.f;
  const wire::Record& w = in.r;
  const bool go = in.op() == wire::Op::kRndvGo;
  auto it = converted_.find(f.aux);
  if (it == converted_.end() || it->second.node != p.node ||
      it->second.sender != t.id()) {
    // Not ours (a client's token never has the bit): a receiver waiting
    // for data learns there is none.
    if (go && w.len > 0) {
      Post(p, wire::PrepAbort(wire::ReceiverOf(f), f.src, w.x,
                              PSM2_EPID_UNREACHABLE));
    }
    return;
  }
  Converted c = std::move(it->second);
  converted_.erase(it);
  std::unique_ptr<OutFrame> frame = std::move(c.payload);
  const uint32_t len = static_cast<uint32_t>(frame->iov.iov_len);
  if (go && w.len > 0 && w.len <= len) {
    // The payload goes as the transfer's one chunk, from the same pool
    // chunk the eager send placed it in.
    frame->msg.f = wire::PrepRndvData(wire::SenderOf(frame->msg.f),
                                      frame->msg.f.dst, w.x, 0);
    frame->iov.iov_len = w.len;
    Enqueue(p, std::move(frame));
  } else {
    if (go && w.len > len) {
      Post(p, wire::PrepAbort(wire::ReceiverOf(f), f.src, w.x,
                              PSM2_EPID_UNREACHABLE));
    }
    frame->ReleaseChunk();
  }
  if (!c.sync) return;  // its sender saw it complete when it was sent
  p.awaiting.erase({t.id(), c.req});
  if (in.op() == wire::Op::kError) {
    engine_->PostErrorFor(t, c.req, w.error);
    return;
  }
  shm::CompletionDesc done{};
  done.op = shm::CompleteOp::kSendDone;
  done.req = c.req;
  done.error = PSM2_OK;
  engine_->PostFor(t, done);
}

bool Remote::TakeKept(const UnexpectedMsg& m, std::vector<uint8_t>* bytes) {
  Peer* p = PeerOf(shm::NodeIdOf(m.remote_src));
  if (p == nullptr) return false;
  auto it = p->kept.find(m.sender_id);
  if (it == p->kept.end() || it->second.f.src != m.remote_src) return false;
  Kept k = std::move(it->second);
  p->kept.erase(it);
  p->parked_bytes -= k.charged;
  if (bytes != nullptr) *bytes = std::move(k.bytes);
  if (k.waiting) {
    auto waiting = p->kept_waiting.find(k.f.dst);
    if (--waiting->second == 0) {
      p->kept_waiting.erase(waiting);
      Post(*p, wire::PrepFlow(wire::Op::kEagerOn, wire::ReceiverOf(k.f)));
    }
  }
  return true;
}

void Remote::DeliverKept(Endpoint& receiver, uint64_t recv_req,
                         uint32_t send_bytes, const UnexpectedMsg& m) {
  std::vector<uint8_t> bytes;
  if (!TakeKept(m, &bytes)) {  // gone with its connection
    if (send_bytes > 0) {
      engine_->PostErrorFor(receiver, recv_req, PSM2_EPID_UNREACHABLE);
    }
    return;
  }
  if (m.flags & shm::kSendSync) TellSender(receiver, m, PSM2_OK);
  if (send_bytes == 0) return;
  Peer& p = *PeerOf(shm::NodeIdOf(m.remote_src));
  const uint64_t id = next_in_transfer_++;
  in_transfers_[id] = std::make_unique<InTransfer>(
      InTransfer{p.node, receiver.id(), recv_req, m.remote_src, send_bytes, 0,
                 m.sender_req, send_bytes});
  bytes.resize(send_bytes);
  p.parked_bytes += bytes.size();
  p.kept_chunks.emplace_back(id, std::move(bytes));
  DeliverKeptChunks(p);
}

bool Remote::DeliverKeptChunks(Peer& p) {
  bool did = false;
  while (!p.kept_chunks.empty() && DeliverChunk(p.kept_chunks.front().first,
                                                p.kept_chunks.front().second)) {
    p.parked_bytes -= p.kept_chunks.front().second.size();
    p.kept_chunks.pop_front();
    did = true;
  }
  return did;
}

bool Remote::DeliverChunk(uint64_t transfer_id,
                          const std::vector<uint8_t>& bytes) {
  const uint32_t len = static_cast<uint32_t>(bytes.size());
  auto it = in_transfers_.find(transfer_id);
  Endpoint* r = it == in_transfers_.end() || it->second->receiver == 0
                    ? nullptr
                    : engine_->FindAny(it->second->receiver);
  if (r == nullptr) {
    OnChunk(transfer_id, nullptr, 0, len);  // its receiver left: dropped
    return true;
  }
  uint64_t chunk = 0;
  if (!AllocInbox(*r, len, &chunk)) return false;
  std::memcpy(r->job()->pool().base() + chunk, bytes.data(), len);
  OnChunk(transfer_id, r->job(), chunk, len);
  return true;
}

Remote::Verdict Remote::Admit(Peer& p, const wire::Envelope& in) {
  // A message waits behind the frames parked for its receiver; a kGone
  // behind those its endpoint sent.
  if (wire::TraitsOf(in.f.op).payload == wire::Payload::kInlineOrFrame) {
    if (p.parked.count(in.f.dst) != 0) return Verdict::kPause;
  } else if (in.op() == wire::Op::kGone) {
    if (p.parked_from.count(in.f.src) != 0) return Verdict::kPause;
  }
  return Handle(p, in);
}

bool Remote::Park(Peer& p, bool chunk) {
  const hw::FrameFields& f = chunk ? p.f : p.in.f;
  uint64_t payload = 0;
  if (chunk) {
    payload = p.length;
  } else if (wire::PayloadFollows(p.in)) {
    payload = p.in.r.len;
  }
  // (A kGone is charged what RetryParked releases: it keeps no bytes.)
  const bool gone = !chunk && p.in.op() == wire::Op::kGone;
  const uint64_t bytes =
      gone ? sizeof(Parked) : sizeof(Parked) + (chunk ? 0 : p.length) + payload;
  if (p.parked_bytes + bytes > kParkMax) {
    if (!p.park_full_logged) {
      spdlog::warn(
          "fabric: {} MiB parked for slow receivers from node {}; reading "
          "from it pauses until they drain (its daemon should have held "
          "them back on kXoff)",
          kParkMax >> 20, p.node);
      p.park_full_logged = true;
    }
    return false;
  }
  p.parked_bytes += bytes;
  counts_by_node_[p.node].parked++;
  if (gone) {
    p.gone_after.push_back(p.in);
    return true;
  }
  auto [list, first] = p.parked.try_emplace(f.dst);
  p.parked_from[f.src]++;
  Parked& e = list->second.emplace_back();
  e.chunk = chunk;
  e.bytes = bytes;
  e.window = WindowBytes(f, p.length) +
             (payload > 0 && !chunk ? hw::kFrameHeaderSize + payload : 0);
  if (chunk) {
    e.env.f = f;
    p.park_chunk = true;
  } else {
    e.env = p.in;
    e.has_held = std::exchange(p.has_held, false);
    e.held_receiver = p.held_receiver;
    e.held_recv = p.held_recv;
    if (payload > 0) {
      p.pending = Pending{};
      p.pending.env = p.in;
      p.expect_payload = true;
      p.park_payload = true;
    }
  }
  if (first) Post(p, wire::PrepFlow(wire::Op::kXoff, wire::ReceiverOf(f)));
  return true;
}

bool Remote::RetryParked(Peer& p) {
  // Matched kept payloads first: nothing received before them on the
  // connection waits for them.
  const bool moved = DeliverKeptChunks(p);
  if (p.parked.empty() && p.gone_after.empty()) return moved;
  // Only between frames: a payload or chunk being read owns p.pending or
  // p.chunk_*. A paused envelope's held receive is kept aside meanwhile.
  if (p.expect_payload || p.dropped ||
      (p.rx != Peer::Rx::kHeader && p.rx != Peer::Rx::kPaused)) {
    return moved;
  }
  const bool has_held = std::exchange(p.has_held, false);
  const uint32_t held_receiver = p.held_receiver;
  const PostedRecv held_recv = p.held_recv;
  bool did = false;
  for (auto it = p.parked.begin(); it != p.parked.end() && !p.dropped;) {
    std::deque<Parked>& frames = it->second;
    hw::FrameFields last;  // of the last frame delivered
    while (!frames.empty() && !p.dropped && Deliver(p, frames.front())) {
      last = frames.front().env.f;
      Consumed(p, last, frames.front().window);
      p.parked_bytes -= frames.front().bytes;
      auto from = p.parked_from.find(last.src);
      if (--from->second == 0) p.parked_from.erase(from);
      frames.pop_front();
      did = true;
    }
    if (!frames.empty()) {
      ++it;
      continue;
    }
    it = p.parked.erase(it);
    // A handover holds every endpoint off (HoldPeers): its release says
    // "on" for all.
    if (holding_) continue;
    // "On", with the credit of what was consumed meanwhile.
    uint64_t credit = 0;
    if (auto c = p.consumed.find(last.dst); c != p.consumed.end()) {
      credit = c->second;
      p.consumed.erase(c);
    }
    Post(p, wire::PrepFlow(wire::Op::kXon, wire::ReceiverOf(last), credit));
  }
  while (!p.gone_after.empty() && !p.dropped) {
    if (Admit(p, p.gone_after.front()) == Verdict::kPause) break;
    p.gone_after.pop_front();
    p.parked_bytes -= sizeof(Parked);
    did = true;
  }
  p.has_held = has_held;
  p.held_receiver = held_receiver;
  p.held_recv = held_recv;
  return did || moved;
}

bool Remote::Deliver(Peer& p, Parked& e) {
  if (e.chunk) return DeliverChunk(e.env.f.aux, e.payload);
  p.has_held = e.has_held;
  p.held_receiver = e.held_receiver;
  p.held_recv = e.held_recv;
  if (Handle(p, e.env) == Verdict::kPause) {
    e.has_held = std::exchange(p.has_held, false);
    e.held_receiver = p.held_receiver;
    e.held_recv = p.held_recv;
    return false;
  }
  if (p.expect_payload) {  // its payload is e.payload
    if (p.pending.keep) {
      p.pending.kept = std::move(e.payload);
    } else if (p.pending.receiver != 0 &&
               e.payload.size() == p.pending.env.r.len) {
      std::memcpy(p.pending.job->pool().base() + p.pending.chunk,
                  e.payload.data(), e.payload.size());
    }
    OnPayload(p);
  }
  return true;
}

Remote::Verdict Remote::OnXoff(Peer& p, const wire::Envelope& in) {
  counts_by_node_[p.node].xoffs++;
  p.off.insert(in.f.src);
  return Verdict::kDone;
}

Remote::Verdict Remote::OnXon(Peer& p, const wire::Envelope& in) {
  const uint64_t dst = in.f.src;
  p.off.erase(dst);
  if (auto it = p.unconsumed.find(dst); it != p.unconsumed.end()) {
    // (A credit beyond what was posted is a peer's error; it only frees
    // the window.)
    it->second -= std::min(it->second, in.r.x);
    if (it->second == 0) p.unconsumed.erase(it);
  }
  Resume(p, dst);
  return Verdict::kDone;
}

Remote::Verdict Remote::OnEagerOff(Peer& p, const wire::Envelope& in) {
  counts_by_node_[p.node].eager_offs++;
  p.eager_off.insert(in.f.src);
  // Its queued eager envelopes (those set aside too) go as rendezvous ones.
  ConvertQueued(p, p.queue, in.f.src);
  if (auto set_aside = p.deferred.find(in.f.src);
      set_aside != p.deferred.end()) {
    ConvertQueued(p, set_aside->second, in.f.src);
  }
  return Verdict::kDone;
}

Remote::Verdict Remote::OnEagerOn(Peer& p, const wire::Envelope& in) {
  p.eager_off.erase(in.f.src);
  return Verdict::kDone;
}

}  // namespace psmd
