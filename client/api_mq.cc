// psm2_mq.h: matched-queue functions of libpsmclient. Matching happens in
// psmd; this file builds descriptors and reports completions.
#include <psm2.h>
#include <psm2_mq.h>

#include <cstring>
#include <mutex>

#include "client/endpoint.h"
#include "client/library.h"

namespace shm = psmd::shm;
using psmd::client::Library;

namespace {

psm2_mq_tag_t Tag64(uint64_t tag) {
  psm2_mq_tag_t t{};
  t.tag0 = static_cast<uint32_t>(tag);
  t.tag1 = static_cast<uint32_t>(tag >> 32);
  t.tag2 = 0;
  return t;
}

uint64_t Tag64Of(const psm2_mq_tag_t& t) { return (uint64_t{t.tag1} << 32) | t.tag0; }

psm2_error_t PostSend(psm2_mq_t mq, psm2_epaddr_t dest, uint32_t flags, const psm2_mq_tag_t* stag,
                      const void* buf, uint32_t len, void* context, psm2_mq_req_t* req) {
  if (mq == nullptr || dest == nullptr || stag == nullptr || req == nullptr ||
      (len > 0 && buf == nullptr) || (flags & ~PSM2_MQ_FLAG_SENDSYNC) != 0) {
    return PSM2_PARAM_ERR;
  }
  psm2_ep_t ep = mq->ep;
  if (dest->ep != ep || dest->slot == psmd::client::kNoSlot) {
    return Library::Report(PSM2_EPID_UNKNOWN,
                           "send to an epaddr that this endpoint has not connected "
                           "(call psm2_ep_connect first)");
  }
  if (len > shm::kInlineMax && len > ep->arena.MaxPayload()) {
    return Library::Report(PSM2_PARAM_ERR,
                           "message of " + std::to_string(len) +
                               " bytes exceeds the largest eager message psmd carries (" +
                               std::to_string(ep->arena.MaxPayload()) +
                               " bytes, the job's send region; raise psmd --region-mib)");
  }
  std::lock_guard<std::mutex> lock(ep->mu);
  if (ep->daemon_lost) return PSM2_EP_WAS_CLOSED;
  psm2_mq_req* r = ep->NewRequest(psm2_mq_req::Kind::kSend, context);
  r->tag = *stag;
  r->msg_length = len;
  r->nbytes = len;
  r->peer = dest;
  shm::SubmissionDesc d{};
  d.op = shm::SubmitOp::kSend;
  d.flags = (flags & PSM2_MQ_FLAG_SENDSYNC) ? shm::kSendSync : 0;
  d.peer = dest->slot;
  d.req = psmd::client::TokenOf(r);
  std::memcpy(d.tag, stag->tag, sizeof(d.tag));
  d.len = len;
  if (len <= shm::kInlineMax && len > 0) std::memcpy(d.body.inline_data, buf, len);
  ep->Submit(r, d, buf);
  *req = r;
  return PSM2_OK;
}

psm2_error_t PostRecv(psm2_mq_t mq, psm2_epaddr_t src, const psm2_mq_tag_t* rtag,
                      const psm2_mq_tag_t* rtagsel, void* buf, uint32_t len, void* context,
                      psm2_mq_req_t* req) {
  if (mq == nullptr || rtag == nullptr || rtagsel == nullptr || req == nullptr ||
      (len > 0 && buf == nullptr)) {
    return PSM2_PARAM_ERR;
  }
  psm2_ep_t ep = mq->ep;
  if (src != nullptr && (src->ep != ep || src->slot == psmd::client::kNoSlot)) {
    return Library::Report(PSM2_EPID_UNKNOWN,
                           "receive from an epaddr that this endpoint has not connected "
                           "(call psm2_ep_connect first, or use PSM2_MQ_ANY_ADDR)");
  }
  std::lock_guard<std::mutex> lock(ep->mu);
  if (ep->daemon_lost) return PSM2_EP_WAS_CLOSED;
  psm2_mq_req* r = ep->NewRequest(psm2_mq_req::Kind::kRecv, context);
  r->buf = buf;
  r->buf_len = len;
  shm::SubmissionDesc d{};
  d.op = shm::SubmitOp::kRecv;
  d.peer = src == nullptr ? shm::kAnySlot : src->slot;
  d.req = psmd::client::TokenOf(r);
  std::memcpy(d.tag, rtag->tag, sizeof(d.tag));
  std::memcpy(d.body.recv.tagsel, rtagsel->tag, sizeof(d.body.recv.tagsel));
  d.len = len;
  ep->Submit(r, d, nullptr);
  *req = r;
  return PSM2_OK;
}

void FillStatus2(const psm2_mq_req* r, psm2_mq_status2_t* s) {
  s->msg_peer = r->peer;
  s->msg_tag = r->tag;
  s->msg_length = r->msg_length;
  s->nbytes = r->nbytes;
  s->error_code = r->error;
  s->context = r->context;
}

void FillStatus(const psm2_mq_req* r, psm2_mq_status_t* s) {
  s->msg_tag = Tag64Of(r->tag);
  s->msg_length = r->msg_length;
  s->nbytes = r->nbytes;
  s->error_code = r->error;
  s->context = r->context;
}

// Shared body of wait/test: `block` selects wait. Fills the status with
// `fill` and frees the request once complete.
template <typename Status, typename Fill>
psm2_error_t Finish(psm2_mq_req_t* request, Status* status, bool block, Fill fill) {
  if (request == nullptr) return PSM2_PARAM_ERR;
  psm2_mq_req* r = *request;
  if (r == PSM2_MQ_REQINVALID) return PSM2_OK;  // nothing to wait for
  psm2_ep_t ep = r->mq->ep;
  std::lock_guard<std::mutex> lock(ep->mu);
  auto done = [r] { return r->state == psm2_mq_req::State::kComplete; };
  if (block) {
    ep->WaitUntil(done);
  } else if (!done()) {
    // Not progress in the PSM2 sense: we only collect what psmd completed.
    ep->Progress();
    if (!done()) return PSM2_MQ_NO_COMPLETIONS;
  }
  if (status != nullptr) fill(r, status);
  ep->FreeRequest(r);
  *request = PSM2_MQ_REQINVALID;
  return PSM2_OK;
}

}  // namespace

extern "C" {

psm2_error_t psm2_mq_init(psm2_ep_t ep, uint64_t ignored, const struct psm2_optkey* opts,
                          int numopts, psm2_mq_t* mq) {
  (void)ignored;
  (void)opts;
  (void)numopts;
  if (ep == nullptr || mq == nullptr) return PSM2_PARAM_ERR;
  *mq = &ep->mq;
  return PSM2_OK;
}

psm2_error_t psm2_mq_finalize(psm2_mq_t mq) {
  if (mq == nullptr) return PSM2_PARAM_ERR;
  return PSM2_OK;
}

psm2_error_t psm2_mq_isend2(psm2_mq_t mq, psm2_epaddr_t dest, uint32_t flags,
                            psm2_mq_tag_t* stag, const void* buf, uint32_t len, void* context,
                            psm2_mq_req_t* req) {
  return PostSend(mq, dest, flags, stag, buf, len, context, req);
}

psm2_error_t psm2_mq_isend(psm2_mq_t mq, psm2_epaddr_t dest, uint32_t flags, uint64_t stag,
                           const void* buf, uint32_t len, void* context, psm2_mq_req_t* req) {
  psm2_mq_tag_t t = Tag64(stag);
  return PostSend(mq, dest, flags, &t, buf, len, context, req);
}

psm2_error_t psm2_mq_send2(psm2_mq_t mq, psm2_epaddr_t dest, uint32_t flags,
                           psm2_mq_tag_t* stag, const void* buf, uint32_t len) {
  psm2_mq_req_t req;
  psm2_error_t err = PostSend(mq, dest, flags, stag, buf, len, nullptr, &req);
  if (err != PSM2_OK) return err;
  psm2_mq_status2_t status;
  psm2_mq_wait2(&req, &status);
  return status.error_code;
}

psm2_error_t psm2_mq_send(psm2_mq_t mq, psm2_epaddr_t dest, uint32_t flags, uint64_t stag,
                          const void* buf, uint32_t len) {
  psm2_mq_tag_t t = Tag64(stag);
  return psm2_mq_send2(mq, dest, flags, &t, buf, len);
}

psm2_error_t psm2_mq_irecv2(psm2_mq_t mq, psm2_epaddr_t src, psm2_mq_tag_t* rtag,
                            psm2_mq_tag_t* rtagsel, uint32_t flags, void* buf, uint32_t len,
                            void* context, psm2_mq_req_t* req) {
  (void)flags;  // reserved in PSM2
  return PostRecv(mq, src, rtag, rtagsel, buf, len, context, req);
}

psm2_error_t psm2_mq_irecv(psm2_mq_t mq, uint64_t rtag, uint64_t rtagsel, uint32_t flags,
                           void* buf, uint32_t len, void* context, psm2_mq_req_t* req) {
  (void)flags;
  psm2_mq_tag_t t = Tag64(rtag);
  psm2_mq_tag_t sel = Tag64(rtagsel);
  sel.tag2 = 0xffffffffu;  // 64-bit receives match only 64-bit (tag2 == 0) sends
  return PostRecv(mq, nullptr, &t, &sel, buf, len, context, req);
}

psm2_error_t psm2_mq_wait2(psm2_mq_req_t* request, psm2_mq_status2_t* status) {
  return Finish(request, status, /*block=*/true, FillStatus2);
}

psm2_error_t psm2_mq_wait(psm2_mq_req_t* request, psm2_mq_status_t* status) {
  return Finish(request, status, /*block=*/true, FillStatus);
}

psm2_error_t psm2_mq_test2(psm2_mq_req_t* request, psm2_mq_status2_t* status) {
  return Finish(request, status, /*block=*/false, FillStatus2);
}

psm2_error_t psm2_mq_test(psm2_mq_req_t* request, psm2_mq_status_t* status) {
  return Finish(request, status, /*block=*/false, FillStatus);
}

}  // extern "C"
