// Remote: sending. The engine's calls for peers on other nodes (sends,
// active messages, rendezvous chunks and answers) become frames through
// wire.h's builders, queued per node and flushed to the fabric.
#include "daemon/remote/remote_state.h"

#include <psm2.h>

#include <string>

#include "shm/epid.h"

namespace psmd {

void Remote::Enqueue(Peer& p, std::unique_ptr<OutFrame> f) {
  f->node = p.node;
  p.queue.push_back(std::move(f));
  Flush(p);
}

void Remote::Post(Peer& p, const wire::Envelope& e) {
  auto f = std::make_unique<OutFrame>();
  f->msg = e;
  Enqueue(p, std::move(f));
}

void Remote::PostTo(uint16_t node, const wire::Envelope& e) {
  if (Peer* p = PeerOf(node)) Post(*p, e);
}

void Remote::Flush(Peer& p) {
  while (p.open && !p.queue.empty()) {
    if (Defer(p, *p.queue.front())) {
      std::unique_ptr<OutFrame>& f = p.queue.front();
      if (f->msg.op() == wire::Op::kGone) {
        p.gone_aside.push_back(std::move(f));
      } else {
        p.deferred[f->msg.f.dst].push_back(std::move(f));
      }
      p.queue.pop_front();
      continue;
    }
    OutFrame& f = *p.queue.front();
    if (wire::TraitsOf(f.msg.f.op).shape == wire::Shape::kEnvelope) {
      f.iov = {f.bytes, wire::Encode(f.msg, f.bytes)};
    }
    const uint64_t cookie = next_cookie_++;
    hw::ErrorClass e = fabric_->PostSend(p.conn, f.msg.f, &f.iov, 1, cookie);
    if (e == hw::ErrorClass::kBusy) return;  // again after a kSendDone
    if (e != hw::ErrorClass::kOk) {
      // The connection is going; its kClosed fails what waits.
      f.ReleaseChunk();
      p.queue.pop_front();
      continue;
    }
    Charge(p, f);
    in_flight_[cookie] = std::move(p.queue.front());
    p.queue.pop_front();
    p.last_sent_ms = NowMs();
  }
}

bool Remote::Send(Endpoint& sender, const shm::SubmissionDesc& d,
                  const PeerLink& to, bool may_hold) {
  const uint64_t dst = to.epid;
  const bool rndv = d.op == shm::SubmitOp::kRndvSend;
  shm::PoolPayload payload =
      rndv ? shm::PoolPayload()
           : shm::PayloadOf(sender.job()->pool().base(), d);
  Peer* p = PeerOf(shm::NodeIdOf(dst));
  if (p == nullptr || to.gone) {
    engine_->PostErrorFor(sender, d.req, PSM2_EPID_UNREACHABLE);
    return true;  // payload released
  }
  // (A closing sender's last sends are taken regardless: it saw them
  // complete, and its ring is not read again.)
  if ((p->queue.size() >= kMaxQueued || Held(*p, dst)) && may_hold) {
    payload.Take();  // still the sender's: the send is held, not dropped
    return false;
  }
  wire::Envelope env =
      wire::PrepMessage(SenderOf(sender), dst, d.req, d.tag, d.len, d.flags,
                        rndv, d.body.inline_data);
  std::unique_ptr<OutFrame> frame;
  if (wire::PayloadFollows(env)) {
    frame = PayloadFrame(sender, dst, d.req, &payload, d.len);
    if (p->eager_off.count(dst) != 0) {
      env.f.aux = Convert(*p, sender.id(), d.req, &env.r, std::move(frame));
    }
  }
  Post(*p, env);
  if (frame) Enqueue(*p, std::move(frame));
  if (rndv || (d.flags & shm::kSendSync))
    p->awaiting.insert({sender.id(), d.req});
  // Another shard's sender was counted by its shard (counters have one
  // writer: MqEngine::ToFabric).
  if (!engine_->IsLocal(sender)) return true;
  sender.counters.msgs_sent.Add(1);
  sender.counters.bytes_sent.Add(d.len);
  if (rndv) {
    sender.counters.rndv_msgs_sent.Add(1);
    sender.counters.rndv_bytes_sent.Add(d.len);
  }
  return true;
}

bool Remote::AmRequest(Endpoint& sender, const shm::SubmissionDesc& d,
                       const PeerLink& to, bool may_hold) {
  const uint64_t dst = to.epid;
  shm::PoolPayload payload = shm::PayloadOf(sender.job()->pool().base(), d);
  Peer* p = PeerOf(shm::NodeIdOf(dst));
  if (p == nullptr || to.gone) {
    engine_->PostErrorFor(sender, d.req, PSM2_EPID_UNREACHABLE);
    return true;
  }
  if ((p->queue.size() >= kMaxQueued || Held(*p, dst)) && may_hold) {
    payload.Take();
    return false;
  }
  uint32_t flags = 0;
  if (d.flags & shm::kAmNoReply) flags |= shm::kAmRequestNoReply;
  if (d.flags & shm::kAmWantsAck) flags |= shm::kAmRequestWantsAck;
  SendAm(*p, /*reply=*/false, sender, dst, d, &payload, flags);
  if (engine_->IsLocal(sender)) sender.counters.am_requests_sent.Add(1);
  return true;
}

void Remote::AmReplyOrAck(Endpoint& sender, const shm::SubmissionDesc& d) {
  shm::PoolPayload payload = shm::PayloadOf(sender.job()->pool().base(), d);
  const uint64_t dst = proxies_.EpidOf(d.peer);
  Peer* p = dst == 0 ? nullptr : PeerOf(shm::NodeIdOf(dst));
  if (d.op == shm::SubmitOp::kAmAck) {
    if (p == nullptr) return;  // the requester's node is gone
    Post(*p, wire::PrepAmAck(SenderOf(sender), dst, d.body.ack.request,
                             d.body.ack.handler, d.body.ack.error));
    return;
  }
  if (p == nullptr) {
    engine_->PostErrorFor(sender, d.req, PSM2_EPID_UNREACHABLE);
    return;
  }
  SendAm(*p, /*reply=*/true, sender, dst, d, &payload,
         (d.flags & shm::kAmWantsAck) ? shm::kAmRequestWantsAck : 0);
  if (engine_->IsLocal(sender)) sender.counters.am_replies_sent.Add(1);
}

void Remote::SendAm(Peer& p, bool reply, const Endpoint& sender, uint64_t dst,
                    const shm::SubmissionDesc& d, shm::PoolPayload* payload,
                    uint32_t wire_flags) {
  const wire::Envelope env =
      wire::PrepActiveMessage(reply, SenderOf(sender), dst, d.req, d.tag[0],
                              d.tag[1], d.len, wire_flags, d.body.inline_data);
  Post(p, env);
  if (wire::PayloadFollows(env)) {
    Enqueue(p, PayloadFrame(sender, dst, d.req, payload, d.len));
  }
  if (d.flags & shm::kAmWantsAck) p.awaiting.insert({sender.id(), d.req});
}

std::unique_ptr<Remote::OutFrame> Remote::ChunkFrame(
    const Endpoint& sender, const hw::FrameFields& fields,
    shm::PoolPayload* payload, uint32_t len) {
  auto f = std::make_unique<OutFrame>();
  f->msg.f = fields;
  f->chunk_base = sender.job()->pool().base();
  f->chunk_offset = payload->Take();
  f->chunk_job = sender.job();
  PagesOf(sender.job()).pages.Prepare(f->chunk_offset, len);
  f->iov = {f->chunk_base + f->chunk_offset, len};
  return f;
}

std::unique_ptr<Remote::OutFrame> Remote::PayloadFrame(
    const Endpoint& sender, uint64_t dst, uint64_t req,
    shm::PoolPayload* payload, uint32_t len) {
  return ChunkFrame(sender, wire::PrepPayload(SenderOf(sender), dst, req),
                    payload, len);
}

bool Remote::RndvData(Endpoint& sender, const shm::SubmissionDesc& d) {
  auto it = out_transfers_.find(d.body.rndv.transfer);
  if (it == out_transfers_.end()) return false;
  OutTransfer& t = *it->second;
  if (t.sender != sender.id() || d.body.rndv.offset != t.forwarded ||
      d.len > t.send_bytes - t.forwarded) {
    return false;  // reported by the engine as a bad chunk
  }
  shm::PoolPayload chunk = shm::PayloadOf(sender.job()->pool().base(), d);
  t.forwarded += d.len;
  Peer* p = t.dead ? nullptr : PeerOf(t.node);
  if (p != nullptr && t.rma) {
    AnnouncePiece(*p, t, sender, d, &chunk);  // the receiver reads it
  } else if (p != nullptr) {
    Enqueue(*p, ChunkFrame(
                    sender,
                    wire::PrepRndvData(SenderOf(sender), t.dst,
                                       t.remote_transfer, d.body.rndv.offset),
                    &chunk, d.len));
  }
  if (t.forwarded == t.send_bytes) out_transfers_.erase(it);
  return true;
}

void Remote::CompleteSync(const Endpoint& receiver, const UnexpectedMsg& m,
                          int32_t error) {
  if (m.sender_id != 0) {  // a kept payload: its sender is waiting only
    TakeKept(m, nullptr);  // if it sent a sync message
    if (!(m.flags & shm::kSendSync)) return;
  }
  TellSender(receiver, m, error);
}

void Remote::TellSender(const Endpoint& receiver, const UnexpectedMsg& m,
                        int32_t error) {
  const wire::Sender from = SenderOf(receiver);
  PostTo(shm::NodeIdOf(m.remote_src),
         error == PSM2_OK
             ? wire::PrepSyncAck(from, m.remote_src, m.sender_req)
             : wire::PrepError(from, m.remote_src, m.sender_req, error));
}

void Remote::StartTransfer(Endpoint& receiver, uint64_t recv_req,
                           uint32_t send_bytes, const UnexpectedMsg& m) {
  if (m.sender_id != 0) {
    DeliverKept(receiver, recv_req, send_bytes, m);
    return;
  }
  const uint16_t node = shm::NodeIdOf(m.remote_src);
  Peer* p = PeerOf(node);
  if (p == nullptr) {
    if (send_bytes > 0) {
      engine_->PostErrorFor(receiver, recv_req, PSM2_EPID_UNREACHABLE);
    }
    return;
  }
  uint64_t transfer = 0;
  if (send_bytes > 0) {
    transfer = next_in_transfer_++;
    // Offered as RMA where this daemon can read into the receiver's pool
    // (rma.cc); the sender decides.
    const bool rma = OfferRma(receiver);
    if (rma) transfer |= wire::kRmaOfferBit;
    auto t = std::make_unique<InTransfer>(
        InTransfer{node, receiver.id(), recv_req, m.remote_src, send_bytes, 0,
                   m.sender_req});
    t->rma = rma;
    t->to = SenderOf(receiver);
    in_transfers_[transfer] = std::move(t);
  }
  Post(*p, wire::PrepRndvGo(SenderOf(receiver), m.remote_src, m.sender_req,
                            send_bytes, transfer));
}

void Remote::EndpointRemoved(uint32_t id) {
  for (auto& [tid, t] : in_transfers_) {
    if (t->receiver != id) continue;
    // Its chunks still come (and are dropped); the sender learns at once,
    // unless nothing more comes (all read, or a payload kept here).
    t->receiver = 0;
    if (t->accepted == t->send_bytes) continue;
    if (Endpoint* r = engine_->FindAny(id)) {
      PostTo(t->node, wire::PrepError(SenderOf(*r), t->src, t->sender_req,
                                      PSM2_EPID_UNREACHABLE));
    }
  }
  for (auto it = out_transfers_.begin(); it != out_transfers_.end();) {
    OutTransfer& t = *it->second;
    if (t.sender != id) {
      ++it;
      continue;
    }
    // The receiver would wait for the rest of the message.
    if (!t.dead) {
      PostTo(t.node, wire::PrepAbort(t.from, t.dst, t.remote_transfer,
                                     PSM2_EPID_UNREACHABLE));
    }
    it = out_transfers_.erase(it);
  }
  // Their kRndvGo finds no sender.
  DropConverted([id](const Converted& c) { return c.sender == id; });
  // Nodes that connected to it learn it is gone, after everything it sent
  // (one connection per node pair keeps the order; a kGone waits behind its
  // endpoint's frames set aside: Defer).
  if (auto w = watchers_.find(id); w != watchers_.end()) {
    if (Endpoint* ep = engine_->FindAny(id)) {
      for (uint16_t node : w->second) {
        PostTo(node, wire::PrepGone(SenderOf(*ep), PSM2_EPID_UNREACHABLE));
      }
    }
    watchers_.erase(w);
  }
  const Endpoint* removed = engine_->FindAny(id);
  for (auto& [node, p] : peers_) {
    if (removed != nullptr) p->consumed.erase(removed->epid());
    for (auto a = p->awaiting.begin(); a != p->awaiting.end();) {
      a = a->first == id ? p->awaiting.erase(a) : std::next(a);
    }
    if (p->expect_payload && p->pending.receiver == id) {
      p->pending.receiver = 0;  // its inbox chunk is released on arrival
    }
  }
}

}  // namespace psmd
