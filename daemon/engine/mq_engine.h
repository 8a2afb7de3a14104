// The matched-queue engine of one progress worker: the endpoints it owns and
// what happens to each descriptor they submit (send, receive, probe, cancel,
// rendezvous data, options, active messages), i.e. matching,
// unexpected-message queueing, rendezvous transfers, active-message routing
// and completion posting. Transports beside it (daemon/remote/remote.h: frames
// from other nodes) reach its state only through the surface below marked
// so: a message arrives (Arrive), a completion or an error is posted, peers
// are gone, a transfer id is taken.
//
// Thread-safety: not thread-safe. Every method runs on the owning progress
// worker's thread (control threads reach it through ProgressWorker::RunSync),
// which holds it PSMD_GUARDED_BY its thread role (daemon/progress.h): the
// thread-safety build rejects a control thread that reaches for it. It is
// the only code that reaches an endpoint's match state (endpoint.h).
//
// Invariants:
//   1. Messages from one sender are matched in submission order (one worker
//      consumes each submission ring in order), giving MPI non-overtaking.
//   2. Every receive and every sync send gets exactly one completion; an
//      invalid descriptor gets exactly one kError completion. An eager sync
//      send's completion is posted before its receive's, so a sender that
//      is its own receiver reaps them in that order.
//   3. A completion that finds the client's completion ring full waits in the
//      endpoint's overflow queue; while that queue is non-empty the endpoint's
//      submissions are not consumed (back-pressure, nothing dropped).
//   4. A receiver's unexpected messages cost at most its budget, those of
//      all endpoints of a job at most the job's budget, and those of all
//      jobs of a uid at most the uid's budget, kUnexpectedOverheadBytes
//      each whatever their length (daemon/engine/endpoint.h says where payloads
//      wait instead), plus one message per receiver, so that a receiver
//      with an empty queue is never starved by its job (nor by a budget of
//      0): a send that would exceed any waits in the sender's held_sends, and
//      the sender's message ring is not read until it fits. Control
//      submissions are always read, so the receiver can still post the
//      receives that drain the queue. A hold that lasts shm::kBudgetStallNs
//      with none of them drained is reported (ReportBudgetStalls). Enforced
//      in one place, Arrive, whatever carried the message (HandleSend, and
//      daemon/remote/receive.cc for frames from other nodes): the only place
//      that charges a message (Uncharge gives it back when it is received or
//      discarded).
//   5. A rendezvous transfer exists from match to its last chunk; chunks
//      arrive from the sender in offset order and are forwarded at once (the
//      daemon never holds payload: the chunk stays in the sender's region
//      until the receiver copied it).
//   6. Active messages are routed, never matched: a request goes from the
//      sender's message ring to the target's completion ring in order (so
//      one sender's requests to one target run in issue order); replies and
//      acks travel on control rings and reach only endpoints of the same job.
//      A request is held while its target has kAmOverflowLimit completions
//      waiting for ring space.
//   7. A pass (PollAll) consumes at most kBatch submissions per ring of an
//      endpoint and kJobBudget per job, whose endpoints are adjacent in
//      order_ and take turns going first; every submission's handling costs
//      O(1) in the depth of the posted queue (daemon/engine/matcher.h). So a
//      job with any backlog delays another job by a bounded slice per pass
//      (issue 12). While another job has work too, a backlogged job's
//      budget is what fits in kJobSliceNs at what its submissions cost in
//      its last pass (Rebudget): O(1) is not cheap when each receive posted
//      into a million misses every cache or faults in a page (issue 38).
//   8. Once an endpoint is removed (closed or dead) after its rings were
//      drained, or its daemon said so (kGone), or the connection to its
//      node ended (daemon/remote/remote.h), a receive that names it as the
//      source can match only what is already queued at the receiver: posted
//      ones fail at once with PSM2_EPID_UNREACHABLE (PSM2_TIMEOUT for a node
//      that fell silent), and new ones do unless a queued message matches,
//      until a psm2_ep_connect re-arms the slot. The survivor of a peer's
//      death never waits for it. Enforced in one place, PeersGone, which
//      Remove and daemon/remote/ call with the links they found gone:
//      it marks them and fails their posted receives; HandleRecv fails new ones
//      on the mark.
//  10. A rendezvous transfer whose sender and receiver both named their
//      buffers (kSendInPlace, kRecvInPlace), of at least the copy threshold,
//      between two endpoints of this node whose processes psmd may read and
//      write, starts as a stream like any other, but its sender completes
//      only on psmd's kSendDone (kGoAwaitDone). If no chunk of it, nor of
//      any transfer of its sender, arrives for copy_after (the sender
//      computes, or waits for pool space its receiver does not give back),
//      psmd takes it over: the CrossCopier
//      copies the rest straight from the sender's memory into the receive
//      buffer, chunks the sender still publishes are released unread, and
//      the receiver gets one kRndvChunk with kPayloadPlaced for the rest, the
//      sender kSendDone. With shards, sender and receiver may live on
//      different ones (invariant 11 says who owns what). A sender removed
//      mid-copy is read no more (CrossCopier invariants 3 and 4), a
//      receiver removed mid-copy is written no more (its shard keeps the
//      copy: Cancel); the other side is told PSM2_EPID_UNREACHABLE. So a
//      transfer completes while both processes
//      compute, and a stream both sides keep busy stays a stream (two
//      processes copy in parallel: faster here than one copier thread).
//   9. The posted receives of a job, and of all jobs of a uid, stay within
//      SetPostedLimits' bounds: a receive that would exceed one fails with
//      PSM2_NO_MEMORY (counted in recvs_refused), the job's other traffic
//      unaffected. A job's count (Job::posted_recvs) is the sum of its
//      endpoints' posted_charged, which is brought up to posted.size() when
//      a receive is posted (matches and cancels lower it lazily: a count
//      may be high, never low, and is recomputed before a refusal). With
//      shards it moves in steps of kPostedStep receives, so that a stream
//      of receives does not bounce the job's line between cores: high by
//      less than two steps per endpoint.
//  11. Shards (issue 38; docs/design.md, "Engine shards"). An endpoint
//      lives on one engine, the shard ShardOf(its id); only that engine
//      reads its rings, matches for it and writes its completion ring. What
//      concerns an endpoint of another shard crosses to it as a CrossItem
//      (crossing.h): a send arrives there through Arrive exactly as a local
//      one does (kArrive), completions for a sender go back (kPost), chunks
//      go to the shard that keeps their transfer (the receiver's: transfer
//      ids name it). One sender lives on one shard and lanes are FIFO, so
//      per-pair order (invariant 1) holds; an item a budget holds waits in
//      its receiver's held list, behind which that receiver's later items
//      queue, and a sender has at most kCrossCredit such items in flight
//      (its message ring waits beyond: invariant 4's back-pressure).
//      Items a full lane did not take wait in the sending shard's outbox.
//      The items of an endpoint's control submissions (replies, acks,
//      chunks, completions: never held where they land) take its control
//      credit instead, returned as the other shard takes them: its control
//      ring waits while kControlCredit of them are in flight, so a shard
//      holds at most that and a batch per endpoint of them, and, since
//      that shard pushes the credit behind its answers to them (one at
//      most per item: a refusal, a completion, a kCopyPeer), at most as
//      many answers to them. Answers to sends and AM requests are bounded
//      by kCrossCredit likewise. Lanes are drained whatever waits, and
//      items are never held for a credit, so that wait ends (no cycle). A
//      removed endpoint's shard drains its rings first, then tells every
//      other shard (kGone): they admit its held items, fail transfers it
//      sent, and mark links to it gone (invariant 8), in lane order after
//      everything it sent. Job and uid budgets are relaxed atomics charged
//      where a message or receive lands; an unexpected message's charge is
//      added first and taken back if it passed a budget (ChargeWithin), so
//      shards charging at once keep invariant 4 exactly. Copies in place
//      (invariant 10) work across shards as within one, each piece of
//      state with one owner: the shard that keeps the transfer (the
//      receiver's) decides the receiver's part at the match, takes it over
//      and runs the copy on its copier; the sender's shard decides the
//      sender's part when the go reaches it (kGoAwaitDone kept or cleared)
//      and answers with the sender (kCopyPeer) before the sender can
//      publish a chunk, and alone writes the sender's copy_denied (told by
//      kCopyDenied) and counters (kSendDone as kPost, kPostCopied). The
//      keeping shard reads of the sender only its identity, last_chunk_ns
//      and removed (endpoint.h, thread-safety 5), and only while the
//      transfer lasts: it ends at the sender's kGone, where that shard
//      cancels its copies from the sender before kGoneAck lets the
//      sender's shard free it. A chunk published after a takeover crosses
//      and goes back unread (kRefused, no error): released once.
//  12. Shards between nodes (fabric_across.cc). Shard 0 owns the fabric:
//      its Remote, every node connection and all of their state. It knows
//      the other shards' endpoints (AddForeign, before they are added;
//      forgotten at kForget, after every answer about one came) and reads
//      only their identity. A message or active message from another node
//      for an endpoint of shard k crosses to it (kRemoteArrive, kRemoteAm)
//      and arrives there through Arrive (Part::kWhole) or is posted as a
//      local one is, held there as a cross-shard send is (invariant 11);
//      at most kFabricCredit of them are in flight to one receiver, beyond
//      which shard 0 leaves its frames unread (parked: remote.h's
//      back-pressure, kXoff), so a full receiver on shard k holds back its
//      own flow and nothing is dropped. Shard k's sends, requests and
//      replies to other nodes, its rendezvous chunks of transfers to them
//      and its answers to their messages cross to shard 0 (kToFabric under
//      the sender's credit, kChunk, kFabricAnswer) and reach the Remote as
//      shard 0's own do; completions for shard k's endpoints come back as
//      kPost. A peer endpoint gone (kGone from its node) or a node lost is
//      told to every shard (kEpidGone, kNodeLost), after which each keeps
//      invariant 8 for its endpoints. Per-pair order holds: one flow
//      crosses one lane in order, in each direction.
#ifndef PSMD_DAEMON_ENGINE_MQ_ENGINE_H_
#define PSMD_DAEMON_ENGINE_MQ_ENGINE_H_

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <unordered_map>
#include <vector>

#include "daemon/clock.h"
#include "daemon/engine/cross_copy.h"
#include "daemon/engine/crossing.h"
#include "daemon/engine/endpoint.h"
#include "daemon/engine/other_nodes.h"
#include "daemon/handover/state_codec.h"
#include "shm/status.h"

namespace psmd {

class MqEngine {
 public:
  // `max_unexpected_budget`: the largest unexpected budget a client may set;
  // `job_unexpected_budget`, `uid_unexpected_budget`: the budget of each
  // job, and of all jobs of one uid (invariant 4).
  MqEngine(uint64_t max_unexpected_budget, uint64_t job_unexpected_budget,
           uint64_t uid_unexpected_budget)
      : max_unexpected_budget_(max_unexpected_budget),
        job_unexpected_budget_(job_unexpected_budget),
        uid_unexpected_budget_(uid_unexpected_budget) {}
  ~MqEngine();

  // Posted receives one job, and all jobs of one uid, may hold (invariant
  // 9).
  void SetPostedLimits(uint64_t per_job, uint64_t per_uid) {
    job_posted_limit_ = per_job;
    uid_posted_limit_ = per_uid;
  }

  void Add(std::shared_ptr<Endpoint> ep);
  // Removes the endpoint and everything queued for it: posted receives are
  // dropped, unexpected payloads and the chunks of completions it never read
  // released back to their senders, sync and rendezvous senders (also those
  // streaming to it) told PSM2_EPID_UNREACHABLE; its unfinished outgoing
  // rendezvous transfers fail their receivers' requests.
  void Remove(uint32_t id);
  void SetPeer(uint32_t id, uint32_t slot, const PeerLink& link);
  void ClearPeer(uint32_t id, uint32_t slot);

  // Consumes and handles up to a batch of submissions from every endpoint.
  // Returns true when anything was done.
  bool PollAll();
  // True when some endpoint has a submission waiting (used before sleeping).
  bool AnySubmissionPending();
  // The same for one endpoint.
  bool SubmissionPending(Endpoint& ep);
  // A doorbell of `ep` that woke us was rung for nothing: no submission
  // waits, and none was published since the last look. A sender held for its
  // receiver (held_sends) goes on publishing sends, which wait in its message
  // ring, and rings for each while we sleep: those rings are not idle.
  bool DoorbellIdle(Endpoint& ep);
  // Whether `ep`'s client has completions in its ring it did not reap yet.
  static bool CompletionsUnreaped(Endpoint& ep) { return !ep.cq.Drained(); }
  // Wakes clients that sleep waiting for completions published since the
  // last call.
  void NotifyClients();

  const std::vector<Endpoint*>& endpoints() const { return order_; }

  // Invariant 7 made visible (psmctl stats, worker): the turns of backlogged
  // jobs timed while another job had work, what they took in all, and how
  // many took longer than 8 and 64 us. Read from any thread.
  struct SliceStats {
    uint64_t slices = 0;
    uint64_t ns = 0;
    uint64_t over_8us = 0;
    uint64_t over_64us = 0;
  };
  SliceStats slice_stats() const {
    return {slices_.Get(), slice_ns_.Get(), slices_over_8us_.Get(),
            slices_over_64us_.Get()};
  }

  // Takes over rendezvous transfers of `min_bytes` or more that stalled for
  // `after_ns` (invariant 10); `wake` wakes the worker when a copy ends.
  // Before the worker starts.
  void EnableCrossCopy(std::function<void()> wake, uint64_t min_bytes,
                       uint64_t after_ns);
  bool copies_done() const { return copier_ && copier_->done_pending(); }
  // Ends the copier (its chunk in flight first) and takes over nothing
  // more: at shutdown, before any shard's engine, whose endpoints a copy
  // of this one may read (invariant 10), goes.
  void EndCopies() {
    copier_.reset();
    takeover_candidates_.clear();
  }
  // The clock of invariant 10's stall test (when a transfer or its sender
  // last moved, and whether copy_after passed since): NowNs, or a test's,
  // which then decides when time passes (engine_fuzz: a takeover happens
  // where its input says, on every run of it). Shards of one node share
  // one, since a sender's shard writes what the keeping shard compares.
  // Before any endpoint is added.
  void SetCopyClock(uint64_t (*now)()) { copy_clock_ = now; }
  // Transfers psmd may yet take over: the worker must not sleep longer
  // than copy_after while there are any.
  bool takeovers_pending() const { return !takeover_candidates_.empty(); }

  // ---- Shards (issue 38; daemon/engine/crossing.h, invariant 11) ----

  // Makes this engine shard `shard` of crossing->shards(), before any
  // endpoint is added: the endpoints whose id is another shard's (ShardOf)
  // are reached through `crossing`, and this engine's transfer ids are its
  // own (NewTransferId). `crossing` outlives the engine.
  void JoinShards(Crossing* crossing, uint32_t shard);
  // The shard that serves endpoint `id` among `shards`: ids are handed out
  // so that this is where the registry placed it.
  static uint32_t ShardOf(uint32_t id, uint32_t shards) {
    return shards > 1 ? id % shards : 0;
  }
  uint32_t shard() const { return shard_; }
  // Whether another shard sent something not taken yet, or our outbox holds
  // items a full lane did not take (the worker must not sleep for long).
  bool CrossingPending();
  bool OutboxWaiting() const { return outbox_items_ > 0; }
  size_t outbox_items() const { return outbox_items_; }
  // Items of one endpoint's control submissions (AM replies and acks,
  // rendezvous chunks, completions for other shards) that may be in flight
  // to other shards (not yet taken there: in the outbox or a lane) before
  // its control ring waits too; what one pass adds beyond is at most a
  // batch's. The other shard gives the credit back behind its answers to
  // them, so this bounds those answers too (invariant 11).
  static constexpr uint32_t kControlCredit = 64;
  // After a transport beside the engine ran (Remote::Poll, invariant 12):
  // wakes the shards it pushed to, as the end of PollAll does.
  void FlushAcross() {
    if (crossing_) FlushCrossing();
  }
  // Whether a send waits for a budget that an endpoint of another shard
  // may free (that shard does not wake us when it does): the worker sleeps
  // briefly then.
  bool HeldForBudget() const;
  // What this shard did (psmctl stats, per worker): submissions consumed,
  // items taken from other shards and sent to them. Read from any thread.
  struct ShardCounters {
    uint64_t submissions = 0;
    uint64_t cross_in = 0;
    uint64_t cross_out = 0;
  };
  ShardCounters shard_counters() const {
    return {submissions_.Get(), cross_in_.Get(), cross_out_.Get()};
  }

  // Endpoints on other nodes, through the fabric (daemon/remote/remote.h),
  // which the caller owns and keeps alive as long as this engine: sends, active
  // messages and rendezvous chunks to them, and the answers to messages
  // from them, go there. None without a fabric. Set before the worker
  // starts.
  void AttachRemote(OtherNodes* remote) { remote_ = remote; }
  // Invariant 12, before the worker starts: on a shard other than 0 when
  // shard 0 owns a fabric, calls for other nodes cross to shard 0.
  void RouteFabricToShard0();
  // Invariant 12, on shard 0 with a fabric: endpoint `ep` of another shard
  // exists (called before that shard adds it), so frames for it find it.
  void AddForeign(std::shared_ptr<Endpoint> ep);

  // ---- What a transport beside the engine uses (daemon/remote/remote.h) ----

  // What became of a message that reached its receiver (Arrive).
  enum class Arrival : uint8_t {
    kMatched,  // a posted receive took it
    kQueued,   // unexpected: queued, charged to the receiver's budgets
    kHeld,     // over a budget: nothing changed; offer it again later
  };
  // How much of a message Arrive is given. A frame from another node is
  // read header first, and where its payload lands (the inbox share it may
  // use) depends on whether a receive matched: such a message arrives as
  // its envelope and then, once the payload is there, as its payload.
  enum class Part : uint8_t {
    kWhole,
    // kMatched takes the receive into *claim (delivered at kPayload);
    // kQueued means only that the budgets admit it (queued at kPayload).
    kEnvelope,
    // Delivers to *claim if not null, else to a receive posted since the
    // envelope, else queues it: the budgets admitted it at its envelope.
    kPayload,
  };
  // The one place a message reaches its receiver, whatever carried it (a
  // local send, a frame from another node): matched against the posted
  // receives in arrival order (invariant 1), else queued as unexpected and
  // charged to the budgets once, or held when over one (invariant 4).
  // `key` is the message's source epid and tag. `receiver` must be served
  // (not faulted); the sender's side (its counters, a refused send) is the
  // caller's.
  Arrival Arrive(Endpoint& receiver, const MsgKey& key, const UnexpectedMsg& m,
                 Part part = Part::kWhole, PostedRecv* claim = nullptr);
  Endpoint* FindEndpoint(uint32_t id) { return Find(id); }
  // A transport's lookup (invariant 12): endpoint `id` of this shard, or on
  // shard 0 with a fabric one of another shard not removed yet. Of another
  // shard's endpoint only the identity may be read; what concerns it goes
  // through PostFor, ArriveAcross and AmArriveAcross.
  Endpoint* FindAny(uint32_t id) {
    if (Local(id)) return Find(id);
    auto it = foreign_.find(id);
    return it == foreign_.end() || it->second.removed ? nullptr
                                                      : it->second.ep.get();
  }
  bool IsLocal(const Endpoint& ep) const { return Local(ep.id()); }
  // The job `key` of an endpoint FindAny knows, or null (a handover's
  // inboxes, daemon/remote/remote_handover.cc).
  std::shared_ptr<Job> FindJob(const JobKey& key) const;
  // Post and PostError for an endpoint FindAny gave: on another shard, the
  // completion crosses to it.
  void PostFor(Endpoint& ep, const shm::CompletionDesc& c);
  void PostErrorFor(Endpoint& ep, uint64_t req, int32_t error);
  // The kError completion of request `req`.
  static shm::CompletionDesc ErrorCompletion(uint64_t req, int32_t error);
  // A message or active message from another node for `receiver`, an
  // endpoint of another shard: Arrive (Part::kWhole) or its completion's
  // Post happen there. At most kFabricCredit of them are in flight to one
  // receiver: MayArriveAcross says whether another may go (else the frame
  // waits: remote.h's back-pressure).
  bool MayArriveAcross(const Endpoint& receiver) const;
  void ArriveAcross(Endpoint& receiver, const MsgKey& key,
                    const UnexpectedMsg& m);
  void AmArriveAcross(Endpoint& receiver, const shm::CompletionDesc& c);
  // Invariant 8 for endpoints on other nodes, on every shard: endpoint
  // `epid` of job `job` and uid `uid` is gone; the connection to node
  // lost.tag[0] ended with lost.error, and every endpoint with a link there
  // gets `lost` (kNodeLost, the node's host name inline) counting them.
  void EpidGone(uint64_t epid, uint32_t uid, const uint8_t job[16]);
  void NodeLost(const shm::CompletionDesc& lost);
  // A completion (or an error completion for request `req`) for `ep`'s
  // client; held in its overflow queue while its ring is full (invariant 3).
  void Post(Endpoint& ep, const shm::CompletionDesc& c);
  void PostError(Endpoint& ep, uint64_t req, int32_t error);
  // Invariant 8, wherever it was learnt that peers are gone (Remove; kGone
  // from another node's daemon, or the connection to it lost:
  // daemon/remote/): every link `gone` selects among the links not yet
  // marked gone is marked, and the receives posted naming its peer fail at
  // once with `error` (HandleRecv fails new ones on the mark).
  using LinkFilter = std::function<bool(const Endpoint&, const PeerLink&)>;
  void PeersGone(const LinkFilter& gone, int32_t error);
  // An id for a rendezvous transfer, unique among this engine's and its
  // transports' (a chunk names its transfer by it alone), and naming this
  // shard (ShardOf): a chunk reaches the shard that keeps its transfer.
  uint64_t NewTransferId() {
    const uint64_t id = next_transfer_;
    next_transfer_ += shards_;
    return id;
  }

  // Whether `ep` is served: its rings were not found corrupted (a receiver
  // Arrive takes).
  static bool Served(const Endpoint& ep) { return !ep.faulted; }
  // Invariant 6: whether active messages to `target` are held, its
  // completion overflow holding kAmOverflowLimit.
  static bool AmHeld(const Endpoint& target) {
    return target.cq_overflow.size() >= kAmOverflowLimit;
  }

  // Invariant 4's hold made visible: tells each receiver whose senders have
  // waited shm::kBudgetStallNs for its unexpected budget, with none of its
  // unexpected messages received since, once per such stall: a warning in the
  // log, its budget_stalls counter and a kBudgetStall completion, which its
  // library prints. A program that waits for a message sent after the
  // ones filling the budget would otherwise hang without a word. Call
  // about once a second; cheap when nothing is held.
  void ReportBudgetStalls(uint64_t now_ns);

  // ---- Handover to a successor process (issue 33; docs/design.md,
  // "Handover") ----
  //
  // A planned upgrade hands everything this engine holds in process memory
  // to a fresh engine in the next psmd, which continues exactly where this
  // one stopped: nothing lost, nothing duplicated, the same match order.
  // What lives in shared memory (rings, pools) stays where it is; the
  // registry carries the endpoints' identities and fds. Protocol, each call
  // on its shard's worker thread (ProgressWorker::RunSync):
  //   1. The worker stops running PollAll (frozen: no submission ring is
  //      read from here on; what clients publish meanwhile waits in their
  //      rings for the successor).
  //   2. Rounds of PollQuiescing then Quiesced on every shard, until a round
  //      in which no PollQuiescing returned true and every shard said
  //      Quiesced. (A round where some shard still moved something may have
  //      pushed an item toward a shard that already said Quiesced.)
  //   3. SaveState on every shard.
  // In the successor, before its workers read any ring: Add every endpoint
  // of the shard (identity as before, empty match state), with JoinShards
  // and EnableCrossCopy as configured, then LoadState.
  //
  // One pass that moves only what is already inside psmd: copies in place
  // that ended are finished, items from other shards taken (and their
  // answers, credits and kGoneAcks sent), held items offered again,
  // completions waiting for ring space flushed into rings the clients
  // drained, clients woken. No submission ring is read and no transfer is
  // taken over. Returns whether anything was done.
  bool PollQuiescing();
  // Whether nothing is in flight that SaveState cannot write: no copy in
  // place running or ended unfinished, nothing in this shard's outbox or
  // pending credits, no item waiting in a lane toward this shard, no removed
  // endpoint awaiting other shards' kGoneAck. (Lanes from this shard are
  // the other shards' to see empty: see the protocol's round.)
  // Not covered: the fabric to other nodes (daemon/remote), whose drain is
  // its own (Remote::Carriable). What the engine holds of it is written:
  // messages from other nodes in the queues and held for a receiver of
  // another shard (kRemoteArrive, kRemoteAm), and on shard 0 the sends of
  // other shards' endpoints that the Remote holds (held_fabric_). Not
  // written: remote_in_flight_, which starts again at 0 (a receiver may
  // then have up to kFabricCredit more in flight once, beside its held
  // ones).
  bool Quiesced() const;
  // Writes the engine's state (engine_state.cc, field by field: written or
  // rebuilt, and why). Quiesced must hold.
  void SaveState(handover::StateWriter& w) const;
  // About how many bytes SaveState writes (a few per cent over, for a
  // writer's Reserve): its entries by count.
  size_t StateBytesHint() const;
  // Reads what SaveState wrote, as untrusted input: every id, offset,
  // length, count and enum is checked (endpoints, pools, budgets, limits,
  // the shard), and counters derived from the queues (charges against the
  // budgets, posted counts, stall watch, takeover candidates) are
  // recomputed rather than read. Either the whole state is loaded, or
  // nothing is changed and the Status names the field and why: the caller
  // may then Remove the endpoints or destroy the engine as it would have.
  // Call after Add of exactly the endpoints the state names (same ids and
  // epids), with empty match state, before any ring is read.
  Status LoadState(handover::StateReader& r);
  // Whether every sender's count of items in flight to other shards
  // (Endpoint::cross_in_flight, carried by its shard's state, bounded by
  // kCrossCredit) is what the other shards hold for it: at a quiesced save
  // the lanes are empty, so the two agree. `shards[i]` is shard i, all
  // loaded; a check for tests and for a caller that can reach every shard
  // at once (no worker running).
  static bool CreditsAgree(const std::vector<const MqEngine*>& shards);

 private:
  // Active messages waiting in a target's completion overflow beyond which
  // further requests to it are held: a target that stops polling must not
  // make psmd buffer without bound.
  static constexpr size_t kAmOverflowLimit = 1024;

  // One rendezvous transfer (invariant 5).
  struct Transfer {
    uint32_t sender_id;
    uint32_t receiver_id;  // 0 once the receiver is gone: chunks are released
    uint64_t sender_req;
    uint64_t recv_req;
    uint32_t send_bytes;
    uint32_t forwarded;
    // Invariant 10: both buffers, and whether the sender awaits kSendDone
    // (then psmd may take the transfer over once it stalls).
    uint64_t send_addr = 0;
    uint64_t recv_addr = 0;
    bool await_done = false;
    bool taken = false;    // the CrossCopier moves the rest from `forwarded`
    uint64_t last_ns = 0;  // when the transfer last moved
    // A sender of another shard that may be copied, as its shard answered
    // the go (kCopyPeer); null until then, and for a local sender (Find).
    // Valid while the transfer lasts (endpoint.h, thread-safety 5).
    Endpoint* copy_peer = nullptr;
  };

  // A job's share of a pass (invariant 7).
  struct JobTurn {
    size_t begin = 0;  // its endpoints: order_[begin, end)
    size_t end = 0;
    size_t used = 0;    // submissions consumed in this pass
    size_t budget = 0;  // submissions it may consume (set by Rebudget)
    uint64_t ns = 0;    // what they took, when timed
    bool timed = false;
    bool adapting = false;  // timed, or its budget is not kJobBudget
  };
  void Rebudget(JobTurn& t);
  void Regroup();
  // One endpoint, both rings (used when removing it).
  bool Poll(Endpoint& ep);
  // Consume up to `limit` submissions (at most a batch) and add how many to
  // *used (invariant 7).
  bool PollControl(Endpoint& ep, size_t limit = SIZE_MAX,
                   size_t* used = nullptr);
  bool PollMessages(Endpoint& ep, size_t limit = SIZE_MAX,
                    size_t* used = nullptr);
  // Validates `d`, taken from `ring`, and runs its handler. False when the
  // descriptor is a send that must wait (invariant 4).
  bool Dispatch(Endpoint& ep, const shm::SubmissionDesc& d, shm::Ring ring);
  // A handler per op (kHandlers, row for row with shm::kOpTraits). Returns
  // false only for a message-ring op that must wait for its receiver.
  using Handler = bool (MqEngine::*)(Endpoint&, const shm::SubmissionDesc&);
  static const Handler kHandlers[shm::kSubmitOpCount];
  bool HandleSend(Endpoint& sender, const shm::SubmissionDesc& d);
  // Arrive, its Part known where it is called.
  template <Part kPart>
  Arrival ArriveAs(Endpoint& receiver, const MsgKey& key,
                   const UnexpectedMsg& m, PostedRecv* claim);
  bool HandleRecv(Endpoint& receiver, const shm::SubmissionDesc& d);
  bool HandleCancel(Endpoint& ep, const shm::SubmissionDesc& d);
  // Frees a bounded part of the first shedding_ endpoint's posted queue's
  // spare memory.
  bool ShedStep();
  bool HandleProbe(Endpoint& ep, const shm::SubmissionDesc& d);
  bool HandleClaimedRecv(Endpoint& ep, const shm::SubmissionDesc& d);
  bool HandleRndvData(Endpoint& sender, const shm::SubmissionDesc& d);
  // Hands chunk `pool_offset` (`len` bytes, at t.forwarded) to t's
  // receiver; false when it is gone or not served (the chunk stays the
  // caller's).
  bool ForwardChunk(const Transfer& t, uint64_t pool_offset, uint32_t len);
  bool HandleSetOption(Endpoint& ep, const shm::SubmissionDesc& d);
  bool HandleAmRequest(Endpoint& sender, const shm::SubmissionDesc& d);
  bool HandleAmReply(Endpoint& sender, const shm::SubmissionDesc& d);
  bool HandleAmAck(Endpoint& sender, const shm::SubmissionDesc& d);
  // What an active message's target gets (its completion).
  static shm::CompletionDesc AmCompletion(const Endpoint& sender,
                                          const shm::SubmissionDesc& d,
                                          shm::CompleteOp op, uint8_t flags);
  // Starts loading the queue entries the sends and receives of a popped
  // batch will match against (PostedQueue::prefetch_slot).
  void PrefetchMatches(Endpoint& ep, const shm::SubmissionDesc* batch,
                       size_t n);
  // Endpoint `id` if it exists, is served and belongs to ep's job.
  Endpoint* FindInJob(const Endpoint& ep, uint32_t id);
  // `recv_addr`: the receive buffer's address in the receiver (kRecvInPlace),
  // or 0.
  void Deliver(Endpoint& receiver, uint64_t recv_req, uint32_t capacity,
               const MsgKey& key, const UnexpectedMsg& m, bool was_unexpected,
               uint64_t recv_addr = 0);
  // Invariant 10: whether `t` may be taken over (both buffers named, large
  // enough, both processes known and not denied). MayTakeOverFrom is the
  // sender's part, which its own shard decides (AnswerGo).
  bool MayTakeOver(const Transfer& t, const Endpoint& sender,
                   const Endpoint& receiver) const;
  bool MayTakeOverTo(const Transfer& t, const Endpoint& receiver) const;
  static bool MayTakeOverFrom(const Endpoint& sender);
  // The sender of `t` for a copy: here, or (another shard's) t.copy_peer.
  Endpoint* CopySender(const Transfer& t);
  // Shard of the sender: a go that let it await kSendDone (kGoAwaitDone)
  // came from the shard that keeps the transfer (`from`). Answers it with
  // the sender if it may be copied (kCopyPeer), or clears the flag and
  // answers none, before the sender can see the go.
  void AnswerGo(Endpoint& sender, shm::CompletionDesc& go, uint32_t from);
  // psmd may not read (or write) `culprit`'s process: its transfers stream
  // from now on. Told to its own shard, which alone writes copy_denied.
  void DenyCopies(Endpoint& culprit, bool reading);
  // Takes over the transfers that stalled for copy_after.
  bool TakeOverStalled();
  // Completes the transfers whose copies ended.
  bool FinishCopies();
  // The last word on a transfer psmd moved itself: the rest of the data to
  // the receiver, kSendDone to the sender (counting `copied` bytes there, if
  // the copy succeeded); erases it.
  void EndTakenTransfer(std::unordered_map<uint64_t, Transfer>::iterator it,
                        int32_t recv_error, int32_t send_error,
                        uint64_t copied = 0);
  // Puts an eager message's payload into a completion (inline, or the pool
  // offset the receiver copies from and releases).
  static void AttachEagerPayload(shm::CompletionDesc& c,
                                 const UnexpectedMsg& m);
  void StartTransfer(Endpoint& receiver, uint64_t recv_req, uint32_t send_bytes,
                     const UnexpectedMsg& m, uint64_t recv_addr = 0);
  // Invariant 4: whether one more unexpected message for `receiver` would
  // exceed its budget, its job's or its uid's; Charge and Uncharge count one
  // in or out.
  bool OverBudget(const Endpoint& receiver) const;
  // The first of those budgets (its own, its job's, its uid's) one more
  // message would exceed, and its size in *bytes (if not null); nothing if
  // none would.
  std::optional<shm::StallBudget> FullBudget(const Endpoint& receiver,
                                             uint64_t* bytes) const;
  // A send to `receiver` waits for its budget: starts its stall clock
  // (ReportBudgetStalls), which Uncharge stops.
  void NoteHeld(Endpoint& receiver);
  void Charge(Endpoint& receiver);
  void Uncharge(Endpoint& receiver);
  // With shards: charges one more unexpected message to `receiver` if it
  // fits every budget (or its queue is empty, or admit_over_budget_), as
  // one step that another shard's charges cannot slip between; false
  // (nothing charged) if not.
  bool ChargeWithin(Endpoint& receiver);
  void CompleteSync(uint32_t sender_id, uint64_t sender_req, int32_t error);
  // The same for message `m` received by `receiver`, wherever its sender is.
  void CompleteSyncOf(const Endpoint& receiver, const UnexpectedMsg& m,
                      int32_t error);
  // Drops a queued (or claimed) message nobody will receive: uncharges it,
  // gives its payload back and fails a waiting sync or rendezvous sender.
  void Discard(Endpoint& receiver, const UnexpectedMsg& m);
  // Invariant 9: brings ep's share of its job's and uid's posted_recvs up
  // to date; and whether one more receive fits, counting every endpoint's
  // share afresh before saying no.
  // `exact`: to posted.size() even with shards (the endpoint is removed).
  void ChargePosted(Endpoint& ep, bool exact = false);
  static constexpr uint64_t kPostedStep = 64;
  bool PostedFits(Endpoint& ep);
  bool FlushOverflow(Endpoint& ep);
  void ReleasePayload(const Endpoint& any_of_job, const UnexpectedMsg& m);
  // Gives back the pool chunk that completion `c` hands to `ep`, which will
  // never read it (it is being removed).
  void ReleaseUnread(const Endpoint& ep, const shm::CompletionDesc& c);
  void ReportBadDescriptor(Endpoint& ep, const char* what);
  Endpoint* Find(uint32_t id);

  // ---- Handover (engine_state.cc) ----
  struct LoadedEndpoint;
  struct Loaded;
  bool ReadEndpoint(handover::StateReader& r, LoadedEndpoint* out);
  bool ReadTransfers(handover::StateReader& r, Loaded* out);
  bool ReadHeldItems(handover::StateReader& r, Loaded* out);
  bool ReadHeldFabric(handover::StateReader& r, Loaded* out);
  bool ReadMsg(handover::StateReader& r, const Endpoint& receiver, MsgKey* key,
               UnexpectedMsg* m);
  void Install(Loaded& loaded);

  // ---- Across shards (across_shards.cc; invariant 11) ----
  // Items in flight to other shards per sender (kArrive, AM requests) past
  // which its message ring waits: what a flooding sender can make another
  // shard hold for a full receiver.
  static constexpr uint32_t kCrossCredit = 32;
  // Messages and active messages from other nodes in flight to one
  // receiver of another shard (invariant 12) past which shard 0 parks its
  // frames: more than a sender's credit, since parking copies the payload
  // and switches the flow off at the sending node, which a stream to a
  // receiver that keeps up should not meet between two of its shard's
  // passes; 256 items of 128 B per such receiver held at most.
  static constexpr uint32_t kFabricCredit = 256;
  bool Local(uint32_t id) const {
    return shards_ == 1 || id % shards_ == shard_;
  }
  // Adds `delta` (mod 2^64: a negative one subtracts) to a job's or uid's
  // counter (invariants 4, 9, 11): a locked add only when other shards
  // charge it too; alone, this thread is its only writer.
  void AddTo(std::atomic<uint64_t>& counter, uint64_t delta) const {
    if (shards_ == 1) {
      counter.store(counter.load(std::memory_order_relaxed) + delta,
                    std::memory_order_relaxed);
    } else {
      counter.fetch_add(delta, std::memory_order_relaxed);
    }
  }
  // Hands `item` to shard `to` (through the outbox while that lane is full);
  // an item of PollControl's endpoint takes its control credit.
  void Push(uint32_t to, const CrossItem& item);
  void PushItem(uint32_t to, const CrossItem& item);
  // A completion for endpoint `id`, on this shard or another.
  void PostTo(uint32_t id, const shm::CompletionDesc& c);
  void PostErrorTo(uint32_t id, uint64_t req, int32_t error);
  // The cross-shard halves of HandleSend and the AM handlers.
  bool SendAcross(Endpoint& sender, uint32_t receiver_id, const MsgKey& key,
                  const UnexpectedMsg& m);
  bool AmAcross(Endpoint& sender, uint32_t target_id,
                const shm::CompletionDesc& c, bool request);
  bool ChunkAcross(Endpoint& sender, const shm::SubmissionDesc& d);
  // What a shard does with an item from shard `from`.
  bool PollCrossing();
  void TakeItem(uint32_t from, const CrossItem& item);
  // kArrive / kAm for a receiver that exists: false when held (invariant 4,
  // invariant 6), the item to be offered again.
  bool OfferItem(Endpoint& receiver, const CrossItem& item);
  void TakeChunk(uint32_t from, const CrossItem& item);
  void TakeGone(uint32_t gone_id);
  // Answers a kArrive / kAm whose receiver is gone, as a send to a closed
  // peer is answered.
  void RefuseItem(const CrossItem& item, int32_t error);
  void ReturnCredit(const CrossItem& item);
  void AddCredit(uint32_t id, bool remote, bool control);
  // Offers the held items again, receiver by receiver, in order.
  bool RetryHeld();
  // At the end of a pass: gives back the credits taken, and wakes the
  // shards pushed to.
  void FlushCrossing();
  // Ends what this shard holds for receiver `ep` (being removed), and tells
  // the other shards it is gone.
  void RemoveAcross(Endpoint& ep);

  // Endpoints removed here that other shards may still answer (a chunk of
  // theirs refused, to be released into their job's pool): kept until every
  // other shard acknowledged their kGone, after which lanes (FIFO) hold
  // nothing more for them.
  struct Departed {
    std::shared_ptr<Endpoint> ep;
    uint32_t acks_due;
  };
  std::unordered_map<uint32_t, Departed> departed_;
  Crossing* crossing_ = nullptr;
  uint32_t shard_ = 0;
  uint32_t shards_ = 1;
  // Per destination shard: what full lanes did not take, in order.
  std::vector<std::deque<CrossItem>> outbox_;
  size_t outbox_items_ = 0;
  Endpoint* pushing_ = nullptr;  // PollControl's endpoint, while it runs
  std::vector<uint8_t> wake_;    // destination shards pushed to this pass
  // Items another shard sent to a receiver of ours that a budget holds, by
  // receiver, in arrival order (a later item for it queues behind them).
  std::unordered_map<uint32_t, std::deque<CrossItem>> held_items_;
  // Credits to give back, per sender: consecutive items of one sender
  // share one kCredit.
  struct CreditRun {
    uint32_t sender_id;  // or, `remote`, a receiver of shard 0's frames
    uint32_t count;
    bool remote;
    bool control;  // kControlCredit's (an item's owner), not kCrossCredit's
  };
  std::vector<CreditRun> credits_;
  // ---- Between nodes across shards (fabric_across.cc; invariant 12) ----
  class FabricVia0;
  static bool FromOtherNode(const CrossItem& item) {
    return item.kind == CrossKind::kRemoteArrive ||
           item.kind == CrossKind::kRemoteAm;
  }
  // A shard other than 0: hands an OtherNodes call to shard 0.
  bool ToFabric(Endpoint& sender, const shm::SubmissionDesc& d,
                const PeerLink& to, bool may_hold, uint8_t call);
  void AnswerToFabric(const Endpoint& receiver, const UnexpectedMsg& m,
                      uint8_t flags, uint64_t recv_req, uint32_t send_bytes,
                      int32_t error);
  // Shard 0: what the other shards hand the fabric.
  void TakeFabricItem(const CrossItem& item);
  bool OfferFabric(Endpoint& sender, const CrossItem& item);
  bool RetryHeldFabric();
  void AdmitHeldFabric(uint32_t sender_id);
  // A kRemoteArrive / kRemoteAm whose receiver is gone: its payload goes
  // back into the inbox, a waiting sender on the other node is told.
  void RefuseRemote(const CrossItem& item, int32_t error);
  void EpidGoneHere(uint64_t epid, uint32_t uid, const uint8_t job[16]);
  void NodeLostHere(const shm::CompletionDesc& lost);
  // The endpoint `id` names, here or removed but not yet forgotten (what
  // an answer about it needs: its job's pool, its identity).
  Endpoint* Known(uint32_t id);
  std::unique_ptr<OtherNodes> fabric_via_0_;
  // Shard 0: the other shards' endpoints (only their identity is read),
  // kept after their removal until kForget; frames in flight to each
  // (kRemoteArrive, kRemoteAm); sends of each to other nodes the fabric
  // holds, in order.
  struct Foreign {
    std::shared_ptr<Endpoint> ep;
    bool removed = false;
  };
  std::unordered_map<uint32_t, Foreign> foreign_;
  std::unordered_map<uint32_t, uint32_t> remote_in_flight_;
  std::unordered_map<uint32_t, std::deque<CrossItem>> held_fabric_;

  Counter submissions_;
  Counter cross_in_;
  Counter cross_out_;

  std::unordered_map<uint32_t, std::shared_ptr<Endpoint>> by_id_;
  std::vector<Endpoint*> order_;
  const uint64_t max_unexpected_budget_;
  const uint64_t job_unexpected_budget_;
  const uint64_t uid_unexpected_budget_;
  uint64_t job_posted_limit_ = uint64_t{1} << 21;
  uint64_t uid_posted_limit_ = uint64_t{1} << 22;
  // Set while Remove() flushes a closing endpoint's submissions: its sends
  // are admitted over any budget (the sender saw them complete).
  bool admit_over_budget_ = false;
  std::unordered_map<uint64_t, Transfer> transfers_;
  uint64_t next_transfer_ = 1;
  // PollAll: passes so far (whose endpoint of a job goes first), each
  // job's turn in this pass (one per run of order_, in order), and the
  // last pass in which more than one job had work (invariant 7).
  size_t passes_ = 0;
  std::vector<JobTurn> job_turns_;
  size_t company_pass_ = 0;
  Counter slices_;
  Counter slice_ns_;
  Counter slices_over_8us_;
  Counter slices_over_64us_;
  OtherNodes* remote_ = nullptr;
  // Invariant 10: the copier (its copies are named by transfer id).
  std::unique_ptr<CrossCopier> copier_;
  uint64_t copy_min_bytes_ = 0;
  uint64_t copy_after_ns_ = 0;
  uint64_t (*copy_clock_)() = NowNs;
  uint64_t next_takeover_check_ns_ = 0;
  // Transfers that may be taken over, in turn: a check looks at most
  // kTakeoverScan of them, so a job with a million transfers outstanding
  // costs the worker a bounded slice (ids of transfers that ended are
  // dropped when their turn comes).
  std::deque<uint64_t> takeover_candidates_;
  // Receivers whose stall clock runs (Endpoint::held_since_ns), each once.
  std::vector<uint32_t> stall_watch_;
  // Endpoints whose posted queue, emptied by cancels, gives back its memory
  // a step per pass (PostedQueue::shed_memory), one after the other.
  std::vector<uint32_t> shedding_;
};

}  // namespace psmd

#endif  // PSMD_DAEMON_ENGINE_MQ_ENGINE_H_
