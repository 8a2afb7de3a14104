// The submitting half of an endpoint: its two submission rings, the queues
// of submissions waiting there for ring space, a completion credit or pool
// space, the credits themselves, the send arena in the job pool, and the
// doorbell. It owns invariants 1 and 2 of client/endpoint.h: each ring's
// submissions are published in API-call order, and outstanding credits
// never exceed the completion ring's capacity.
//
// What a published submission means for its request (complete at once,
// posted, one more chunk out) is the endpoint's business: the Publisher
// hands every published submission that has a request to the endpoint's
// callback.
//
// Thread-safety: none of its own; the endpoint uses it under its mutex.
#ifndef PSMD_CLIENT_PUBLISHER_H_
#define PSMD_CLIENT_PUBLISHER_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <vector>

#include "shm/descriptor.h"
#include "shm/layout.h"
#include "shm/pool.h"
#include "shm/prefault.h"
#include "shm/ring.h"
#include "shm/segment.h"

struct psm2_mq_req;

namespace psmd::client {

// A submission waiting for ring space, a credit or pool space. `req` is
// null for fire-and-forget submissions (AM replies and acks).
struct Deferred {
  psm2_mq_req* req;
  shm::SubmissionDesc desc;
  // Pool payload, copied into the pool when space frees: `prefix` (AM
  // arguments) then `payload`, desc.len bytes in all.
  const void* payload;
  const void* prefix = nullptr;
  uint32_t prefix_len = 0;
  std::vector<uint8_t> owned{};  // the bytes themselves, when the caller's
                                 // may change
};

class Publisher {
 public:
  // Called with each published submission that has a request.
  using OnPublished = std::function<void(Deferred& published)>;
  // Turns a queued eager send into a rendezvous send (no pool payload);
  // false when that send cannot be one.
  using ToRendezvous = std::function<bool(Deferred& send)>;

  Publisher() = default;
  // `pool_pages` (the endpoint's, for the whole pool) maps each chunk's
  // window before the payload is copied in.
  Publisher(const shm::ClientRings& rings, uint8_t* pool_base,
            shm::Prefaulter* pool_pages, const shm::SendArena& arena,
            uint32_t credits, int doorbell_fd, OnPublished on_published,
            ToRendezvous to_rendezvous);

  // Queues `desc` behind whatever waits for its ring (invariant 1), then
  // publishes what it can and rings the doorbell. Returns the queued
  // submission if it could not be published at once (valid until the next
  // call), else null.
  Deferred* Submit(psm2_mq_req* req, const shm::SubmissionDesc& desc,
                   const void* payload, const void* prefix = nullptr,
                   uint32_t prefix_len = 0);
  // Queues without publishing (a batch of rendezvous chunks); Flush next.
  void Enqueue(Deferred d);
  // Publishes a batch from each queue; true when anything went out.
  bool Flush();
  // Rings the doorbell if anything was published (or NoteWork was called)
  // since the last ring and psmd sleeps.
  void RingDoorbell();
  // Something for psmd to do without a submission (ring space freed).
  void NoteWork() { pending_doorbell_ = true; }

  void ReturnCredit() { credits_++; }
  // Drops the submissions of `req` still waiting (they never reached psmd).
  void Forget(psm2_mq_req* req);
  // Drops every waiting submission and publishes nothing more (psmd gone).
  void Stop();

  // Publishes `d` exactly as given on `ring`, past the queues, credits and
  // validation of the library: only for tests that play a misbehaving
  // client (tests/programs/garbage_client.cc). False when the ring is full.
  bool TryPushRaw(const shm::SubmissionDesc& d, shm::Ring ring) {
    return (ring == shm::Ring::kMessage ? msg_sq_ : ctl_sq_).TryPush(d);
  }

  bool idle() const { return msg_queue_.empty() && ctl_queue_.empty(); }
  size_t queued() const { return msg_queue_.size() + ctl_queue_.size(); }
  // The largest payload one pool chunk holds.
  uint64_t MaxPayload() const { return arena_.MaxPayload(); }

 private:
  bool TryPublish(Deferred& d, shm::RingProducer<shm::SubmissionDesc>& ring);
  // Finds pool space for d's payload and copies it in; false when there is
  // none (d may have become a rendezvous send instead: no payload).
  bool PlacePayload(Deferred& d);
  bool FlushQueue(std::deque<Deferred>& queue,
                  shm::RingProducer<shm::SubmissionDesc>& ring);
  static bool OnMessageRing(const shm::SubmissionDesc& desc) {
    return shm::TraitsOf(desc.op).ring == shm::Ring::kMessage;
  }
  std::deque<Deferred>& QueueFor(const shm::SubmissionDesc& desc) {
    return OnMessageRing(desc) ? msg_queue_ : ctl_queue_;
  }
  shm::RingProducer<shm::SubmissionDesc>& RingFor(
      const shm::SubmissionDesc& desc) {
    return OnMessageRing(desc) ? msg_sq_ : ctl_sq_;
  }

  shm::SegmentControl* control_ = nullptr;
  shm::RingProducer<shm::SubmissionDesc> msg_sq_;
  shm::RingProducer<shm::SubmissionDesc> ctl_sq_;
  uint8_t* pool_base_ = nullptr;
  shm::Prefaulter* pool_pages_ = nullptr;
  shm::SendArena arena_;
  uint32_t credits_ = 0;
  int doorbell_fd_ = -1;
  OnPublished on_published_;
  ToRendezvous to_rendezvous_;
  std::deque<Deferred> msg_queue_;  // for msg_sq_
  std::deque<Deferred> ctl_queue_;  // for ctl_sq_
  bool pending_doorbell_ = false;
  bool stopped_ = false;
};

}  // namespace psmd::client

#endif  // PSMD_CLIENT_PUBLISHER_H_
