#include "client/endpoint.h"

#include <poll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>

#include "client/library.h"
#include "shm/doorbell.h"
#include "shm/payload.h"
#include "shm/segment.h"

using psmd::Status;
using psmd::client::Deferred;
namespace shm = psmd::shm;

namespace {

constexpr size_t kReapBatch = 32;
constexpr int64_t kSleepSliceNs =
    100'000'000;  // re-check daemon liveness this often
// With submissions deferred for ring or pool space, what frees the space (psmd
// consuming a ring, a receiver releasing a chunk) posts us no completion, so
// no wake-up comes: sleep only briefly, then retry.
constexpr int64_t kDeferredSliceNs = 50'000;

std::string ProgramName() {
  char buf[256];
  ssize_t n = readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  if (n <= 0) return "?";
  buf[n] = '\0';
  const char* slash = strrchr(buf, '/');
  return slash ? slash + 1 : buf;
}

}  // namespace

psm2_ep::psm2_ep(Identity identity, shm::Mapping segment, shm::Mapping pool,
                 int doorbell_fd, int liveness_fd)
    : identity_(std::move(identity)),
      segment_(std::move(segment)),
      pool_(std::move(pool)),
      doorbell_fd_(doorbell_fd),
      liveness_fd_(liveness_fd) {
  mq_.ep = this;
}

psm2_ep::~psm2_ep() {
  if (doorbell_fd_ >= 0) close(doorbell_fd_);
  if (liveness_fd_ >= 0) close(liveness_fd_);
}

Status psm2_ep::Open(psmd::client::ControlClient* control,
                     const psm2_uuid_t uuid, std::unique_ptr<psm2_ep>* out) {
  std::array<uint8_t, 16> key;
  std::memcpy(key.data(), uuid, key.size());
  psmd::v1::OpenEndpointReply reply;
  Status err = control->OpenEndpoint(key, ProgramName(), &reply);
  if (!err.ok()) return err;
  psmd::client::AttachedFds fds;
  err = control->Attach(reply.attach_token(), &fds);
  if (!err.ok()) {
    control->CloseEndpoint(reply.endpoint_id(), reply.epid());
    return err;
  }
  std::string error;
  shm::Mapping segment, pool;
  auto fail = [&](const std::string& what) {
    for (int fd : {fds.doorbell, fds.liveness}) {
      if (fd >= 0) close(fd);
    }
    if (segment.fd() < 0 && fds.segment >= 0) close(fds.segment);
    if (pool.fd() < 0 && fds.pool >= 0) close(fds.pool);
    control->CloseEndpoint(reply.endpoint_id(), reply.epid());
    return Status{PSM2_SHMEM_SEGMENT_ERR, "psm2_ep_open: " + what};
  };
  if (!shm::Mapping::Attach(fds.segment, reply.segment_bytes(), &segment,
                            &error)) {
    return fail("endpoint segment: " + error);
  }
  if (!shm::Mapping::Attach(fds.pool, reply.pool_bytes(), &pool, &error)) {
    return fail("job pool: " + error);
  }
  shm::SegmentParams params;
  if (!shm::ReadSegmentHeader(segment.base(), reply.segment_bytes(),
                              reply.pool_bytes(), &params, &error)) {
    return fail(error);
  }
  Identity identity;
  identity.control = control;
  identity.id = reply.endpoint_id();
  identity.epid = reply.epid();
  identity.daemon_version = reply.daemon_version();
  identity.remote_wait = std::chrono::milliseconds(reply.fabric_timeout_ms());
  std::memcpy(identity.uuid, uuid, sizeof(identity.uuid));
  identity.max_unexpected_budget = params.max_unexpected_budget;
  auto ep =
      std::make_unique<psm2_ep>(std::move(identity), std::move(segment),
                                std::move(pool), fds.doorbell, fds.liveness);
  // Not shared yet; locked all the same, so that every write of a guarded
  // field is seen under the mutex.
  psmd::client::EndpointLock lock(&ep->mu);
  ep->UseRings(shm::ClientRingsOf(ep->segment_.base(), params.geometry),
               shm::SendArena(ep->pool_.base(), params.region_offset,
                              params.region_bytes),
               params.geometry.cq_capacity);
  ep->mq_.max_sysbuf_mbytes =
      static_cast<uint32_t>(params.unexpected_budget >> 20);
  *out = std::move(ep);
  return {};
}

void psm2_ep::UseRings(const shm::ClientRings& rings,
                       const shm::SendArena& arena, uint32_t credits) {
  ctl_ = rings.control;
  spin_.Attach(&ctl_->spin);
  cq_ = rings.cq;
  // Every pool page faults on its first use in this process, ~12 us each on
  // this VM: a 2-4 KiB ping-pong took 45 us per half round trip until the
  // sender's region had wrapped once, against 11 us after. Chunks we write
  // (Publisher) and read (HandleCompletion) map their window first instead
  // (shm/prefault.h).
  pool_pages_ = shm::Prefaulter(pool_.base(), pool_.size());
  publisher_ = psmd::client::Publisher(
      rings, pool_.base(), &pool_pages_, arena, credits, doorbell_fd_,
      [this](Deferred& d) PSMD_NO_THREAD_SAFETY_ANALYSIS {
        Published(d);  // called from inside publisher's methods: mu is held
      },
      [this](Deferred& d) PSMD_NO_THREAD_SAFETY_ANALYSIS {
        return SendByRendezvous(d);  // likewise
      });
}

psm2_epaddr_t psm2_ep::EpaddrFor(psm2_epid_t peer_epid) {
  auto& slot = epaddrs_[peer_epid];
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
  psm2_mq_req* r = requests_.New();
  r->kind = kind;
  r->state = psm2_mq_req::State::kDeferred;
  r->mq = &mq_;
  r->user.context = context;
  r->user.error_code = PSM2_OK;
  return r;
}

psm2_mq_req* psm2_ep::CopyForSelf(const void* buf, uint32_t len,
                                  const psm2_mq_req* send) {
  if (self_copy_bytes_ + len > (uint64_t{mq_.max_sysbuf_mbytes} << 20))
    return nullptr;
  psm2_mq_req* r = NewRequest(psm2_mq_req::Kind::kInternal, nullptr);
  r->free_when_done = true;
  std::vector<uint8_t>& copy = self_copies_[r->index];
  copy.assign(static_cast<const uint8_t*>(buf),
              static_cast<const uint8_t*>(buf) + len);
  r->has_self_copy = true;
  r->send_buf = copy.data();
  r->self_copy_of = psmd::client::TokenOf(send);
  self_copy_bytes_ += len;
  return r;
}

void psm2_ep::FreeRequest(psm2_mq_req* req) {
  RemoveFromDoneList(req);
  TakeClaimedPayload(req);  // never received: released here
  if (req->has_self_copy) {
    auto copy = self_copies_.find(req->index);
    self_copy_bytes_ -= copy->second.size();
    self_copies_.erase(copy);
    req->has_self_copy = false;
  }
  requests_.Free(req);
}

void psm2_ep::MarkComplete(psm2_mq_req* req) {
  req->state = psm2_mq_req::State::kComplete;
  if (req->free_when_done) {
    FreeRequest(req);
    return;
  }
  if (req->kind == psm2_mq_req::Kind::kInternal)
    return;                                          // not the application's
  if (req->self_send && !req->self_matched) return;  // invariant 4
  req->on_done_list = true;
  req->next_done = nullptr;
  req->prev_done = mq_.done_tail;
  if (mq_.done_tail) {
    mq_.done_tail->next_done = req;
  } else {
    mq_.done_head = req;
  }
  mq_.done_tail = req;
}

void psm2_ep::SelfSendMatched(psm2_mq_req* req) {
  req->self_matched = true;
  if (req->state == psm2_mq_req::State::kComplete) {
    req->self_send = false;  // an ordinary completed send from here on
    MarkComplete(req);
  }
}

void psm2_ep::RemoveFromDoneList(psm2_mq_req* req) {
  if (!req->on_done_list) return;
  if (req->prev_done) {
    req->prev_done->next_done = req->next_done;
  } else {
    mq_.done_head = req->next_done;
  }
  if (req->next_done) {
    req->next_done->prev_done = req->prev_done;
  } else {
    mq_.done_tail = req->prev_done;
  }
  req->on_done_list = false;
  req->next_done = req->prev_done = nullptr;
}

psm2_error_t psm2_ep::RoundTrip(psm2_mq_req* req,
                                const shm::SubmissionDesc& desc) {
  publisher_.Submit(req, desc, nullptr);
  WaitUntil([req] { return req->state == psm2_mq_req::State::kComplete; });
  return static_cast<psm2_error_t>(req->user.error_code);
}

void psm2_ep::Published(Deferred& d) {
  empty_checks_ = 0;  // new work: the next empty check need not yield
  const shm::SubmitOp op = d.desc.op;
  const bool am =
      op == shm::SubmitOp::kAmRequest || op == shm::SubmitOp::kAmReply;
  if (op == shm::SubmitOp::kRndvData) {
    d.req->published += d.desc.len;
    // The last chunk is in the pool: the user's buffer is free again,
    // unless psmd may still read it (kGoAwaitDone: wait for kSendDone).
    if (d.req->published == d.req->send_bytes && !d.req->await_done) {
      MarkComplete(d.req);
    }
  } else if ((op == shm::SubmitOp::kSend &&
              (!(d.desc.flags & shm::kSendSync) || d.req->self_send)) ||
             (am && !d.req->holds_credit)) {
    // Eager (or an active message nobody waits on): the payload is in the
    // pool or the descriptor, so the user's buffer is free again.
    MarkComplete(d.req);
  } else {
    d.req->state = psm2_mq_req::State::kPosted;
  }
}

bool psm2_ep::SendByRendezvous(Deferred& d) {
  psm2_mq_req* r = d.req;
  // A send to ourselves has its own way (CopyForSelf); a failed one carries
  // no payload.
  if (r == nullptr || r->self_send || (d.desc.flags & shm::kSendFailed)) {
    return false;
  }
  const uint32_t len = d.desc.len;
  d.desc = shm::PrepSend(d.desc.peer, d.desc.req, d.desc.tag, len,
                         /*rendezvous=*/true);
  // PSM2 lets us read the application's buffer until the send completes.
  r->send_buf = static_cast<const uint8_t*>(d.payload);
  d.payload = nullptr;
  psm2_mq_stats_t& s = mq_.stats;
  s.tx_eager_num--;
  s.tx_eager_bytes -= len;
  s.tx_rndv_num++;
  s.tx_rndv_bytes += len;
  return true;
}

bool psm2_ep::Progress() {
  // An AM handler calling back into the library (psm2_poll, a test) must not
  // reap further completions: they would run before the rest of the batch.
  if (in_progress_) return false;
  in_progress_ = true;
  bool did = false;
  shm::CompletionDesc batch[kReapBatch];
  size_t n;
  while ((n = cq_.PopBatch(batch, kReapBatch)) > 0) {
    for (size_t i = 0; i < n; i++) HandleCompletion(batch[i]);
    did = true;
  }
  if (did && shm::DaemonWantsCqSpace(ctl_->doorbells)) publisher_.NoteWork();
  if (!publisher_.idle()) did |= publisher_.Flush();
  publisher_.RingDoorbell();
  in_progress_ = false;
  if (did) empty_checks_ = 0;
  return did;
}

void psm2_ep::HandleCompletion(const shm::CompletionDesc& c) {
  using State = psm2_mq_req::State;
  // The completion after a SENDSYNC send to ourselves is that of the
  // receive it matched (invariant 2 of daemon/engine/mq_engine.h): the send
  // completes now, just before it, so that a receive is never seen pending
  // after the send that it matched has returned.
  if (sync_self_pending_ != 0) {
    psm2_mq_req* send = requests_.Lookup(std::exchange(sync_self_pending_, 0));
    if (send != nullptr && send->state == State::kPosted) MarkComplete(send);
  }
  if (shm::CompletionCarriesChunk(c)) {
    const uint32_t len =
        c.op == shm::CompleteOp::kRndvChunk ? c.body.chunk.len : c.msg_len;
    pool_pages_.Prepare(shm::ChunkOffsetOf(c) - shm::kChunkHeaderBytes,
                        uint64_t{len} + shm::kChunkHeaderBytes);
  }
  // Released when this returns, unless a request keeps it (a claim).
  shm::PoolPayload payload = shm::PayloadOf(pool_.base(), c);
  switch (c.op) {  // active messages carry the sender's token, not ours
    case shm::CompleteOp::kAmRequest:
    case shm::CompleteOp::kAmReply:
      RunAmHandler(c, payload);
      return;
    case shm::CompleteOp::kAmAcked:
      AmAcknowledged(c);
      return;
    case shm::CompleteOp::kNodeLost:
      NodeLost(c);
      return;
    case shm::CompleteOp::kBudgetStall:
      BudgetStall(c);
      return;
    default:
      break;
  }
  psm2_mq_req* req = requests_.Lookup(c.req);
  if (req != nullptr && req->self_send && c.op == shm::CompleteOp::kSendDone) {
    SelfSendMatched(req);
    return;
  }
  bool chunk = c.op == shm::CompleteOp::kRndvChunk;
  // kSendDone also ends a send psmd may take over (kGoAwaitDone).
  State expected = chunk ? State::kReceiving : State::kPosted;
  if (c.op == shm::CompleteOp::kSendDone && req != nullptr && req->await_done) {
    expected = State::kStreaming;
  }
  // An error ends a request in any state that waits for psmd: posted, or
  // in the middle of a rendezvous (streaming or receiving its chunks) when
  // the peer died.
  bool transfer_error =
      c.op == shm::CompleteOp::kError && req != nullptr &&
      (req->state == State::kStreaming || req->state == State::kReceiving);
  if (req == nullptr || (req->state != expected && !transfer_error)) {
    // Stale token (e.g. a send that had already completed locally): the only
    // such completions are errors for requests the application let go of,
    // and payloads of a receive that failed meanwhile, given back (payload's
    // destructor).
    return;
  }
  if (req->holds_credit && !chunk) {
    req->holds_credit = false;
    publisher_.ReturnCredit();
  }
  switch (c.op) {
    case shm::CompleteOp::kRecvDone:
      CompleteEager(req, c, payload);
      return;
    case shm::CompleteOp::kRecvRndv:
      StartRendezvousReceive(req, c);
      return;
    case shm::CompleteOp::kRndvChunk:
      ReceiveChunk(req, c, payload);
      return;
    case shm::CompleteOp::kRndvGo:
      StartStreaming(req, c);
      return;
    case shm::CompleteOp::kProbeDone:
      if (c.error == PSM2_OK) SetMatchedStatus(req, c);
      if (c.error == PSM2_OK && (c.flags & shm::kPayloadClaimed)) {
        req->claimed.present = true;
        req->claimed.is_inline = (c.flags & shm::kPayloadInline) != 0;
        req->claimed.failed = (c.flags & shm::kPayloadFailed) != 0;
        if (req->claimed.is_inline) {
          std::memcpy(req->claimed.inline_data, c.body.inline_data,
                      shm::kInlineMax);
        } else {
          req->claimed.pool_offset = payload.Take();  // ReceiveClaimed's now
        }
      }
      req->user.error_code = static_cast<uint32_t>(c.error);
      break;
    case shm::CompleteOp::kSendDone:
      // Chunks not yet published are not needed: psmd has the data.
      if (req->state == State::kStreaming) publisher_.Forget(req);
      req->user.error_code = static_cast<uint32_t>(c.error);
      if (req->sync_to_self && c.error == PSM2_OK) {
        sync_self_pending_ = psmd::client::TokenOf(req);
        return;  // completes with the next completion, its receive's
      }
      break;
    case shm::CompleteOp::kCancelDone:
    case shm::CompleteOp::kOptionSet:
      req->user.error_code = static_cast<uint32_t>(c.error);
      break;
    case shm::CompleteOp::kError:
      if (req->state == State::kStreaming) publisher_.Forget(req);
      req->user.error_code = static_cast<uint32_t>(c.error);
      break;
    default:
      req->user.error_code = PSM2_INTERNAL_ERR;
      break;
  }
  MarkComplete(req);
}

void psm2_ep::RunAmHandler(const shm::CompletionDesc& c,
                           const shm::PoolPayload& payload) {
  const psm2_error_t ran = am_.Deliver(this, identity_.id, c, payload);
  // A sender waiting for the handler learns whether it ran; a request's
  // sender learns that it did not even when not waiting.
  if ((c.flags & shm::kAmRequestWantsAck) ||
      (ran != PSM2_OK && c.op == shm::CompleteOp::kAmRequest)) {
    SendAmAck(c, ran);
  }
}

void psm2_ep::SendAmAck(const shm::CompletionDesc& c, psm2_error_t error) {
  publisher_.Submit(nullptr, shm::PrepAmAck(c.tag[2], c.req, c.tag[0], error),
                    nullptr);
}

void psm2_ep::AmAcknowledged(const shm::CompletionDesc& c) {
  psm2_mq_req* req = requests_.Lookup(c.req);
  bool ours = req != nullptr && req->kind == psm2_mq_req::Kind::kAm &&
              req->state == psm2_mq_req::State::kPosted;
  if (c.error != PSM2_OK) {
    psmd::client::Library::Report(
        static_cast<psm2_error_t>(c.error),
        "active message to handler " + std::to_string(c.tag[0]) + " at epid " +
            std::to_string(c.src_epid) +
            " was not run: the target has no such handler");
  }
  if (!ours) return;  // sent without a completion function
  if (req->holds_credit) {
    req->holds_credit = false;
    publisher_.ReturnCredit();
  }
  psm2_am_completion_fn_t done = req->am_done;
  void* context = req->am_done_context;
  FreeRequest(req);
  // Complete even if the handler did not run (reported above), as Intel's.
  if (done != nullptr) done(context);
}

void psm2_ep::BudgetStall(const shm::CompletionDesc& c) {
  const auto full = static_cast<shm::StallBudget>(c.tag[1]);
  const char* fix =
      full == shm::StallBudget::kJob ? "psmd's --job-unexpected-mib"
      : full == shm::StallBudget::kUid
          ? "psmd's --uid-unexpected-mib"
          : "PSM2_MQ_MAX_SYSBUF_MBYTES (psm2_mq_setopt or the environment; "
            "psmd's --max-unexpected-mib caps it)";
  psmd::client::Library::Warn(
      "endpoint " + std::to_string(identity_.id) +
      ": sends to it have waited " +
      std::to_string(shm::kBudgetStallNs / 1'000'000'000) + " s for " +
      shm::StallBudgetName(full) + " unexpected-message budget (" +
      std::to_string(c.tag[0]) + " MiB), and it received none of its " +
      std::to_string(c.msg_len) +
      " unexpected messages meanwhile. If it waits for a message sent after "
      "them, that message cannot arrive: receive the waiting messages first, "
      "or raise " +
      fix);
}

void psm2_ep::NodeLost(const shm::CompletionDesc& c) {
  const auto error = static_cast<psm2_error_t>(c.error);
  node_lost_ = error;
  psm2_epaddr_t one = nullptr;
  if (auto it = epaddrs_.find(c.src_epid); it != epaddrs_.end()) {
    one = it->second.get();
  }
  const std::string host(
      reinterpret_cast<const char*>(c.body.inline_data),
      strnlen(reinterpret_cast<const char*>(c.body.inline_data),
              shm::kInlineMax));
  psmd::client::Library::Report(
      this, error,
      "endpoint " + std::to_string(identity_.id) + " lost node " +
          std::to_string(c.tag[0]) + (host.empty() ? "" : " (" + host + ")") +
          (error == PSM2_TIMEOUT ? ", silent for psmd's --fabric-timeout-ms"
                                 : ": its psmd or the link to it is down") +
          ". The " + std::to_string(c.msg_len) +
          " endpoint(s) there that it connected to, such as " +
          psmd::client::Library::Get().Describe(c.src_epid, one) +
          ", are unreachable. Their requests fail, messages from them not "
          "yet received are lost, and a receive from any source no longer "
          "hears from them; psm2_ep_connect reaches them again once the node "
          "is back");
}

void psm2_ep::SetMatchedStatus(psm2_mq_req* req, const shm::CompletionDesc& c) {
  req->user.peer = EpaddrFor(c.src_epid);
  std::memcpy(req->user.tag.tag, c.tag, sizeof(c.tag));
  req->user.tag.tag[3] = 0;
  req->user.send_msglen = c.msg_len;
  req->user.recv_msglen =
      c.msg_len < req->user.buf_len ? c.msg_len : req->user.buf_len;
  req->user.error_code =
      c.msg_len > req->user.buf_len ? PSM2_MQ_TRUNCATION : PSM2_OK;
  req->was_unexpected = (c.flags & shm::kWasUnexpected) != 0;
}

void psm2_ep::CompleteEager(psm2_mq_req* req, const shm::CompletionDesc& c,
                            shm::PoolPayload& payload) {
  SetMatchedStatus(req, c);
  if (c.flags & shm::kPayloadFailed) req->user.error_code = PSM2_PARAM_ERR;
  uint32_t n = req->user.recv_msglen;
  const uint8_t* src = payload ? payload.data() : c.body.inline_data;
  if (n > 0) std::memcpy(req->user.buf, src, n);
  payload.Release();
  CountReceive(req, /*rendezvous=*/false);
  MarkComplete(req);
}

void psm2_ep::ReceiveClaimed(psm2_mq_req* req) {
  psm2_mq_req_user& u = req->user;
  u.recv_msglen = std::min(u.send_msglen, u.buf_len);
  u.error_code = req->claimed.failed         ? PSM2_PARAM_ERR
                 : u.send_msglen > u.buf_len ? PSM2_MQ_TRUNCATION
                                             : PSM2_OK;
  shm::PoolPayload payload = TakeClaimedPayload(req);
  const uint8_t* src = payload ? payload.data() : req->claimed.inline_data;
  if (u.recv_msglen > 0) std::memcpy(u.buf, src, u.recv_msglen);
  CountReceive(req, /*rendezvous=*/false);
  MarkComplete(req);
}

void psm2_ep::StartRendezvousReceive(psm2_mq_req* req,
                                     const shm::CompletionDesc& c) {
  SetMatchedStatus(req, c);
  req->expect_bytes = req->user.recv_msglen;
  req->received_bytes = 0;
  req->state = psm2_mq_req::State::kReceiving;
  if (req->expect_bytes == 0) {
    CountReceive(req, /*rendezvous=*/true);
    MarkComplete(req);
  }
}

shm::PoolPayload psm2_ep::TakeClaimedPayload(psm2_mq_req* req) {
  const bool pooled = req->claimed.present && !req->claimed.is_inline;
  req->claimed.present = false;
  if (!pooled) return {};
  return shm::PoolPayload(pool_.base(), req->claimed.pool_offset);
}

void psm2_ep::ReceiveChunk(psm2_mq_req* req, const shm::CompletionDesc& c,
                           shm::PoolPayload& payload) {
  uint64_t off = c.body.chunk.offset;
  uint32_t len = c.body.chunk.len;
  const bool placed = (c.flags & shm::kPayloadPlaced) != 0;
  // psmd forwards chunks in order and never past what we accept; checked
  // anyway so that no byte lands outside the user's buffer.
  if (off != req->received_bytes ||
      len > req->expect_bytes - req->received_bytes) {
    req->user.error_code = PSM2_INTERNAL_ERR;
    MarkComplete(req);
    return;
  }
  if (placed && c.error != PSM2_OK) {  // psmd's copy of the rest failed
    req->user.error_code = static_cast<uint32_t>(c.error);
    MarkComplete(req);
    return;
  }
  if (!placed) std::memcpy(req->user.buf + off, payload.data(), len);
  payload.Release();  // before completing: the sender may reuse it at once
  req->received_bytes += len;
  if (req->received_bytes == req->expect_bytes) {
    CountReceive(req, /*rendezvous=*/true);
    MarkComplete(req);
  }
}

void psm2_ep::CountReceive(const psm2_mq_req* req, bool rendezvous) {
  // As Intel's: a message that waited in a system buffer counts as rx_sys; a
  // matched one, and any rendezvous one (its data lands in the user's buffer
  // directly), as rx_user. Unlike Intel's, counted when the receive
  // completes, and rx_shm_num counts every message (all of psmd is on-node).
  psm2_mq_stats_t& s = mq_.stats;
  uint64_t bytes = req->user.recv_msglen;
  s.rx_shm_num++;
  if (req->was_unexpected && !rendezvous) {
    s.rx_sysbuf_num++;
    s.rx_sysbuf_bytes += req->user.send_msglen;
    s.rx_sys_num++;
    s.rx_sys_bytes += req->user.send_msglen;  // the whole message was buffered
  } else {
    s.rx_user_num++;
    s.rx_user_bytes += bytes;
  }
}

void psm2_ep::StartStreaming(psm2_mq_req* req, const shm::CompletionDesc& c) {
  if (req->has_self_copy) {  // the receive matched our copy: the send is
                             // matched
    if (psm2_mq_req* send = requests_.Lookup(req->self_copy_of)) {
      if (send->self_send) SelfSendMatched(send);
    }
  }
  if (c.error != PSM2_OK) {
    req->user.error_code = static_cast<uint32_t>(c.error);
    MarkComplete(req);
    return;
  }
  req->send_bytes = c.body.go.send_bytes;
  req->transfer = c.body.go.transfer;
  req->published = 0;
  req->await_done = (c.flags & shm::kGoAwaitDone) != 0;
  if (req->send_bytes ==
      0) {  // the receiver takes nothing (zero-length buffer)
    MarkComplete(req);
    return;
  }
  req->state = psm2_mq_req::State::kStreaming;
  // All chunk descriptors are queued now (a few dozen even for a large
  // message); each takes pool space only when it reaches the ring.
  // A 64-bit offset: within one chunk of 4 GiB a 32-bit one would wrap and
  // queue chunks until memory ran out.
  for (uint64_t off = 0; off < req->send_bytes;
       off += psmd::client::kRndvChunkBytes) {
    const auto len = static_cast<uint32_t>(std::min<uint64_t>(
        psmd::client::kRndvChunkBytes, req->send_bytes - off));
    publisher_.Enqueue(Deferred{
        req,
        shm::PrepRndvData(psmd::client::TokenOf(req), req->transfer, off, len),
        req->send_buf + off});
  }
  // Published by Progress once the whole batch of completions is handled:
  // a kSendDone behind this kRndvGo (psmd took the transfer over) then
  // drops them before any is copied.
}

void psm2_ep::SleepForCompletions() {
  spin_.Sleeping();
  shm::Doorbells& bells = ctl_->doorbells;
  uint32_t seen = shm::ClientPrepareToSleep(bells);
  if (cq_.Available() == 0) {
    // Read before unlocking: other threads may submit meanwhile.
    const bool blocked = !publisher_.idle();
    mu.Unlock();  // let other application threads use the endpoint meanwhile
    shm::FutexWait(&bells.cq_futex, seen,
                   blocked ? kDeferredSliceNs : kSleepSliceNs);
    mu.Lock();
  }
  shm::ClientAwake(bells);
  CheckDaemon();
}

bool psm2_ep::CheckDaemon() {
  // The attach connection hangs up when the daemon dies or closes us; a
  // new psmd on the same socket (systemd's Restart=) does not reopen it.
  // The kernel closes it as the old psmd exits, before anything could have
  // waited for that exit to start a successor.
  pollfd p{liveness_fd_, POLLIN | POLLRDHUP, 0};
  if (!daemon_lost_ && poll(&p, 1, 0) > 0) {
    daemon_lost_ = true;
    // psmd writes on this connection only to say why it ends it (a
    // successor that could not take over: daemon/handover/handover.h).
    char why[512];
    ssize_t n = recv(liveness_fd_, why, sizeof(why) - 1, MSG_DONTWAIT);
    while (n > 0 && (why[n - 1] == '\n' || why[n - 1] == '\0')) n--;
    why[n > 0 ? n : 0] = '\0';
    fprintf(stderr,
            "libpsmclient: endpoint %u: lost psmd (%s)%s%s; pending requests "
            "fail\n",
            identity_.id, identity_.control->socket_path().c_str(),
            n > 0 ? ": " : "", why);
    FailAllPending(PSM2_EP_WAS_CLOSED);
  }
  return daemon_lost_;
}

void psm2_ep::IdleTurn(uint32_t turn) {
  spin_.Idle(turn, !publisher_.idle());
  if (turn % kClockTurns != 0) return;
  // The coarse clock: read from the vDSO without a syscall, and its few ms
  // of resolution are plenty for a 20 ms interval.
  timespec now{};
  clock_gettime(CLOCK_MONOTONIC_COARSE, &now);
  const int64_t now_ns = int64_t{now.tv_sec} * 1'000'000'000 + now.tv_nsec;
  if (now_ns - liveness_checked_ns_ < kLivenessIntervalNs) return;
  liveness_checked_ns_ = now_ns;
  CheckDaemon();
}

void psm2_ep::FailAllPending(psm2_error_t error) {
  requests_.ForEach([&](psm2_mq_req* r) PSMD_REQUIRES(mu) {
    if (r->state == psm2_mq_req::State::kComplete) return;  // or free
    r->user.error_code = error;
    MarkComplete(r);
  });
  publisher_.Stop();
}
