#include "client/publisher.h"

#include <cstring>
#include <utility>

#include "client/endpoint.h"
#include "shm/doorbell.h"

namespace psmd::client {

namespace {

// Submissions published per queue per Flush: completions are reaped in
// between, so a rendezvous send whose receiver died sees psmd's error
// before it could publish its last chunk and complete as if delivered.
constexpr size_t kPublishBatch = 32;

}  // namespace

Publisher::Publisher(const shm::ClientRings& rings, uint8_t* pool_base,
                     shm::Prefaulter* pool_pages, const shm::SendArena& arena,
                     uint32_t credits, int doorbell_fd,
                     OnPublished on_published, ToRendezvous to_rendezvous)
    : control_(rings.control),
      msg_sq_(rings.msg_sq),
      ctl_sq_(rings.ctl_sq),
      pool_base_(pool_base),
      pool_pages_(pool_pages),
      arena_(arena),
      credits_(credits),
      doorbell_fd_(doorbell_fd),
      on_published_(std::move(on_published)),
      to_rendezvous_(std::move(to_rendezvous)) {}

Deferred* Publisher::Submit(psm2_mq_req* req, const shm::SubmissionDesc& desc,
                            const void* payload, const void* prefix,
                            uint32_t prefix_len) {
  std::deque<Deferred>& queue = QueueFor(desc);
  Deferred d{req, desc, payload, prefix, prefix_len, {}};
  // Nothing waits: publishing at once is what queueing and flushing would
  // do, without a trip through the deque (on the hop's path, it cost more
  // than the rest of the submission; docs/perf.md, "Instructions per hop").
  if (idle() && !stopped_ && TryPublish(d, RingFor(desc))) {
    arena_.ForgetRefusals();  // as Flush: nothing waits for space
    RingDoorbell();
    return nullptr;
  }
  queue.push_back(std::move(d));
  Flush();
  RingDoorbell();
  // FIFO and we came last: whatever is still queued ends with us.
  return queue.empty() ? nullptr : &queue.back();
}

void Publisher::Enqueue(Deferred d) {
  QueueFor(d.desc).push_back(std::move(d));
}

bool Publisher::Flush() {
  bool did = FlushQueue(ctl_queue_, ctl_sq_);
  did |= FlushQueue(msg_queue_, msg_sq_);
  if (idle()) arena_.ForgetRefusals();  // nothing waits for space now
  return did;
}

bool Publisher::FlushQueue(std::deque<Deferred>& queue,
                           shm::RingProducer<shm::SubmissionDesc>& ring) {
  size_t published = 0;
  while (published < kPublishBatch && !queue.empty() && !stopped_ &&
         TryPublish(queue.front(), ring)) {
    queue.pop_front();
    published++;
  }
  return published > 0;
}

bool Publisher::TryPublish(Deferred& d,
                           shm::RingProducer<shm::SubmissionDesc>& ring) {
  // (A send that PlacePayload turns into a rendezvous one takes no credit
  // either way.)
  const bool needs_credit = shm::TakesCredit(d.desc);  // invariant 2
  if (needs_credit && credits_ == 0) return false;
  if (ring.FreeSlots() == 0) return false;
  if (shm::PayloadInPool(d.desc) && !PlacePayload(d)) return false;
  ring.TryPush(d.desc);
  pending_doorbell_ = true;
  if (d.req == nullptr) return true;  // fire and forget
  if (needs_credit) {
    credits_--;
    d.req->holds_credit = true;
  }
  if (d.desc.op == shm::SubmitOp::kRndvData) {
    // Wake psmd per chunk, not after the whole batch: the receiver copies
    // this chunk out while we copy the next one in.
    RingDoorbell();
  }
  on_published_(d);
  return true;
}

bool Publisher::PlacePayload(Deferred& d) {
  const bool eager = d.desc.op == shm::SubmitOp::kSend;
  auto off = arena_.Allocate(
      d.desc.len, eager ? shm::ChunkUse::kMayLinger : shm::ChunkUse::kBrief);
  if (!off && eager && arena_.Stalled()) {
    // Neither the region nor the eager payloads' share of it has had room
    // for a while: perhaps messages nobody receives before our later ones.
    // An eager send then waits in the application's buffer instead
    // (rendezvous); one that cannot still takes any room.
    if (to_rendezvous_(d)) return true;
    off = arena_.Allocate(d.desc.len, shm::ChunkUse::kMayLingerPastShare);
  }
  if (!off) return false;  // back-pressure: receivers have not drained yet
  pool_pages_->Prepare(*off - shm::kChunkHeaderBytes,
                       d.desc.len + shm::kChunkHeaderBytes);
  // (memcpy's pointers must not be null even for 0 bytes: AM arguments
  // may come without a payload, and payloads without arguments.)
  if (d.prefix_len > 0) std::memcpy(pool_base_ + *off, d.prefix, d.prefix_len);
  if (d.desc.len > d.prefix_len) {
    std::memcpy(pool_base_ + *off + d.prefix_len, d.payload,
                d.desc.len - d.prefix_len);
  }
  d.desc.body.pool.pool_offset = *off;  // (aliases body.rndv.pool_offset)
  return true;
}

void Publisher::RingDoorbell() {
  if (!pending_doorbell_) return;
  pending_doorbell_ = false;
  if (shm::DaemonAsleep(control_->doorbells)) shm::RingEventFd(doorbell_fd_);
}

void Publisher::Forget(psm2_mq_req* req) {
  for (auto* queue : {&ctl_queue_, &msg_queue_}) {
    for (auto it = queue->begin(); it != queue->end();) {
      it = it->req == req ? queue->erase(it) : it + 1;
    }
  }
}

void Publisher::Stop() {
  stopped_ = true;
  msg_queue_.clear();
  ctl_queue_.clear();
}

}  // namespace psmd::client
