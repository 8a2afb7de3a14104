#include "daemon/mq_engine.h"

#include <psm2.h>

#include <algorithm>
#include <cstring>

#include <spdlog/spdlog.h>

#include "shm/doorbell.h"
#include "shm/pool.h"

namespace psmd {

namespace {

constexpr size_t kBatch = 32;

MsgKey KeyOf(uint64_t source, const uint32_t tag[3]) {
  MsgKey k;
  k.source = source;
  std::memcpy(k.tag.w, tag, sizeof(k.tag.w));
  return k;
}

}  // namespace

void MqEngine::Add(std::shared_ptr<Endpoint> ep) {
  Endpoint* raw = ep.get();
  const shm::SegmentGeometry& g = raw->geometry;
  raw->sq = shm::RingConsumer<shm::SubmissionDesc>(
      &raw->control()->sq, shm::SubmissionSlotsOf(raw->segment.base(), g), g.sq_capacity);
  raw->cq = shm::RingProducer<shm::CompletionDesc>(
      &raw->control()->cq, shm::CompletionSlotsOf(raw->segment.base(), g), g.cq_capacity);
  by_id_[raw->id] = std::move(ep);
  order_.push_back(raw);
}

void MqEngine::Remove(uint32_t id) {
  auto it = by_id_.find(id);
  if (it == by_id_.end()) return;
  Endpoint& ep = *it->second;
  // Submissions the client published before it closed (or died) still count:
  // a send it saw complete locally must reach its receiver.
  for (uint32_t i = 0; i <= ep.sq.capacity() && !ep.faulted && ep.sq.Available() > 0; i++) {
    ep.cq_overflow.clear();  // nobody will read completions any more
    Poll(ep);
  }
  ep.posted.drain([](PostedRecv&&) {});
  ep.unexpected.drain([&](const MsgKey&, UnexpectedMsg&& m) {
    ReleasePayload(ep, m);
    if (m.flags & shm::kSendSync) CompleteSync(m.sender_id, m.sender_req, PSM2_EPID_UNREACHABLE);
  });
  order_.erase(std::find(order_.begin(), order_.end(), &ep));
  last_complaint_.erase(id);
  by_id_.erase(it);
}

void MqEngine::SetPeer(uint32_t id, uint32_t slot, const PeerLink& link) {
  Endpoint* ep = Find(id);
  if (ep == nullptr) return;
  if (ep->peers.size() <= slot) ep->peers.resize(slot + 1);
  ep->peers[slot] = link;
}

void MqEngine::ClearPeer(uint32_t id, uint32_t slot) {
  Endpoint* ep = Find(id);
  if (ep != nullptr && slot < ep->peers.size()) ep->peers[slot] = PeerLink{};
}

Endpoint* MqEngine::Find(uint32_t id) {
  auto it = by_id_.find(id);
  return it == by_id_.end() ? nullptr : it->second.get();
}

bool MqEngine::PollAll() {
  bool did = false;
  // Index loop: handlers never add or remove endpoints.
  for (size_t i = 0; i < order_.size(); i++) did |= Poll(*order_[i]);
  return did;
}

bool MqEngine::AnySubmissionPending() {
  for (Endpoint* ep : order_) {
    if (!ep->faulted && ep->sq.Available() > 0) return true;
  }
  return false;
}

bool MqEngine::Poll(Endpoint& ep) {
  if (ep.faulted) return false;
  bool did = false;
  if (!ep.cq_overflow.empty()) {
    did = FlushOverflow(ep);
    if (!ep.cq_overflow.empty()) return did;  // back-pressure: see invariant 3
  }
  shm::SubmissionDesc batch[kBatch];
  size_t n = ep.sq.PopBatch(batch, kBatch);
  for (size_t i = 0; i < n; i++) Dispatch(ep, batch[i]);
  if (ep.sq.corrupt()) {
    spdlog::error("endpoint {} (pid {}): submission ring indices corrupted by the client; "
                  "the endpoint is no longer served — close and reopen it",
                  ep.id, ep.pid);
    ep.faulted = true;
  }
  return did || n > 0;
}

void MqEngine::Dispatch(Endpoint& ep, const shm::SubmissionDesc& d) {
  SubmissionBounds bounds;
  bounds.peer_slots = static_cast<uint32_t>(ep.peers.size());
  bounds.region = ep.region;
  Rejection r = ValidateSubmission(d, bounds);
  if (r == Rejection::kNone && d.op != shm::SubmitOp::kCancel && d.peer != shm::kAnySlot &&
      ep.peers[d.peer].endpoint_id == 0) {
    r = Rejection::kBadPeer;
  }
  if (r != Rejection::kNone) {
    ReportBadDescriptor(ep, RejectionName(r));
    PostError(ep, d.req, r == Rejection::kBadPeer ? PSM2_EPID_UNKNOWN : PSM2_PARAM_ERR);
    return;
  }
  switch (d.op) {
    case shm::SubmitOp::kSend:
      HandleSend(ep, d);
      break;
    case shm::SubmitOp::kRecv:
      HandleRecv(ep, d);
      break;
    case shm::SubmitOp::kCancel:
      HandleCancel(ep, d);
      break;
    default:
      break;  // unreachable: validated above
  }
}

void MqEngine::HandleSend(Endpoint& sender, const shm::SubmissionDesc& d) {
  const PeerLink& link = sender.peers[d.peer];
  UnexpectedMsg m{};
  m.sender_id = sender.id;
  m.flags = d.flags;
  m.len = d.len;
  m.sender_req = d.req;
  if (d.len <= shm::kInlineMax) {
    std::memcpy(m.inline_data, d.body.inline_data, d.len);
  } else {
    m.pool_offset = d.body.pool.pool_offset;
  }
  Endpoint* receiver = Find(link.endpoint_id);
  if (receiver == nullptr || receiver->faulted) {
    // The peer is gone: give the payload back and tell the sender.
    if (d.len > shm::kInlineMax) shm::ReleaseChunk(sender.job->pool().base(), m.pool_offset);
    PostError(sender, d.req, PSM2_EPID_UNREACHABLE);
    return;
  }
  sender.counters.msgs_sent.Add(1);
  sender.counters.bytes_sent.Add(d.len);
  MsgKey key = KeyOf(sender.epid, d.tag);
  if (auto recv = receiver->posted.take_match(key)) {
    Deliver(*receiver, recv->req, key, m);
    return;
  }
  receiver->counters.unexpected_msgs.Add(1);
  receiver->counters.unexpected_bytes.Add(d.len);
  receiver->unexpected.push(key, m);
}

void MqEngine::HandleRecv(Endpoint& receiver, const shm::SubmissionDesc& d) {
  RecvPattern p;
  p.source = d.peer == shm::kAnySlot ? kAnySource : receiver.peers[d.peer].epid;
  std::memcpy(p.tag.w, d.tag, sizeof(p.tag.w));
  std::memcpy(p.sel.w, d.body.recv.tagsel, sizeof(p.sel.w));
  receiver.counters.posted_recvs.Add(1);
  MsgKey key;
  if (auto m = receiver.unexpected.take(p, &key)) {
    Deliver(receiver, d.req, key, *m);
    return;
  }
  receiver.posted.post(p, PostedRecv{d.req});
}

void MqEngine::HandleCancel(Endpoint& ep, const shm::SubmissionDesc& d) {
  shm::CompletionDesc c{};
  c.op = shm::CompleteOp::kCancelDone;
  c.req = d.req;
  auto removed = ep.posted.remove_first_if([&](const PostedRecv& r) { return r.req == d.req; });
  c.error = removed ? PSM2_OK : PSM2_MQ_NO_COMPLETIONS;
  Post(ep, c);
}

void MqEngine::Deliver(Endpoint& receiver, uint64_t recv_req, const MsgKey& key,
                       const UnexpectedMsg& m) {
  shm::CompletionDesc c{};
  c.op = shm::CompleteOp::kRecvDone;
  c.req = recv_req;
  std::memcpy(c.tag, key.tag.w, sizeof(c.tag));
  c.msg_len = m.len;
  c.src_epid = key.source;
  if (m.len <= shm::kInlineMax) {
    c.flags = shm::kPayloadInline;
    std::memcpy(c.body.inline_data, m.inline_data, m.len);
  } else {
    c.body.pool.pool_offset = m.pool_offset;
  }
  receiver.counters.msgs_received.Add(1);
  receiver.counters.bytes_received.Add(m.len);
  Post(receiver, c);
  if (m.flags & shm::kSendSync) CompleteSync(m.sender_id, m.sender_req, PSM2_OK);
}

void MqEngine::CompleteSync(uint32_t sender_id, uint64_t sender_req, int32_t error) {
  Endpoint* sender = Find(sender_id);
  if (sender == nullptr) return;  // sender gone: nobody to tell
  shm::CompletionDesc c{};
  c.op = shm::CompleteOp::kSendDone;
  c.req = sender_req;
  c.error = error;
  Post(*sender, c);
}

void MqEngine::PostError(Endpoint& ep, uint64_t req, int32_t error) {
  shm::CompletionDesc c{};
  c.op = shm::CompleteOp::kError;
  c.req = req;
  c.error = error;
  Post(ep, c);
}

void MqEngine::Post(Endpoint& ep, const shm::CompletionDesc& c) {
  if (ep.faulted) return;
  if (ep.cq_overflow.empty() && ep.cq.TryPush(c)) {
    ep.notify_pending = true;
    return;
  }
  if (ep.cq.corrupt()) {
    spdlog::error("endpoint {} (pid {}): completion ring indices corrupted by the client; "
                  "the endpoint is no longer served — close and reopen it",
                  ep.id, ep.pid);
    ep.faulted = true;
    return;
  }
  ep.cq_overflow.push_back(c);
}

bool MqEngine::FlushOverflow(Endpoint& ep) {
  bool did = false;
  while (!ep.cq_overflow.empty() && ep.cq.TryPush(ep.cq_overflow.front())) {
    ep.cq_overflow.pop_front();
    did = true;
  }
  if (did) ep.notify_pending = true;
  return did;
}

void MqEngine::NotifyClients() {
  for (Endpoint* ep : order_) {
    if (!ep->notify_pending) continue;
    ep->notify_pending = false;
    shm::Doorbells& bells = ep->control()->doorbells;
    // Full fence: our ring stores must be visible before we read the client's
    // waiting flag, mirroring the client's store-flag/fence/check-ring order,
    // so at least one side sees the other (no lost wake-up).
    std::atomic_thread_fence(std::memory_order_seq_cst);
    if (bells.client_waiting.load(std::memory_order_relaxed) != 0) {
      bells.cq_futex.fetch_add(1, std::memory_order_release);
      shm::FutexWakeAll(&bells.cq_futex);
    }
  }
}

void MqEngine::ReleasePayload(const Endpoint& receiver, const UnexpectedMsg& m) {
  if (m.len > shm::kInlineMax) shm::ReleaseChunk(receiver.job->pool().base(), m.pool_offset);
}

void MqEngine::ReportBadDescriptor(Endpoint& ep, const char* what) {
  ep.counters.bad_descriptors.Add(1);
  // Rate-limited: a client spraying garbage must not flood the log.
  auto now = std::chrono::steady_clock::now();
  auto [it, first] = last_complaint_.try_emplace(ep.id, now);
  if (!first && now - it->second < std::chrono::seconds(1)) return;
  it->second = now;
  spdlog::warn("endpoint {} (pid {}, uid {}): rejected submission: {} ({} rejected so far); "
               "the request completes with an error",
               ep.id, ep.pid, ep.uid, what, ep.counters.bad_descriptors.Get());
}

}  // namespace psmd
