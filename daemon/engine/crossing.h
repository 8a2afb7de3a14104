// Crossing: the lock-free queues between the engine shards of one psmd
// (issue 38; docs/design.md, "Engine shards"). Each shard is an MqEngine on
// its own progress worker; an endpoint lives on one shard for its life, and
// what one shard has to say about an endpoint of another (a message for it,
// a completion for it, a chunk of a transfer the other shard keeps) crosses
// as a CrossItem on the lane from the one to the other.
//
// Thread-safety: lane (from, to) has one producer, shard `from`'s worker,
// and one consumer, shard `to`'s worker (shm/ring.h's ring in process
// memory). The sleep flags are written by their shard and read by any.
//
// Invariants:
//   1. Items of one lane arrive in the order they were pushed; an item that
//      finds its lane full waits in its shard's outbox (MqEngine), behind
//      which every later item for that shard queues, so order holds through
//      the outbox too. Nothing is dropped.
//   2. A shard that is about to sleep sets its flag, fences, and looks at
//      its incoming lanes once more; a producer pushes, fences, and wakes
//      the shard if it sees the flag (the doorbell protocol of
//      shm/doorbell.h between two threads): either the sleeper sees the
//      item or the producer sees the flag.
#ifndef PSMD_DAEMON_ENGINE_CROSSING_H_
#define PSMD_DAEMON_ENGINE_CROSSING_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <vector>

#include "daemon/engine/endpoint.h"
#include "daemon/engine/job.h"
#include "daemon/engine/tag.h"
#include "shm/descriptor.h"
#include "shm/ring.h"

namespace psmd {

// What an item asks of the shard it reaches.
enum class CrossKind : uint8_t {
  kArrive,   // a send (eager, or a request to send) for receiver `to`
  kAm,       // an active message (request, reply or ack) for endpoint `to`
  kChunk,    // a rendezvous chunk of a transfer the destination keeps
  kPost,     // a completion for endpoint `to`
  kRefused,  // a request of `to` failed where it went: release, report
  kCredit,   // `to` has `count` fewer items in flight to other shards
  kGone,     // endpoint `from` was removed (invariant 8 across shards)
  kGoneAck,  // the destination took kGone for its endpoint `to`
  kTransferSenderGone,  // the sender of transfer `transfer` is gone
  // Copies in place across shards (mq_engine.h invariant 10): the sender's
  // shard answers a kRndvGo that let it await kSendDone with its sender, or
  // none (`copy_peer`); the keeping shard found the sender's process closed
  // to psmd (kCopyDenied for `to`, `flags` kCopyDeniedReading or not).
  kCopyPeer,
  kCopyDenied,
  // Between nodes (mq_engine.h invariant 12): shard 0 owns the fabric.
  kRemoteArrive,  // to a shard: a message from another node for `to`
  kRemoteAm,      // to a shard: an active message from another node for `to`
  kRemoteCredit,  // to shard 0: `count` of those for `to` were taken
  kToFabric,      // to shard 0: a send, AM or AM answer of `from` (`fabric`)
  kFabricAnswer,  // to shard 0: `from` received or failed a message from
                  // another node (`answer`)
  kEpidGone,      // from shard 0: an endpoint on another node is gone
  kNodeLost,      // from shard 0: the connection to a node ended (`post`)
  kForget,        // to shard 0: nothing more about its endpoint `to` comes
};

// kRefused's flags.
inline constexpr uint8_t kRefusedBad = 1;     // count a bad descriptor
inline constexpr uint8_t kRefusedPost = 2;    // post `error` for `req`
inline constexpr uint8_t kAmTakesCredit = 1;  // kAm: a request, credited
// kToFabric's flags: which call (OtherNodes) and its arguments.
inline constexpr uint8_t kFabricSend = 0;
inline constexpr uint8_t kFabricAmRequest = 1;
inline constexpr uint8_t kFabricAmAnswer = 2;  // a reply or an ack
inline constexpr uint8_t kFabricCallMask = 3;
inline constexpr uint8_t kFabricLinkGone = 4;
inline constexpr uint8_t kFabricMayHold = 8;
// kCredit's flags: the credit of control-ring items (kAm replies and acks,
// kChunk, kToFabric answers), not of sends and AM requests.
inline constexpr uint8_t kCreditControl = 1;
// kPost's flags: the completion is a kSendDone of a copy in place that
// moved post.msg_len bytes (the sender's shard counts them, and clears the
// field, unused by a kSendDone, before posting it).
inline constexpr uint8_t kPostCopied = 1;
inline constexpr uint8_t kCopyDeniedReading = 1;
// kFabricAnswer's flags.
inline constexpr uint8_t kAnswerStart = 1;  // StartTransfer, else CompleteSync

struct CrossItem {
  CrossKind kind;
  uint8_t flags;
  uint16_t ring_seq;  // the ring's publication stamp (shm/ring.h)
  uint32_t to;        // an endpoint of the destination shard
  uint32_t from;      // an endpoint of the source shard
  // kCredit, kRemoteCredit: how many. Any other kind: the endpoint of the
  // source shard whose control submission made the item (0: none), which
  // the destination gives a control credit back when it takes the item,
  // behind what it answers (MqEngine::kControlCredit). (One field, so that
  // an item stays 104 bytes: every crossing message copies it twice.)
  uint32_t count;
  union {
    struct {
      MsgKey key;
      UnexpectedMsg msg;
    } arrive;
    struct {
      shm::CompletionDesc c;  // as the target's completion ring gets it
      JobKey job;             // the sender's: only its job is reached
    } am;
    struct {
      uint64_t transfer;
      uint64_t req;
      uint64_t offset;
      uint64_t pool_offset;
      uint32_t len;
    } chunk;
    shm::CompletionDesc post;
    struct {
      uint64_t req;
      uint64_t pool_offset;  // a chunk of `to`'s to give back, or 0
      int32_t error;
    } refused;
    uint64_t transfer;
    struct {
      uint64_t transfer;
      // The sender, kept by its shard until the destination acknowledged
      // its kGone (MqEngine::departed_): read there only for its identity,
      // its removed flag and last_chunk_ns (endpoint.h, thread-safety 5).
      // Null: the sender may not be copied; the go went without
      // kGoAwaitDone.
      Endpoint* sender;
    } copy_peer;
    struct {
      shm::SubmissionDesc d;  // as the sender submitted it
      uint64_t epid;          // its peer link's
    } fabric;
    struct {
      UnexpectedMsg msg;
      uint64_t recv_req;
      uint32_t send_bytes;
      int32_t error;
    } answer;
    struct {
      uint64_t epid;
      uint32_t uid;
      uint8_t job[16];
    } epid_gone;
  };
};
static_assert(sizeof(CrossItem) <= 128, "two cache lines per item at most");
static_assert(std::is_trivially_copyable_v<CrossItem>);

class Crossing {
 public:
  // Items per lane; a power of two.
  static constexpr uint32_t kLaneItems = 4096;

  explicit Crossing(uint32_t shards);
  Crossing(const Crossing&) = delete;
  Crossing& operator=(const Crossing&) = delete;

  uint32_t shards() const { return shards_; }

  // Shard `from`'s worker only: false when the lane is full.
  bool TryPush(uint32_t from, uint32_t to, const CrossItem& item) {
    return Lane(from, to).producer.TryPush(item);
  }
  // Shard `to`'s worker only.
  size_t Pop(uint32_t from, uint32_t to, CrossItem* out, size_t max) {
    return Lane(from, to).consumer.PopBatch(out, max);
  }
  bool Pending(uint32_t from, uint32_t to) {
    return Lane(from, to).consumer.Available() > 0;
  }

  // Invariant 2. `fd` is the eventfd shard's worker sleeps on; set before
  // any worker starts.
  void SetWakeFd(uint32_t shard, int fd) { wake_[shard].fd = fd; }
  void SetSleeping(uint32_t shard, bool sleeping) {
    wake_[shard].sleeping.store(sleeping, std::memory_order_relaxed);
  }
  // After pushing to `shard`: wakes it if it sleeps (fences first).
  void Wake(uint32_t shard);

 private:
  struct alignas(shm::kCacheLine) LaneState {
    shm::RingControl control;
    std::unique_ptr<CrossItem[]> slots;
    alignas(shm::kCacheLine) shm::RingProducer<CrossItem> producer;
    alignas(shm::kCacheLine) shm::RingConsumer<CrossItem> consumer;
  };
  struct alignas(shm::kCacheLine) WakeState {
    std::atomic<bool> sleeping{false};
    int fd = -1;
  };
  LaneState& Lane(uint32_t from, uint32_t to) {
    return *lanes_[from * shards_ + to];
  }

  const uint32_t shards_;
  std::vector<std::unique_ptr<LaneState>> lanes_;  // [from * shards + to]
  std::unique_ptr<WakeState[]> wake_;
};

}  // namespace psmd

#endif  // PSMD_DAEMON_ENGINE_CROSSING_H_
