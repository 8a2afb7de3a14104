// The engine's part of a handover (issue 33; mq_engine.h, "Handover to a
// successor process"; docs/design.md, "Handover"): what an MqEngine holds
// in process memory, written by SaveState and read back by LoadState into a
// fresh engine, whose endpoints the registry re-created over the same
// shared memory.
//
// Layout (daemon/handover/state_codec.h): one section kEngineSection with
// the shard, the engine's own fields, a section kEndpointSection per
// endpoint (in order_), the transfers, the held items and the items held
// for the fabric (shard 0's, with shards). Every field read
// names itself, so a refusal says which field of which endpoint was wrong.
#include <psm2.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstring>
#include <iterator>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <unordered_set>

#include "daemon/clock.h"
#include "daemon/engine/mq_engine.h"
#include "shm/epid.h"
#include "shm/payload.h"
#include "shm/pool.h"
#include "shm/segment.h"

namespace psmd {

namespace {

constexpr uint32_t kEngineSection = 0x454e4731;    // "ENG1"
constexpr uint32_t kEndpointSection = 0x45504431;  // "EPD1"
// The engine part's own version, inside the envelope's (the lead's): bumped
// whenever a field is added, removed or changes meaning.
constexpr uint32_t kEngineFormat = 2;

// Unexpected (and claimed) messages one endpoint may hold beyond its budget:
// a closing sender's last sends, and a removed sender's held items, are
// admitted over any budget (mq_engine.h, Remove and TakeGone), so a queue
// may exceed it. A bound anyway: a forged count cannot make the successor
// build a queue of 2^32 messages (the reader already bounds counts by the
// bytes left; this bounds what a large state may ask).
constexpr uint64_t kOverBudgetSlack = uint64_t{1} << 16;
// Completions waiting for ring space, peer slots and held cross-shard
// items: no limit of their own in the engine (kAmOverflowLimit holds only
// active messages), so bounds well above anything a live engine reaches.
constexpr uint64_t kMaxOverflow = uint64_t{1} << 20;
constexpr uint64_t kMaxPeers = uint64_t{1} << 20;
constexpr uint64_t kMaxHeldItems = uint64_t{1} << 20;
constexpr uint64_t kMaxCounters = 256;

// Bytes each item takes at least (Count's second check).
constexpr size_t kMinPeerBytes = 4 + 8 + 1;
constexpr size_t kMinPostedBytes = 8 + 12 + 12 + 8 + 4 + 8;
constexpr size_t kMinMsgBytes = 8 + 12 + 4 + 1 + 1 + 4 + 8 + 8 + 8;
constexpr size_t kMinTransferBytes = 8 + 4 + 4 + 8 + 8 + 4 + 4 + 8 + 8 + 1 + 8;

// The flags a send may carry (shm::kOpTraits), eager or rendezvous.
uint8_t SendFlags() {
  return shm::TraitsOf(shm::SubmitOp::kSend).allowed_flags |
         shm::TraitsOf(shm::SubmitOp::kRndvSend).allowed_flags;
}

void WriteKey(handover::StateWriter& w, const MsgKey& k) {
  w.U64(k.source);
  for (uint32_t t : k.tag.w) w.U32(t);
}

bool ReadTag(handover::StateReader& r, Tag96* t, const char* what) {
  return r.U32(&t->w[0], what) && r.U32(&t->w[1], what) &&
         r.U32(&t->w[2], what);
}

void WriteMsg(handover::StateWriter& w, const UnexpectedMsg& m) {
  w.U32(m.sender_id);
  w.U8(m.flags);
  w.Bool(m.rendezvous);
  w.U32(m.len);
  w.U64(m.sender_req);
  w.U64(m.pool_offset);  // or send_addr: one union
  w.U64(m.remote_src);
  // Inline payload bytes only where there are some.
  const uint32_t inline_len = !m.rendezvous && shm::IsInline(m.len) ? m.len : 0;
  w.U8(static_cast<uint8_t>(inline_len));
  for (uint32_t i = 0; i < inline_len; i++) w.U8(m.inline_data[i]);
}

// Where a completion's chunk may lie in `pool` (as ReleaseUnread checks a
// completion read back from a client's ring).
bool ChunkInPool(const shm::Mapping& pool, uint64_t offset) {
  return offset >= shm::kChunkHeaderBytes && offset < pool.size() &&
         offset % shm::kChunkHeaderBytes == 0;
}

// A completion the engine could have made: a known op, and a chunk, if it
// hands one over, inside the job's pool.
bool ValidCompletion(const shm::CompletionDesc& c, const shm::Mapping& pool) {
  const auto op = static_cast<uint8_t>(c.op);
  if (op == 0 || op > static_cast<uint8_t>(shm::CompleteOp::kBudgetStall))
    return false;
  return !shm::CompletionCarriesChunk(c) ||
         ChunkInPool(pool, shm::ChunkOffsetOf(c));
}

// Times are CLOCK_MONOTONIC (NowNs, and the copy clock, SetCopyClock), which
// an exec does not restart; one from the future (damaged) would make
// `now - t` wrap: clamped to now.
uint64_t ClampNow(uint64_t t, uint64_t now) { return t > now ? now : t; }

}  // namespace

// What LoadState read for one endpoint, checked, not yet installed.
struct MqEngine::LoadedEndpoint {
  Endpoint* ep = nullptr;
  shm::RingPositions rings;
  bool faulted = false;
  bool copy_denied = false;
  bool stall_watched = false;
  uint32_t cross_in_flight = 0;
  uint64_t unexpected_budget = 0;
  uint64_t held_since_ns = 0;
  uint64_t last_chunk_ns = 0;
  std::vector<PeerLink> peers;
  std::vector<std::pair<RecvPattern, PostedRecv>> posted;
  std::vector<std::pair<MsgKey, UnexpectedMsg>> unexpected;
  std::vector<std::pair<uint64_t, ClaimedMsg>> claimed;
  std::vector<shm::CompletionDesc> cq_overflow;
  std::vector<shm::SubmissionDesc> held_sends;
  std::vector<std::pair<size_t, uint64_t>> counters;  // kAll index, value
};

struct MqEngine::Loaded {
  uint64_t next_transfer = 0;
  uint64_t passes = 0;
  uint64_t company_pass = 0;
  uint64_t engine_counters[7] = {};
  std::vector<LoadedEndpoint> endpoints;
  std::vector<std::pair<uint64_t, Transfer>> transfers;
  std::vector<std::pair<uint32_t, std::deque<CrossItem>>> held;
  std::vector<std::pair<uint32_t, std::deque<CrossItem>>> held_fabric;
};

bool MqEngine::PollQuiescing() {
  bool did = copies_done() && FinishCopies();
  if (crossing_) did |= PollCrossing();
  for (Endpoint* ep : order_) {
    if (!ep->faulted && !ep->cq_overflow.empty()) did |= FlushOverflow(*ep);
  }
  if (crossing_) {
    // Anything pushed toward another shard counts, even where the pass has
    // nothing else to show for it (RetryHeld refusing the held items of a
    // receiver that faulted): that shard may have said Quiesced already.
    did |= !credits_.empty() ||
           std::any_of(wake_.begin(), wake_.end(),
                       [](uint8_t pushed) { return pushed != 0; });
    FlushCrossing();
  }
  NotifyClients();
  return did;
}

bool MqEngine::Quiesced() const {
  if (copies_done()) return false;  // copies ended, not finished yet
  for (const auto& [id, t] : transfers_) {
    if (t.taken) return false;  // a copy in place runs
  }
  if (!credits_.empty() || outbox_items_ > 0 || !departed_.empty())
    return false;
  if (crossing_ != nullptr) {
    for (uint32_t from = 0; from < shards_; from++) {
      if (from != shard_ && crossing_->Pending(from, shard_)) return false;
    }
  }
  return true;
}

size_t MqEngine::StateBytesHint() const {
  // Per entry, its fields as SaveState writes them (and a little more): a
  // posted receive 60 bytes, a message 57 and up to kInlineMax inline, a
  // completion or submission its descriptor, a slot 13; per endpoint its
  // header and counters by name (about 1.5 KiB).
  size_t bytes = 4096 + transfers_.size() * 64;
  for (const Endpoint* ep : order_) {
    bytes +=
        2048 + ep->peers.size() * 16 + ep->posted.size() * 64 +
        (ep->unexpected.size() + ep->claimed.size()) * (72 + shm::kInlineMax) +
        ep->cq_overflow.size() * sizeof(shm::CompletionDesc) +
        ep->held_sends.size() * sizeof(shm::SubmissionDesc);
  }
  return bytes;
}

void MqEngine::SaveState(handover::StateWriter& w) const {
  const size_t engine = w.BeginSection(kEngineSection);
  w.U32(kEngineFormat);
  // The shard and their number: ids name their shard (ShardOf), transfer
  // ids too, so the successor must have as many.
  w.U32(shard_);
  w.U32(shards_);
  // Written: ids of transfers that ended are recognised by being below it
  // (HandleRndvData: a chunk the sender published before it learnt).
  w.U64(next_transfer_);
  // Written: passes so far (whose endpoint of a job goes first in the next
  // pass) and the last pass with company: the successor's passes turn as
  // this engine's would have (invariant 7).
  w.U64(passes_);
  w.U64(company_pass_);
  // Written: the shard's and slices' counters (psmctl stats continue).
  for (const Counter* c : {&submissions_, &cross_in_, &cross_out_, &slices_,
                           &slice_ns_, &slices_over_8us_, &slices_over_64us_})
    w.U64(c->Get());
  // Not written, rebuilt: order_ and the jobs' turns (Add), the budgets of
  // a pass (fairness, not correctness: they adapt within a few
  // passes), shedding_ (a fresh queue keeps no spare memory), stall_watch_
  // (from each endpoint's stall_watched), takeover_candidates_ (from the
  // transfers that await kSendDone), wake_ (per pass). Empty when
  // Quiesced, so not written: outbox_, credits_, departed_, the copier's
  // queue; admit_over_budget_ is false between calls.
  w.U32(static_cast<uint32_t>(order_.size()));
  for (const Endpoint* ep : order_) {
    const size_t s = w.BeginSection(kEndpointSection);
    // Checked against the endpoint the registry re-created.
    w.U32(ep->id());
    w.U64(ep->epid());
    // Written: the daemon's private ring positions (the consumer's head is
    // in the segment too, where the client could overwrite it; the
    // completion ring's tail only here).
    w.U32(ep->msg_sq.position());
    w.U32(ep->ctl_sq.position());
    w.U32(ep->cq.position());
    // Written: flags. notify_pending is not: every endpoint is woken once
    // after the load (a spurious wake costs nothing, a lost one a hang).
    w.Bool(ep->faulted);
    w.Bool(ep->copy_denied);
    w.Bool(ep->stall_watched);
    w.U64(ep->unexpected_budget);
    // Written: since when sends wait for its budget (ReportBudgetStalls),
    // when it last sent a chunk (takeover's stall test).
    w.U64(ep->held_since_ns);
    w.U64(ep->last_chunk_ns.load(std::memory_order_relaxed));
    // Written: the connection slots, with their gone marks (invariant 8).
    w.U32(static_cast<uint32_t>(ep->peers.size()));
    for (const PeerLink& p : ep->peers) {
      w.U32(p.endpoint_id);
      w.U64(p.epid);
      w.Bool(p.gone);
    }
    // Written: posted receives in posting order (matches take the
    // earliest), each with its pattern; the id is the request (HandleRecv).
    w.U32(static_cast<uint32_t>(ep->posted.size()));
    ep->posted.for_each_in_order(
        [&](const RecvPattern& p, uint64_t, const PostedRecv& v) {
          w.U64(p.source);
          for (uint32_t t : p.tag.w) w.U32(t);
          for (uint32_t t : p.sel.w) w.U32(t);
          w.U64(v.req);
          w.U32(v.capacity);
          w.U64(v.addr);
        });
    // Written: unexpected messages in arrival order, and claimed ones.
    // unexpected_cost and the job's and uid's charges are not: recomputed
    // from these at the load.
    w.U32(static_cast<uint32_t>(ep->unexpected.size()));
    ep->unexpected.for_each_in_order(
        [&](const MsgKey& k, const UnexpectedMsg& m) {
          WriteKey(w, k);
          WriteMsg(w, m);
        });
    // Claimed messages by token, in token order (a map has none; any order
    // is the same map).
    std::map<uint64_t, const ClaimedMsg*> claimed;
    for (const auto& [token, c] : ep->claimed) claimed[token] = &c;
    w.U32(static_cast<uint32_t>(claimed.size()));
    for (const auto& [token, c] : claimed) {
      w.U64(token);
      WriteKey(w, c->key);
      WriteMsg(w, c->msg);
    }
    // Written: completions waiting for ring space, in order (shared layout).
    w.U32(static_cast<uint32_t>(ep->cq_overflow.size()));
    for (const shm::CompletionDesc& c : ep->cq_overflow) w.Pod(c);
    // Written: sends taken off the message ring that wait for a budget, in
    // order (validated again when dispatched, as before).
    w.U32(static_cast<uint32_t>(ep->held_sends.size()));
    for (const shm::SubmissionDesc& d : ep->held_sends) w.Pod(d);
    // Written: its items held by other shards whose credit has not come
    // back (the lanes are empty when quiesced: CreditsAgree).
    w.U32(ep->cross_in_flight);
    // Written: the counters by name (psmctl stats continue). posted_charged
    // is not (recomputed).
    const counters::Values values = ep->counters.Values();
    w.U32(static_cast<uint32_t>(counters::kNumCounters));
    for (size_t i = 0; i < counters::kNumCounters; i++) {
      w.Str(counters::kAll[i].name);
      w.U64(values[i]);
    }
    w.EndSection(s);
  }
  // Written: rendezvous transfers by id (sorted: deterministic output).
  // `taken` is false in all (Quiesced); last_ns as the copy clock wrote it.
  std::map<uint64_t, const Transfer*> transfers;
  for (const auto& [id, t] : transfers_) transfers[id] = &t;
  w.U32(static_cast<uint32_t>(transfers.size()));
  for (const auto& [id, t] : transfers) {
    w.U64(id);
    w.U32(t->sender_id);
    w.U32(t->receiver_id);
    w.U64(t->sender_req);
    w.U64(t->recv_req);
    w.U32(t->send_bytes);
    w.U32(t->forwarded);
    w.U64(t->send_addr);
    w.U64(t->recv_addr);
    w.Bool(t->await_done);
    w.U64(t->last_ns);
  }
  // Written: items that a budget holds for a receiver here, by receiver
  // (sorted), each list in arrival order: from other shards' senders, and
  // from other nodes (shard 0's Remote hands another shard's receiver its
  // messages and active messages whole: kRemoteArrive, kRemoteAm).
  std::map<uint32_t, const std::deque<CrossItem>*> held;
  for (const auto& [id, items] : held_items_) held[id] = &items;
  w.U32(static_cast<uint32_t>(held.size()));
  for (const auto& [id, items] : held) {
    w.U32(id);
    w.U32(static_cast<uint32_t>(items->size()));
    for (const CrossItem& item : *items) {
      w.U8(static_cast<uint8_t>(item.kind));
      w.U8(item.flags);
      w.U32(item.from);
      if (item.kind == CrossKind::kArrive ||
          item.kind == CrossKind::kRemoteArrive) {
        WriteKey(w, item.arrive.key);
        WriteMsg(w, item.arrive.msg);
      } else {  // kAm, kRemoteAm: only these four kinds are ever held
        w.Pod(item.am.c);
        w.Pod(item.am.job.uuid);
        w.U32(item.am.job.uid);
      }
    }
  }
  // Written (shard 0 with a fabric only): other shards' sends and active
  // -message requests to other nodes that the Remote holds (a receiver
  // there is off, its window full, its node's queue full), by sender
  // (sorted), each list in order. Each is one of its sender's
  // cross_in_flight, which its shard wrote.
  std::map<uint32_t, const std::deque<CrossItem>*> held_fabric;
  for (const auto& [id, items] : held_fabric_) held_fabric[id] = &items;
  w.U32(static_cast<uint32_t>(held_fabric.size()));
  for (const auto& [id, items] : held_fabric) {
    w.U32(id);
    w.U32(static_cast<uint32_t>(items->size()));
    for (const CrossItem& item : *items) {
      w.U8(item.flags);
      w.U64(item.fabric.epid);
      w.Pod(item.fabric.d);
    }
  }
  w.EndSection(engine);
}

// A message (unexpected, claimed, or held from another shard) for
// `receiver`: fields in range, its payload where a payload may be.
bool MqEngine::ReadMsg(handover::StateReader& r, const Endpoint& receiver,
                       MsgKey* key, UnexpectedMsg* m) {
  *m = UnexpectedMsg{};
  uint8_t inline_len = 0;
  if (!r.U64(&key->source, "message source") ||
      !ReadTag(r, &key->tag, "message tag") ||
      !r.U32(&m->sender_id, "message sender") ||
      !r.U8(&m->flags, "message flags") ||
      !r.Bool(&m->rendezvous, "message rendezvous") ||
      !r.U32(&m->len, "message length") ||
      !r.U64(&m->sender_req, "message sender request") ||
      !r.U64(&m->pool_offset, "message payload offset") ||
      !r.U64(&m->remote_src, "message remote source") ||
      !r.U8(&inline_len, "message inline length")) {
    return false;
  }
  if (m->remote_src != 0) {
    // From another node, through this psmd's fabric (carried with it,
    // daemon/remote/remote_handover.cc): its answers go to the sender's
    // daemon, its payload, if pooled, is in the job's inbox. A payload
    // daemon/remote keeps (sender_id) makes it a rendezvous from this psmd:
    // the Remote's section carries the payload (one it lacks fails the
    // receive, Remote::TakeKept).
    if (remote_ == nullptr)
      return r.Fail("message remote source", "names another node: no fabric");
    if (shm::NodeIdOf(m->remote_src) == shm::NodeIdOf(receiver.epid()))
      return r.Fail("message remote source", "is of this node");
    if (key->source != m->remote_src)
      return r.Fail("message source", "is not its remote sender");
    if (m->sender_id != 0 && !m->rendezvous)
      return r.Fail("message sender", "names a kept payload, but is eager");
  } else if (m->sender_id == 0 || m->sender_id == kRemotePeer) {
    return r.Fail("message sender", "is not an endpoint id");
  }
  if ((m->flags & ~SendFlags()) != 0)
    return r.Fail("message flags", "has bits no send carries");
  const Endpoint* sender =
      m->remote_src == 0 && Local(m->sender_id) ? Find(m->sender_id) : nullptr;
  if (sender != nullptr) {
    // A sender still here: of the receiver's job, under its own epid.
    if (sender->job() != receiver.job())
      return r.Fail("message sender", "is of another job");
    if (key->source != sender->epid())
      return r.Fail("message source", "is not its sender's epid");
  }
  if (key->source == kAnySource)
    return r.Fail("message source", "is the any-source wildcard");
  const uint32_t want_inline =
      !m->rendezvous && shm::IsInline(m->len) ? m->len : 0;
  if (inline_len != want_inline)
    return r.Fail("message inline length", "does not match its length");
  for (uint32_t i = 0; i < inline_len; i++) {
    if (!r.U8(&m->inline_data[i], "message inline payload")) return false;
  }
  if ((m->flags & shm::kSendFailed) && m->len != 0)
    return r.Fail("message length", "is not 0 for a failed send");
  if (m->rendezvous) {
    // The payload waits in the sender's memory: an address there only if
    // it named its buffer (kSendInPlace) on this node.
    if ((m->remote_src != 0 || !(m->flags & shm::kSendInPlace)) &&
        m->send_addr != 0)
      return r.Fail("message payload offset",
                    "is an address without kSendInPlace");
  } else if (shm::IsInline(m->len)) {
    if (m->pool_offset != 0)
      return r.Fail("message payload offset", "is set for an inline payload");
  } else {
    // In its sender's region if the sender is here (as its descriptor was
    // checked), in the job's inbox if it came from another node, else
    // somewhere in the job's pool: it is released there.
    std::optional<SendRegion> inbox;
    if (m->remote_src != 0) {
      inbox = receiver.job()->InboxRegion();
      if (!inbox) return r.Fail("message payload offset", "but no inbox");
    }
    const SendRegion region =
        sender != nullptr ? sender->region()
        : inbox           ? *inbox
                          : SendRegion{0, receiver.job()->pool().size()};
    if (ValidatePoolRange(m->pool_offset, m->len, region) != Rejection::kNone)
      return r.Fail("message payload offset",
                    "is not a chunk of the sender's pool region");
  }
  return true;
}

bool MqEngine::ReadEndpoint(handover::StateReader& r, LoadedEndpoint* out) {
  uint32_t id = 0;
  uint64_t epid = 0;
  if (!r.U32(&id, "endpoint id") || !r.U64(&epid, "endpoint epid"))
    return false;
  Endpoint* ep = Find(id);
  if (ep == nullptr) {
    return r.Fail("endpoint id",
                  std::to_string(id) + " was not added to this shard");
  }
  if (ep->epid() != epid)
    return r.Fail("endpoint epid", "is not the added one's");
  if (!ep->posted.empty() || !ep->unexpected.empty() || !ep->claimed.empty() ||
      !ep->cq_overflow.empty() || !ep->held_sends.empty())
    return r.Fail("endpoint id",
                  std::to_string(id) + " has match state already");
  out->ep = ep;
  if (!r.U32(&out->rings.msg_sq, "message ring position") ||
      !r.U32(&out->rings.ctl_sq, "control ring position") ||
      !r.U32(&out->rings.cq, "completion ring position") ||
      !r.Bool(&out->faulted, "faulted") ||
      !r.Bool(&out->copy_denied, "copy denied") ||
      !r.Bool(&out->stall_watched, "stall watched") ||
      !r.U64(&out->unexpected_budget, "unexpected budget") ||
      !r.U64(&out->held_since_ns, "held since") ||
      !r.U64(&out->last_chunk_ns, "last chunk time")) {
    return false;
  }
  // Ring positions are any values: a consumer finds what was published by
  // the slots' stamps, and a completion ring whose client index is more
  // than a ring behind is found corrupt at the next completion (the
  // endpoint faulted), as before the handover.
  // Budgets: what HandleSetOption accepts, or what the registry gave it.
  if ((out->unexpected_budget == 0 ||
       out->unexpected_budget > max_unexpected_budget_) &&
      out->unexpected_budget != ep->unexpected_budget)
    return r.Fail("unexpected budget", "is out of range");
  // (stall_watched with no clock running is legal: ReportBudgetStalls
  // drops such an endpoint from its watch at its next look.)
  out->held_since_ns = ClampNow(out->held_since_ns, NowNs());
  out->last_chunk_ns = ClampNow(out->last_chunk_ns, copy_clock_());

  uint32_t n = 0;
  if (!r.Count(&n, kMinPeerBytes, kMaxPeers, "peer count")) return false;
  out->peers.resize(n);
  for (PeerLink& p : out->peers) {
    if (!r.U32(&p.endpoint_id, "peer endpoint id") ||
        !r.U64(&p.epid, "peer epid") || !r.Bool(&p.gone, "peer gone"))
      return false;
    if (p.endpoint_id != 0 && p.endpoint_id != kRemotePeer) {
      // A peer of this shard still here: of the same job (Connect checked).
      const Endpoint* peer =
          Local(p.endpoint_id) ? Find(p.endpoint_id) : nullptr;
      if (peer != nullptr && peer->job() != ep->job())
        return r.Fail("peer endpoint id", "is of another job");
    }
  }

  // Posted receives: at most what the job may hold (invariant 9).
  if (!r.Count(&n, kMinPostedBytes, job_posted_limit_, "posted receive count"))
    return false;
  out->posted.resize(n);
  for (auto& [p, v] : out->posted) {
    if (!r.U64(&p.source, "posted source") ||
        !ReadTag(r, &p.tag, "posted tag") ||
        !ReadTag(r, &p.sel, "posted selector") ||
        !r.U64(&v.req, "posted request") ||
        !r.U32(&v.capacity, "posted capacity") ||
        !r.U64(&v.addr, "posted buffer address"))
      return false;
    // The queue keeps tag & selector: anything else was not written by one.
    if (!(matcher_internal::MaskTag(p.tag, p.sel) == p.tag))
      return r.Fail("posted tag", "has bits its selector ignores");
    v.source = p.source;
  }

  // Unexpected and claimed messages: within the budget as invariant 4
  // bounds them (plus what a closing sender may add over it).
  const uint64_t max_msgs =
      std::max(out->unexpected_budget, max_unexpected_budget_) /
          kUnexpectedOverheadBytes +
      1 + kOverBudgetSlack;
  if (!r.Count(&n, kMinMsgBytes, max_msgs, "unexpected message count"))
    return false;
  out->unexpected.resize(n);
  for (auto& [k, m] : out->unexpected) {
    if (!ReadMsg(r, *ep, &k, &m)) return false;
  }
  if (!r.Count(&n, kMinMsgBytes + 8, max_msgs - out->unexpected.size(),
               "claimed message count"))
    return false;
  out->claimed.resize(n);
  std::unordered_set<uint64_t> tokens;
  for (auto& [token, c] : out->claimed) {
    if (!r.U64(&token, "claimed token")) return false;
    if (!tokens.insert(token).second)
      return r.Fail("claimed token", "appears twice");
    if (!ReadMsg(r, *ep, &c.key, &c.msg)) return false;
    // An eager message is delivered with the probe's answer (HandleProbe):
    // only rendezvous ones wait to be claimed.
    if (!c.msg.rendezvous)
      return r.Fail("claimed message", "is not a rendezvous message");
  }

  if (!r.Count(&n, sizeof(shm::CompletionDesc), kMaxOverflow,
               "completion overflow count"))
    return false;
  out->cq_overflow.resize(n);
  for (shm::CompletionDesc& c : out->cq_overflow) {
    if (!r.Pod(&c, "overflowing completion")) return false;
    if (!ValidCompletion(c, ep->job()->pool()))
      return r.Fail("overflowing completion",
                    "has an unknown op or a chunk outside the job's pool");
  }

  // Held sends: at most a batch, taken off the message ring. The first is
  // the send that waits, which the validator accepted with the loaded
  // peers; the rest of its batch were taken with it but not dispatched yet
  // (PollMessages), so they may be anything the client wrote: Dispatch
  // checks each when its turn comes, here as it would have there.
  if (!r.Count(&n, sizeof(shm::SubmissionDesc), ep->msg_sq.capacity(),
               "held send count"))
    return false;
  out->held_sends.resize(n);
  SubmissionBounds bounds;
  bounds.peer_slots = static_cast<uint32_t>(out->peers.size());
  bounds.region = ep->region();
  for (shm::SubmissionDesc& d : out->held_sends) {
    if (!r.Pod(&d, "held send")) return false;
    if (&d == &out->held_sends.front() &&
        ValidateSubmission(d, shm::Ring::kMessage, bounds) != Rejection::kNone)
      return r.Fail("held send", "is not a valid message-ring submission");
  }

  // At most kCrossCredit: SendAcross and AmAcross take no more but for a
  // closing endpoint, which is gone by the save.
  if (!r.U32(&out->cross_in_flight, "cross-shard items in flight"))
    return false;
  if (out->cross_in_flight > kCrossCredit ||
      (shards_ == 1 && out->cross_in_flight != 0))
    return r.Fail("cross-shard items in flight", "exceed the credit");
  if (!r.Count(&n, 4 + 8, kMaxCounters, "counter count")) return false;
  out->counters.resize(n);
  std::unordered_set<size_t> named;
  for (auto& [index, value] : out->counters) {
    std::string name;
    if (!r.Str(&name, 64, "counter name") || !r.U64(&value, "counter value"))
      return false;
    // By name: a counter the successor added starts at 0; one it does not
    // know is refused (the format version should have said so).
    index = counters::kNumCounters;
    for (size_t i = 0; i < counters::kNumCounters; i++) {
      if (name == counters::kAll[i].name) index = i;
    }
    if (index == counters::kNumCounters)
      return r.Fail("counter name", "'" + name + "' is unknown");
    if (!named.insert(index).second)
      return r.Fail("counter name", "'" + name + "' appears twice");
  }
  if (!r.AtEnd()) return r.Fail("endpoint", "has bytes after its last field");
  return true;
}

bool MqEngine::ReadTransfers(handover::StateReader& r, Loaded* out) {
  uint32_t n = 0;
  if (!r.Count(&n, kMinTransferBytes, UINT32_MAX, "transfer count"))
    return false;
  out->transfers.resize(n);
  std::unordered_set<uint64_t> ids;
  const uint64_t now = copy_clock_();
  for (auto& [id, t] : out->transfers) {
    t = Transfer{};
    if (!r.U64(&id, "transfer id") || !r.U32(&t.sender_id, "transfer sender") ||
        !r.U32(&t.receiver_id, "transfer receiver") ||
        !r.U64(&t.sender_req, "transfer sender request") ||
        !r.U64(&t.recv_req, "transfer receive request") ||
        !r.U32(&t.send_bytes, "transfer length") ||
        !r.U32(&t.forwarded, "transfer forwarded") ||
        !r.U64(&t.send_addr, "transfer send address") ||
        !r.U64(&t.recv_addr, "transfer receive address") ||
        !r.Bool(&t.await_done, "transfer awaits done") ||
        !r.U64(&t.last_ns, "transfer last moved"))
      return false;
    // Ids are this shard's (a chunk finds its transfer's shard by its id),
    // handed out below next_transfer_, each once.
    if (id == 0 || id >= out->next_transfer || id % shards_ != shard_ % shards_)
      return r.Fail("transfer id", "is not one this shard handed out");
    if (!ids.insert(id).second) return r.Fail("transfer id", "appears twice");
    // The receiver's shard keeps the transfer (its id names it), and a
    // transfer ends when either side leaves here: both present.
    const Endpoint* receiver =
        Local(t.receiver_id) ? Find(t.receiver_id) : nullptr;
    if (receiver == nullptr)
      return r.Fail("transfer receiver", "is not an endpoint of this shard");
    if (t.sender_id == 0 || t.sender_id == kRemotePeer)
      return r.Fail("transfer sender", "is not an endpoint id");
    if (Local(t.sender_id)) {
      const Endpoint* sender = Find(t.sender_id);
      if (sender == nullptr)
        return r.Fail("transfer sender", "is not an endpoint of this shard");
      if (sender->job() != receiver->job())
        return r.Fail("transfer sender", "is of another job");
    }
    if (t.send_bytes == 0 || t.forwarded >= t.send_bytes)
      return r.Fail("transfer forwarded", "is not within a transfer under way");
    if (t.await_done && (t.send_addr == 0 || t.recv_addr == 0))
      return r.Fail("transfer awaits done", "without both buffers named");
    t.last_ns = ClampNow(t.last_ns, now);
  }
  return true;
}

bool MqEngine::ReadHeldItems(handover::StateReader& r, Loaded* out) {
  uint32_t receivers = 0;
  if (!r.Count(&receivers, 8, shards_ > 1 ? kMaxHeldItems : 0,
               "held receiver count"))
    return false;
  out->held.resize(receivers);
  std::unordered_set<uint32_t> seen;
  size_t total = 0;
  for (auto& [id, items] : out->held) {
    uint32_t n = 0;
    if (!r.U32(&id, "held receiver") ||
        !r.Count(&n, 1 + 1 + 4 + sizeof(shm::CompletionDesc) / 4,
                 kMaxHeldItems - total, "held item count"))
      return false;
    total += n;
    Endpoint* receiver = Local(id) ? Find(id) : nullptr;
    if (receiver == nullptr)
      return r.Fail("held receiver", "is not an endpoint of this shard");
    if (!seen.insert(id).second)
      return r.Fail("held receiver", "appears twice");
    if (n == 0) return r.Fail("held item count", "is 0");
    for (uint32_t i = 0; i < n; i++) {
      CrossItem item{};
      uint8_t kind = 0;
      if (!r.U8(&kind, "held item kind") ||
          !r.U8(&item.flags, "held item flags") ||
          !r.U32(&item.from, "held item sender"))
        return false;
      item.to = id;
      // Another shard's endpoints send items, and (through shard 0) other
      // nodes: the remote kinds, which need this psmd's fabric.
      const bool remote =
          kind == static_cast<uint8_t>(CrossKind::kRemoteArrive) ||
          kind == static_cast<uint8_t>(CrossKind::kRemoteAm);
      if (remote) {
        if (item.from != kRemotePeer || remote_ == nullptr)
          return r.Fail("held item sender",
                        "is not another node through this psmd's fabric");
      } else if (item.from == 0 || item.from == kRemotePeer ||
                 Local(item.from)) {
        return r.Fail("held item sender",
                      "is not an endpoint of another shard");
      }
      if (kind == static_cast<uint8_t>(CrossKind::kArrive) ||
          kind == static_cast<uint8_t>(CrossKind::kRemoteArrive)) {
        item.kind = static_cast<CrossKind>(kind);
        if (item.flags != 0) return r.Fail("held item flags", "are not 0");
        if (!ReadMsg(r, *receiver, &item.arrive.key, &item.arrive.msg))
          return false;
        if (remote ? item.arrive.msg.remote_src == 0
                   : item.arrive.msg.sender_id != item.from)
          return r.Fail("held item sender", "is not its message's sender");
      } else if (kind == static_cast<uint8_t>(CrossKind::kAm) ||
                 kind == static_cast<uint8_t>(CrossKind::kRemoteAm)) {
        item.kind = static_cast<CrossKind>(kind);
        // (A remote one is credited by its kind: AmArriveAcross sets none.)
        if ((item.flags & ~(remote ? 0 : kAmTakesCredit)) != 0)
          return r.Fail("held item flags", "has unknown bits");
        if (!r.Pod(&item.am.c, "held active message") ||
            !r.Pod(&item.am.job.uuid, "held active message job") ||
            !r.U32(&item.am.job.uid, "held active message uid"))
          return false;
        const shm::CompleteOp op = item.am.c.op;
        const bool request = op == shm::CompleteOp::kAmRequest;
        if (!request && op != shm::CompleteOp::kAmReply &&
            op != shm::CompleteOp::kAmAcked)
          return r.Fail("held active message", "is not an active message");
        if (!remote && ((item.flags & kAmTakesCredit) != 0) != request)
          return r.Fail("held item flags", "credit a request, only a request");
        // An active message reaches only its sender's job (TakeItem).
        if (!(item.am.job == receiver->job()->key()))
          return r.Fail("held active message job", "is not the receiver's");
        if (!ValidCompletion(item.am.c, receiver->job()->pool()))
          return r.Fail("held active message", "has a chunk outside the pool");
      } else {
        return r.Fail("held item kind", "is neither a message nor an AM");
      }
      items.push_back(item);
    }
  }
  return true;
}

bool MqEngine::ReadHeldFabric(handover::StateReader& r, Loaded* out) {
  // Only shard 0 of several holds them (a lone engine's senders hold their
  // own: held_sends), and only with a fabric.
  const bool may_hold = shards_ > 1 && shard_ == 0 && remote_ != nullptr;
  uint32_t senders = 0;
  if (!r.Count(&senders, 8, may_hold ? kMaxHeldItems : 0,
               "held fabric sender count"))
    return false;
  out->held_fabric.resize(senders);
  std::unordered_set<uint32_t> seen;
  for (auto& [id, items] : out->held_fabric) {
    uint32_t n = 0;
    // A sender takes at most kCrossCredit credits (ToFabric), but for a
    // closing sender's last sends, which are never held.
    if (!r.U32(&id, "held fabric sender") ||
        !r.Count(&n, 1 + 8 + sizeof(shm::SubmissionDesc), kCrossCredit,
                 "held fabric item count"))
      return false;
    Endpoint* sender = Local(id) ? nullptr : Known(id);
    if (id == 0 || id == kRemotePeer || sender == nullptr)
      return r.Fail("held fabric sender",
                    "is not an endpoint of another shard");
    if (!seen.insert(id).second)
      return r.Fail("held fabric sender", "appears twice");
    if (n == 0) return r.Fail("held fabric item count", "is 0");
    for (uint32_t i = 0; i < n; i++) {
      CrossItem item{};
      item.kind = CrossKind::kToFabric;
      item.from = id;
      if (!r.U8(&item.flags, "held fabric item flags") ||
          !r.U64(&item.fabric.epid, "held fabric item peer") ||
          !r.Pod(&item.fabric.d, "held fabric item"))
        return false;
      // A send or a request (an answer is never held; one to a link gone
      // waits behind its sender's held ones too): as ToFabric made it.
      const uint8_t call = item.flags & kFabricCallMask;
      if ((item.flags &
           ~(kFabricCallMask | kFabricLinkGone | kFabricMayHold)) != 0 ||
          (call != kFabricSend && call != kFabricAmRequest))
        return r.Fail("held fabric item flags", "are not a held call's");
      const shm::SubmitOp op = item.fabric.d.op;
      if (call == kFabricSend
              ? op != shm::SubmitOp::kSend && op != shm::SubmitOp::kRndvSend
              : op != shm::SubmitOp::kAmRequest)
        return r.Fail("held fabric item", "is not of its call's op");
      // Checked as its shard checked it when it was submitted; the peer
      // slot is its shard's to check, and was (the item names the epid).
      SubmissionBounds bounds;
      bounds.peer_slots = item.fabric.d.peer + 1;
      bounds.region = sender->region();
      if (ValidateSubmission(item.fabric.d, shm::TraitsOf(op).ring, bounds) !=
          Rejection::kNone)
        return r.Fail("held fabric item", "is not a valid submission");
      if (shm::NodeIdOf(item.fabric.epid) == shm::NodeIdOf(sender->epid()))
        return r.Fail("held fabric item peer", "is of this node");
      items.push_back(item);
    }
  }
  return true;
}

Status MqEngine::LoadState(handover::StateReader& in) {
  handover::StateReader r;
  Loaded loaded;
  auto refuse = [&](handover::StateReader& failed) {
    in.Absorb(failed);
    return Status(
        PSM2_INTERNAL_ERR,
        "engine state of shard " + std::to_string(shard_) + ": " + in.error());
  };
  if (!in.Section(kEngineSection, &r, "engine section")) return refuse(in);
  uint32_t format = 0, shard = 0, shards = 0;
  if (!r.U32(&format, "engine format") || !r.U32(&shard, "shard") ||
      !r.U32(&shards, "shard count"))
    return refuse(r);
  if (format != kEngineFormat) {
    r.Fail("engine format",
           std::to_string(format) + " is not " + std::to_string(kEngineFormat));
    return refuse(r);
  }
  if (shard != shard_ || shards != shards_) {
    r.Fail("shard", "shard " + std::to_string(shard) + " of " +
                        std::to_string(shards) + " is not this engine's " +
                        std::to_string(shard_) + " of " +
                        std::to_string(shards_) +
                        " (the successor must run as many workers)");
    return refuse(r);
  }
  if (!r.U64(&loaded.next_transfer, "next transfer id")) return refuse(r);
  if (loaded.next_transfer == 0 ||
      loaded.next_transfer % shards_ != shard_ % shards_ ||
      loaded.next_transfer > UINT64_MAX / 2) {
    r.Fail("next transfer id", "is not one of this shard's");
    return refuse(r);
  }
  if (!r.U64(&loaded.passes, "passes") ||
      !r.U64(&loaded.company_pass, "company pass"))
    return refuse(r);
  if (loaded.company_pass > loaded.passes) {
    r.Fail("company pass", "is after the last pass");
    return refuse(r);
  }
  for (uint64_t& c : loaded.engine_counters) {
    if (!r.U64(&c, "engine counter")) return refuse(r);
  }
  uint32_t n = 0;
  // Exactly the endpoints added: one the state does not name would run
  // with empty match state; one it names that was not added is refused by
  // ReadEndpoint.
  if (!r.Count(&n, 12, by_id_.size(), "endpoint count")) return refuse(r);
  if (n != by_id_.size()) {
    r.Fail("endpoint count", std::to_string(n) + " where " +
                                 std::to_string(by_id_.size()) +
                                 " endpoints were added");
    return refuse(r);
  }
  loaded.endpoints.resize(n);
  std::unordered_set<uint32_t> ids;
  for (LoadedEndpoint& e : loaded.endpoints) {
    handover::StateReader body;
    if (!r.Section(kEndpointSection, &body, "endpoint section"))
      return refuse(r);
    if (!ReadEndpoint(body, &e)) return refuse(body);
    if (!ids.insert(e.ep->id()).second) {
      r.Fail("endpoint id", std::to_string(e.ep->id()) + " appears twice");
      return refuse(r);
    }
  }
  // Posted receives per job and uid on this shard: within the limits
  // (invariant 9; each shard checks then charges, so one over per shard).
  std::map<const Job*, uint64_t> job_posted;
  std::map<const UidAccount*, uint64_t> uid_posted;
  for (const LoadedEndpoint& e : loaded.endpoints) {
    job_posted[e.ep->job().get()] += e.posted.size();
    uid_posted[&e.ep->job()->account()] += e.posted.size();
  }
  for (const auto& [job, count] : job_posted) {
    if (count > job_posted_limit_ + shards_) {
      r.Fail("posted receive count", "exceeds the job's limit");
      return refuse(r);
    }
  }
  for (const auto& [uid, count] : uid_posted) {
    if (count > uid_posted_limit_ + shards_) {
      r.Fail("posted receive count", "exceeds the uid's limit");
      return refuse(r);
    }
  }
  if (!ReadTransfers(r, &loaded) || !ReadHeldItems(r, &loaded) ||
      !ReadHeldFabric(r, &loaded))
    return refuse(r);
  if (!r.AtEnd()) {
    r.Fail("engine section", "has bytes after its last field");
    return refuse(r);
  }
  // Everything checked: nothing below can refuse.
  Install(loaded);
  return Status();
}

void MqEngine::Install(Loaded& loaded) {
  next_transfer_ = loaded.next_transfer;
  passes_ = loaded.passes;
  company_pass_ = loaded.company_pass;
  Counter* engine_counters[] = {
      &submissions_, &cross_in_,        &cross_out_,       &slices_,
      &slice_ns_,    &slices_over_8us_, &slices_over_64us_};
  for (size_t i = 0; i < std::size(engine_counters); i++)
    engine_counters[i]->Add(loaded.engine_counters[i]);
  for (LoadedEndpoint& e : loaded.endpoints) {
    Endpoint& ep = *e.ep;
    shm::DaemonRings rings =
        shm::DaemonRingsOf(ep.segment().base(), ep.geometry(), e.rings);
    ep.msg_sq = rings.msg_sq;
    ep.ctl_sq = rings.ctl_sq;
    ep.cq = rings.cq;
    ep.faulted = e.faulted;
    ep.copy_denied = e.copy_denied;
    ep.unexpected_budget = e.unexpected_budget;
    ep.held_since_ns = e.held_since_ns;
    ep.last_chunk_ns.store(e.last_chunk_ns, std::memory_order_relaxed);
    ep.stall_watched = e.stall_watched;
    if (e.stall_watched) stall_watch_.push_back(ep.id());
    ep.peers = std::move(e.peers);
    // In posting order: the same match order (matcher.h for_each_in_order).
    for (const auto& [p, v] : e.posted) ep.posted.post(p, v, v.req);
    ChargePosted(ep, /*exact=*/true);
    // Charged here, once each, as Arrive charged them (invariant 4).
    for (const auto& [k, m] : e.unexpected) {
      ep.unexpected.push(k, m);
      Charge(ep);
    }
    for (const auto& [token, c] : e.claimed) {
      ep.claimed.emplace(token, c);
      Charge(ep);
    }
    ep.cq_overflow.assign(e.cq_overflow.begin(), e.cq_overflow.end());
    ep.held_sends.assign(e.held_sends.begin(), e.held_sends.end());
    Counter* counters[] = {
#define PSMD_COUNTER_ADDRESS(name, unit, help) &ep.counters.name,
        PSMD_ENDPOINT_COUNTERS(PSMD_COUNTER_ADDRESS)
#undef PSMD_COUNTER_ADDRESS
    };
    for (const auto& [index, value] : e.counters) counters[index]->Add(value);
    ep.cross_in_flight = e.cross_in_flight;
    ep.notify_pending = true;  // woken once: see SaveState
  }
  for (const auto& [id, t] : loaded.transfers) {
    transfers_[id] = t;
    // Candidates for a takeover again, if this engine copies in place (a
    // successor without copies lets the stream finish: the sender's
    // kSendDone comes with its last chunk, HandleRndvData).
    // A sender of another shard is not known here until its shard answers a
    // go (kCopyPeer), which came before the handover: that transfer
    // streams to its end, its kSendDone with its last chunk (TakeChunk).
    if (t.await_done && copier_ && Local(t.sender_id))
      takeover_candidates_.push_back(id);
  }
  for (auto& [id, items] : loaded.held) held_items_[id] = std::move(items);
  size_t held_fabric = 0;
  for (auto& [id, items] : loaded.held_fabric) {
    held_fabric += items.size();
    held_fabric_[id] = std::move(items);
  }
  if (held_fabric > 0) {
    spdlog::info(
        "handover: took over {} sends of other shards' endpoints held for "
        "other nodes",
        held_fabric);
  }
}

bool MqEngine::CreditsAgree(const std::vector<const MqEngine*>& shards) {
  std::unordered_map<uint32_t, uint32_t> held;  // credited items by sender
  for (const MqEngine* e : shards) {
    for (const auto& [id, items] : e->held_items_) {
      for (const CrossItem& item : items) {
        if (item.kind == CrossKind::kArrive ||
            (item.kind == CrossKind::kAm && (item.flags & kAmTakesCredit)))
          held[item.from]++;
      }
    }
    // Each held for the fabric took its sender's credit (ToFabric).
    for (const auto& [id, items] : e->held_fabric_) {
      held[id] += static_cast<uint32_t>(items.size());
    }
  }
  for (const MqEngine* e : shards) {
    for (const Endpoint* ep : e->order_) {
      auto it = held.find(ep->id());
      if (ep->cross_in_flight != (it == held.end() ? 0 : it->second))
        return false;
    }
  }
  return true;
}

}  // namespace psmd
