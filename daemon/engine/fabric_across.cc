// Between nodes with engine shards (mq_engine.h, invariant 12): shard 0 owns
// the fabric (its Remote and every node connection); the other shards reach
// it through the Crossing, and it reaches their endpoints the same way. Each
// function runs on the worker of the shard it names.
#include <psm2.h>

#include <algorithm>
#include <cstring>

#include "daemon/engine/mq_engine.h"
#include "shm/epid.h"
#include "shm/payload.h"
#include "shm/pool.h"

namespace psmd {

// A shard other than 0: what the engine asks of other nodes crosses to
// shard 0, where the Remote takes it as it takes its own shard's.
class MqEngine::FabricVia0 : public OtherNodes {
 public:
  explicit FabricVia0(MqEngine* engine) : e_(engine) {}
  bool Send(Endpoint& sender, const shm::SubmissionDesc& d, const PeerLink& to,
            bool may_hold) override {
    return e_->ToFabric(sender, d, to, may_hold, kFabricSend);
  }
  bool AmRequest(Endpoint& sender, const shm::SubmissionDesc& d,
                 const PeerLink& to, bool may_hold) override {
    return e_->ToFabric(sender, d, to, may_hold, kFabricAmRequest);
  }
  void AmReplyOrAck(Endpoint& sender, const shm::SubmissionDesc& d) override {
    e_->ToFabric(sender, d, PeerLink{}, /*may_hold=*/false, kFabricAmAnswer);
  }
  // Its chunks cross as kChunk to shard 0, whose id the transfer has.
  bool RndvData(Endpoint&, const shm::SubmissionDesc&) override {
    return false;
  }
  void CompleteSync(const Endpoint& receiver, const UnexpectedMsg& m,
                    int32_t error) override {
    e_->AnswerToFabric(receiver, m, 0, 0, 0, error);
  }
  void StartTransfer(Endpoint& receiver, uint64_t recv_req, uint32_t send_bytes,
                     const UnexpectedMsg& m) override {
    e_->AnswerToFabric(receiver, m, kAnswerStart, recv_req, send_bytes,
                       PSM2_OK);
  }
  // Shard 0 learns it from kGone, after everything the endpoint sent.
  void EndpointRemoved(uint32_t) override {}

 private:
  MqEngine* const e_;
};

void MqEngine::RouteFabricToShard0() {
  fabric_via_0_ = std::make_unique<FabricVia0>(this);
  remote_ = fabric_via_0_.get();
}

void MqEngine::AddForeign(std::shared_ptr<Endpoint> ep) {
  const uint32_t id = ep->id();
  foreign_[id] = Foreign{std::move(ep), false};
}

std::shared_ptr<Job> MqEngine::FindJob(const JobKey& key) const {
  for (const Endpoint* ep : order_) {
    if (ep->job()->key() == key) return ep->job();
  }
  for (const auto& [id, f] : foreign_) {
    if (!f.removed && f.ep->job()->key() == key) return f.ep->job();
  }
  return nullptr;
}

Endpoint* MqEngine::Known(uint32_t id) {
  if (Endpoint* ep = Find(id)) return ep;
  if (auto d = departed_.find(id); d != departed_.end()) {
    return d->second.ep.get();
  }
  if (auto f = foreign_.find(id); f != foreign_.end()) {
    return f->second.ep.get();
  }
  return nullptr;
}

void MqEngine::PostFor(Endpoint& ep, const shm::CompletionDesc& c) {
  if (IsLocal(ep)) {
    Post(ep, c);
  } else {
    PostTo(ep.id(), c);
  }
}

void MqEngine::PostErrorFor(Endpoint& ep, uint64_t req, int32_t error) {
  PostFor(ep, ErrorCompletion(req, error));
}

bool MqEngine::MayArriveAcross(const Endpoint& receiver) const {
  auto it = remote_in_flight_.find(receiver.id());
  return it == remote_in_flight_.end() || it->second < kFabricCredit;
}

void MqEngine::ArriveAcross(Endpoint& receiver, const MsgKey& key,
                            const UnexpectedMsg& m) {
  CrossItem item{};
  item.kind = CrossKind::kRemoteArrive;
  item.to = receiver.id();
  item.from = kRemotePeer;
  item.arrive.key = key;
  item.arrive.msg = m;
  remote_in_flight_[receiver.id()]++;
  cross_out_.Add(1);
  Push(ShardOf(receiver.id(), shards_), item);
}

void MqEngine::AmArriveAcross(Endpoint& receiver,
                              const shm::CompletionDesc& c) {
  CrossItem item{};
  item.kind = CrossKind::kRemoteAm;
  item.to = receiver.id();
  item.from = kRemotePeer;
  item.am.c = c;
  item.am.job = receiver.job()->key();
  remote_in_flight_[receiver.id()]++;
  cross_out_.Add(1);
  Push(ShardOf(receiver.id(), shards_), item);
}

void MqEngine::EpidGone(uint64_t epid, uint32_t uid, const uint8_t job[16]) {
  CrossItem item{};
  item.kind = CrossKind::kEpidGone;
  item.epid_gone.epid = epid;
  item.epid_gone.uid = uid;
  std::memcpy(item.epid_gone.job, job, 16);
  for (uint32_t to = 0; to < shards_; to++) {
    if (to != shard_) Push(to, item);
  }
  EpidGoneHere(epid, uid, job);
}

void MqEngine::EpidGoneHere(uint64_t epid, uint32_t uid,
                            const uint8_t job[16]) {
  PeersGone(
      [&](const Endpoint& ep, const PeerLink& link) {
        return link.endpoint_id == kRemotePeer && link.epid == epid &&
               ep.uid() == uid &&
               std::memcmp(ep.job()->key().uuid.data(), job, 16) == 0;
      },
      PSM2_EPID_UNREACHABLE);
}

void MqEngine::NodeLost(const shm::CompletionDesc& lost) {
  CrossItem item{};
  item.kind = CrossKind::kNodeLost;
  item.post = lost;
  for (uint32_t to = 0; to < shards_; to++) {
    if (to != shard_) Push(to, item);
  }
  NodeLostHere(lost);
}

void MqEngine::NodeLostHere(const shm::CompletionDesc& lost) {
  const uint16_t node = static_cast<uint16_t>(lost.tag[0]);
  // Per endpoint: how many of its links went, and one of their epids.
  std::unordered_map<const Endpoint*, shm::CompletionDesc> lost_at;
  PeersGone(
      [&](const Endpoint& ep, const PeerLink& link) {
        if (link.endpoint_id != kRemotePeer ||
            shm::NodeIdOf(link.epid) != node) {
          return false;
        }
        auto [at, fresh] = lost_at.try_emplace(&ep, lost);
        if (fresh) at->second.msg_len = 0;
        at->second.msg_len++;
        at->second.src_epid = link.epid;
        return true;
      },
      lost.error);
  for (Endpoint* ep : order_) {
    auto at = lost_at.find(ep);
    if (at != lost_at.end()) Post(*ep, at->second);
  }
}

bool MqEngine::ToFabric(Endpoint& sender, const shm::SubmissionDesc& d,
                        const PeerLink& to, bool may_hold, uint8_t call) {
  // Sends and requests take the credit sends to other shards take
  // (invariant 11); an answer comes off the control ring and takes none.
  const bool credited = call != kFabricAmAnswer;
  if (credited) {
    if (may_hold && sender.cross_in_flight >= kCrossCredit) return false;
    sender.cross_in_flight++;
  }
  CrossItem item{};
  item.kind = CrossKind::kToFabric;
  item.flags = static_cast<uint8_t>(call | (to.gone ? kFabricLinkGone : 0) |
                                    (may_hold ? kFabricMayHold : 0));
  item.from = sender.id();
  item.fabric.d = d;
  item.fabric.epid = to.epid;
  cross_out_.Add(1);
  Push(0, item);
  // Counted here, as the Remote counts its own shard's (a send to a link
  // already gone fails at once and is not).
  if (to.gone && call != kFabricAmAnswer) return true;
  switch (call) {
    case kFabricSend:
      sender.counters.msgs_sent.Add(1);
      sender.counters.bytes_sent.Add(d.len);
      if (d.op == shm::SubmitOp::kRndvSend) {
        sender.counters.rndv_msgs_sent.Add(1);
        sender.counters.rndv_bytes_sent.Add(d.len);
      }
      break;
    case kFabricAmRequest:
      sender.counters.am_requests_sent.Add(1);
      break;
    default:
      if (d.op == shm::SubmitOp::kAmReply) {
        sender.counters.am_replies_sent.Add(1);
      }
      break;
  }
  return true;
}

void MqEngine::AnswerToFabric(const Endpoint& receiver, const UnexpectedMsg& m,
                              uint8_t flags, uint64_t recv_req,
                              uint32_t send_bytes, int32_t error) {
  CrossItem item{};
  item.kind = CrossKind::kFabricAnswer;
  item.flags = flags;
  item.from = receiver.id();
  item.answer = {m, recv_req, send_bytes, error};
  Push(0, item);
}

void MqEngine::TakeFabricItem(const CrossItem& item) {
  switch (item.kind) {
    case CrossKind::kRemoteCredit: {
      auto it = remote_in_flight_.find(item.to);
      if (it == remote_in_flight_.end()) return;
      it->second -= std::min(it->second, item.count);
      if (it->second == 0) remote_in_flight_.erase(it);
      return;
    }
    case CrossKind::kToFabric: {
      cross_in_.Add(1);
      Endpoint* sender = Known(item.from);
      if (sender == nullptr || remote_ == nullptr) {
        ReturnCredit(item);  // (not reached: the sender is known first)
        return;
      }
      // Behind the sender's held ones: one sender's order holds. An answer
      // (a reply or an ack, off the control ring) is never held, and goes
      // past them as it goes past held sends within one shard: nothing of
      // a sender's control ring waits here.
      auto held = held_fabric_.find(item.from);
      if ((item.flags & kFabricCallMask) == kFabricAmAnswer) {
        OfferFabric(*sender, item);
      } else if (held != held_fabric_.end()) {
        held->second.push_back(item);
      } else if (!OfferFabric(*sender, item)) {
        held_fabric_[item.from].push_back(item);
      }
      return;
    }
    case CrossKind::kFabricAnswer: {
      Endpoint* receiver = Known(item.from);
      if (receiver == nullptr || remote_ == nullptr) return;
      if (item.flags & kAnswerStart) {
        remote_->StartTransfer(*receiver, item.answer.recv_req,
                               item.answer.send_bytes, item.answer.msg);
      } else {
        remote_->CompleteSync(*receiver, item.answer.msg, item.answer.error);
      }
      return;
    }
    case CrossKind::kForget:
      foreign_.erase(item.to);
      remote_in_flight_.erase(item.to);
      return;
    default:
      return;
  }
}

bool MqEngine::OfferFabric(Endpoint& sender, const CrossItem& item) {
  const shm::SubmissionDesc& d = item.fabric.d;
  PeerLink link;
  link.endpoint_id = kRemotePeer;
  link.epid = item.fabric.epid;
  link.gone = (item.flags & kFabricLinkGone) != 0;
  const bool may_hold = (item.flags & kFabricMayHold) && !admit_over_budget_;
  switch (item.flags & kFabricCallMask) {
    case kFabricSend:
      if (!remote_->Send(sender, d, link, may_hold)) return false;
      break;
    case kFabricAmRequest:
      if (!remote_->AmRequest(sender, d, link, may_hold)) return false;
      break;
    default:
      remote_->AmReplyOrAck(sender, d);
      return true;  // no credit taken
  }
  ReturnCredit(item);
  return true;
}

bool MqEngine::RetryHeldFabric() {
  bool did = false;
  for (auto it = held_fabric_.begin(); it != held_fabric_.end();) {
    std::deque<CrossItem>& items = it->second;
    Endpoint* sender = Known(it->first);
    while (!items.empty() && sender != nullptr &&
           OfferFabric(*sender, items.front())) {
      items.pop_front();
      did = true;
    }
    if (sender == nullptr) items.clear();  // (not reached: kForget is last)
    it = items.empty() ? held_fabric_.erase(it) : std::next(it);
  }
  return did;
}

void MqEngine::AdmitHeldFabric(uint32_t sender_id) {
  auto held = held_fabric_.find(sender_id);
  if (held == held_fabric_.end()) return;
  // Its last sends go regardless: it saw them complete.
  admit_over_budget_ = true;
  if (Endpoint* sender = Known(sender_id)) {
    for (const CrossItem& item : held->second) OfferFabric(*sender, item);
  }
  admit_over_budget_ = false;
  held_fabric_.erase(held);
}

void MqEngine::RefuseRemote(const CrossItem& item, int32_t error) {
  // As the Remote answers a frame whose receiver left: the inbox chunk goes
  // back, a sync or rendezvous sender learns (through shard 0).
  if (Endpoint* receiver = Known(item.to)) {
    if (item.kind == CrossKind::kRemoteArrive) {
      const UnexpectedMsg& m = item.arrive.msg;
      ReleasePayload(*receiver, m);
      if (m.rendezvous || (m.flags & shm::kSendSync)) {
        CompleteSyncOf(*receiver, m, error);
      }
    } else {
      shm::PayloadOf(receiver->job()->pool().base(), item.am.c).Release();
    }
  }
  ReturnCredit(item);
}

}  // namespace psmd
