// Remote: receiving. Each frame's header is checked and its op's handler
// (kHandlers, row for row with wire::kOpTraits) places its bytes or decides
// its decoded envelope.
#include "daemon/remote/remote_state.h"

#include <psm2.h>

#include <algorithm>
#include <string>

#include "shm/epid.h"

namespace psmd {

// Indexed by wire::Op, row for row with wire::kOpTraits: a data op's handler
// decides where its bytes go once its header is in; an envelope's handles
// it once decoded.
constexpr Remote::Handler Remote::kHandlers[wire::kOpCount] = {
    /* kInvalid  */ {},  // refused by wire::CheckHeader
    /* kQuery    */ On(&Remote::OnQuery),
    /* kAnswer   */ On(&Remote::OnAnswer),
    /* kEnvelope */ On(&Remote::OnMessage),
    /* kPayload  */ On(&Remote::OnPayloadHeader),
    /* kSyncAck  */ On(&Remote::OnSendAnswer),
    /* kRndvGo   */ On(&Remote::OnRndvGo),
    /* kRndvData */ On(&Remote::OnChunkHeader),
    /* kAmRequest*/ On(&Remote::OnActiveMessage),
    /* kAmReply  */ On(&Remote::OnActiveMessage),
    /* kAmAck    */ On(&Remote::OnAmAck),
    /* kError    */ On(&Remote::OnSendAnswer),
    /* kAbort    */ On(&Remote::OnAbort),
    /* kPing     */ On(&Remote::OnPing),
    /* kGone     */ On(&Remote::OnGone),
    /* kXoff     */ On(&Remote::OnXoff),
    /* kXon      */ On(&Remote::OnXon),
    /* kEagerOff */ On(&Remote::OnEagerOff),
    /* kEagerOn  */ On(&Remote::OnEagerOn),
    /* kRndvRead */ On(&Remote::OnRndvRead),
    /* kRndvReadDone */ On(&Remote::OnRndvReadDone),
};

// (Shapes, not the pointers: GCC cannot compare member pointers in a
// constant expression under -fsanitize=undefined.)
constexpr bool Remote::EveryOpHasItsHandler() {
  for (uint16_t op = 0; op < wire::kOpCount; op++) {
    if (kHandlers[op].shape != wire::kOpTraits[op].shape) return false;
  }
  return true;
}

void Remote::OnHeader(Peer& p, const hw::Event& e) {
  static_assert(EveryOpHasItsHandler(), "a handler per op, of its shape");
  p.last_recv_ms = NowMs();
  p.f = e.fields;
  p.length = e.length;
  const wire::Error error = wire::CheckHeader(p.node, e.fields, e.length);
  if (error != wire::Error::kOk) {
    Drop(p, wire::ErrorName(error));
    return;
  }
  // After a message envelope whose payload follows, that payload and
  // nothing else.
  const bool payload =
      wire::TraitsOf(e.fields.op).payload == wire::Payload::kFrame;
  if (p.expect_payload != payload) {
    Drop(p, payload ? "payload without its envelope"
                    : "envelope without its payload");
    return;
  }
  if (const DataHandler data = kHandlers[e.fields.op].data) {
    (this->*data)(p, e);
    return;
  }
  p.rx = Peer::Rx::kEnvelope;
  ReadBody(p, p.env, e.length);
}

void Remote::ReadBody(Peer& p, uint8_t* to, uint32_t length) {
  iovec iov{to, length};
  if (to == nullptr) {
    p.discard.resize(std::min<uint32_t>(length, kDiscardBytes));
    iov = {p.discard.data(), p.discard.size()};
  }
  fabric_->PostPayload(p.conn, &iov, 1, p.node);
}

uint8_t* Remote::ParkedBody(Peer& p, uint64_t dst, uint32_t length) {
  std::vector<uint8_t>& to = p.parked[dst].back().payload;
  to.resize(length);
  return to.data();
}

void Remote::OnPayloadHeader(Peer& p, const hw::Event& e) {
  const hw::FrameFields& env = p.pending.env.f;
  if (e.length != p.pending.env.r.len || e.fields.aux != env.aux ||
      e.fields.dst != env.dst) {
    Drop(p, "payload without its envelope");
    return;
  }
  uint8_t* to = nullptr;  // nobody takes it
  if (p.park_payload) {
    to = ParkedBody(p, env.dst, e.length);
  } else if (p.pending.keep) {
    p.pending.kept.resize(e.length);
    to = p.pending.kept.data();
  } else if (p.pending.receiver != 0) {
    to = p.pending.job->pool().base() + p.pending.chunk;
  }
  p.rx = Peer::Rx::kPayload;
  ReadBody(p, to, e.length);
}

void Remote::OnChunkHeader(Peer& p, const hw::Event& e) {
  auto it = in_transfers_.find(e.fields.aux);
  // (Not into a transfer that reads by RMA: chunks reach the receiver in
  // order, and its reads may still be landing.)
  if (it == in_transfers_.end() || it->second->node != p.node ||
      it->second->src != e.fields.src || it->second->has_region ||
      e.fields.offset != it->second->accepted ||
      e.length > it->second->send_bytes - it->second->accepted) {
    Drop(p, "rendezvous chunk of no transfer, or out of order");
    return;
  }
  InTransfer& t = *it->second;
  p.chunk_transfer = e.fields.aux;
  p.chunk_offset = 0;
  p.chunk_job.reset();
  p.park_chunk = false;
  Endpoint* r = t.receiver == 0 ? nullptr : engine_->FindAny(t.receiver);
  if (r != nullptr) {
    // Behind what is parked for its receiver, or parked itself when the
    // inbox is full.
    if (p.parked.count(e.fields.dst) != 0 ||
        !AllocInbox(*r, e.length, &p.chunk_offset)) {
      if (!Park(p, /*chunk=*/true)) {
        p.rx = Peer::Rx::kPaused;  // retried in Poll
        return;
      }
    } else {
      p.chunk_job = r->job();
    }
  }
  t.accepted += e.length;
  uint8_t* to = nullptr;  // its receiver left
  if (p.park_chunk) {
    to = ParkedBody(p, e.fields.dst, e.length);
  } else if (p.chunk_job) {
    to = p.chunk_job->pool().base() + p.chunk_offset;
  }
  p.rx = Peer::Rx::kChunk;
  ReadBody(p, to, e.length);
}

void Remote::OnRecvDone(Peer& p, const hw::Event& e) {
  // A discarded payload longer than the scratch buffer ends kTruncated.
  if (e.error != hw::ErrorClass::kOk && e.error != hw::ErrorClass::kTruncated)
    return;  // kClosed follows
  switch (p.rx) {
    case Peer::Rx::kEnvelope: {
      const wire::Error error =
          wire::DecodeEnvelope(p.node, p.f, p.env, p.length, &p.in);
      if (error != wire::Error::kOk) {
        Drop(p, wire::ErrorName(error));
        return;
      }
      if (Admit(p, p.in) == Verdict::kDone) {
        Consumed(p, p.f, WindowBytes(p.f, p.length));
      } else if (!Park(p, /*chunk=*/false)) {
        p.rx = Peer::Rx::kPaused;
        return;
      }
      break;
    }
    case Peer::Rx::kPayload:
      if (p.park_payload) {
        p.park_payload = false;
        p.expect_payload = false;
        p.pending = Pending{};
      } else {
        OnPayload(p);
        Consumed(p, p.f, WindowBytes(p.f, p.length));
      }
      break;
    case Peer::Rx::kChunk:
      if (p.park_chunk) {
        p.park_chunk = false;
      } else {
        OnChunk(p.chunk_transfer, p.chunk_job, p.chunk_offset, p.length);
        p.chunk_job.reset();
        Consumed(p, p.f, WindowBytes(p.f, p.length));
      }
      break;
    default:
      Drop(p, "receive completion out of turn");
      return;
  }
  RecvNext(p);
}

namespace {

// The completion an active message arrives as, but for its payload.
shm::CompletionDesc AmArrival(const wire::Envelope& in, uint32_t proxy) {
  shm::CompletionDesc c{};
  c.op = in.op() == wire::Op::kAmRequest ? shm::CompleteOp::kAmRequest
                                         : shm::CompleteOp::kAmReply;
  c.flags = static_cast<uint8_t>(in.r.flags);
  c.req = in.f.aux;
  c.tag[0] = in.r.tag[0];
  c.tag[1] = in.r.tag[1];
  c.tag[2] = proxy;
  c.msg_len = in.r.len;
  c.src_epid = in.f.src;
  return c;
}

}  // namespace

void Remote::OnPayload(Peer& p) {
  Pending& q = p.pending;
  const hw::FrameFields& f = q.env.f;
  p.expect_payload = false;
  Endpoint* r = q.receiver == 0 ? nullptr : engine_->FindAny(q.receiver);
  if (r == nullptr || r->job() != q.job) {
    if (q.job && !q.keep) shm::ReleaseChunk(q.job->pool().base(), q.chunk);
    if (q.env.op() == wire::Op::kEnvelope && (q.env.r.flags & shm::kSendSync) &&
        q.receiver != 0) {
      Post(p, wire::PrepError(wire::ReceiverOf(f), f.src, f.aux,
                              PSM2_EPID_UNREACHABLE));
    }
  } else if (q.env.op() == wire::Op::kEnvelope) {
    UnexpectedMsg m{};
    m.flags = static_cast<uint8_t>(q.env.r.flags);
    m.len = q.env.r.len;
    m.sender_req = f.aux;
    m.pool_offset = q.chunk;
    m.remote_src = f.src;
    Kept* kept = nullptr;
    if (q.keep) {  // a rendezvous from this daemon's memory
      m.rendezvous = true;
      m.pool_offset = 0;
      m.sender_id = p.NextKeptId(&next_kept_);
      kept = &p.kept[m.sender_id];
      kept->f = f;
      kept->bytes = std::move(q.kept);
      kept->charged = sizeof(Kept) + kept->bytes.size();
      p.parked_bytes += kept->charged;
      counts_by_node_[p.node].kept++;
    }
    if (!engine_->IsLocal(*r)) {
      // Invariant 12: it arrives whole on its receiver's shard, which says
      // nothing back about a match; a kept payload counts as waiting
      // until its receive asks for it (StartTransfer) or it is dropped.
      if (kept != nullptr) {
        kept->waiting = true;
        if (p.kept_waiting[f.dst]++ == 0) {
          Post(p, wire::PrepFlow(wire::Op::kEagerOff, wire::ReceiverOf(f)));
        }
      }
      engine_->ArriveAcross(*r, KeyOf(f.src, q.env.r.tag), m);
      q = Pending{};
      return;
    }
    const MqEngine::Arrival arrival = engine_->Arrive(
        *r, KeyOf(f.src, q.env.r.tag), m, MqEngine::Part::kPayload,
        q.matched ? &q.recv : nullptr);
    if (arrival == MqEngine::Arrival::kQueued && kept != nullptr) {
      kept->waiting = true;
      if (p.kept_waiting[f.dst]++ == 0) {  // (takes uid and job of f)
        Post(p, wire::PrepFlow(wire::Op::kEagerOff, wire::ReceiverOf(f)));
      }
    }
  } else {  // kAmRequest, kAmReply
    shm::CompletionDesc c = AmArrival(q.env, proxies_.For(f.src));
    c.body.pool.pool_offset = q.chunk;
    PostAm(*r, c);
  }
  q = Pending{};
}

void Remote::OnChunk(uint64_t transfer_id, const std::shared_ptr<Job>& job,
                     uint64_t chunk, uint32_t len) {
  auto it = in_transfers_.find(transfer_id);
  if (it == in_transfers_.end()) {
    if (job) shm::ReleaseChunk(job->pool().base(), chunk);
    return;
  }
  InTransfer& t = *it->second;
  Endpoint* r = t.receiver == 0 ? nullptr : engine_->FindAny(t.receiver);
  if (job && (r == nullptr || r->job() != job)) {
    shm::ReleaseChunk(job->pool().base(), chunk);
  } else if (job) {
    shm::CompletionDesc c{};
    c.op = shm::CompleteOp::kRndvChunk;
    c.req = t.recv_req;
    c.body.chunk.pool_offset = chunk;
    c.body.chunk.offset = t.received;
    c.body.chunk.len = len;
    engine_->PostFor(*r, c);
  }
  t.received += len;
  if (t.received == t.send_bytes) in_transfers_.erase(it);
}

void Remote::PostAm(Endpoint& r, const shm::CompletionDesc& c) {
  if (engine_->IsLocal(r)) {
    engine_->Post(r, c);
  } else {
    engine_->AmArriveAcross(r, c);
  }
}

Remote::Verdict Remote::Handle(Peer& p, const wire::Envelope& in) {
  return (this->*kHandlers[in.f.op].envelope)(p, in);
}

Remote::Verdict Remote::OnQuery(Peer& p, const wire::Envelope& in) {
  Endpoint* t = Target(in.f);
  if (t == nullptr) Refused(p.node, in.f, "connect");
  if (t != nullptr) watchers_[t->id()].insert(p.node);
  Post(p, wire::PrepAnswer(wire::ReceiverOf(in.f), in.f.src, in.f.aux,
                           t != nullptr ? PSM2_OK : PSM2_EPID_UNREACHABLE));
  return Verdict::kDone;
}

Remote::Verdict Remote::OnAnswer(Peer& p, const wire::Envelope& in) {
  auto it = queries_.find(in.f.aux);
  if (it != queries_.end() && it->second->node == p.node) {
    QueryDone done = std::move(it->second->done);
    queries_.erase(it);
    const int32_t error = in.r.error;
    done(error,
         error == PSM2_OK
             ? std::string()
             : nodes_.NodeName(p.node) +
                   " has no endpoint of this job and uid with that epid");
  }
  return Verdict::kDone;
}

Remote::Verdict Remote::OnSendAnswer(Peer& p, const wire::Envelope& in) {
  const hw::FrameFields& f = in.f;
  Endpoint* t = Target(f);
  if (t == nullptr) return Verdict::kDone;  // the sender is gone
  if (f.aux & wire::kConvertedBit) {
    OnConverted(p, in, *t);
    return Verdict::kDone;
  }
  p.awaiting.erase({t->id(), f.aux});
  if (in.op() == wire::Op::kSyncAck) {
    shm::CompletionDesc c{};
    c.op = shm::CompleteOp::kSendDone;
    c.req = f.aux;
    c.error = in.r.error;
    engine_->PostFor(*t, c);
    return Verdict::kDone;
  }
  // A rendezvous send streaming to a receiver that left: its chunks still
  // on the ring are dropped.
  for (auto& [id, out] : out_transfers_) {
    if (out->sender == t->id() && out->sender_req == f.aux) out->dead = true;
  }
  engine_->PostErrorFor(*t, f.aux, in.r.error);
  return Verdict::kDone;
}

Remote::Verdict Remote::OnRndvGo(Peer& p, const wire::Envelope& in) {
  const hw::FrameFields& f = in.f;
  const wire::Record& w = in.r;
  Endpoint* t = Target(f);
  if (t == nullptr) {
    // The sender left: the receiver would wait for its data.
    if (w.len > 0) {
      Post(p, wire::PrepAbort(wire::ReceiverOf(f), f.src, w.x,
                              PSM2_EPID_UNREACHABLE));
    }
    return Verdict::kDone;
  }
  if (f.aux & wire::kConvertedBit) {
    OnConverted(p, in, *t);
    return Verdict::kDone;
  }
  p.awaiting.erase({t->id(), f.aux});
  shm::CompletionDesc go{};
  go.op = shm::CompleteOp::kRndvGo;
  go.req = f.aux;
  go.error = PSM2_OK;
  go.body.go.send_bytes = w.len;
  if (w.len > 0) {
    go.body.go.transfer = engine_->NewTransferId();
    out_transfers_[go.body.go.transfer] = std::make_unique<OutTransfer>(
        OutTransfer{p.node, t->id(), f.src, w.x, w.len, 0, false, f.aux,
                    wire::ReceiverOf(f), UseRma(*t, w.x)});
  }
  engine_->PostFor(*t, go);
  return Verdict::kDone;
}

Remote::Verdict Remote::OnPing(Peer&, const wire::Envelope&) {
  return Verdict::kDone;  // heard: CheckLiveness counts from its header
}

Remote::Verdict Remote::OnGone(Peer& p, const wire::Envelope& in) {
  const hw::FrameFields& f = in.f;
  // No credit comes for it any more, nor a kXon: what waits for it goes
  // (and is refused there), and its flags go with it.
  p.unconsumed.erase(f.src);
  p.off.erase(f.src);
  p.eager_off.erase(f.src);
  Resume(p, f.src);
  proxies_.Drop(f.src);
  engine_->EpidGone(f.src, f.uid, f.job);  // on every shard
  return Verdict::kDone;
}

Remote::Verdict Remote::OnAbort(Peer& p, const wire::Envelope& in) {
  auto it = in_transfers_.find(in.f.aux);
  if (it == in_transfers_.end() || it->second->node != p.node ||
      it->second->src != in.f.src) {
    return Verdict::kDone;
  }
  if (it->second->receiver != 0) {
    if (Endpoint* r = engine_->FindAny(it->second->receiver)) {
      engine_->PostErrorFor(*r, it->second->recv_req, in.r.error);
    }
  }
  EndReads(*it->second, in.r.error, /*tell=*/true);
  in_transfers_.erase(it);
  return Verdict::kDone;
}

Remote::Verdict Remote::OnAmAck(Peer& p, const wire::Envelope& in) {
  Endpoint* t = Target(in.f);
  if (t == nullptr) return Verdict::kDone;
  p.awaiting.erase({t->id(), in.f.aux});
  shm::CompletionDesc c{};
  c.op = shm::CompleteOp::kAmAcked;
  c.req = in.f.aux;
  c.error = in.r.error;
  c.tag[0] = in.r.tag[0];
  c.src_epid = in.f.src;
  engine_->PostFor(*t, c);
  return Verdict::kDone;
}

Endpoint* Remote::Receiver(Peer& p, const wire::Envelope& in) {
  if (Endpoint* r = Target(in.f)) return r;
  const hw::FrameFields& f = in.f;
  Refused(p.node, f,
          in.op() == wire::Op::kEnvelope ? "a message" : "an active message");
  // As for a local receiver that is gone, the sender's request gets an
  // error completion (a reply's sender is not waiting for one).
  if (in.op() != wire::Op::kAmReply) {
    Post(p, wire::PrepError(wire::ReceiverOf(f), f.src, f.aux,
                            PSM2_EPID_UNREACHABLE));
  }
  if (wire::PayloadFollows(in)) {  // read and drop it
    p.pending = Pending{};
    p.pending.env = in;
    p.expect_payload = true;
  }
  return nullptr;
}

Remote::Verdict Remote::OnActiveMessage(Peer& p, const wire::Envelope& in) {
  Endpoint* r = Receiver(p, in);
  if (r == nullptr) return Verdict::kDone;
  // Held while the target is slow (on another shard: while it has not
  // taken those in flight to it).
  if (engine_->IsLocal(*r) ? MqEngine::AmHeld(*r)
                           : !engine_->MayArriveAcross(*r)) {
    return Verdict::kPause;
  }
  if (!wire::PayloadFollows(in)) {
    shm::CompletionDesc c = AmArrival(in, proxies_.For(in.f.src));
    c.flags |= shm::kPayloadInline;
    std::memcpy(c.body.inline_data, in.inline_data, in.inline_len);
    PostAm(*r, c);
    return Verdict::kDone;
  }
  Pending q;
  q.env = in;
  if (!AllocInbox(*r, in.r.len, &q.chunk)) return Verdict::kPause;
  q.receiver = r->id();
  q.job = r->job();
  p.pending = std::move(q);
  p.expect_payload = true;
  return Verdict::kDone;
}

Remote::Verdict Remote::OnMessage(Peer& p, const wire::Envelope& in) {
  Endpoint* r = Receiver(p, in);
  if (r == nullptr) return Verdict::kDone;
  const wire::Record& w = in.r;
  UnexpectedMsg m{};
  m.flags = static_cast<uint8_t>(w.flags);
  m.rendezvous = (w.flags & wire::kFlagRndv) != 0;
  m.len = w.len;
  m.sender_req = in.f.aux;
  m.remote_src = in.f.src;
  std::memcpy(m.inline_data, in.inline_data, in.inline_len);
  const MsgKey key = KeyOf(in.f.src, w.tag);
  // A receiver of another shard takes the message whole there (invariant
  // 12 of mq_engine.h): it waits here while kFabricCredit are in flight to
  // it, which its budgets hold back.
  const bool here = engine_->IsLocal(*r);
  if (!here && !engine_->MayArriveAcross(*r)) return Verdict::kPause;
  if (!wire::PayloadFollows(in)) {
    if (!here) {
      engine_->ArriveAcross(*r, key, m);
      return Verdict::kDone;
    }
    return engine_->Arrive(*r, key, m) == MqEngine::Arrival::kHeld
               ? Verdict::kPause
               : Verdict::kDone;
  }
  // The payload follows. A receive it matches is taken now (and kept
  // across pauses: the message is next in its flow anyway); otherwise the
  // budget must admit it. Then it needs inbox space. (On another shard
  // neither is known here: its payload takes the share of a message that
  // may stay unexpected.)
  if (p.has_held && p.held_receiver != r->id()) p.has_held = false;
  if (here && !p.has_held) {
    switch (
        engine_->Arrive(*r, key, m, MqEngine::Part::kEnvelope, &p.held_recv)) {
      case MqEngine::Arrival::kMatched:
        p.has_held = true;
        p.held_receiver = r->id();
        break;
      case MqEngine::Arrival::kHeld:
        return Verdict::kPause;
      case MqEngine::Arrival::kQueued:
        break;
    }
  }
  Pending q;
  q.env = in;
  // A message that may stay unexpected takes at most half the inbox; the
  // rest is for the ones receives wait for. When that has had no room for
  // a while, its payload is kept (remote.h, back-pressure 3).
  if (!AllocInbox(
          *r, w.len, &q.chunk,
          p.has_held ? shm::ChunkUse::kBrief : shm::ChunkUse::kMayLinger)) {
    const auto& inbox = PagesOf(r->job()).inbox;
    if (!inbox || !inbox->Stalled() ||
        p.parked_bytes + sizeof(Kept) + w.len > kParkMax) {
      return Verdict::kPause;
    }
    q.keep = true;
  }
  q.matched = p.has_held;
  q.recv = p.held_recv;
  p.has_held = false;
  q.receiver = r->id();
  q.job = r->job();
  p.pending = std::move(q);
  p.expect_payload = true;
  return Verdict::kDone;
}

Endpoint* Remote::Target(const hw::FrameFields& f) {
  if (shm::NodeIdOf(f.dst) != node_id_ ||
      shm::BootNonceOf(f.dst) != boot_nonce_) {
    return nullptr;
  }
  Endpoint* ep = engine_->FindAny(shm::EndpointIdOf(f.dst));
  // (Another shard's endpoint is checked where it is served.)
  if (ep == nullptr || (engine_->IsLocal(*ep) && !MqEngine::Served(*ep)) ||
      ep->epid() != f.dst || ep->uid() != f.uid ||
      std::memcmp(ep->job()->key().uuid.data(), f.job, 16) != 0) {
    return nullptr;
  }
  return ep;
}

Remote::JobPages& Remote::PagesOf(const std::shared_ptr<Job>& job) {
  auto& slot = job_pages_[job.get()];
  if (slot && slot->job.lock() == job) return *slot;
  // A new job (or a new one at a gone job's address): the moment to forget
  // the jobs that are gone, so the map holds live jobs only.
  for (auto it = job_pages_.begin(); it != job_pages_.end();) {
    it = it->second && it->second->job.expired() ? job_pages_.erase(it)
                                                 : std::next(it);
  }
  auto& fresh = job_pages_[job.get()];
  fresh = std::make_unique<JobPages>();
  fresh->job = job;
  fresh->pages = shm::Prefaulter(job->pool().base(), job->pool().size());
  if (auto region = job->InboxRegion()) {
    fresh->inbox.emplace(job->pool().base(), region->offset, region->bytes);
  }
  return *fresh;
}

bool Remote::AllocInbox(Endpoint& ep, uint32_t bytes, uint64_t* offset,
                        shm::ChunkUse use) {
  JobPages& job = PagesOf(ep.job());
  if (!job.inbox || bytes > job.inbox->MaxPayload()) return false;
  auto got = job.inbox->Allocate(bytes, use);
  if (!got) return false;
  job.pages.Prepare(*got - shm::kChunkHeaderBytes,
                    uint64_t{bytes} + shm::kChunkHeaderBytes);
  *offset = *got;
  return true;
}

}  // namespace psmd
