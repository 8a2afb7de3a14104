#include "daemon/engine/mq_engine.h"

#include <psm2.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>

#include <spdlog/spdlog.h>

#include "daemon/clock.h"
#include "daemon/log.h"
#include "shm/doorbell.h"
#include "shm/payload.h"
#include "shm/pool.h"
#include "shm/segment.h"

namespace psmd {

namespace {

constexpr size_t kBatch = 32;

// Submissions consumed per job per pass (invariant 7): a job with many busy
// endpoints gets as much of a pass as a job with two, so one with a million
// operations queued delays another by at most one such slice per pass.
constexpr size_t kJobBudget = 4 * kBatch;
// ... and at most about this much of the worker's time per pass while
// another job has work too (invariant 7): a count alone does not bound a
// slice, since what one submission costs varies a thousandfold. Receives
// posted into a queue of a million cost 0.3 us each (their hash slots and
// nodes miss every cache), and tens of us when they fault in a growing
// table's pages or a new chunk of nodes: 128 of them were slices of
// 40-600 us, and a bystander's 8 B round trip waited for one each way
// (issue 38). 4 us is about one such round trip.
constexpr uint64_t kJobSliceNs = 4000;
// A job that consumed this many submissions in a pass (or all it was
// allowed) is timed in the next while it has company: only backlogged jobs
// read the clock, never a latency-bound client's pass.
constexpr size_t kTimedFrom = 8;
// Passes after the last one in which two jobs had work during which a job
// still counts as having company (a bystander between two messages).
constexpr size_t kCompanyPasses = 256;
// The copier's bounce buffer: one process_vm_readv and one
// process_vm_writev per MiB (docs/perf.md, "Copies in place": 64 KiB
// chunks reach half the bandwidth of 1 MiB ones at 4 MiB).
constexpr size_t kCopyChunkBytes = size_t{1} << 20;
// Takeover candidates looked at per check (every copy_after_us / 4).
constexpr size_t kTakeoverScan = 256;
// A posted queue emptied by cancels gives back what it kept from its peak
// (PostedQueue::shed_memory) once that is this much: below, it is kept for
// the receives to come.
constexpr size_t kShedFromBytes = size_t{4} << 20;

// Queue depth from which a batch's matches are prefetched. Up to here a
// queue's entries and hash slots (~250 KiB at 4096) stay in L2, and
// bench/match_bench measures the prefetch pass costing as much as it saves.
constexpr size_t kPrefetchMinDepth = 4096;

// The receive buffer's address a kRecv names (kRecvInPlace), or 0.
uint64_t RecvAddrOf(const shm::SubmissionDesc& d) {
  return (d.flags & shm::kRecvInPlace) ? d.body.recv.addr : 0;
}

// `peers`: the receiving endpoint's.
RecvPattern PatternOf(const std::vector<PeerLink>& peers,
                      const shm::SubmissionDesc& d) {
  RecvPattern p;
  p.source = d.peer == shm::kAnySlot ? kAnySource : peers[d.peer].epid;
  std::memcpy(p.tag.w, d.tag, sizeof(p.tag.w));
  std::memcpy(p.sel.w, d.body.recv.tagsel, sizeof(p.sel.w));
  return p;
}

}  // namespace

MqEngine::~MqEngine() = default;

void MqEngine::Add(std::shared_ptr<Endpoint> ep) {
  Endpoint* raw = ep.get();
  shm::DaemonRings rings =
      shm::DaemonRingsOf(raw->segment().base(), raw->geometry());
  raw->msg_sq = rings.msg_sq;
  raw->ctl_sq = rings.ctl_sq;
  raw->cq = rings.cq;
  by_id_[raw->id()] = std::move(ep);
  // Next to the other endpoints of its job: PollAll serves a job's
  // endpoints as one group (invariant 7).
  auto last_of_job = std::find_if(order_.rbegin(), order_.rend(), [&](auto* e) {
    return e->job() == raw->job();
  });
  order_.insert(last_of_job.base(), raw);
  Regroup();
}

// The jobs' runs of order_ (invariant 7), worked out when it changes rather
// than on every pass. A job whose endpoints change starts afresh.
void MqEngine::Regroup() {
  std::vector<JobTurn> turns;
  for (size_t begin = 0; begin < order_.size();) {
    size_t end = begin + 1;
    while (end < order_.size() && order_[end]->job() == order_[begin]->job())
      end++;
    turns.push_back(JobTurn{begin, end, 0, kJobBudget, 0, false, false});
    begin = end;
  }
  job_turns_ = std::move(turns);
}

void MqEngine::Remove(uint32_t id) {
  auto it = by_id_.find(id);
  if (it == by_id_.end()) return;
  Endpoint& ep = *it->second;
  // Submissions the client published before it closed (or died) still count:
  // a send it saw complete locally must reach its receiver. Sends still held
  // for budget are admitted regardless: the sender is gone, and dropping them
  // would lose messages it saw complete.
  admit_over_budget_ = true;
  // Nobody will read its completions any more: the pool chunks they hand
  // over go back to their senders, or those would wait for good.
  auto release_unread = [&] {
    for (const shm::CompletionDesc& c : ep.cq_overflow) ReleaseUnread(ep, c);
    ep.cq_overflow.clear();
  };
  for (uint32_t i = 0; i <= 2 * ep.msg_sq.capacity() && !ep.faulted &&
                       (ep.msg_sq.Available() > 0 ||
                        ep.ctl_sq.Available() > 0 || !ep.held_sends.empty());
       i++) {
    release_unread();
    Poll(ep);
  }
  admit_over_budget_ = false;
  release_unread();
  ep.cq.ForEachUnconsumed(
      [&](const shm::CompletionDesc& c) { ReleaseUnread(ep, c); });
  ep.posted.clear();  // O(chunks), however many receives it had posted
  ChargePosted(ep, /*exact=*/true);  // gives its share back (invariant 9)
  ep.unexpected.drain(
      [&](const MsgKey&, UnexpectedMsg&& m) { Discard(ep, m); });
  for (auto& [token, c] : ep.claimed) Discard(ep, c.msg);
  ep.claimed.clear();
  // Before the endpoint (and its pidfd) goes: no byte moves to or from its
  // process after this (CrossCopier invariant 3); the transfers the copies
  // belonged to end below.
  // Copies another shard runs from it deliver nothing read after this
  // (CrossCopier invariant 4); that shard cancels them at its kGone.
  ep.removed.store(true, std::memory_order_release);
  if (copier_) copier_->Cancel(id);
  for (auto t = transfers_.begin(); t != transfers_.end();) {
    if (t->second.sender_id == id) {
      // The receiver would wait forever for the rest of the message.
      if (Endpoint* r = Find(t->second.receiver_id)) {
        PostError(*r, t->second.recv_req, PSM2_EPID_UNREACHABLE);
      }
      t = transfers_.erase(t);
      continue;
    }
    if (t->second.receiver_id == id) {
      // The sender learns at once (its queued chunks are dropped); chunks
      // already on its ring are released as they arrive (HandleRndvData:
      // a transfer that ended).
      PostErrorTo(t->second.sender_id, t->second.sender_req,
                  PSM2_EPID_UNREACHABLE);
      t = transfers_.erase(t);
      continue;
    }
    ++t;
  }
  if (remote_) remote_->EndpointRemoved(id);
  if (crossing_) RemoveAcross(ep);
  order_.erase(std::find(order_.begin(), order_.end(), &ep));
  Regroup();
  // Its peers' receives naming it can never match now (invariant 8): they
  // fail at once instead of waiting forever.
  PeersGone([id](const Endpoint&,
                 const PeerLink& link) { return link.endpoint_id == id; },
            PSM2_EPID_UNREACHABLE);
  if (crossing_ && shards_ > 1) {
    departed_.emplace(id, Departed{std::move(it->second), shards_ - 1});
  }
  by_id_.erase(it);
}

void MqEngine::PeersGone(const LinkFilter& gone, int32_t error) {
  for (Endpoint* ep : order_) {
    for (PeerLink& link : ep->peers) {
      if (link.gone || !gone(*ep, link)) continue;
      link.gone = true;
      const uint64_t gone_epid = link.epid;
      ep->posted.remove_all_if(
          [&](const PostedRecv& r) { return r.source == gone_epid; },
          [&](PostedRecv&& r) { PostError(*ep, r.req, error); });
    }
  }
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
  bool did = copies_done() && FinishCopies();
  if (!takeover_candidates_.empty()) did |= TakeOverStalled();
  if (!shedding_.empty()) did |= ShedStep();
  ++passes_;
  // Two phases: every endpoint's control ring (receives, probes, ...) before
  // any message ring. A receive published before a send (say, before the
  // receiver told the sender to go) then finds the send as expected unless
  // it arrived within the microseconds of one pass: fewer unexpected
  // messages, and matching follows the order processes saw.
  //
  // Each job (a run of order_, see Add) spends at most kJobBudget
  // submissions over both phases, and its endpoints take turns being first
  // from pass to pass, so none of them starves when the budget runs out
  // (invariant 7). Index loops: handlers never add or remove endpoints.
  size_t busy_jobs = 0;
  for (int phase = 0; phase < 2; phase++) {
    // What other shards sent arrives with the message rings, after every
    // control ring, as a local send does (invariant 11).
    if (phase == 1 && crossing_) did |= PollCrossing();
    for (JobTurn& t : job_turns_) {
      if (phase == 0) {
        t.used = 0;
        t.ns = 0;
      }
      const size_t begin = t.begin;
      const size_t n = t.end - begin;
      // (No division for a job of one endpoint: a divide costs dozens of
      // cycles, on every pass of every latency-bound client.)
      const size_t first = n == 1 ? 0 : passes_ % n;
      const uint64_t start = t.timed ? NowNs() : 0;
      for (size_t k = 0; k < n && t.used < t.budget; k++) {
        const size_t turn = first + k < n ? first + k : first + k - n;
        Endpoint& ep = *order_[begin + turn];
        const size_t limit = std::min(kBatch, t.budget - t.used);
        if (phase == 0) {
          did |= PollControl(ep, limit, &t.used);
        } else if (!ep.faulted && ep.cq_overflow.empty()) {
          did |= PollMessages(ep, limit, &t.used);
        }
      }
      if (t.timed) t.ns += NowNs() - start;
      if (phase == 1) {
        busy_jobs += t.used > 0;
        // Only a job with a backlog, or one timed or held back, has a
        // budget to work out: a latency-bound pass skips the call.
        if (t.used >= kTimedFrom || t.adapting) Rebudget(t);
      }
    }
  }
  if (busy_jobs > 1) company_pass_ = passes_;
  if (crossing_) FlushCrossing();
  return did;
}

// Invariant 7's time bound. A job is timed once it shows a backlog (it
// consumed kTimedFrom submissions, or all it was allowed) while another
// job has work; its next budget is what fits in kJobSliceNs at the cost
// per submission it just took, so a slice tracks its cost from pass to
// pass (a deep queue, a growing table). Without company the budget is
// kJobBudget again. Without a backlog nothing is timed and the budget
// doubles per pass: a flooding client whose ring ran dry for a pass (it
// publishes only inside its library's calls) must not come back with a
// full kJobBudget of its expensive submissions.
void MqEngine::Rebudget(JobTurn& t) {
  // Company as of the passes before this one.
  const bool company = passes_ - company_pass_ <= kCompanyPasses;
  if (t.timed && t.used > 0) {
    slices_.Add(1);
    slice_ns_.Add(t.ns);
    if (t.ns > 8000) slices_over_8us_.Add(1);
    if (t.ns > 64000) slices_over_64us_.Add(1);
  }
  if (!company) {
    t.timed = false;
    t.budget = kJobBudget;
  } else if (t.used < kTimedFrom && t.used < t.budget) {
    t.timed = false;
    t.budget = std::min(kJobBudget, 2 * t.budget);
  } else {
    if (t.timed && t.ns > 0) {
      t.budget = static_cast<size_t>(
          std::clamp<uint64_t>(t.used * kJobSliceNs / t.ns, 1, kJobBudget));
    }
    t.timed = true;
  }
  t.adapting = t.timed || t.budget != kJobBudget;
}

bool MqEngine::AnySubmissionPending() {
  for (Endpoint* ep : order_) {
    if (SubmissionPending(*ep)) return true;
  }
  return false;
}

bool MqEngine::SubmissionPending(Endpoint& ep) {
  if (ep.faulted) return false;
  // Completions waiting for ring space the client has freed meanwhile. (A
  // client that frees space after this check sees cq_space_wanted, set
  // before the caller's fence, and rings.)
  if (!ep.cq_overflow.empty() && ep.cq.FreeSlots() > 0) return true;
  // A held endpoint's message ring does not count: it waits for a receiver,
  // and whatever drains that receiver arrives on some control ring.
  // Nor does a control ring that waits for its control credit
  // (PollControl): the shard that gives it back wakes this one.
  if (ep.ctl_sq.Available() > 0 && ep.ctl_in_flight < kControlCredit)
    return true;
  return ep.held_sends.empty() && ep.msg_sq.Available() > 0;
}

bool MqEngine::DoorbellIdle(Endpoint& ep) {
  if (SubmissionPending(ep)) return false;
  if (ep.faulted || ep.held_sends.empty()) return true;
  const uint32_t end = ep.msg_sq.position() + ep.msg_sq.Rescan();
  return std::exchange(ep.doorbell_seen_end, end) == end;
}

bool MqEngine::Poll(Endpoint& ep) {
  bool did = PollControl(ep);
  if (!ep.faulted && ep.cq_overflow.empty()) did |= PollMessages(ep);
  return did;
}

bool MqEngine::PollControl(Endpoint& ep, size_t limit, size_t* used) {
  if (ep.faulted) return false;
  bool did = false;
  if (!ep.cq_overflow.empty()) {
    did = FlushOverflow(ep);
    if (!ep.cq_overflow.empty()) return did;  // back-pressure: see invariant 3
  }
  // An empty ring, the common case, costs one look at its next slot.
  if (ep.ctl_sq.Available() == 0) return did;
  // What it handed other shards was not taken there yet: its control ring
  // waits for the credit, so that what waits for a lane, and the answers
  // to it, stay bounded (invariant 11). A closing endpoint's submissions
  // are all taken (Remove).
  if (ep.ctl_in_flight >= kControlCredit && !admit_over_budget_) return did;
  shm::SubmissionDesc batch[kBatch];
  size_t n = ep.ctl_sq.PopBatch(batch, std::min(limit, kBatch));
  if (used != nullptr) *used += n;
  submissions_.Add(n);
  PrefetchMatches(ep, batch, n);
  pushing_ = &ep;  // its items in the outbox count against it
  for (size_t i = 0; i < n; i++) Dispatch(ep, batch[i], shm::Ring::kControl);
  pushing_ = nullptr;
  return did || n > 0;
}

bool MqEngine::PollMessages(Endpoint& ep, size_t limit, size_t* used) {
  if (ep.held_sends.empty() && ep.msg_sq.Available() == 0) return false;
  bool did = false;
  size_t held = 0;
  while (!ep.held_sends.empty()) {
    if (used != nullptr) ++*used;
    ++held;
    if (!Dispatch(ep, ep.held_sends.front(), shm::Ring::kMessage))
      return did;  // still over budget
    ep.held_sends.pop_front();
    did = true;
  }
  shm::SubmissionDesc batch[kBatch];
  const size_t room = std::min(limit, kBatch);
  size_t n = ep.msg_sq.PopBatch(batch, held < room ? room - held : 0);
  if (used != nullptr) *used += n;
  submissions_.Add(n);
  PrefetchMatches(ep, batch, n);
  for (size_t i = 0; i < n; i++) {
    if (!Dispatch(ep, batch[i], shm::Ring::kMessage)) {
      ep.counters.sends_held.Add(1);
      ep.held_sends.assign(batch + i, batch + n);
      return true;
    }
  }
  return did || n > 0;
}

// At depth each match waits for main memory twice (hash slot, then entry);
// asking for every match of the batch first lets those waits overlap, in the
// two passes PostedQueue::prefetch_slot() describes. Only a hint: a
// descriptor is checked just enough to be safe to look at (Dispatch
// validates it for real), and the queues are not changed. A batch of one
// has no waits to overlap (and an empty poll nothing to look at): both
// return at once, as most passes of a latency-bound client do.
void MqEngine::PrefetchMatches(Endpoint& ep, const shm::SubmissionDesc* batch,
                               size_t n) {
  if (n < 2) return;
  // Calls prefetch(queue, key) for every descriptor whose queue is deep;
  // returns how many there were.
  auto each_deep_match = [&](auto&& prefetch) {
    size_t deep = 0;
    uint32_t receiver_slot = shm::kAnySlot;  // batches mostly go to one peer
    const Endpoint* receiver = nullptr;
    for (size_t i = 0; i < n; i++) {
      const shm::SubmissionDesc& d = batch[i];
      if (d.op == shm::SubmitOp::kSend || d.op == shm::SubmitOp::kRndvSend) {
        if (d.peer >= ep.peers.size()) continue;
        if (d.peer != receiver_slot) {
          receiver_slot = d.peer;
          receiver = Find(ep.peers[d.peer].endpoint_id);
        }
        if (receiver != nullptr &&
            receiver->posted.size() >= kPrefetchMinDepth) {
          prefetch(receiver->posted, KeyOf(ep.epid(), d.tag));
          deep++;
        }
      } else if (d.op == shm::SubmitOp::kRecv) {
        if (d.peer != shm::kAnySlot && d.peer >= ep.peers.size()) continue;
        if (ep.unexpected.size() >= kPrefetchMinDepth) {
          prefetch(ep.unexpected, PatternOf(ep.peers, d));
          deep++;
        }
      }
    }
    return deep;
  };
  // Shallow queues (the common case) cost one look at the batch.
  if (each_deep_match([](const auto& queue, const auto& key) {
        queue.prefetch_slot(key);
      }) == 0) {
    return;
  }
  each_deep_match(
      [](const auto& queue, const auto& key) { queue.prefetch_entry(key); });
}

// Indexed by SubmitOp, row for row with shm::kOpTraits.
const MqEngine::Handler MqEngine::kHandlers[shm::kSubmitOpCount] = {
    /* kInvalid     */ nullptr,  // rejected by validation
    /* kSend        */ &MqEngine::HandleSend,
    /* kRecv        */ &MqEngine::HandleRecv,
    /* kCancel      */ &MqEngine::HandleCancel,
    /* kRndvSend    */ &MqEngine::HandleSend,
    /* kRndvData    */ &MqEngine::HandleRndvData,
    /* kProbe       */ &MqEngine::HandleProbe,
    /* kClaimedRecv */ &MqEngine::HandleClaimedRecv,
    /* kSetOption   */ &MqEngine::HandleSetOption,
    /* kAmRequest   */ &MqEngine::HandleAmRequest,
    /* kAmReply     */ &MqEngine::HandleAmReply,
    /* kAmAck       */ &MqEngine::HandleAmAck,
};

bool MqEngine::Dispatch(Endpoint& ep, const shm::SubmissionDesc& d,
                        shm::Ring ring) {
  SubmissionBounds bounds;
  bounds.peer_slots = static_cast<uint32_t>(ep.peers.size());
  bounds.region = ep.region();
  Rejection r = ValidateSubmission(d, ring, bounds);
  if (r == Rejection::kNone) {
    // A slot in range may still have been disconnected.
    const shm::PeerField peer = shm::TraitsOf(d.op).peer;
    const bool names_slot =
        peer == shm::PeerField::kSlot || peer == shm::PeerField::kSlotOrAny;
    if (names_slot && d.peer != shm::kAnySlot &&
        ep.peers[d.peer].endpoint_id == 0) {
      // A send published just before its slot was disconnected: the client
      // saw it complete and will not release its (validated) payload, so it
      // goes back here, as for a peer that is gone. Found by engine_fuzz.
      shm::PayloadOf(ep.job()->pool().base(), d).Release();
      r = Rejection::kBadPeer;
    }
  }
  if (r != Rejection::kNone) {
    ReportBadDescriptor(ep, RejectionName(r));
    PostError(ep, d.req,
              r == Rejection::kBadPeer ? PSM2_EPID_UNKNOWN : PSM2_PARAM_ERR);
    return true;
  }
  return (this->*kHandlers[static_cast<uint8_t>(d.op)])(ep, d);
}

// One body for every Part, so that a local send's arrival (kWhole, the hot
// path) compiles to the match, the budget check and the queueing alone,
// inlined into HandleSend (always: GCC would not, as it has four callers).
template <MqEngine::Part kPart>
[[gnu::always_inline]] inline MqEngine::Arrival MqEngine::ArriveAs(
    Endpoint& receiver, const MsgKey& key, const UnexpectedMsg& m,
    PostedRecv* claim) {
  // The receive it matches: the one its envelope claimed, or the first
  // posted.
  std::optional<PostedRecv> recv;
  if (kPart == Part::kPayload && claim != nullptr) {
    recv = *claim;
  } else {
    recv = receiver.posted.take_match(key);
  }
  if (recv) {
    if constexpr (kPart == Part::kEnvelope) {
      *claim = *recv;
    } else {
      Deliver(receiver, recv->req, recv->capacity, key, m,
              /*was_unexpected=*/false, recv->addr);
    }
    return Arrival::kMatched;
  }
  // Invariant 4. (While Remove flushes a closing sender, its sends are
  // admitted over any budget: it saw them complete.) With shards, the job's
  // and uid's counters are charged by every shard: reserved, then looked
  // at (ChargeWithin), so that two shards cannot both squeeze under.
  const bool shared = kPart == Part::kWhole && shards_ > 1;
  if (shared) {
    if (!ChargeWithin(receiver)) {
      NoteHeld(receiver);
      return Arrival::kHeld;
    }
  } else if (kPart != Part::kPayload && !admit_over_budget_ &&
             OverBudget(receiver)) {
    NoteHeld(receiver);
    return Arrival::kHeld;
  }
  if constexpr (kPart == Part::kEnvelope) return Arrival::kQueued;
  receiver.counters.unexpected_msgs.Add(1);
  receiver.counters.unexpected_bytes.Add(m.len);
  if (!shared) Charge(receiver);
  receiver.unexpected.push(key, m);
  return Arrival::kQueued;
}

MqEngine::Arrival MqEngine::Arrive(Endpoint& receiver, const MsgKey& key,
                                   const UnexpectedMsg& m, Part part,
                                   PostedRecv* claim) {
  switch (part) {
    case Part::kEnvelope:
      return ArriveAs<Part::kEnvelope>(receiver, key, m, claim);
    case Part::kPayload:
      return ArriveAs<Part::kPayload>(receiver, key, m, claim);
    case Part::kWhole:
      break;
  }
  return ArriveAs<Part::kWhole>(receiver, key, m, claim);
}

bool MqEngine::HandleSend(Endpoint& sender, const shm::SubmissionDesc& d) {
  const PeerLink& link = sender.peers[d.peer];
  if (link.endpoint_id == kRemotePeer && remote_) {
    return remote_->Send(sender, d, link, /*may_hold=*/!admit_over_budget_);
  }
  UnexpectedMsg m{};
  m.sender_id = sender.id();
  m.flags = d.flags;
  m.rendezvous = d.op == shm::SubmitOp::kRndvSend;
  m.len = d.len;
  m.sender_req = d.req;
  if (m.rendezvous) {
    // No payload yet: psmd copies it (kSendInPlace, invariant 10) or the
    // sender streams it after the match (kRndvGo).
    if (d.flags & shm::kSendInPlace) m.send_addr = d.body.place.addr;
  } else if (shm::IsInline(d.len)) {
    std::memcpy(m.inline_data, d.body.inline_data, d.len);
  } else {
    m.pool_offset = d.body.pool.pool_offset;
  }
  if (!Local(link.endpoint_id)) {
    // Invariant 11: it arrives on the receiver's shard.
    if (!SendAcross(sender, link.endpoint_id, KeyOf(sender.epid(), d.tag), m))
      return false;  // out of credit: held
  } else {
    Endpoint* receiver = Find(link.endpoint_id);
    if (receiver == nullptr || receiver->faulted) {
      // The peer is gone: give the payload back and tell the sender.
      ReleasePayload(sender, m);
      PostError(sender, d.req, PSM2_EPID_UNREACHABLE);
      return true;
    }
    if (ArriveAs<Part::kWhole>(*receiver, KeyOf(sender.epid(), d.tag), m,
                               nullptr) == Arrival::kHeld) {
      return false;
    }
  }
  sender.counters.msgs_sent.Add(1);
  sender.counters.bytes_sent.Add(d.len);
  if (m.rendezvous) {
    sender.counters.rndv_msgs_sent.Add(1);
    sender.counters.rndv_bytes_sent.Add(d.len);
  }
  return true;
}

bool MqEngine::HandleRecv(Endpoint& receiver, const shm::SubmissionDesc& d) {
  RecvPattern p = PatternOf(receiver.peers, d);
  receiver.counters.posted_recvs.Add(1);
  MsgKey key;
  if (auto m = receiver.unexpected.take(p, &key)) {
    Uncharge(receiver);
    Deliver(receiver, d.req, d.len, key, *m, /*was_unexpected=*/true,
            RecvAddrOf(d));
    return true;
  }
  if (d.peer != shm::kAnySlot && receiver.peers[d.peer].gone) {
    // Nothing more can come from that peer (invariant 8).
    PostError(receiver, d.req, PSM2_EPID_UNREACHABLE);
    return true;
  }
  if (!PostedFits(receiver)) {
    receiver.counters.recvs_refused.Add(1);
    WarnClient(
        receiver.uid(),
        "endpoint {} (uid {}): receive refused: its job holds {} posted "
        "receives, its uid {} (max_posted_recvs_per_job {}, "
        "max_posted_recvs_per_uid {})",
        receiver.id(), receiver.uid(),
        receiver.job()->posted_recvs.load(std::memory_order_relaxed),
        receiver.job()->account().posted_recvs.load(std::memory_order_relaxed),
        job_posted_limit_, uid_posted_limit_);
    PostError(receiver, d.req, PSM2_NO_MEMORY);
    return true;
  }
  receiver.posted.post(p, PostedRecv{d.req, d.len, p.source, RecvAddrOf(d)},
                       d.req);
  ChargePosted(receiver);
  return true;
}

void MqEngine::ChargePosted(Endpoint& ep, bool exact) {
  uint64_t now = ep.posted.size();
  if (shards_ > 1 && !exact) {
    // The job's and uid's counts are lines every shard writes: a stream of
    // receives touches them once per kPostedStep (invariant 9: high by
    // less than two steps per endpoint, never low).
    if (now <= ep.posted_charged && ep.posted_charged - now < 2 * kPostedStep)
      return;
    now = (now + kPostedStep - 1) / kPostedStep * kPostedStep;
  }
  // Unsigned arithmetic: a shrunken queue subtracts.
  AddTo(ep.job()->posted_recvs, now - ep.posted_charged);
  AddTo(ep.job()->account().posted_recvs, now - ep.posted_charged);
  ep.posted_charged = now;
}

bool MqEngine::PostedFits(Endpoint& ep) {
  auto fits = [&] {
    return ep.job()->posted_recvs.load(std::memory_order_relaxed) <
               job_posted_limit_ &&
           ep.job()->account().posted_recvs.load(std::memory_order_relaxed) <
               uid_posted_limit_;
  };
  ChargePosted(ep);
  if (fits()) return true;
  // Counts may be stale-high (receives matched or cancelled since): count
  // afresh. Rare: only at the limit.
  for (Endpoint* other : order_) {
    if (&other->job()->account() == &ep.job()->account()) ChargePosted(*other);
  }
  return fits();
}

bool MqEngine::HandleCancel(Endpoint& ep, const shm::SubmissionDesc& d) {
  shm::CompletionDesc c{};
  c.op = shm::CompleteOp::kCancelDone;
  c.req = d.req;
  // O(1) (PostedQueue::remove_id): a client cancelling receives must not
  // make the worker scan every one it has posted.
  auto removed = ep.posted.remove_id(d.body.cancel.target);
  c.error = removed ? PSM2_OK : PSM2_MQ_NO_COMPLETIONS;
  Post(ep, c);
  // The last of a deep queue cancelled: give its memory back, a step per
  // pass (ShedStep).
  if (removed && ep.posted.empty() &&
      ep.posted.memory_bytes() >= kShedFromBytes &&
      std::find(shedding_.begin(), shedding_.end(), ep.id()) ==
          shedding_.end()) {
    shedding_.push_back(ep.id());
  }
  return true;
}

bool MqEngine::ShedStep() {
  Endpoint* ep = Find(shedding_.front());
  if (ep == nullptr || !ep->posted.shed_memory()) {
    shedding_.erase(shedding_.begin());
  }
  return true;
}

bool MqEngine::HandleProbe(Endpoint& ep, const shm::SubmissionDesc& d) {
  ep.counters.probes.Add(1);
  RecvPattern p = PatternOf(ep.peers, d);
  shm::CompletionDesc c{};
  c.op = shm::CompleteOp::kProbeDone;
  c.req = d.req;
  MsgKey key;
  const UnexpectedMsg* found = nullptr;
  std::optional<UnexpectedMsg> taken;
  if (d.flags & shm::kProbeRemove) {
    taken = ep.unexpected.take(p, &key);
    if (taken) found = &*taken;
  } else {
    found = ep.unexpected.find(p, &key);
  }
  if (found == nullptr) {
    c.error = PSM2_MQ_NO_COMPLETIONS;
    Post(ep, c);
    return true;
  }
  c.error = PSM2_OK;
  std::memcpy(c.tag, key.tag.w, sizeof(c.tag));
  c.msg_len = found->len;
  c.src_epid = key.source;
  if (taken && !taken->rendezvous) {
    // An eager message is received by the claim itself: its payload goes to
    // the client with the answer, so psm2_mq_imrecv completes at once, as
    // with Intel's library (applications drop such requests after one test
    // and free the buffer). The message is matched: a sync sender completes.
    Uncharge(ep);
    c.flags |= shm::kPayloadClaimed | shm::kWasUnexpected;
    AttachEagerPayload(c, *taken);
    ep.counters.msgs_received.Add(1);
    ep.counters.bytes_received.Add(taken->len);
    // The sync sender first, as in Deliver.
    if (taken->flags & shm::kSendSync) CompleteSyncOf(ep, *taken, PSM2_OK);
    Post(ep, c);
    return true;
  }
  if (taken) {
    // Still charged to the budget until received. A client reusing a token
    // replaces (and so must first give back) what it had claimed.
    auto [slot, fresh] = ep.claimed.try_emplace(d.req, ClaimedMsg{key, *taken});
    if (!fresh) {
      Discard(ep, slot->second.msg);
      slot->second = ClaimedMsg{key, *taken};
    }
  }
  Post(ep, c);
  return true;
}

bool MqEngine::HandleClaimedRecv(Endpoint& ep, const shm::SubmissionDesc& d) {
  auto it = ep.claimed.find(d.req);
  if (it == ep.claimed.end()) {
    ReportBadDescriptor(ep, "receive of a message no matched probe claimed");
    PostError(ep, d.req, PSM2_MQ_NO_COMPLETIONS);
    return true;
  }
  ClaimedMsg c = it->second;
  ep.claimed.erase(it);
  Uncharge(ep);
  Deliver(ep, d.req, d.len, c.key, c.msg, /*was_unexpected=*/true,
          (d.flags & shm::kRecvInPlace) ? d.body.place.addr : 0);
  return true;
}

bool MqEngine::HandleRndvData(Endpoint& sender, const shm::SubmissionDesc& d) {
  if (remote_ && transfers_.count(d.body.rndv.transfer) == 0 &&
      remote_->RndvData(sender, d)) {
    return true;  // a transfer to another node
  }
  // Invariant 11: the transfer is kept by the receiver's shard.
  if (shards_ > 1 && d.body.rndv.transfer % shards_ != shard_) {
    return ChunkAcross(sender, d);
  }
  // The pool range was validated, so the chunk can safely be given back if
  // it goes nowhere.
  shm::PoolPayload chunk = shm::PayloadOf(sender.job()->pool().base(), d);
  auto it = transfers_.find(d.body.rndv.transfer);
  if (it == transfers_.end() && d.body.rndv.transfer != 0 &&
      d.body.rndv.transfer < next_transfer_) {
    // A transfer that ended (psmd moved the rest itself, or its receiver
    // left): the sender published this before it learnt; nobody reads it.
    return true;
  }
  if (it != transfers_.end() && it->second.taken &&
      it->second.sender_id == sender.id()) {
    return true;  // psmd is copying the rest: released unread
  }
  if (it == transfers_.end() || it->second.sender_id != sender.id() ||
      d.body.rndv.offset != it->second.forwarded ||
      d.len > it->second.send_bytes - it->second.forwarded) {
    ReportBadDescriptor(
        sender, "rendezvous chunk out of order or for an unknown transfer");
    PostError(sender, d.req, PSM2_PARAM_ERR);
    return true;
  }
  Transfer& t = it->second;
  // (Not handed over, the chunk goes back when `chunk` goes.)
  if (ForwardChunk(t, d.body.rndv.pool_offset, d.len)) chunk.Take();
  t.forwarded += d.len;
  const uint64_t now = copy_clock_();
  sender.last_chunk_ns.store(now, std::memory_order_relaxed);
  if (t.await_done) t.last_ns = now;
  if (t.forwarded == t.send_bytes) {
    if (t.await_done) {  // the sender's buffer is free now
      shm::CompletionDesc c{};
      c.op = shm::CompleteOp::kSendDone;
      c.req = t.sender_req;
      Post(sender, c);
    }
    transfers_.erase(it);
  }
  return true;
}

bool MqEngine::ForwardChunk(const Transfer& t, uint64_t pool_offset,
                            uint32_t len) {
  Endpoint* receiver = Find(t.receiver_id);
  if (receiver == nullptr || receiver->faulted) return false;
  shm::CompletionDesc c{};
  c.op = shm::CompleteOp::kRndvChunk;
  c.req = t.recv_req;
  c.body.chunk.pool_offset = pool_offset;
  c.body.chunk.offset = t.forwarded;
  c.body.chunk.len = len;
  Post(*receiver, c);
  return true;
}

bool MqEngine::HandleSetOption(Endpoint& ep, const shm::SubmissionDesc& d) {
  shm::CompletionDesc c{};
  c.op = shm::CompleteOp::kOptionSet;
  c.req = d.req;
  c.error = PSM2_OK;
  switch (static_cast<shm::QueueOption>(d.body.option.key)) {
    case shm::QueueOption::kUnexpectedBudgetBytes:
      if (d.body.option.value == 0 ||
          d.body.option.value > max_unexpected_budget_) {
        c.error = PSM2_PARAM_ERR;
      } else {
        ep.unexpected_budget = d.body.option.value;
      }
      break;
    default:
      c.error = PSM2_PARAM_ERR;
      break;
  }
  Post(ep, c);
  return true;
}

bool MqEngine::HandleAmRequest(Endpoint& sender, const shm::SubmissionDesc& d) {
  if (sender.peers[d.peer].endpoint_id == kRemotePeer && remote_) {
    return remote_->AmRequest(sender, d, sender.peers[d.peer],
                              /*may_hold=*/!admit_over_budget_);
  }
  uint8_t flags = 0;
  if (d.flags & shm::kAmNoReply) flags |= shm::kAmRequestNoReply;
  if (d.flags & shm::kAmWantsAck) flags |= shm::kAmRequestWantsAck;
  const uint32_t target_id = sender.peers[d.peer].endpoint_id;
  if (!Local(target_id)) {
    if (!AmAcross(sender, target_id,
                  AmCompletion(sender, d, shm::CompleteOp::kAmRequest, flags),
                  /*request=*/true)) {
      return false;  // out of credit: held
    }
    sender.counters.am_requests_sent.Add(1);
    return true;
  }
  Endpoint* target = Find(target_id);
  if (target == nullptr || target->faulted) {
    shm::PayloadOf(sender.job()->pool().base(), d).Release();
    PostError(sender, d.req, PSM2_EPID_UNREACHABLE);
    return true;
  }
  if (AmHeld(*target)) return false;  // held (invariant 6)
  Post(*target, AmCompletion(sender, d, shm::CompleteOp::kAmRequest, flags));
  sender.counters.am_requests_sent.Add(1);
  return true;
}

bool MqEngine::HandleAmReply(Endpoint& sender, const shm::SubmissionDesc& d) {
  if (remote_ && IsProxy(d.peer)) {
    remote_->AmReplyOrAck(sender, d);
    return true;
  }
  const shm::CompletionDesc c =
      AmCompletion(sender, d, shm::CompleteOp::kAmReply,
                   (d.flags & shm::kAmWantsAck) ? shm::kAmRequestWantsAck : 0);
  if (!Local(d.peer)) {
    AmAcross(sender, d.peer, c, /*request=*/false);
    sender.counters.am_replies_sent.Add(1);
    return true;
  }
  Endpoint* target = FindInJob(sender, d.peer);
  if (target == nullptr) {
    shm::PayloadOf(sender.job()->pool().base(), d).Release();
    PostError(sender, d.req, PSM2_EPID_UNREACHABLE);
    return true;
  }
  Post(*target, c);
  sender.counters.am_replies_sent.Add(1);
  return true;
}

bool MqEngine::HandleAmAck(Endpoint& sender, const shm::SubmissionDesc& d) {
  if (remote_ && IsProxy(d.peer)) {
    remote_->AmReplyOrAck(sender, d);
    return true;
  }
  shm::CompletionDesc c{};
  c.op = shm::CompleteOp::kAmAcked;
  c.req = d.body.ack.request;
  c.error = d.body.ack.error;
  c.tag[0] = d.body.ack.handler;
  c.src_epid = sender.epid();
  if (!Local(d.peer)) {
    AmAcross(sender, d.peer, c, /*request=*/false);
    return true;
  }
  Endpoint* target = FindInJob(sender, d.peer);
  if (target == nullptr) return true;  // the requester is gone: nobody to tell
  Post(*target, c);
  return true;
}

shm::CompletionDesc MqEngine::AmCompletion(const Endpoint& sender,
                                           const shm::SubmissionDesc& d,
                                           shm::CompleteOp op, uint8_t flags) {
  shm::CompletionDesc c{};
  c.op = op;
  c.flags = flags;
  c.req = d.req;
  c.tag[0] = d.tag[0];
  c.tag[1] = d.tag[1];
  c.tag[2] = sender.id();
  c.msg_len = d.len;
  c.src_epid = sender.epid();
  if (shm::IsInline(d.len)) {
    c.flags |= shm::kPayloadInline;
    std::memcpy(c.body.inline_data, d.body.inline_data, d.len);
  } else {
    c.body.pool.pool_offset = d.body.pool.pool_offset;
  }
  return c;
}

Endpoint* MqEngine::FindInJob(const Endpoint& ep, uint32_t id) {
  Endpoint* other = Find(id);
  // Only an endpoint of the same job: a client must not reach another tenant
  // by naming an endpoint id.
  if (other == nullptr || other->faulted || other->job() != ep.job())
    return nullptr;
  return other;
}

void MqEngine::Deliver(Endpoint& receiver, uint64_t recv_req, uint32_t capacity,
                       const MsgKey& key, const UnexpectedMsg& m,
                       bool was_unexpected, uint64_t recv_addr) {
  shm::CompletionDesc c{};
  c.op = m.rendezvous ? shm::CompleteOp::kRecvRndv : shm::CompleteOp::kRecvDone;
  c.flags = was_unexpected ? shm::kWasUnexpected : 0;
  c.req = recv_req;
  std::memcpy(c.tag, key.tag.w, sizeof(c.tag));
  c.msg_len = m.len;
  c.src_epid = key.source;
  // A rendezvous message owes nothing past the receiver's buffer: the
  // sender sends only what fits, and the receiver reports truncation from
  // msg_len.
  if (!m.rendezvous) AttachEagerPayload(c, m);
  receiver.counters.msgs_received.Add(1);
  receiver.counters.bytes_received.Add(m.len);
  // The sync sender first: when it is the receiver itself (a send to
  // oneself), its completion ring then holds the send's end before the
  // receive's, so a client that saw the receive complete has seen the send
  // complete too (MPI_Testall after a receive from oneself expects both).
  if (!m.rendezvous && (m.flags & shm::kSendSync)) {
    CompleteSyncOf(receiver, m, PSM2_OK);
  }
  Post(receiver, c);
  if (m.rendezvous) {
    StartTransfer(receiver, recv_req, std::min(m.len, capacity), m, recv_addr);
  }
}

void MqEngine::AttachEagerPayload(shm::CompletionDesc& c,
                                  const UnexpectedMsg& m) {
  if (m.flags & shm::kSendFailed) c.flags |= shm::kPayloadFailed;
  if (shm::IsInline(m.len)) {
    c.flags |= shm::kPayloadInline;
    std::memcpy(c.body.inline_data, m.inline_data, m.len);
  } else {
    c.body.pool.pool_offset = m.pool_offset;
  }
}

void MqEngine::StartTransfer(Endpoint& receiver, uint64_t recv_req,
                             uint32_t send_bytes, const UnexpectedMsg& m,
                             uint64_t recv_addr) {
  if (m.remote_src != 0) {
    if (remote_) remote_->StartTransfer(receiver, recv_req, send_bytes, m);
    return;
  }
  if (!Local(m.sender_id)) {
    // Invariant 11: kept here, streamed from the sender's shard (kChunk).
    // Its shard answers kTransferSenderGone if the sender left meanwhile.
    shm::CompletionDesc go{};
    go.op = shm::CompleteOp::kRndvGo;
    go.req = m.sender_req;
    go.body.go.send_bytes = send_bytes;
    if (send_bytes > 0) {
      go.body.go.transfer = NewTransferId();
      Transfer t{m.sender_id, receiver.id(), m.sender_req,
                 recv_req,    send_bytes,    0};
      t.send_addr = m.send_addr;
      t.recv_addr = recv_addr;
      // Invariant 10 across shards: the receiver's part is decided here,
      // the sender's by its shard, which answers the go (kCopyPeer) before
      // any chunk of it, in lane order; only then may it be taken over.
      if (MayTakeOverTo(t, receiver)) {
        t.await_done = true;
        t.last_ns = copy_clock_();
        go.flags |= shm::kGoAwaitDone;
      }
      transfers_[go.body.go.transfer] = t;
    }
    PostTo(m.sender_id, go);
    return;
  }
  Endpoint* sender = Find(m.sender_id);
  if (sender == nullptr) {
    // The sender left before the match: its data is gone with it.
    if (send_bytes > 0) PostError(receiver, recv_req, PSM2_EPID_UNREACHABLE);
    return;
  }
  shm::CompletionDesc go{};
  go.op = shm::CompleteOp::kRndvGo;
  go.req = m.sender_req;
  go.error = PSM2_OK;
  go.body.go.send_bytes = send_bytes;
  if (send_bytes > 0) {
    go.body.go.transfer = NewTransferId();
    Transfer t{sender->id(), receiver.id(), m.sender_req,
               recv_req,     send_bytes,    0};
    t.send_addr = m.send_addr;
    t.recv_addr = recv_addr;
    if (MayTakeOver(t, *sender, receiver)) {
      t.await_done = true;
      t.last_ns = copy_clock_();
      go.flags |= shm::kGoAwaitDone;
      takeover_candidates_.push_back(go.body.go.transfer);
    }
    transfers_[go.body.go.transfer] = t;
  }
  Post(*sender, go);
}

void MqEngine::EnableCrossCopy(std::function<void()> wake, uint64_t min_bytes,
                               uint64_t after_ns) {
  copier_ = std::make_unique<CrossCopier>(std::move(wake), kCopyChunkBytes);
  copy_min_bytes_ = min_bytes;
  copy_after_ns_ = after_ns;
}

bool MqEngine::MayTakeOver(const Transfer& t, const Endpoint& sender,
                           const Endpoint& receiver) const {
  return MayTakeOverTo(t, receiver) && MayTakeOverFrom(sender);
}

bool MqEngine::MayTakeOverTo(const Transfer& t,
                             const Endpoint& receiver) const {
  return copier_ && t.send_addr != 0 && t.recv_addr != 0 &&
         t.send_bytes >= copy_min_bytes_ && !receiver.copy_denied &&
         receiver.pidfd.load(std::memory_order_acquire) >= 0;
}

bool MqEngine::MayTakeOverFrom(const Endpoint& sender) {
  return !sender.copy_denied && !sender.faulted &&
         sender.pidfd.load(std::memory_order_acquire) >= 0;
}

Endpoint* MqEngine::CopySender(const Transfer& t) {
  return Local(t.sender_id) ? Find(t.sender_id) : t.copy_peer;
}

void MqEngine::DenyCopies(Endpoint& culprit, bool reading) {
  if (!Local(culprit.id())) {
    CrossItem item{};
    item.kind = CrossKind::kCopyDenied;
    item.flags = reading ? kCopyDeniedReading : 0;
    item.to = culprit.id();
    Push(ShardOf(culprit.id(), shards_), item);
    return;
  }
  if (culprit.copy_denied) return;
  culprit.copy_denied = true;
  spdlog::warn(
      "endpoint {} (pid {}): psmd may not {} its memory (EPERM): its "
      "rendezvous messages stream through the pool; give psmd "
      "CAP_SYS_PTRACE to copy them in place",
      culprit.id(), culprit.pid(), reading ? "read" : "write");
}

bool MqEngine::TakeOverStalled() {
  if (!copier_) return false;  // EndCopies
  const uint64_t now = copy_clock_();
  if (now < next_takeover_check_ns_) return false;
  next_takeover_check_ns_ = now + copy_after_ns_ / 4;
  bool did = false;
  for (size_t n = std::min(kTakeoverScan, takeover_candidates_.size()); n > 0;
       n--) {
    const uint64_t id = takeover_candidates_.front();
    takeover_candidates_.pop_front();
    auto it = transfers_.find(id);
    if (it == transfers_.end()) continue;  // ended
    Transfer& t = it->second;
    Endpoint* sender = CopySender(t);
    Endpoint* receiver = Find(t.receiver_id);
    if (sender == nullptr || receiver == nullptr) continue;
    // Left (another shard's: its kGone is on its way and ends the transfer).
    if (sender->removed.load(std::memory_order_acquire)) continue;
    // A sender streaming other messages (say 64 sends outstanding, each
    // waiting for pool space) will come to this one: not stalled.
    if (now - t.last_ns < copy_after_ns_ ||
        now - sender->last_chunk_ns.load(std::memory_order_relaxed) <
            copy_after_ns_) {
      takeover_candidates_.push_back(id);
      continue;
    }
    CopySide from{sender->id(), sender->pid(), sender->pidfd.load(),
                  t.send_addr, &sender->removed};
    CopySide to{receiver->id(), receiver->pid(), receiver->pidfd.load(),
                t.recv_addr, &receiver->removed};
    // One byte first, here: a process psmd may not touch (EPERM) keeps its
    // stream, before any chunk of it is released unread.
    bool reading = false;
    if (CrossCopier::CopyOneByte(from, to, t.forwarded, &reading) == EPERM) {
      DenyCopies(reading ? *sender : *receiver, reading);
      continue;  // the stream goes on; never taken over
    }
    t.taken = true;
    from.addr += t.forwarded;
    to.addr += t.forwarded;
    copier_->Submit(CrossCopier::Copy{id, receiver->job().get(), from, to,
                                      t.send_bytes - t.forwarded});
    did = true;
  }
  return did;
}

bool MqEngine::FinishCopies() {
  std::vector<CrossCopier::Done> done = copier_->TakeDone();
  for (const CrossCopier::Done& d : done) {
    auto it = transfers_.find(d.id);
    if (it == transfers_.end()) continue;  // an endpoint of it left
    const Transfer& t = it->second;
    int32_t recv_error = PSM2_OK;
    int32_t send_error = PSM2_OK;
    if (d.error == EFAULT) {
      // A range that is not the process's: that request fails, and the
      // receive, which did not get the message, with it.
      Endpoint* culprit =
          d.failed_reading ? CopySender(t) : Find(t.receiver_id);
      if (culprit != nullptr) {
        WarnClient(culprit->uid(),
                   "endpoint {} (uid {}): a rendezvous {} buffer at {:#x} is "
                   "not mapped in its process: the transfer fails",
                   culprit->id(), culprit->uid(),
                   d.failed_reading ? "send" : "receive",
                   d.failed_reading ? t.send_addr : t.recv_addr);
      }
      recv_error = PSM2_PARAM_ERR;
      if (d.failed_reading) send_error = PSM2_PARAM_ERR;
    } else if (d.error != 0) {
      // The process on one side ended (ESRCH) or the kernel refused: the
      // other side learns its peer is unreachable.
      recv_error = d.failed_reading ? PSM2_EPID_UNREACHABLE : PSM2_INTERNAL_ERR;
      send_error = d.failed_reading ? PSM2_INTERNAL_ERR : PSM2_EPID_UNREACHABLE;
      Endpoint* culprit =
          d.failed_reading ? CopySender(t) : Find(t.receiver_id);
      // Refused after the one-byte check passed (the process made itself
      // undumpable, say): no more copies for it; logged per uid, bounded.
      if (culprit != nullptr && d.error != ESRCH) {
        if (d.error == EPERM) DenyCopies(*culprit, d.failed_reading);
        WarnClient(culprit->uid(),
                   "endpoint {} (uid {}): copy in place of a rendezvous "
                   "message failed: {}",
                   culprit->id(), culprit->uid(), strerror(d.error));
      }
    }
    EndTakenTransfer(it, recv_error, send_error, d.error == 0 ? d.copied : 0);
  }
  return !done.empty();
}

void MqEngine::EndTakenTransfer(
    std::unordered_map<uint64_t, Transfer>::iterator it, int32_t recv_error,
    int32_t send_error, uint64_t copied) {
  const Transfer t = it->second;
  transfers_.erase(it);
  if (Endpoint* r = Find(t.receiver_id)) {
    shm::CompletionDesc c{};
    c.op = shm::CompleteOp::kRndvChunk;
    c.flags = shm::kPayloadPlaced;
    c.error = recv_error;
    c.req = t.recv_req;
    c.body.chunk.offset = t.forwarded;
    c.body.chunk.len = t.send_bytes - t.forwarded;
    Post(*r, c);
  }
  shm::CompletionDesc c{};
  c.op = shm::CompleteOp::kSendDone;
  c.req = t.sender_req;
  c.error = send_error;
  if (Local(t.sender_id)) {
    if (Endpoint* s = Find(t.sender_id)) {
      if (copied > 0) {
        s->counters.rndv_msgs_copied.Add(1);
        s->counters.rndv_bytes_copied.Add(copied);
      }
      Post(*s, c);
    }
    return;
  }
  // The sender's counters are its shard's to write (single-writer Counter).
  CrossItem item{};
  item.kind = CrossKind::kPost;
  item.flags = copied > 0 ? kPostCopied : 0;
  item.to = t.sender_id;
  item.post = c;
  item.post.msg_len = static_cast<uint32_t>(copied);  // <= send_bytes
  Push(ShardOf(t.sender_id, shards_), item);
}

bool MqEngine::OverBudget(const Endpoint& receiver) const {
  // An empty queue always admits one message (invariant 4).
  return receiver.unexpected_cost > 0 &&
         FullBudget(receiver, nullptr).has_value();
}

std::optional<shm::StallBudget> MqEngine::FullBudget(const Endpoint& receiver,
                                                     uint64_t* bytes) const {
  constexpr uint64_t kOne = kUnexpectedOverheadBytes;
  const auto full = [bytes](shm::StallBudget which, uint64_t budget) {
    if (bytes != nullptr) *bytes = budget;
    return which;
  };
  if (receiver.unexpected_cost + kOne > receiver.unexpected_budget)
    return full(shm::StallBudget::kEndpoint, receiver.unexpected_budget);
  const Job& job = *receiver.job();
  const uint64_t job_budget =
      std::min(job_unexpected_budget_, job.unexpected_budget());
  if (job.unexpected_cost.load(std::memory_order_relaxed) + kOne > job_budget)
    return full(shm::StallBudget::kJob, job_budget);
  if (job.account().unexpected_cost.load(std::memory_order_relaxed) + kOne >
      uid_unexpected_budget_)
    return full(shm::StallBudget::kUid, uid_unexpected_budget_);
  return std::nullopt;
}

bool MqEngine::ChargeWithin(Endpoint& receiver) {
  constexpr uint64_t kOne = kUnexpectedOverheadBytes;
  // An empty queue always admits one message (invariant 4), and a closing
  // sender's sends go regardless.
  if (admit_over_budget_ || receiver.unexpected_cost == 0) {
    Charge(receiver);
    return true;
  }
  if (receiver.unexpected_cost + kOne > receiver.unexpected_budget)
    return false;
  // Each add sees every other shard's before it (one modification order
  // per counter), so what stays added never passes the budget; a shard
  // that finds it passed takes its add back and holds the message, which
  // another shard's add it saw may also take back: then both hold it
  // until the next pass, never both keep it.
  Job& job = *receiver.job();
  const uint64_t job_budget =
      std::min(job_unexpected_budget_, job.unexpected_budget());
  if (job.unexpected_cost.fetch_add(kOne, std::memory_order_relaxed) + kOne >
      job_budget) {
    job.unexpected_cost.fetch_sub(kOne, std::memory_order_relaxed);
    return false;
  }
  std::atomic<uint64_t>& uid = job.account().unexpected_cost;
  if (uid.fetch_add(kOne, std::memory_order_relaxed) + kOne >
      uid_unexpected_budget_) {
    uid.fetch_sub(kOne, std::memory_order_relaxed);
    job.unexpected_cost.fetch_sub(kOne, std::memory_order_relaxed);
    return false;
  }
  receiver.unexpected_cost += kOne;
  return true;
}

void MqEngine::Charge(Endpoint& receiver) {
  receiver.unexpected_cost += kUnexpectedOverheadBytes;
  AddTo(receiver.job()->unexpected_cost, kUnexpectedOverheadBytes);
  AddTo(receiver.job()->account().unexpected_cost, kUnexpectedOverheadBytes);
}

void MqEngine::NoteHeld(Endpoint& receiver) {
  if (receiver.held_since_ns != 0) return;  // the clock runs
  receiver.held_since_ns = NowNs();
  if (!receiver.stall_watched) {
    receiver.stall_watched = true;
    stall_watch_.push_back(receiver.id());
  }
}

void MqEngine::ReportBudgetStalls(uint64_t now_ns) {
  size_t kept = 0;
  for (uint32_t id : stall_watch_) {
    Endpoint* r = Find(id);
    if (r == nullptr) continue;
    if (r->held_since_ns == 0) {  // drained since: the clock stopped
      r->stall_watched = false;
      continue;
    }
    if (now_ns - r->held_since_ns < shm::kBudgetStallNs) {  // not yet due
      stall_watch_[kept++] = id;
      continue;
    }
    // Reported once: the clock keeps running (NoteHeld does not restart
    // it) until a receive drains the queue, and only then can it be
    // watched again.
    r->stall_watched = false;
    // Which budget holds the sends (a drain elsewhere in the job may have
    // made room since: then the receiver's own is named).
    uint64_t budget = r->unexpected_budget;
    const shm::StallBudget full =
        FullBudget(*r, &budget).value_or(shm::StallBudget::kEndpoint);
    r->counters.budget_stalls.Add(1);
    LogClient(spdlog::level::warn, r->job()->key().uid,
              "endpoint {} (pid {}): sends to it have waited {} s for {} "
              "unexpected-message budget ({} MiB), and it received none of "
              "its {} unexpected messages meanwhile; if it waits for a "
              "message sent after them it waits for good: raise "
              "PSM2_MQ_MAX_SYSBUF_MBYTES (up to --max-unexpected-mib) or "
              "--job-unexpected-mib / --uid-unexpected-mib",
              r->id(), r->pid(), (now_ns - r->held_since_ns) / 1'000'000'000,
              shm::StallBudgetName(full), budget >> 20, r->unexpected.size());
    shm::CompletionDesc c{};
    c.op = shm::CompleteOp::kBudgetStall;
    c.msg_len = static_cast<uint32_t>(
        std::min<uint64_t>(r->unexpected.size(), UINT32_MAX));
    c.tag[0] =
        static_cast<uint32_t>(std::min<uint64_t>(budget >> 20, UINT32_MAX));
    c.tag[1] = static_cast<uint32_t>(full);
    Post(*r, c);
  }
  stall_watch_.resize(kept);
}

void MqEngine::Uncharge(Endpoint& receiver) {
  receiver.held_since_ns = 0;  // a receive drained it: not stalled
  receiver.unexpected_cost -= kUnexpectedOverheadBytes;
  AddTo(receiver.job()->unexpected_cost, -kUnexpectedOverheadBytes);
  AddTo(receiver.job()->account().unexpected_cost, -kUnexpectedOverheadBytes);
}

void MqEngine::Discard(Endpoint& receiver, const UnexpectedMsg& m) {
  Uncharge(receiver);
  ReleasePayload(receiver, m);
  if (m.rendezvous || (m.flags & shm::kSendSync)) {
    CompleteSyncOf(receiver, m, PSM2_EPID_UNREACHABLE);
  }
}

void MqEngine::CompleteSyncOf(const Endpoint& receiver, const UnexpectedMsg& m,
                              int32_t error) {
  if (m.remote_src == 0) {
    CompleteSync(m.sender_id, m.sender_req, error);
  } else if (remote_) {
    // A rendezvous sender on another node learns of the failure as a sync
    // sender does (kError).
    remote_->CompleteSync(receiver, m, error);
  }
}

void MqEngine::CompleteSync(uint32_t sender_id, uint64_t sender_req,
                            int32_t error) {
  shm::CompletionDesc c{};
  c.op = shm::CompleteOp::kSendDone;
  c.req = sender_req;
  c.error = error;
  PostTo(sender_id, c);  // a sender that is gone has nobody to tell
}

shm::CompletionDesc MqEngine::ErrorCompletion(uint64_t req, int32_t error) {
  shm::CompletionDesc c{};
  c.op = shm::CompleteOp::kError;
  c.req = req;
  c.error = error;
  return c;
}

void MqEngine::PostError(Endpoint& ep, uint64_t req, int32_t error) {
  Post(ep, ErrorCompletion(req, error));
}

void MqEngine::Post(Endpoint& ep, const shm::CompletionDesc& c) {
  if (ep.faulted) return;
  if (ep.cq_overflow.empty() && ep.cq.TryPush(c)) {
    ep.notify_pending = true;
    return;
  }
  if (ep.cq.corrupt()) {
    LogClient(spdlog::level::err, ep.uid(),
              "endpoint {} (pid {}): completion ring indices corrupted by the "
              "client; the endpoint is no longer served — close and reopen it",
              ep.id(), ep.pid());
    ep.faulted = true;
    return;
  }
  if (ep.cq_overflow.empty()) {
    shm::SetCqSpaceWanted(ep.control()->doorbells, true);
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
  if (ep.cq_overflow.empty()) {
    shm::SetCqSpaceWanted(ep.control()->doorbells, false);
  }
  return did;
}

void MqEngine::NotifyClients() {
  for (Endpoint* ep : order_) {
    if (!ep->notify_pending) continue;
    ep->notify_pending = false;
    shm::WakeClientIfWaiting(ep->control()->doorbells);
  }
}

void MqEngine::ReleasePayload(const Endpoint& any_of_job,
                              const UnexpectedMsg& m) {
  if (!m.rendezvous && !shm::IsInline(m.len)) {
    shm::ReleaseChunk(any_of_job.job()->pool().base(), m.pool_offset);
  }
}

void MqEngine::ReleaseUnread(const Endpoint& ep, const shm::CompletionDesc& c) {
  if (!shm::CompletionCarriesChunk(c)) return;
  // Entries of the completion ring lie in memory the client could write:
  // only a chunk position inside the job's pool is touched.
  const uint64_t offset = shm::ChunkOffsetOf(c);
  const shm::Mapping& pool = ep.job()->pool();
  if (offset < shm::kChunkHeaderBytes || offset >= pool.size() ||
      offset % shm::kChunkHeaderBytes != 0) {
    return;
  }
  shm::PoolPayload(pool.base(), offset).Release();
}

void MqEngine::ReportBadDescriptor(Endpoint& ep, const char* what) {
  ep.counters.bad_descriptors.Add(1);
  // Rate-limited per uid: a client spraying garbage must not flood the log.
  WarnClient(ep.uid(),
             "endpoint {} (pid {}, uid {}): rejected submission: {} ({} "
             "rejected so far); the request completes with an error",
             ep.id(), ep.pid(), ep.uid(), what,
             ep.counters.bad_descriptors.Get());
}

}  // namespace psmd
