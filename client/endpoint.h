// libpsmclient's endpoint: the PSM2 handles (psm2_ep, psm2_mq, psm2_epaddr,
// psm2_mq_req) and the client half of the ring protocol: posting
// submissions, reaping completions, copying payloads, waiting.
//
// Thread-safety: every handle belongs to one endpoint, and every operation on
// an endpoint runs under that endpoint's mutex (the public API functions take
// it), so applications may call PSM2 from several threads.
//
// Invariants:
//   1. Submissions reach each ring in API-call order: once anything waits in
//      a ring's deferred queue, later submissions for that ring queue behind
//      it (MPI order for sends, posting order for receives).
//   2. Round trips (probe, cancel, option) and active messages that want an
//      acknowledgement hold one completion-ring credit until their
//      completion is reaped; outstanding credits never exceed the completion
//      ring's capacity. Receives and sync or rendezvous sends take none:
//      applications keep any number of them outstanding until a peer acts,
//      and one held back for a credit would hold back every later probe or
//      cancel behind it (invariant 1), possibly for good. Their completions
//      may find the ring full; they then wait in psmd's overflow queue
//      (bounded by the receives and sends psmd already holds) until we reap.
//   3. A request is referred to on the wire by a token (slot index and the
//      generation's low 31 bits, so a token stays below 2^63: psmd names
//      requests of its own above, daemon/remote/remote.h); a completion whose
//      token is stale is ignored.
//   4. A non-sync send to the endpoint itself completes for test and wait
//      without a receive, but joins the ipeek list only when a receive
//      matched it (psmd's kSendDone for the eager message or kRndvGo for the
//      copy), as Intel's self device does: Open MPI collects completions
//      through ipeek, and programs expect such sends to finish together with
//      their receives.
#ifndef PSMD_CLIENT_ENDPOINT_H_
#define PSMD_CLIENT_ENDPOINT_H_

#include <psm2.h>
#include <psm2_am.h>
#include <psm2_mq.h>

#include <sched.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <vector>

#include "client/am_dispatcher.h"
#include "client/control_client.h"
#include "client/mutex.h"
#include "client/publisher.h"
#include "client/request_table.h"
#include "shm/descriptor.h"
#include "shm/layout.h"
#include "shm/mapping.h"
#include "shm/payload.h"
#include "shm/pool.h"
#include "shm/prefault.h"
#include "shm/ring.h"
#include "shm/spin.h"

// The opaque PSM2 handle types, defined here.
struct psm2_epaddr {
  psm2_ep_t ep;
  psm2_epid_t epid;
  uint32_t
      slot;  // connection slot, or kNoSlot when not connected from this side
  void* ctxt;
};

struct psm2_mq_req {
  enum class Kind : uint8_t {
    kSend,
    kRecv,
    kInternal,  // a round trip of the library itself (probe, cancel, option)
    kAm,        // an active message waiting for its handler to have run
  };
  enum class State : uint8_t {
    kDeferred,   // waiting in a deferred queue for ring space, credit or pool
    kPosted,     // published; the daemon answers
    kStreaming,  // rendezvous send: cleared to send, chunks being published
    kReceiving,  // rendezvous receive: matched, chunks arriving
    kClaimed,    // matched probe: holds a message for psm2_mq_imrecv
    kComplete,
  };
  // What psm2_mq_ipeek_dequeue_multi's callback reads: first, and current
  // (peer, tag, buffer, error_code, recv_msglen = nbytes, send_msglen =
  // msg_length, context).
  psm2_mq_req_user user;
  Kind kind;
  State state;
  bool holds_credit;    // invariant 2
  bool free_when_done;  // the application let go of it (e.g. send completed)
  bool freed;           // in the free list (RequestTable::Free)
  bool was_unexpected;  // receive: the message had waited in psmd (stats)
  uint32_t index;       // position in the endpoint's request table
  uint32_t generation;
  psm2_mq_t mq;
  // Rendezvous send: the user's buffer, how much the receiver takes, how much
  // has been queued as chunks and published.
  const uint8_t* send_buf;
  uint64_t transfer;
  uint32_t send_bytes;
  uint32_t chunked;
  uint32_t published;
  bool await_done;  // kGoAwaitDone: complete on psmd's kSendDone
  // Rendezvous send to the endpoint itself: this internal request carries
  // the protocol from the library's copy of the payload (psm2_ep's
  // self_copies[index], which send_buf points into); self_copy_of is the
  // token of the application's send, which completed when the copy was made.
  // (The copy lives outside the request so that requests stay plain data,
  // cheap to reset on the hot path.)
  bool has_self_copy;
  uint64_t self_copy_of;
  // A non-sync send to this endpoint itself: complete for test and wait once
  // published (or copied), on the MQ's ipeek list only once matched
  // (self_matched), as with Intel's self device.
  bool self_send;
  bool self_matched;
  // An eager SENDSYNC send to this endpoint itself: complete only together
  // with the receive that matched it (psm2_ep::sync_self_pending_), as
  // with Intel's self device, which copies during the send.
  bool sync_to_self;
  // Matched probe of an eager message: its payload, handed over with the
  // claim (kPayloadClaimed) so that psm2_mq_imrecv completes at once.
  struct {
    bool present;
    bool is_inline;
    bool failed;  // kPayloadFailed: the sender's send had failed
    uint64_t pool_offset;
    uint8_t inline_data[psmd::shm::kInlineMax];
  } claimed;
  // Rendezvous receive: bytes owed (min of message and buffer) and arrived.
  uint32_t expect_bytes;
  uint32_t received_bytes;
  // Active message: called once the target's handler ran.
  psm2_am_completion_fn_t am_done;
  void* am_done_context;
  // Completion-order list of the MQ (for ipeek).
  psm2_mq_req* next_done;
  psm2_mq_req* prev_done;
  bool on_done_list;
};

// Plain data: NewRequest resets a recycled request by assignment, on the
// hot path.
static_assert(std::is_trivially_copyable_v<psm2_mq_req>);

struct psm2_mq {
  psm2_ep_t ep;
  bool initialized = false;
  // Options (psm2_mq_setopt). Messages above rndv_shm_bytes to an endpoint
  // of this node, and above rndv_hfi_bytes to one on another node (through
  // the fabric, as Intel's library uses it for its HFI), use rendezvous.
  uint32_t rndv_shm_bytes = 0;
  uint32_t rndv_hfi_bytes = 0;
  uint32_t max_sysbuf_mbytes = 0;
  // Name rendezvous buffers to psmd so that it may copy their payloads
  // itself (shm::PlaceInMemory); PSMD_COPY_IN_PLACE=off streams them.
  bool copy_in_place = true;
  psm2_mq_stats_t stats{};
  psm2_mq_req* done_head = nullptr;
  psm2_mq_req* done_tail = nullptr;
};

namespace psmd::client {

inline constexpr uint32_t kNoSlot = 0xffffffffu;

// Rendezvous payloads move in chunks of this size, so a message of any size
// needs only a few chunks of pool at a time (pipelined with the receiver's
// copy-out).
inline constexpr uint32_t kRndvChunkBytes = 256u << 10;

// The generation bits a token carries (invariant 3).
inline constexpr uint32_t kTokenGenerationMask = 0x7fffffffu;

// The wire name of a request (invariant 3).
inline uint64_t TokenOf(const psm2_mq_req* r) {
  return (uint64_t{r->generation & kTokenGenerationMask} << 32) | r->index;
}

}  // namespace psmd::client

struct psm2_ep {
  // Who the endpoint is: set by Open, then constant.
  struct Identity {
    psmd::client::ControlClient* control = nullptr;
    uint32_t id = 0;  // psmd's endpoint id
    psm2_epid_t epid = 0;
    psm2_uuid_t uuid{};
    std::string daemon_version;          // as psmd reported it (PSM2_IDENTIFY)
    uint64_t max_unexpected_budget = 0;  // from the segment header
    // How long a connect to other nodes may take psmd (its fabric timeout).
    std::chrono::milliseconds remote_wait{0};
  };

  // Takes over the attached segment and pool and the two descriptors; wire
  // it to its rings with UseRings before use.
  psm2_ep(Identity identity, psmd::shm::Mapping segment,
          psmd::shm::Mapping pool, int doorbell_fd, int liveness_fd);
  ~psm2_ep();
  psm2_ep(const psm2_ep&) = delete;
  psm2_ep& operator=(const psm2_ep&) = delete;

  // Opens, attaches and maps; on failure returns the error and message.
  static psmd::Status Open(psmd::client::ControlClient* control,
                           const psm2_uuid_t uuid,
                           std::unique_ptr<psm2_ep>* out);

  // Recursive: AM handlers call PSM2 from inside progress (client/mutex.h).
  psmd::client::EndpointMutex mu;

  psmd::client::ControlClient* control() const { return identity_.control; }
  uint32_t id() const { return identity_.id; }
  psm2_epid_t epid() const { return identity_.epid; }
  const uint8_t* uuid() const { return identity_.uuid; }
  const std::string& daemon_version() const { return identity_.daemon_version; }
  std::chrono::milliseconds remote_wait() const {
    return identity_.remote_wait;
  }
  uint64_t max_unexpected_budget() const {
    return identity_.max_unexpected_budget;
  }
  uint8_t* pool_base() const { return pool_.base(); }
  // What the segment shares with psmd; tests/programs/garbage_client writes
  // them raw, as a hostile client would.
  int doorbell_fd() const { return doorbell_fd_; }
  psmd::shm::SegmentControl* segment_control() const { return ctl_; }
  // The endpoint's one matched queue, as the handle psm2_mq_init returns
  // (its address never changes; what it points to is guarded by mu).
  psm2_mq_t mq_handle() { return &mq_; }

  // --- everything below requires `mu` held (PSMD_REQUIRES: checked by clang)
  // ---

  psm2_mq& mq() PSMD_REQUIRES(mu) { return mq_; }
  // The submission rings, what waits for them, credits, the send arena.
  psmd::client::Publisher& publisher() PSMD_REQUIRES(mu) { return publisher_; }
  psmd::client::RequestTable& requests() PSMD_REQUIRES(mu) { return requests_; }
  psmd::client::AmDispatcher& am() PSMD_REQUIRES(mu) { return am_; }
  // psmd went away (its liveness descriptor hung up): every call fails with
  // PSM2_EP_WAS_CLOSED.
  bool daemon_lost() const PSMD_REQUIRES(mu) { return daemon_lost_; }
  // Wires the endpoint to a segment's rings (`ctl`, `cq`, the publisher);
  // `segment`, `pool` and `doorbell_fd` are set.
  void UseRings(const psmd::shm::ClientRings& rings,
                const psmd::shm::SendArena& arena, uint32_t credits)
      PSMD_REQUIRES(mu);
  psm2_epaddr_t EpaddrFor(psm2_epid_t epid) PSMD_REQUIRES(mu);
  psm2_mq_req* NewRequest(psm2_mq_req::Kind kind, void* context)
      PSMD_REQUIRES(mu);
  // For a rendezvous send of `len` bytes to this endpoint itself: a copy of
  // the payload in an internal request that carries the protocol, so that
  // the application's send completes before the receive is posted, as with
  // Intel's self device. Null (send by plain rendezvous) when the copies
  // would exceed the unexpected budget.
  psm2_mq_req* CopyForSelf(const void* buf, uint32_t len,
                           const psm2_mq_req* send) PSMD_REQUIRES(mu);
  // A receive matched the self send `req` (invariant 4).
  void SelfSendMatched(psm2_mq_req* req) PSMD_REQUIRES(mu);
  void FreeRequest(psm2_mq_req* req) PSMD_REQUIRES(mu);
  // Publishes `desc` (a probe, cancel or option, with req's token) and waits
  // for the daemon's answer, which lands in req->user (error_code and, for a
  // probe that found a message, its status). Returns the answer's error.
  psm2_error_t RoundTrip(psm2_mq_req* req,
                         const psmd::shm::SubmissionDesc& desc)
      PSMD_REQUIRES(mu);
  // Reaps completions and flushes deferred submissions. Returns true when
  // anything happened.
  bool Progress() PSMD_REQUIRES(mu);
  // Blocks until `done()` holds: spins briefly, then sleeps on the
  // completion-ring futex (docs/design.md, "Wake-up").
  template <typename Done>
  void WaitUntil(Done done) PSMD_REQUIRES(mu);
  // Marks req complete and, unless the application let go of it, appends it
  // to the MQ's ipeek list (a self send: once also matched, invariant 4).
  void MarkComplete(psm2_mq_req* req) PSMD_REQUIRES(mu);
  // psm2_mq_imrecv of a claimed eager message (req->claimed.present): copies
  // the payload into req->user.buf and completes the request.
  void ReceiveClaimed(psm2_mq_req* req) PSMD_REQUIRES(mu);
  // Called when a non-blocking call (psm2_poll, a test, a peek) found
  // nothing: applications spin on those. Where psmd or another poller shares
  // our core it needs the core to do the work we wait for, so we yield
  // (else it would get it only when the scheduler preempts us:
  // milliseconds); elsewhere we pause for a while, then yield (shm/spin.h).
  // Only from the second empty call since Progress last found work or a
  // submission was published: a single check (Open MPI's mtl psmd peeks once
  // after every blocking send) should not cost even that.
  // Empty calls also look, now and then, whether psmd is still there
  // (IdleTurn): an application that only polls never sleeps in
  // SleepForCompletions, where a waiting one finds out.
  void IdleYield() PSMD_REQUIRES(mu) {
    if (empty_checks_++ > 0) IdleTurn(empty_checks_ - 1);
  }
  // Whether the psmd this endpoint attached to is gone, looked at now (its
  // attach connection hung up), not just remembered: the socket path may
  // already be served by a successor that knows nothing of this endpoint
  // and whose own endpoints may have the same ids. The first time it finds
  // psmd gone it fails every pending request with PSM2_EP_WAS_CLOSED and
  // says "lost psmd" once.
  bool CheckDaemon() PSMD_REQUIRES(mu);
  void RemoveFromDoneList(psm2_mq_req* req) PSMD_REQUIRES(mu);
  // The error of the last node lost (kNodeLost) since the previous call,
  // else PSM2_OK: psm2_poll returns it once, so that an application
  // without an error handler learns of it too.
  psm2_error_t TakeNodeLost() PSMD_REQUIRES(mu) {
    return std::exchange(node_lost_, PSM2_OK);
  }

 private:
  // What publishing a submission means for its request.
  void Published(psmd::client::Deferred& d) PSMD_REQUIRES(mu);
  // An eager send that found no pool space for shm::kPoolStallNs becomes
  // a rendezvous send (docs/design.md, "Payload pool"); false if it cannot.
  bool SendByRendezvous(psmd::client::Deferred& d) PSMD_REQUIRES(mu);
  void HandleCompletion(const psmd::shm::CompletionDesc& c) PSMD_REQUIRES(mu);
  void CompleteEager(psm2_mq_req* req, const psmd::shm::CompletionDesc& c,
                     psmd::shm::PoolPayload& payload) PSMD_REQUIRES(mu);
  // The pool chunk of a claimed eager message (none if inline or absent)
  // PSMD_REQUIRES(mu); the request no longer holds it.
  psmd::shm::PoolPayload TakeClaimedPayload(psm2_mq_req* req) PSMD_REQUIRES(mu);
  void StartRendezvousReceive(psm2_mq_req* req,
                              const psmd::shm::CompletionDesc& c)
      PSMD_REQUIRES(mu);
  void ReceiveChunk(psm2_mq_req* req, const psmd::shm::CompletionDesc& c,
                    psmd::shm::PoolPayload& payload) PSMD_REQUIRES(mu);
  void StartStreaming(psm2_mq_req* req, const psmd::shm::CompletionDesc& c)
      PSMD_REQUIRES(mu);
  void SetMatchedStatus(psm2_mq_req* req, const psmd::shm::CompletionDesc& c)
      PSMD_REQUIRES(mu);
  void RunAmHandler(const psmd::shm::CompletionDesc& c,
                    const psmd::shm::PoolPayload& payload) PSMD_REQUIRES(mu);
  void AmAcknowledged(const psmd::shm::CompletionDesc& c) PSMD_REQUIRES(mu);
  // Reports kNodeLost through this endpoint's error handler.
  void NodeLost(const psmd::shm::CompletionDesc& c) PSMD_REQUIRES(mu);
  // Prints kBudgetStall's warning (not an error: the sends still wait).
  void BudgetStall(const psmd::shm::CompletionDesc& c) PSMD_REQUIRES(mu);
  void SendAmAck(const psmd::shm::CompletionDesc& c, psm2_error_t error)
      PSMD_REQUIRES(mu);
  void CountReceive(const psm2_mq_req* req, bool rendezvous) PSMD_REQUIRES(mu);
  psm2_mq_req* Lookup(uint64_t token) PSMD_REQUIRES(mu);
  void SleepForCompletions() PSMD_REQUIRES(mu);
  // One idle turn of a poll or wait that found nothing (`turn` counts them
  // from 1): pause or yield (spin_), and every kClockTurns-th turn, if
  // kLivenessIntervalNs have passed since the last look, CheckDaemon. By
  // time, not by a count of turns alone: on a loaded node a turn that
  // yields can cost a whole time slice, and 1024 of them (the count this
  // replaced) took 0.6-2.4 s with four busy processes on 2 cores.
  void IdleTurn(uint32_t turn) PSMD_REQUIRES(mu);
  static constexpr uint32_t kClockTurns = 16;
  // A poll(2) every 20 ms is nothing beside the turns' own yields; psmd's
  // loss is then seen within 20 ms plus at most kClockTurns turns.
  static constexpr int64_t kLivenessIntervalNs = 20'000'000;
  void FailAllPending(psm2_error_t error) PSMD_REQUIRES(mu);

  const Identity identity_;
  psmd::shm::Mapping segment_;
  psmd::shm::Mapping pool_;
  const int doorbell_fd_;
  const int liveness_fd_;
  psmd::shm::SegmentControl* ctl_ = nullptr;  // set by UseRings

  psmd::shm::RingConsumer<psmd::shm::CompletionDesc> cq_ PSMD_GUARDED_BY(mu);
  psmd::shm::Prefaulter pool_pages_ PSMD_GUARDED_BY(mu);  // set by UseRings
  psmd::client::Publisher publisher_ PSMD_GUARDED_BY(mu);
  bool daemon_lost_ PSMD_GUARDED_BY(mu) = false;
  // CLOCK_MONOTONIC_COARSE ns of the last CheckDaemon from IdleTurn.
  int64_t liveness_checked_ns_ PSMD_GUARDED_BY(mu) = 0;
  psm2_error_t node_lost_ PSMD_GUARDED_BY(mu) = PSM2_OK;  // TakeNodeLost
  // Token of a SENDSYNC send to ourselves that psmd matched (kSendDone) and
  // that completes with the next completion (psm2_mq_req::sync_to_self);
  // 0: none.
  uint64_t sync_self_pending_ PSMD_GUARDED_BY(mu) = 0;
  // Payload copies of rendezvous sends to ourselves, by the index of the
  // request that carries each, and their bytes; kept within the MQ's
  // unexpected budget (PSM2_MQ_MAX_SYSBUF_MBYTES).
  std::unordered_map<uint32_t, std::vector<uint8_t>> self_copies_
      PSMD_GUARDED_BY(mu);
  uint64_t self_copy_bytes_ PSMD_GUARDED_BY(mu) = 0;
  psm2_mq mq_ PSMD_GUARDED_BY(mu);
  std::unordered_map<psm2_epid_t, std::unique_ptr<psm2_epaddr>> epaddrs_
      PSMD_GUARDED_BY(mu);
  psmd::client::RequestTable requests_ PSMD_GUARDED_BY(mu);
  psmd::client::AmDispatcher am_ PSMD_GUARDED_BY(mu);
  // Progress is running (a handler called back in).
  bool in_progress_ PSMD_GUARDED_BY(mu) = false;
  // IdleYield calls since Progress last found work or a submission was
  // published.
  uint32_t empty_checks_ PSMD_GUARDED_BY(mu) = 0;
  // Pause or yield when a poll finds nothing (shm/spin.h); set by UseRings.
  psmd::shm::ClientSpin spin_ PSMD_GUARDED_BY(mu);
};

template <typename Done>
void psm2_ep::WaitUntil(Done done) {
  // Spin budget: polls of the completion ring before sleeping. Tuned on a
  // 2-core machine where a third busy process destroys latency
  // (docs/design.md); overridable with PSMD_CLIENT_SPIN.
  static const uint32_t spins = [] {
    const char* env = getenv("PSMD_CLIENT_SPIN");
    return env ? static_cast<uint32_t>(strtoul(env, nullptr, 10)) : 2000u;
  }();
  uint32_t idle = 0;
  while (!done()) {
    if (Progress()) {
      idle = 0;
      continue;
    }
    if (done()) return;
    if (++idle < spins) {
      IdleTurn(idle);
      // Another application thread wants the endpoint (a send, a test):
      // let it in, as Intel's psm2_mq_wait does, rather than make it wait
      // until this wait ends or sleeps.
      if (mu.Contended()) {
        mu.Unlock();
        sched_yield();
        mu.Lock();
      }
      continue;
    }
    SleepForCompletions();
    idle = 0;
  }
}

#endif  // PSMD_CLIENT_ENDPOINT_H_
