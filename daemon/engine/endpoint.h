// The daemon's view of one endpoint, in three parts as the client's psm2_ep
// is: its identity, the match state its engine owns, and its counters.
//
// Thread-safety (each checked by the compiler where it says so):
//   1. The identity (id, epid, job, uid/gid/pid, label, segment mapping,
//      geometry, pool region, doorbell) is built whole before the endpoint
//      exists and is const: any thread reads it through the accessors.
//   2. The match state (rings, queues, peers, budgets, flags) is private to
//      the endpoint and reachable only from MqEngine (friend), whose every
//      method runs on its progress worker's thread; the worker holds its
//      engine PSMD_GUARDED_BY its thread role (base/thread_role.h), so code
//      on any other thread that reaches for it does not compile under
//      --config=thread-safety. Transports beside the engine
//      (daemon/remote) use MqEngine's public surface.
//   3. pidfd is stored once by the registry at attach (release) and read by
//      the engine (acquire).
//   4. Counters are written by the worker only (relaxed stores) and read by
//      control threads (relaxed loads): stats may be a moment old, never torn.
//   5. Two fields of the match state are read by another shard's worker,
//      the one that keeps a rendezvous transfer from this endpoint and may
//      copy it in place (mq_engine.h, invariant 10): last_chunk_ns, written
//      by this endpoint's worker only (relaxed), and removed, set once by
//      it before the endpoint leaves (release) and read by the copier
//      (acquire). That shard holds the pointer only while the transfer
//      lasts, which ends before it acknowledges the endpoint's kGone, before
//      which the endpoint is not freed (MqEngine::departed_).
#ifndef PSMD_DAEMON_ENGINE_ENDPOINT_H_
#define PSMD_DAEMON_ENGINE_ENDPOINT_H_

#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "daemon/engine/job.h"
#include "daemon/engine/matcher.h"
#include "daemon/engine/validate.h"
#include "proto/counters.h"
#include "shm/descriptor.h"
#include "shm/layout.h"
#include "shm/mapping.h"
#include "shm/ring.h"

namespace psmd {

// A counter with one writer: increments are a load and a store, no locked
// instruction on the hot path.
class Counter {
 public:
  void Add(uint64_t n) {
    v_.store(v_.load(std::memory_order_relaxed) + n, std::memory_order_relaxed);
  }
  uint64_t Get() const { return v_.load(std::memory_order_relaxed); }

 private:
  std::atomic<uint64_t> v_{0};
};

// One Counter per entry of the list in proto/counters.h.
struct EndpointCounters {
#define PSMD_COUNTER_FIELD(name, unit, help) Counter name;
  PSMD_ENDPOINT_COUNTERS(PSMD_COUNTER_FIELD)
#undef PSMD_COUNTER_FIELD

  counters::Values Values() const {
    return {{
#define PSMD_COUNTER_VALUE(name, unit, help) name.Get(),
        PSMD_ENDPOINT_COUNTERS(PSMD_COUNTER_VALUE)
#undef PSMD_COUNTER_VALUE
    }};
  }
};

// What one unexpected message is charged against its receiver's budgets
// (mq_engine.h, invariant 4): the daemon's own bookkeeping for it (the queue
// entry, with up to shm::kInlineMax payload bytes, and matcher node),
// rounded up. A larger payload is not psmd's memory: it waits in a pool
// region whose share for payloads that may linger bounds it (shm/pool.h;
// the sender's region on this node, the receiving job's inbox from another
// node), or with its sender (rendezvous), or in a connection's park
// (daemon/remote/remote.h, kParkMax).
inline constexpr uint64_t kUnexpectedOverheadBytes = 128;

// A receive waiting in the posted queue.
struct PostedRecv {
  uint64_t req;
  uint32_t capacity;  // bytes the receive buffer holds
  uint64_t source;    // the epid it names, or kAnySource
  uint64_t addr;  // the buffer in the receiver's memory (kRecvInPlace), or 0
};

// A message waiting in the unexpected queue (or claimed by a matched probe).
struct UnexpectedMsg {
  // The sending endpoint's id; for a sender on another node (remote_src),
  // 0, or the id of its payload this daemon keeps (a rendezvous whose
  // sender is psmd, daemon/remote/remote.h back-pressure 3).
  uint32_t sender_id;
  uint8_t flags;    // shm::SubmitFlags of the send
  bool rendezvous;  // a request-to-send: the payload is still with the sender
  uint32_t len;
  uint64_t sender_req;  // kSendSync / rendezvous: the sender's request
  // One or the other, so that a queued message costs psmd no more than
  // kUnexpectedOverheadBytes charges for it.
  union {
    uint64_t pool_offset;  // eager, len > kInlineMax
    uint64_t send_addr;    // rendezvous with kSendInPlace: the payload's
                           // address in the sender (else 0)
  };
  uint8_t inline_data[shm::kInlineMax];
  // Non-zero: the sender is this epid on another node; an eager payload is
  // in the receiver's job inbox (daemon/remote/remote.h).
  uint64_t remote_src;
};

// A message removed from the unexpected queue by a matched probe
// (psm2_mq_improbe), waiting for the receive that names the probe's request.
struct ClaimedMsg {
  MsgKey key;
  UnexpectedMsg msg;
};

// PeerLink::endpoint_id of a peer on another node (daemon/remote/remote.h).
inline constexpr uint32_t kRemotePeer = 0xffffffffu;

// One connection slot: the peer this endpoint named by index in descriptors.
struct PeerLink {
  uint32_t endpoint_id = 0;  // 0: slot unused
  uint64_t epid = 0;
  // The peer closed or died: everything it sent has been delivered or is
  // queued here, so a receive naming it can match only what is queued.
  bool gone = false;
};

class Endpoint {
 public:
  // Who the endpoint is and where its shared memory lies: built whole by the
  // registry (the segment created, its header written, the doorbell made)
  // before the endpoint exists, then constant.
  struct Identity {
    uint32_t id = 0;
    uint64_t epid = 0;
    std::shared_ptr<Job> job;
    uid_t uid = 0;
    gid_t gid = 0;
    pid_t pid = 0;
    std::string label;
    shm::Mapping segment;
    shm::SegmentGeometry geometry{};
    SendRegion region;
    int doorbell_fd = -1;  // eventfd the client rings when the daemon sleeps
  };

  // Takes over the identity's segment and doorbell (closed with the
  // endpoint); `unexpected_budget` is PSM2_MQ_MAX_SYSBUF_MBYTES until the
  // client sets it.
  Endpoint(Identity identity, uint64_t unexpected_budget)
      : identity_(std::move(identity)), unexpected_budget(unexpected_budget) {}
  Endpoint(const Endpoint&) = delete;
  Endpoint& operator=(const Endpoint&) = delete;
  ~Endpoint();

  // ---- identity: read from any thread ----
  uint32_t id() const { return identity_.id; }
  uint64_t epid() const { return identity_.epid; }
  const std::shared_ptr<Job>& job() const { return identity_.job; }
  uid_t uid() const { return identity_.uid; }
  gid_t gid() const { return identity_.gid; }
  pid_t pid() const { return identity_.pid; }
  const std::string& label() const { return identity_.label; }
  const shm::Mapping& segment() const { return identity_.segment; }
  const shm::SegmentGeometry& geometry() const { return identity_.geometry; }
  const SendRegion& region() const { return identity_.region; }
  int doorbell_fd() const { return identity_.doorbell_fd; }
  shm::SegmentControl* control() const {
    return shm::ControlOf(identity_.segment.base());
  }

  // The client process, from its attach socket (SO_PEERPIDFD), for copies in
  // place (daemon/engine/cross_copy.h): stored once by the registry at
  // attach (release), read by the engine (acquire); -1 until attached, or
  // when unavailable.
  std::atomic<int> pidfd{-1};

  // Written by the progress worker only (relaxed stores), read by control
  // threads (relaxed loads).
  EndpointCounters counters;

  // Set by its worker when it removes the endpoint, before other shards
  // learn (kGone): a copy in place another shard's copier runs from this
  // process delivers nothing it read after this (thread-safety 5).
  std::atomic<bool> removed{false};

 private:
  // The match state: the engine's alone (it runs on the progress worker's
  // thread, and only that thread reaches the engine: daemon/progress.h).
  // Transports beside the engine reach it through MqEngine's public surface;
  // tests look at it through EndpointTestPeer
  // (daemon/engine/test_endpoint.h).
  friend class MqEngine;
  friend class EndpointTestPeer;

  const Identity identity_;

  shm::RingConsumer<shm::SubmissionDesc> msg_sq;
  shm::RingConsumer<shm::SubmissionDesc> ctl_sq;
  shm::RingProducer<shm::CompletionDesc> cq;
  std::deque<shm::CompletionDesc>
      cq_overflow;  // completions waiting for ring space
  // Sends taken off msg_sq that wait for their receiver's unexpected budget,
  // in order; at most one batch. msg_sq is not read while this is non-empty.
  std::deque<shm::SubmissionDesc> held_sends;
  // msg_sq's published end when a doorbell was last looked at while held
  // (MqEngine::DoorbellIdle): a ring with more published since was not idle.
  uint32_t doorbell_seen_end = 0;
  std::vector<PeerLink> peers;
  PostedQueue<PostedRecv> posted;
  UnexpectedQueue<UnexpectedMsg> unexpected;
  // Rendezvous messages claimed by a matched probe, by the probe's request
  // token, until the client receives them (kClaimedRecv). A claimed eager
  // message goes to the client with the probe's answer instead.
  std::unordered_map<uint64_t, ClaimedMsg> claimed;
  uint64_t unexpected_cost = 0;  // kUnexpectedOverheadBytes per unexpected
                                 // and claimed message
  uint64_t unexpected_budget;    // PSM2_MQ_MAX_SYSBUF_MBYTES of this endpoint
  // Since when a send to this endpoint has waited for its budget with none
  // of its unexpected messages received (0: none waits); whether it is in
  // MqEngine's stall_watch_.
  uint64_t held_since_ns = 0;
  bool stall_watched = false;
  // posted.size() when last added to its job's and uid's posted_recvs
  // (mq_engine.h, invariant 9).
  uint64_t posted_charged = 0;
  bool notify_pending =
      false;             // completions published since the last wake check
  bool faulted = false;  // ring corrupted by the client: no longer served
  // psmd may not read or write this process (a copy failed with EPERM):
  // its rendezvous messages stream through the pool (mq_engine.h, inv. 10).
  bool copy_denied = false;
  // Its sends and AM requests handed to other shards whose credit did not
  // come back yet (mq_engine.h, invariant 11).
  uint32_t cross_in_flight = 0;
  // Items its control submissions handed other shards (AM replies and
  // acks, rendezvous chunks, completions) that the other shard has not
  // taken yet (no control credit came back), in the outbox or in a lane;
  // its control ring waits beyond MqEngine::kControlCredit (invariant 11).
  uint32_t ctl_in_flight = 0;
  // When psmd last took a rendezvous chunk from this endpoint: a sender
  // busy streaming one message is not stalled on the others (inv. 10).
  // Written by this endpoint's worker only; read by the shard that keeps a
  // transfer from it (thread-safety 5).
  std::atomic<uint64_t> last_chunk_ns{0};
};

}  // namespace psmd

#endif  // PSMD_DAEMON_ENGINE_ENDPOINT_H_
