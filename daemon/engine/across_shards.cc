// The engine's part across shards (mq_engine.h, invariant 11): what one
// shard hands another through the Crossing, and what it does with what it
// is handed. Each function runs on the worker of the shard it names.
#include <psm2.h>

#include <algorithm>

#include "daemon/clock.h"
#include "daemon/engine/mq_engine.h"
#include "shm/payload.h"
#include "shm/pool.h"

namespace psmd {

namespace {

// Items taken from one incoming lane per pass: another shard's flood
// costs this shard a bounded slice of each pass (invariant 7's aim).
constexpr size_t kLaneBatch = 256;
constexpr size_t kPopBatch = 64;

// The chunk an item hands over that must go back to its sender if the item
// goes nowhere (0: none; chunk offsets are never 0).
uint64_t ChunkOf(const CrossItem& item) {
  if (item.kind == CrossKind::kArrive ||
      item.kind == CrossKind::kRemoteArrive) {
    const UnexpectedMsg& m = item.arrive.msg;
    return m.rendezvous || shm::IsInline(m.len) ? 0 : m.pool_offset;
  }
  const shm::CompletionDesc& c = item.am.c;  // kAm, kRemoteAm
  return c.op == shm::CompleteOp::kAmAcked || shm::IsInline(c.msg_len)
             ? 0
             : c.body.pool.pool_offset;
}

bool Credited(const CrossItem& item) {
  return item.kind == CrossKind::kArrive ||
         item.kind == CrossKind::kRemoteArrive ||
         item.kind == CrossKind::kRemoteAm ||
         (item.kind == CrossKind::kAm && (item.flags & kAmTakesCredit));
}

}  // namespace

void MqEngine::JoinShards(Crossing* crossing, uint32_t shard) {
  crossing_ = crossing;
  shard_ = shard;
  shards_ = crossing->shards();
  next_transfer_ = shards_ + shard_;  // ids of this shard, never 0
  outbox_.resize(shards_);
  wake_.assign(shards_, 0);
}

// Inlined into Push: one call per item, as before owners (engine_scale).
[[gnu::always_inline]] inline void MqEngine::PushItem(uint32_t to,
                                                      const CrossItem& item) {
  std::deque<CrossItem>& out = outbox_[to];
  // Behind what waits already (Crossing invariant 1).
  if (!out.empty() || !crossing_->TryPush(shard_, to, item)) {
    out.push_back(item);
    outbox_items_++;
  }
  wake_[to] = 1;
}

void MqEngine::Push(uint32_t to, const CrossItem& item) {
  if (pushing_ != nullptr) {  // a control submission's (PollControl)
    CrossItem owned = item;
    owned.count = pushing_->id();  // its owner (crossing.h)
    pushing_->ctl_in_flight++;
    PushItem(to, owned);
  } else {
    PushItem(to, item);
  }
}

void MqEngine::PostTo(uint32_t id, const shm::CompletionDesc& c) {
  if (Local(id)) {
    if (Endpoint* ep = Find(id)) Post(*ep, c);
    return;
  }
  CrossItem item{};
  item.kind = CrossKind::kPost;
  item.to = id;
  item.post = c;
  Push(ShardOf(id, shards_), item);
}

void MqEngine::PostErrorTo(uint32_t id, uint64_t req, int32_t error) {
  PostTo(id, ErrorCompletion(req, error));
}

bool MqEngine::SendAcross(Endpoint& sender, uint32_t receiver_id,
                          const MsgKey& key, const UnexpectedMsg& m) {
  // A closing sender's last sends go regardless: it saw them complete.
  if (sender.cross_in_flight >= kCrossCredit && !admit_over_budget_)
    return false;
  CrossItem item{};
  item.kind = CrossKind::kArrive;
  item.to = receiver_id;
  item.from = sender.id();
  item.arrive.key = key;
  item.arrive.msg = m;
  sender.cross_in_flight++;
  cross_out_.Add(1);
  Push(ShardOf(receiver_id, shards_), item);
  return true;
}

bool MqEngine::AmAcross(Endpoint& sender, uint32_t target_id,
                        const shm::CompletionDesc& c, bool request) {
  // Replies and acks come off the control ring, which is always read
  // (invariant 4), and are never held where they go: no credit.
  if (request) {
    if (sender.cross_in_flight >= kCrossCredit && !admit_over_budget_)
      return false;
    sender.cross_in_flight++;
  }
  CrossItem item{};
  item.kind = CrossKind::kAm;
  item.flags = request ? kAmTakesCredit : 0;
  item.to = target_id;
  item.from = sender.id();
  item.am.c = c;
  item.am.job = sender.job()->key();
  cross_out_.Add(1);
  Push(ShardOf(target_id, shards_), item);
  return true;
}

bool MqEngine::ChunkAcross(Endpoint& sender, const shm::SubmissionDesc& d) {
  CrossItem item{};
  item.kind = CrossKind::kChunk;
  item.from = sender.id();
  item.chunk.transfer = d.body.rndv.transfer;
  item.chunk.req = d.req;
  item.chunk.offset = d.body.rndv.offset;
  item.chunk.pool_offset = d.body.rndv.pool_offset;
  item.chunk.len = d.len;
  sender.last_chunk_ns.store(copy_clock_(), std::memory_order_relaxed);
  Push(static_cast<uint32_t>(d.body.rndv.transfer % shards_), item);
  return true;
}

bool MqEngine::CrossingPending() {
  if (outbox_items_ > 0) return true;
  for (uint32_t from = 0; from < shards_; from++) {
    if (from != shard_ && crossing_->Pending(from, shard_)) return true;
  }
  return false;
}

bool MqEngine::HeldForBudget() const {
  if (!held_items_.empty() || !held_fabric_.empty()) return true;
  return std::any_of(order_.begin(), order_.end(), [](const Endpoint* ep) {
    return !ep->held_sends.empty();
  });
}

bool MqEngine::PollCrossing() {
  bool did = false;
  // What full lanes did not take goes before anything new.
  for (uint32_t to = 0; outbox_items_ > 0 && to < shards_; to++) {
    std::deque<CrossItem>& out = outbox_[to];
    while (!out.empty() && crossing_->TryPush(shard_, to, out.front())) {
      out.pop_front();
      outbox_items_--;
      wake_[to] = 1;
      did = true;
    }
  }
  CrossItem items[kPopBatch];
  for (uint32_t from = 0; from < shards_; from++) {
    if (from == shard_) continue;
    for (size_t taken = 0; taken < kLaneBatch;) {
      const size_t n = crossing_->Pop(from, shard_, items, kPopBatch);
      if (n == 0) break;
      for (size_t i = 0; i < n; i++) TakeItem(from, items[i]);
      taken += n;
      did = true;
    }
  }
  if (!held_items_.empty()) did |= RetryHeld();
  if (!held_fabric_.empty()) did |= RetryHeldFabric();
  return did;
}

void MqEngine::FlushCrossing() {
  for (const CreditRun& run : credits_) {
    CrossItem item{};
    item.kind = run.remote ? CrossKind::kRemoteCredit : CrossKind::kCredit;
    item.flags = run.control ? kCreditControl : 0;
    item.to = run.sender_id;
    item.count = run.count;
    Push(run.remote ? 0 : ShardOf(run.sender_id, shards_), item);
  }
  credits_.clear();
  for (uint32_t to = 0; to < shards_; to++) {
    if (wake_[to] == 0) continue;
    wake_[to] = 0;
    crossing_->Wake(to);
  }
}

void MqEngine::TakeItem(uint32_t from, const CrossItem& item) {
  // Its control credit goes back at the end of the pass, behind whatever
  // this item makes us answer (invariant 11).
  if (item.count != 0 && item.kind != CrossKind::kCredit &&
      item.kind != CrossKind::kRemoteCredit) {
    AddCredit(item.count, /*remote=*/false, /*control=*/true);
  }
  switch (item.kind) {
    case CrossKind::kArrive:
    case CrossKind::kAm:
    case CrossKind::kRemoteArrive:
    case CrossKind::kRemoteAm: {
      cross_in_.Add(1);
      Endpoint* r = Find(item.to);
      // An active message reaches only its sender's job: a reply or an ack
      // names its target by an id the client wrote.
      const bool am =
          item.kind == CrossKind::kAm || item.kind == CrossKind::kRemoteAm;
      if (r == nullptr || r->faulted ||
          (am && !(r->job()->key() == item.am.job))) {
        RefuseItem(item, PSM2_EPID_UNREACHABLE);
        return;
      }
      auto held =
          held_items_.empty() ? held_items_.end() : held_items_.find(item.to);
      if (held != held_items_.end()) {
        held->second.push_back(item);  // behind the receiver's held items
      } else if (!OfferItem(*r, item)) {
        held_items_[item.to].push_back(item);
      }
      return;
    }
    case CrossKind::kChunk:
      TakeChunk(from, item);
      return;
    case CrossKind::kPost: {
      if (Endpoint* ep = Find(item.to)) {
        if (item.flags & kPostCopied) {  // a copy in place's kSendDone
          ep->counters.rndv_msgs_copied.Add(1);
          ep->counters.rndv_bytes_copied.Add(item.post.msg_len);
          shm::CompletionDesc done = item.post;
          done.msg_len = 0;
          Post(*ep, done);
          return;
        }
        if (item.post.op == shm::CompleteOp::kRndvGo &&
            (item.post.flags & shm::kGoAwaitDone)) {
          shm::CompletionDesc go = item.post;
          AnswerGo(*ep, go, from);
          Post(*ep, go);
          return;
        }
        Post(*ep, item.post);
      } else if (item.post.op == shm::CompleteOp::kRndvGo &&
                 item.post.body.go.send_bytes > 0) {
        // The sender left before its go: the receiver waits for nothing.
        CrossItem gone{};
        gone.kind = CrossKind::kTransferSenderGone;
        gone.transfer = item.post.body.go.transfer;
        Push(from, gone);
      }
      return;
    }
    case CrossKind::kRefused: {
      Endpoint* ep = Find(item.to);
      if (ep == nullptr) {
        // Its chunk still goes back (property 2 of engine_fuzz).
        auto gone = departed_.find(item.to);
        if (gone != departed_.end() && item.refused.pool_offset != 0) {
          shm::PoolPayload(gone->second.ep->job()->pool().base(),
                           item.refused.pool_offset)
              .Release();
        }
        return;
      }
      if (item.refused.pool_offset != 0) {
        shm::PoolPayload(ep->job()->pool().base(), item.refused.pool_offset)
            .Release();
      }
      if (item.flags & kRefusedBad) {
        ReportBadDescriptor(
            *ep, "rendezvous chunk out of order or for an unknown transfer");
      }
      if (item.flags & kRefusedPost) {
        PostError(*ep, item.refused.req, item.refused.error);
      }
      return;
    }
    case CrossKind::kCredit: {
      if (Endpoint* ep = Find(item.to)) {
        uint32_t& in_flight = (item.flags & kCreditControl)
                                  ? ep->ctl_in_flight
                                  : ep->cross_in_flight;
        in_flight -= std::min(in_flight, item.count);
      }
      return;
    }
    case CrossKind::kGone: {
      TakeGone(item.from);
      CrossItem ack{};
      ack.kind = CrossKind::kGoneAck;
      ack.to = item.from;
      Push(from, ack);
      return;
    }
    case CrossKind::kGoneAck: {
      auto gone = departed_.find(item.to);
      if (gone != departed_.end() && --gone->second.acks_due == 0) {
        departed_.erase(gone);
      }
      // Shard 0 will send nothing more for it, so every answer about it is
      // on its way there (invariant 12).
      if (from == 0 && fabric_via_0_) {
        CrossItem forget{};
        forget.kind = CrossKind::kForget;
        forget.to = item.to;
        Push(0, forget);
      }
      return;
    }
    case CrossKind::kCopyPeer: {
      auto it = transfers_.find(item.copy_peer.transfer);
      if (it == transfers_.end()) return;  // its receiver left meanwhile
      Transfer& t = it->second;
      if (item.copy_peer.sender == nullptr) {
        t.await_done = false;  // the sender completes with its last chunk
      } else if (copier_ && t.await_done && !t.taken &&
                 item.copy_peer.sender->id() == t.sender_id) {
        t.copy_peer = item.copy_peer.sender;
        takeover_candidates_.push_back(it->first);
      }
      return;
    }
    case CrossKind::kCopyDenied: {
      if (Endpoint* ep = Find(item.to)) {
        DenyCopies(*ep, item.flags & kCopyDeniedReading);
      }
      return;
    }
    case CrossKind::kTransferSenderGone: {
      auto it = transfers_.find(item.transfer);
      if (it == transfers_.end()) return;
      if (Endpoint* r = Find(it->second.receiver_id)) {
        PostError(*r, it->second.recv_req, PSM2_EPID_UNREACHABLE);
      }
      transfers_.erase(it);
      return;
    }
    case CrossKind::kRemoteCredit:
    case CrossKind::kToFabric:
    case CrossKind::kFabricAnswer:
    case CrossKind::kForget:
      TakeFabricItem(item);
      return;
    case CrossKind::kEpidGone:
      EpidGoneHere(item.epid_gone.epid, item.epid_gone.uid, item.epid_gone.job);
      return;
    case CrossKind::kNodeLost:
      NodeLostHere(item.post);
      return;
  }
}

void MqEngine::AnswerGo(Endpoint& sender, shm::CompletionDesc& go,
                        uint32_t from) {
  CrossItem answer{};
  answer.kind = CrossKind::kCopyPeer;
  answer.copy_peer.transfer = go.body.go.transfer;
  if (MayTakeOverFrom(sender)) {
    answer.copy_peer.sender = &sender;
  } else {
    // The sender completes when it published its last chunk, as any
    // stream's: psmd will never read its buffer.
    go.flags &= ~shm::kGoAwaitDone;
  }
  // In lane order before any chunk of the transfer: the sender publishes
  // those only once it read the go, which is posted after this.
  Push(from, answer);
}

bool MqEngine::OfferItem(Endpoint& receiver, const CrossItem& item) {
  if (item.kind == CrossKind::kArrive ||
      item.kind == CrossKind::kRemoteArrive) {
    if (Arrive(receiver, item.arrive.key, item.arrive.msg) == Arrival::kHeld) {
      return false;
    }
  } else {
    if ((item.flags & kAmTakesCredit || item.kind == CrossKind::kRemoteAm) &&
        !admit_over_budget_ && AmHeld(receiver)) {
      return false;  // invariant 6
    }
    Post(receiver, item.am.c);
  }
  if (Credited(item)) ReturnCredit(item);
  return true;
}

void MqEngine::RefuseItem(const CrossItem& item, int32_t error) {
  if (FromOtherNode(item)) {
    RefuseRemote(item, error);
    return;
  }
  // As a send to a closed peer is answered: the payload goes back, the
  // sender is told (an ack's requester has nobody to tell).
  CrossItem r{};
  r.kind = CrossKind::kRefused;
  r.to = item.from;
  r.refused.pool_offset = ChunkOf(item);
  r.refused.error = error;
  if (item.kind == CrossKind::kArrive) {
    r.flags = kRefusedPost;
    r.refused.req = item.arrive.msg.sender_req;
  } else if (item.am.c.op != shm::CompleteOp::kAmAcked) {
    r.flags = kRefusedPost;
    r.refused.req = item.am.c.req;
  }
  if (Credited(item)) ReturnCredit(item);
  Push(ShardOf(item.from, shards_), r);
}

void MqEngine::ReturnCredit(const CrossItem& item) {
  // A sender's credit, or (from another node) its receiver's at shard 0.
  const bool remote = FromOtherNode(item);
  AddCredit(remote ? item.to : item.from, remote, /*control=*/false);
}

void MqEngine::AddCredit(uint32_t id, bool remote, bool control) {
  if (!credits_.empty() && credits_.back().sender_id == id &&
      credits_.back().remote == remote && credits_.back().control == control) {
    credits_.back().count++;
  } else {
    credits_.push_back(CreditRun{id, 1, remote, control});
  }
}

bool MqEngine::RetryHeld() {
  bool did = false;
  for (auto it = held_items_.begin(); it != held_items_.end();) {
    std::deque<CrossItem>& items = it->second;
    Endpoint* r = Find(it->first);
    if (r == nullptr || r->faulted) {
      for (const CrossItem& item : items)
        RefuseItem(item, PSM2_EPID_UNREACHABLE);
      items.clear();
    }
    while (!items.empty() && OfferItem(*r, items.front())) {
      items.pop_front();
      did = true;
    }
    it = items.empty() ? held_items_.erase(it) : std::next(it);
  }
  return did;
}

void MqEngine::TakeChunk(uint32_t from, const CrossItem& item) {
  const uint64_t id = item.chunk.transfer;
  auto it = transfers_.find(id);
  if (it == transfers_.end() && remote_ && !fabric_via_0_) {
    // A chunk of a transfer to another node (invariant 12: its id is
    // shard 0's, the fabric keeps it).
    if (Endpoint* sender = Known(item.from)) {
      shm::SubmissionDesc d{};
      d.op = shm::SubmitOp::kRndvData;
      d.req = item.chunk.req;
      d.len = item.chunk.len;
      d.body.rndv.pool_offset = item.chunk.pool_offset;
      d.body.rndv.transfer = id;
      d.body.rndv.offset = item.chunk.offset;
      if (remote_->RndvData(*sender, d)) return;
    }
  }
  if (it != transfers_.end() && it->second.taken &&
      it->second.sender_id == item.from) {
    // psmd copies the rest (invariant 10): released unread, no error, as
    // in HandleRndvData.
    CrossItem r{};
    r.kind = CrossKind::kRefused;
    r.to = item.from;
    r.refused.pool_offset = item.chunk.pool_offset;
    Push(from, r);
    return;
  }
  const bool fits =
      it != transfers_.end() && it->second.sender_id == item.from &&
      item.chunk.offset == it->second.forwarded &&
      item.chunk.len <= it->second.send_bytes - it->second.forwarded;
  if (!fits) {
    // Its chunk goes back; a chunk of a transfer that ended (its receiver
    // left) is no error, as in HandleRndvData.
    CrossItem r{};
    r.kind = CrossKind::kRefused;
    r.to = item.from;
    r.refused.pool_offset = item.chunk.pool_offset;
    const bool ended = it == transfers_.end() && id != 0 && id < next_transfer_;
    if (!ended) {
      r.flags = kRefusedBad | kRefusedPost;
      r.refused.req = item.chunk.req;
      r.refused.error = PSM2_PARAM_ERR;
    }
    Push(from, r);
    return;
  }
  Transfer& t = it->second;
  if (!ForwardChunk(t, item.chunk.pool_offset, item.chunk.len)) {
    // A receiver not served: the chunk goes back into its job's pool.
    if (Endpoint* receiver = Find(t.receiver_id)) {
      shm::PoolPayload(receiver->job()->pool().base(), item.chunk.pool_offset)
          .Release();
    }
  }
  t.forwarded += item.chunk.len;
  if (t.await_done) t.last_ns = copy_clock_();
  if (t.forwarded == t.send_bytes) {
    if (t.await_done) {  // the sender's buffer is free now
      shm::CompletionDesc c{};
      c.op = shm::CompleteOp::kSendDone;
      c.req = t.sender_req;
      PostTo(t.sender_id, c);
    }
    transfers_.erase(it);
  }
}

void MqEngine::TakeGone(uint32_t gone_id) {
  // Its held items first, over any budget: the sender saw those sends
  // complete (Remove admits a closing sender's held sends the same way).
  // Its items are visited in order, so they arrive in order.
  admit_over_budget_ = true;
  for (auto it = held_items_.begin(); it != held_items_.end();) {
    std::deque<CrossItem>& items = it->second;
    Endpoint* r = Find(it->first);
    for (auto item = items.begin(); item != items.end();) {
      if (item->from != gone_id || r == nullptr) {
        ++item;
        continue;
      }
      OfferItem(*r, *item);
      item = items.erase(item);
    }
    it = items.empty() ? held_items_.erase(it) : std::next(it);
  }
  admit_over_budget_ = false;
  if (!held_fabric_.empty()) AdmitHeldFabric(gone_id);
  // Copies in place from its process stop before its shard may free it
  // (which waits for this shard's kGoneAck): Transfer::copy_peer and the
  // pidfd the copier polls live until then (endpoint.h, thread-safety 5).
  if (copier_) copier_->Cancel(gone_id);
  // The transfers it was sending here: their receivers wait for nothing.
  for (auto t = transfers_.begin(); t != transfers_.end();) {
    if (t->second.sender_id != gone_id) {
      ++t;
      continue;
    }
    if (Endpoint* r = Find(t->second.receiver_id)) {
      PostError(*r, t->second.recv_req, PSM2_EPID_UNREACHABLE);
    }
    t = transfers_.erase(t);
  }
  // Everything it sent is here now (lanes are FIFO): invariant 8.
  PeersGone(
      [gone_id](const Endpoint&, const PeerLink& link) {
        return link.endpoint_id == gone_id;
      },
      PSM2_EPID_UNREACHABLE);
  // Shard 0: the fabric ends what it keeps for it and tells the nodes that
  // connected to it, after everything it sent (invariant 12).
  auto foreign = foreign_.find(gone_id);
  if (foreign != foreign_.end() && !foreign->second.removed) {
    if (remote_) remote_->EndpointRemoved(gone_id);
    foreign->second.removed = true;
  }
}

void MqEngine::RemoveAcross(Endpoint& ep) {
  auto held = held_items_.find(ep.id());
  if (held != held_items_.end()) {
    for (const CrossItem& item : held->second) {
      RefuseItem(item, PSM2_EPID_UNREACHABLE);
    }
    held_items_.erase(held);
  }
  CrossItem gone{};
  gone.kind = CrossKind::kGone;
  gone.from = ep.id();
  for (uint32_t to = 0; to < shards_; to++) {
    if (to != shard_) Push(to, gone);
  }
  FlushCrossing();
}

}  // namespace psmd
