#include "client/endpoint.h"

#include <poll.h>
#include <unistd.h>

#include <cstring>

#include "shm/doorbell.h"

using psmd::client::CallError;
using psmd::client::Deferred;
namespace shm = psmd::shm;

namespace {

constexpr size_t kReapBatch = 32;
constexpr int64_t kSleepSliceNs = 100'000'000;  // re-check daemon liveness this often

std::string ProgramName() {
  char buf[256];
  ssize_t n = readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  if (n <= 0) return "?";
  buf[n] = '\0';
  const char* slash = strrchr(buf, '/');
  return slash ? slash + 1 : buf;
}

}  // namespace

psm2_ep::~psm2_ep() {
  for (psm2_mq_req* r : requests) delete r;
  if (doorbell_fd >= 0) close(doorbell_fd);
  if (liveness_fd >= 0) close(liveness_fd);
}

CallError psm2_ep::Open(psmd::client::ControlClient* control, const psm2_uuid_t uuid,
                        std::unique_ptr<psm2_ep>* out) {
  std::array<uint8_t, 16> key;
  std::memcpy(key.data(), uuid, key.size());
  psmd::v1::OpenEndpointReply reply;
  CallError err = control->OpenEndpoint(key, ProgramName(), &reply);
  if (!err.ok()) return err;
  psmd::client::AttachedFds fds;
  err = control->Attach(reply.attach_token(), &fds);
  if (!err.ok()) {
    control->CloseEndpoint(reply.endpoint_id());
    return err;
  }
  auto ep = std::make_unique<psm2_ep>();
  ep->control = control;
  ep->id = reply.endpoint_id();
  ep->epid = reply.epid();
  std::memcpy(ep->uuid, uuid, sizeof(ep->uuid));
  ep->doorbell_fd = fds.doorbell;
  ep->liveness_fd = fds.liveness;
  std::string error;
  auto fail = [&](const std::string& what) {
    if (ep->segment.fd() < 0 && fds.segment >= 0) close(fds.segment);
    if (ep->pool.fd() < 0 && fds.pool >= 0) close(fds.pool);
    control->CloseEndpoint(ep->id);
    return CallError{PSM2_SHMEM_SEGMENT_ERR, "psm2_ep_open: " + what};
  };
  if (!shm::Mapping::Attach(fds.segment, reply.segment_bytes(), &ep->segment, &error)) {
    return fail("endpoint segment: " + error);
  }
  if (!shm::Mapping::Attach(fds.pool, reply.pool_bytes(), &ep->pool, &error)) {
    return fail("job pool: " + error);
  }
  const shm::SegmentHeader& h = *shm::HeaderOf(ep->segment.base());
  shm::SegmentGeometry g = shm::ComputeGeometry(h.sq_capacity, h.cq_capacity);
  if (h.magic != shm::kSegmentMagic || h.version != shm::kLayoutVersion ||
      !shm::IsPowerOfTwo(h.sq_capacity) || !shm::IsPowerOfTwo(h.cq_capacity) ||
      g.bytes != reply.segment_bytes() || g.sq_offset != h.sq_offset ||
      g.cq_offset != h.cq_offset || h.region_offset + h.region_bytes > reply.pool_bytes() ||
      h.inline_max != shm::kInlineMax) {
    return fail("segment layout does not match this library (psmd and libpsmclient from "
                "different versions?)");
  }
  ep->ctl = shm::ControlOf(ep->segment.base());
  ep->sq = shm::RingProducer<shm::SubmissionDesc>(
      &ep->ctl->sq, shm::SubmissionSlotsOf(ep->segment.base(), g), g.sq_capacity);
  ep->cq = shm::RingConsumer<shm::CompletionDesc>(
      &ep->ctl->cq, shm::CompletionSlotsOf(ep->segment.base(), g), g.cq_capacity);
  ep->credits = g.cq_capacity;
  ep->arena = shm::SendArena(ep->pool.base(), h.region_offset, h.region_bytes);
  ep->mq.ep = ep.get();
  *out = std::move(ep);
  return {};
}

psm2_epaddr_t psm2_ep::EpaddrFor(psm2_epid_t peer_epid) {
  auto& slot = epaddrs[peer_epid];
  if (!slot) {
    slot = std::make_unique<psm2_epaddr>();
    slot->ep = this;
    slot->epid = peer_epid;
    slot->slot = psmd::client::kNoSlot;
    slot->ctxt = nullptr;
  }
  return slot.get();
}

psm2_mq_req* psm2_ep::NewRequest(psm2_mq_req::Kind kind, void* context) {
  psm2_mq_req* r;
  if (!free_indices.empty()) {
    uint32_t index = free_indices.back();
    free_indices.pop_back();
    r = requests[index];
    uint32_t generation = r->generation + 1;
    *r = psm2_mq_req{};
    r->index = index;
    r->generation = generation;
  } else {
    r = new psm2_mq_req{};
    r->index = static_cast<uint32_t>(requests.size());
    requests.push_back(r);
  }
  r->kind = kind;
  r->state = psm2_mq_req::State::kDeferred;
  r->mq = &mq;
  r->context = context;
  r->error = PSM2_OK;
  return r;
}

void psm2_ep::FreeRequest(psm2_mq_req* req) {
  RemoveFromDoneList(req);
  req->generation++;  // stale tokens no longer resolve to it
  req->state = psm2_mq_req::State::kComplete;
  req->free_when_done = false;
  free_indices.push_back(req->index);
}

psm2_mq_req* psm2_ep::Lookup(uint64_t token) {
  uint32_t index = static_cast<uint32_t>(token);
  uint32_t generation = static_cast<uint32_t>(token >> 32);
  if (index >= requests.size()) return nullptr;
  psm2_mq_req* r = requests[index];
  return r->generation == generation ? r : nullptr;
}

void psm2_ep::MarkComplete(psm2_mq_req* req) {
  req->state = psm2_mq_req::State::kComplete;
  if (req->free_when_done) {
    FreeRequest(req);
    return;
  }
  req->on_done_list = true;
  req->next_done = nullptr;
  req->prev_done = mq.done_tail;
  if (mq.done_tail) {
    mq.done_tail->next_done = req;
  } else {
    mq.done_head = req;
  }
  mq.done_tail = req;
}

void psm2_ep::RemoveFromDoneList(psm2_mq_req* req) {
  if (!req->on_done_list) return;
  if (req->prev_done) {
    req->prev_done->next_done = req->next_done;
  } else {
    mq.done_head = req->next_done;
  }
  if (req->next_done) {
    req->next_done->prev_done = req->prev_done;
  } else {
    mq.done_tail = req->prev_done;
  }
  req->on_done_list = false;
  req->next_done = req->prev_done = nullptr;
}

void psm2_ep::Submit(psm2_mq_req* req, const shm::SubmissionDesc& desc, const void* payload) {
  deferred.push_back(Deferred{req, desc, payload});
  FlushDeferred();
  RingDoorbell();
}

bool psm2_ep::TryPublish(Deferred& d) {
  bool needs_credit = d.desc.op != shm::SubmitOp::kSend || (d.desc.flags & shm::kSendSync);
  if (needs_credit && credits == 0) return false;
  if (sq.FreeSlots() == 0) return false;
  bool pooled = d.desc.op == shm::SubmitOp::kSend && d.desc.len > shm::kInlineMax;
  if (pooled) {
    auto off = arena.Allocate(d.desc.len);
    if (!off) return false;  // back-pressure: receivers have not drained yet
    std::memcpy(pool.base() + *off, d.payload, d.desc.len);
    d.desc.body.pool.pool_offset = *off;
  }
  sq.TryPush(d.desc);
  pending_doorbell_ = true;
  if (needs_credit) {
    credits--;
    d.req->holds_credit = true;
  }
  if (d.desc.op == shm::SubmitOp::kSend && !(d.desc.flags & shm::kSendSync)) {
    // Eager: the payload is in the pool (or the descriptor), so the user's
    // buffer is free again: local completion.
    MarkComplete(d.req);
  } else {
    d.req->state = psm2_mq_req::State::kPosted;
  }
  return true;
}

bool psm2_ep::FlushDeferred() {
  bool did = false;
  while (!deferred.empty() && !daemon_lost && TryPublish(deferred.front())) {
    deferred.pop_front();
    did = true;
  }
  return did;
}

void psm2_ep::RingDoorbell() {
  if (!pending_doorbell_) return;
  pending_doorbell_ = false;
  // Full fence: the published tail must be visible before we read the
  // daemon's sleeping flag; the daemon does set-flag / fence / check-rings.
  std::atomic_thread_fence(std::memory_order_seq_cst);
  if (ctl->doorbells.daemon_sleeping.load(std::memory_order_relaxed) != 0) {
    shm::RingEventFd(doorbell_fd);
  }
}

bool psm2_ep::Progress() {
  bool did = false;
  shm::CompletionDesc batch[kReapBatch];
  size_t n;
  while ((n = cq.PopBatch(batch, kReapBatch)) > 0) {
    for (size_t i = 0; i < n; i++) HandleCompletion(batch[i]);
    did = true;
  }
  if (!deferred.empty()) did |= FlushDeferred();
  RingDoorbell();
  return did;
}

void psm2_ep::HandleCompletion(const shm::CompletionDesc& c) {
  psm2_mq_req* req = Lookup(c.req);
  if (req == nullptr || req->state != psm2_mq_req::State::kPosted) {
    // Stale token (e.g. a send that had already completed locally): the only
    // such completions are errors for requests the application let go of.
    if (c.op == shm::CompleteOp::kRecvDone && !(c.flags & shm::kPayloadInline)) {
      shm::ReleaseChunk(pool.base(), c.body.pool.pool_offset);
    }
    return;
  }
  if (req->holds_credit) {
    req->holds_credit = false;
    credits++;
  }
  switch (c.op) {
    case shm::CompleteOp::kRecvDone: {
      uint32_t n = c.msg_len < req->buf_len ? c.msg_len : req->buf_len;
      if (c.flags & shm::kPayloadInline) {
        std::memcpy(req->buf, c.body.inline_data, n);
      } else {
        if (n > 0) std::memcpy(req->buf, pool.base() + c.body.pool.pool_offset, n);
        shm::ReleaseChunk(pool.base(), c.body.pool.pool_offset);
      }
      req->peer = EpaddrFor(c.src_epid);
      std::memcpy(req->tag.tag, c.tag, sizeof(c.tag));
      req->tag.tag[3] = 0;
      req->msg_length = c.msg_len;
      req->nbytes = n;
      req->error = c.msg_len > req->buf_len ? PSM2_MQ_TRUNCATION : PSM2_OK;
      break;
    }
    case shm::CompleteOp::kSendDone:
    case shm::CompleteOp::kError:
      req->error = static_cast<psm2_error_t>(c.error);
      break;
    default:
      req->error = PSM2_INTERNAL_ERR;
      break;
  }
  MarkComplete(req);
}

void psm2_ep::SleepForCompletions() {
  shm::Doorbells& bells = ctl->doorbells;
  uint32_t seen = bells.cq_futex.load(std::memory_order_acquire);
  bells.client_waiting.store(1, std::memory_order_relaxed);
  // Full fence: our waiting flag must be visible before we re-check the ring,
  // mirroring the daemon's publish / fence / read-flag order.
  std::atomic_thread_fence(std::memory_order_seq_cst);
  if (cq.Available() == 0) {
    mu.unlock();  // let other application threads use the endpoint meanwhile
    shm::FutexWait(&bells.cq_futex, seen, kSleepSliceNs);
    mu.lock();
  }
  bells.client_waiting.store(0, std::memory_order_relaxed);
  // The attach connection hangs up when the daemon dies or closes us.
  pollfd p{liveness_fd, POLLIN | POLLRDHUP, 0};
  if (!daemon_lost && poll(&p, 1, 0) > 0) {
    daemon_lost = true;
    fprintf(stderr, "libpsmclient: endpoint %u: lost psmd (%s); pending requests fail\n", id,
            control->socket_path().c_str());
    FailAllPending(PSM2_EP_WAS_CLOSED);
  }
}

void psm2_ep::FailAllPending(psm2_error_t error) {
  for (psm2_mq_req* r : requests) {
    if (r->state == psm2_mq_req::State::kComplete) continue;  // includes free slots
    r->error = error;
    MarkComplete(r);
  }
  deferred.clear();
}
