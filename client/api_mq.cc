// psm2_mq.h: matched-queue functions of libpsmclient. Matching happens in
// psmd; this file builds descriptors, answers completion queries and keeps
// the MQ's options and statistics.
#include <psm2.h>
#include <psm2_mq.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>

#include "client/endpoint.h"
#include "client/library.h"
#include "client/mq_options.h"
#include "shm/epid.h"

namespace shm = psmd::shm;
using psmd::client::Library;
using State = psm2_mq_req::State;

namespace {

psm2_mq_tag_t Tag64(uint64_t tag) {
  psm2_mq_tag_t t{};
  t.tag0 = static_cast<uint32_t>(tag);
  t.tag1 = static_cast<uint32_t>(tag >> 32);
  t.tag2 = 0;
  return t;
}

// The selector of a 64-bit receive or probe ignores the third tag word, as
// Intel's does: it also matches 96-bit sends whatever their tag2.
psm2_mq_tag_t Selector64(uint64_t sel) { return Tag64(sel); }

uint64_t Tag64Of(const psm2_mq_tag_t& t) {
  return (uint64_t{t.tag1} << 32) | t.tag0;
}

// psm2_ep_connect writes addr->slot under ep->mu.
bool Connected(psm2_ep_t ep, psm2_epaddr_t addr) PSMD_REQUIRES(ep->mu) {
  return addr->ep == ep && addr->slot != psmd::client::kNoSlot;
}

psm2_error_t PostSend(psm2_mq_t mq, psm2_epaddr_t dest, uint32_t flags,
                      const psm2_mq_tag_t* stag, const void* buf, uint32_t len,
                      void* context, psm2_mq_req_t* req) {
  if (mq == nullptr || dest == nullptr || stag == nullptr || req == nullptr ||
      (flags & ~PSM2_MQ_FLAG_SENDSYNC) != 0) {
    return Library::BadArgument("psm2_mq_isend",
                                "mq, dest, tag and req must not be null, "
                                "flags only PSM2_MQ_FLAG_SENDSYNC");
  }
  // A send that fails leaves no request: a program that waits on it anyway
  // returns at once instead of reading an uninitialized handle.
  *req = PSM2_MQ_REQINVALID;
  // A NULL buffer with a length cannot be sent. Failing the call would leave
  // the matching receive waiting for good (Open MPI 4.1's mtl psm2 passes
  // NULL for MPI_BOTTOM with absolute-address datatypes, and its collectives
  // then wait on their receives): a zero-length stand-in fails both the send
  // and its receive with PSM2_PARAM_ERR instead (docs/compat.md).
  const bool failed = len > 0 && buf == nullptr;
  if (failed) {
    static std::once_flag warned;
    std::call_once(warned, [len] {
      fprintf(stderr,
              "libpsmclient: a send of %u bytes from a NULL buffer fails with "
              "PSM2_PARAM_ERR, and so does its matching receive (with Open MPI "
              "4.1: MPI_BOTTOM "
              "with absolute-address datatypes is not supported by mtl psm2; "
              "use the psmd MTL "
              "or a buffer address)\n",
              len);
    });
    len = 0;
    flags &= ~PSM2_MQ_FLAG_SENDSYNC;
  }
  psm2_ep_t ep = mq->ep;
  psmd::client::EndpointLock lock(&ep->mu);
  // Under the lock: psm2_ep_connect sets the slot under it.
  if (!Connected(ep, dest)) {
    lock.Unlock();  // a handler may close the endpoint
    return Library::Report(
        PSM2_EPID_UNKNOWN,
        "send to an epaddr that this endpoint has not connected "
        "(call psm2_ep_connect first)");
  }
  if (ep->daemon_lost()) {
    lock.Unlock();
    return Library::DaemonGone(ep, "psm2_mq_isend");
  }
  psm2_mq_req* r = ep->NewRequest(psm2_mq_req::Kind::kSend, context);
  r->user.tag = *stag;
  r->user.send_msglen = len;
  r->user.recv_msglen = len;
  r->user.peer = dest;
  r->user.buf = static_cast<uint8_t*>(const_cast<void*>(buf));
  r->user.buf_len = len;
  // Above the threshold that applies (the fabric's to another node), or too
  // big for the send region, the payload waits with the sender until the
  // receiver matched (rendezvous): unexpected large messages then cost the
  // receiver nothing.
  const uint32_t threshold =
      shm::NodeIdOf(dest->epid) == shm::NodeIdOf(ep->epid())
          ? mq->rndv_shm_bytes
          : mq->rndv_hfi_bytes;
  bool rendezvous = len > threshold ||
                    (!shm::IsInline(len) && len > ep->publisher().MaxPayload());
  shm::SubmissionDesc d = shm::PrepSend(dest->slot, psmd::client::TokenOf(r),
                                        stag->tag, len, rendezvous);
  d.flags =
      (!rendezvous && (flags & PSM2_MQ_FLAG_SENDSYNC)) ? shm::kSendSync : 0;
  if (failed) {
    d.flags = shm::kSendFailed;
    r->user.error_code = PSM2_PARAM_ERR;
  }
  // A send to ourselves completes at once for psm2_mq_test and wait, but
  // enters the ipeek queue only once its receive matched it, as with Intel's
  // self device (req->self_send). A rendezvous one would otherwise wait for
  // a receive that the application may post only after the send completes
  // (MPI_Send to one's own rank): it travels from a copy instead.
  r->self_send =
      dest->epid == ep->epid() && !(flags & PSM2_MQ_FLAG_SENDSYNC) && !failed;
  r->sync_to_self = dest->epid == ep->epid() &&
                    (flags & PSM2_MQ_FLAG_SENDSYNC) && !rendezvous && !failed;
  psm2_mq_req* self_copy = nullptr;
  if (r->self_send && rendezvous) {
    self_copy = ep->CopyForSelf(buf, len, r);
    r->self_send = self_copy != nullptr;
  } else if (r->self_send) {
    d.flags |= shm::kSendSync;  // psmd tells us when it matched
  }
  if (self_copy != nullptr) {
    d.req = psmd::client::TokenOf(self_copy);
  } else if (rendezvous) {
    r->send_buf = static_cast<const uint8_t*>(buf);
    if (mq->copy_in_place) shm::PlaceInMemory(d, buf);
  } else if (shm::IsInline(len) && len > 0) {
    std::memcpy(d.body.inline_data, buf, len);
  }
  psm2_mq_stats_t& s = mq->stats;
  s.tx_num++;
  s.tx_shm_num++;
  (rendezvous ? s.tx_rndv_num : s.tx_eager_num)++;
  (rendezvous ? s.tx_rndv_bytes : s.tx_eager_bytes) += len;
  if (self_copy != nullptr) {
    ep->publisher().Submit(self_copy, d, nullptr);
    ep->MarkComplete(r);
  } else {
    ep->publisher().Submit(r, d, buf);
  }
  *req = r;
  return PSM2_OK;
}

psm2_error_t PostRecv(psm2_mq_t mq, psm2_epaddr_t src,
                      const psm2_mq_tag_t* rtag, const psm2_mq_tag_t* rtagsel,
                      void* buf, uint32_t len, void* context,
                      psm2_mq_req_t* req) {
  if (mq == nullptr || rtag == nullptr || rtagsel == nullptr ||
      req == nullptr || (len > 0 && buf == nullptr)) {
    return Library::BadArgument(
        "psm2_mq_irecv",
        "mq, tag, tagsel and req must not be null, nor buf "
        "when len is not 0");
  }
  *req = PSM2_MQ_REQINVALID;  // as in PostSend
  psm2_ep_t ep = mq->ep;
  psmd::client::EndpointLock lock(&ep->mu);
  // Under the lock: psm2_ep_connect sets the slot under it.
  if (src != nullptr && !Connected(ep, src)) {
    lock.Unlock();  // a handler may close the endpoint
    return Library::Report(
        PSM2_EPID_UNKNOWN,
        "receive from an epaddr that this endpoint has not connected "
        "(call psm2_ep_connect first, or use PSM2_MQ_ANY_ADDR)");
  }
  if (ep->daemon_lost()) {
    lock.Unlock();
    return Library::DaemonGone(ep, "psm2_mq_irecv");
  }
  psm2_mq_req* r = ep->NewRequest(psm2_mq_req::Kind::kRecv, context);
  r->user.buf = static_cast<uint8_t*>(buf);
  r->user.buf_len = len;
  r->user.tag = *rtag;
  r->user.tagsel = *rtagsel;
  shm::SubmissionDesc d =
      shm::PrepRecv(src == nullptr ? shm::kAnySlot : src->slot,
                    psmd::client::TokenOf(r), rtag->tag, rtagsel->tag, len);
  if (mq->copy_in_place && len > 0) shm::PlaceInMemory(d, buf);
  ep->publisher().Submit(r, d, nullptr);
  *req = r;
  return PSM2_OK;
}

void FillStatus2(const psm2_mq_req* r, psm2_mq_status2_t* s) {
  s->msg_peer = r->user.peer;
  s->msg_tag = r->user.tag;
  s->msg_length = r->user.send_msglen;
  s->nbytes = r->user.recv_msglen;
  s->error_code = static_cast<psm2_error_t>(r->user.error_code);
  s->context = r->user.context;
}

void FillStatus(const psm2_mq_req* r, psm2_mq_status_t* s) {
  s->msg_tag = Tag64Of(r->user.tag);
  s->msg_length = r->user.send_msglen;
  s->nbytes = r->user.recv_msglen;
  s->error_code = static_cast<psm2_error_t>(r->user.error_code);
  s->context = r->user.context;
}

// Shared body of wait/test: `block` selects wait. Fills the status with
// `fill` and frees the request once complete.
template <typename Status, typename Fill>
psm2_error_t Finish(psm2_mq_req_t* request, Status* status, bool block,
                    Fill fill) {
  if (request == nullptr)
    return Library::BadArgument("psm2_mq_wait/test", "request is null");
  psm2_mq_req* r = *request;
  if (r == PSM2_MQ_REQINVALID) return PSM2_OK;  // nothing to wait for
  psm2_ep_t ep = r->mq->ep;
  psmd::client::EndpointLock lock(&ep->mu);
  if (r->freed) {
    lock.Unlock();  // a handler may close the endpoint
    return Library::Report(PSM2_PARAM_ERR,
                           "wait or test on a request that was already "
                           "completed and freed (use the handle once)");
  }
  if (r->state == State::kClaimed) {
    return Library::Report(
        PSM2_PARAM_ERR,
        "request from psm2_mq_improbe: receive it with psm2_mq_imrecv first");
  }
  auto done = [r] { return r->state == State::kComplete; };
  if (block) {
    ep->WaitUntil(done);
  } else if (!done()) {
    // Not progress in the PSM2 sense: we only collect what psmd completed.
    ep->Progress();
    if (!done()) {
      ep->IdleYield();
      return PSM2_MQ_NO_COMPLETIONS;
    }
  }
  if (status != nullptr) fill(r, status);
  ep->FreeRequest(r);
  *request = PSM2_MQ_REQINVALID;
  return PSM2_OK;
}

// Shared body of the four probes. With `claim` the message is taken out of
// the unexpected queue into a request for psm2_mq_imrecv (*claimed).
template <typename Status, typename Fill>
psm2_error_t Probe(psm2_mq_t mq, psm2_epaddr_t src, const psm2_mq_tag_t* rtag,
                   const psm2_mq_tag_t* rtagsel, psm2_mq_req_t* claimed,
                   Status* status, Fill fill) {
  if (mq == nullptr || rtag == nullptr || rtagsel == nullptr) {
    return Library::BadArgument("psm2_mq_iprobe/improbe",
                                "mq, tag and tagsel must not be null");
  }
  psm2_ep_t ep = mq->ep;
  psmd::client::EndpointLock lock(&ep->mu);
  // Under the lock: psm2_ep_connect sets the slot under it.
  if (src != nullptr && !Connected(ep, src)) {
    lock.Unlock();  // a handler may close the endpoint
    return Library::Report(
        PSM2_EPID_UNKNOWN,
        "probe for an epaddr that this endpoint has not connected");
  }
  if (ep->daemon_lost()) {
    lock.Unlock();
    return Library::DaemonGone(ep, "psm2_mq_iprobe/improbe");
  }
  psm2_mq_req* r = ep->NewRequest(psm2_mq_req::Kind::kInternal, nullptr);
  psm2_error_t err = ep->RoundTrip(
      r, shm::PrepProbe(src == nullptr ? shm::kAnySlot : src->slot,
                        psmd::client::TokenOf(r), rtag->tag, rtagsel->tag,
                        /*claim=*/claimed != nullptr));
  if (err != PSM2_OK) {
    ep->FreeRequest(r);
    if (err != PSM2_MQ_NO_COMPLETIONS)
      return Library::Report(err, "psm2_mq_iprobe failed");
    // Intel's library clears the request of a matched probe that found
    // nothing; callers (MPI_Improbe) test it for NULL.
    if (claimed != nullptr) *claimed = PSM2_MQ_REQINVALID;
    return err;
  }
  // A probe has no receive buffer yet: the whole message is "received".
  r->user.recv_msglen = r->user.send_msglen;
  r->user.error_code = PSM2_OK;
  if (status != nullptr) fill(r, status);
  if (claimed == nullptr) {
    ep->FreeRequest(r);
  } else {
    // The same token names a claimed rendezvous message in kClaimedRecv.
    r->kind = psm2_mq_req::Kind::kRecv;
    r->state = State::kClaimed;
    *claimed = r;
  }
  return PSM2_OK;
}

// Shared body of ipeek/ipeek2.
template <typename Status, typename Fill>
psm2_error_t Peek(psm2_mq_t mq, psm2_mq_req_t* req, Status* status, Fill fill) {
  if (mq == nullptr || req == nullptr)
    return Library::BadArgument("psm2_mq_ipeek", "mq and req must not be null");
  psm2_ep_t ep = mq->ep;
  psmd::client::EndpointLock lock(&ep->mu);
  if (mq->done_head == nullptr) ep->Progress();
  psm2_mq_req* r = mq->done_head;
  if (r == nullptr) {
    ep->IdleYield();
    return PSM2_MQ_NO_COMPLETIONS;
  }
  *req = r;
  if (status != nullptr) fill(r, status);
  return PSM2_OK;
}

}  // namespace

extern "C" {

psm2_error_t psm2_mq_init(psm2_ep_t ep, uint64_t ignored,
                          const struct psm2_optkey* opts, int numopts,
                          psm2_mq_t* mq) {
  (void)ignored;
  if (ep == nullptr || mq == nullptr || numopts < 0 ||
      (numopts > 0 && opts == nullptr)) {
    return Library::BadArgument(
        "psm2_mq_init",
        "ep and mq must not be null, numopts not "
        "negative, opts not null when numopts is not 0");
  }
  // One MQ per endpoint: a second call returns the same one and, as Intel's
  // does, applies its options too.
  psm2_mq_t q = ep->mq_handle();
  if (!q->initialized) {
    // Defaults, then PSM2's environment variables, then the caller's options.
    psm2_error_t err = psmd::client::InitMqOptions(q);
    if (err != PSM2_OK) return err;
    q->initialized = true;
  }
  for (int i = 0; i < numopts; i++) {
    if (opts[i].value == nullptr) {
      return Library::BadArgument("psm2_mq_init",
                                  "an option in opts has a null value");
    }
    psm2_error_t err =
        psmd::client::SetMqOption(q, static_cast<int>(opts[i].key),
                                  *static_cast<const uint32_t*>(opts[i].value));
    if (err != PSM2_OK) return err;
  }
  *mq = q;
  return PSM2_OK;
}

psm2_error_t psm2_mq_finalize(psm2_mq_t mq) {
  if (mq == nullptr)
    return Library::BadArgument("psm2_mq_finalize", "mq is null");
  return PSM2_OK;
}

psm2_error_t psm2_mq_getopt(psm2_mq_t mq, int option, void* value) {
  if (mq == nullptr || value == nullptr) {
    return Library::BadArgument("psm2_mq_getopt",
                                "mq and value must not be null");
  }
  return psmd::client::GetMqOption(mq, option, static_cast<uint32_t*>(value));
}

psm2_error_t psm2_mq_setopt(psm2_mq_t mq, int option, const void* value) {
  if (mq == nullptr || value == nullptr) {
    return Library::BadArgument("psm2_mq_setopt",
                                "mq and value must not be null");
  }
  return psmd::client::SetMqOption(mq, option,
                                   *static_cast<const uint32_t*>(value));
}

psm2_error_t psm2_mq_isend2(psm2_mq_t mq, psm2_epaddr_t dest, uint32_t flags,
                            psm2_mq_tag_t* stag, const void* buf, uint32_t len,
                            void* context, psm2_mq_req_t* req) {
  return PostSend(mq, dest, flags, stag, buf, len, context, req);
}

psm2_error_t psm2_mq_isend(psm2_mq_t mq, psm2_epaddr_t dest, uint32_t flags,
                           uint64_t stag, const void* buf, uint32_t len,
                           void* context, psm2_mq_req_t* req) {
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

psm2_error_t psm2_mq_send(psm2_mq_t mq, psm2_epaddr_t dest, uint32_t flags,
                          uint64_t stag, const void* buf, uint32_t len) {
  psm2_mq_tag_t t = Tag64(stag);
  return psm2_mq_send2(mq, dest, flags, &t, buf, len);
}

psm2_error_t psm2_mq_irecv2(psm2_mq_t mq, psm2_epaddr_t src,
                            psm2_mq_tag_t* rtag, psm2_mq_tag_t* rtagsel,
                            uint32_t flags, void* buf, uint32_t len,
                            void* context, psm2_mq_req_t* req) {
  (void)flags;  // reserved in PSM2
  return PostRecv(mq, src, rtag, rtagsel, buf, len, context, req);
}

psm2_error_t psm2_mq_irecv(psm2_mq_t mq, uint64_t rtag, uint64_t rtagsel,
                           uint32_t flags, void* buf, uint32_t len,
                           void* context, psm2_mq_req_t* req) {
  (void)flags;
  psm2_mq_tag_t t = Tag64(rtag);
  psm2_mq_tag_t sel = Selector64(rtagsel);
  return PostRecv(mq, nullptr, &t, &sel, buf, len, context, req);
}

psm2_error_t psm2_mq_fp_msg(psm2_ep_t ep, psm2_mq_t mq, psm2_epaddr_t addr,
                            psm2_mq_tag_t* tag, psm2_mq_tag_t* tagsel,
                            uint32_t flags, void* buf, uint32_t len,
                            void* context, enum psm2_mq_fp_op fp_type,
                            psm2_mq_req_t* req) {
  if (ep == nullptr || mq == nullptr || mq->ep != ep) {
    return Library::BadArgument("psm2_mq_fp_msg",
                                "ep and mq must not be null, mq of ep");
  }
  switch (fp_type) {
    case PSM2_MQ_ISEND_FP:
      return PostSend(mq, addr, flags, tag, buf, len, context, req);
    case PSM2_MQ_IRECV_FP:
      return PostRecv(mq, addr, tag, tagsel, buf, len, context, req);
  }
  return Library::Report(PSM2_PARAM_ERR,
                         "psm2_mq_fp_msg: unknown fp_type " +
                             std::to_string(static_cast<int>(fp_type)));
}

psm2_error_t psm2_mq_imrecv(psm2_mq_t mq, uint32_t flags, void* buf,
                            uint32_t len, void* context, psm2_mq_req_t* reqo) {
  (void)flags;
  if (mq == nullptr || reqo == nullptr || *reqo == nullptr ||
      (len > 0 && buf == nullptr)) {
    return Library::BadArgument("psm2_mq_imrecv",
                                "mq, reqo and *reqo must not be null, nor buf "
                                "when len is not 0");
  }
  psm2_mq_req* r = *reqo;
  psm2_ep_t ep = mq->ep;
  psmd::client::EndpointLock lock(&ep->mu);
  if (r->mq != mq || r->state != State::kClaimed) {
    lock.Unlock();  // a handler may close the endpoint
    return Library::Report(
        PSM2_PARAM_ERR,
        "psm2_mq_imrecv: the request was not returned by psm2_mq_improbe "
        "(or was already received)");
  }
  r->user.buf = static_cast<uint8_t*>(buf);
  r->user.buf_len = len;
  r->user.context = context;
  if (r->claimed
          .present) {  // eager: psmd handed the payload over with the claim
    ep->ReceiveClaimed(r);
    return PSM2_OK;
  }
  r->state = State::kDeferred;
  shm::SubmissionDesc d = shm::PrepClaimedRecv(psmd::client::TokenOf(r), len);
  if (mq->copy_in_place && len > 0) shm::PlaceInMemory(d, buf);
  ep->publisher().Submit(r, d, nullptr);
  return PSM2_OK;
}

psm2_error_t psm2_mq_iprobe2(psm2_mq_t mq, psm2_epaddr_t src,
                             psm2_mq_tag_t* rtag, psm2_mq_tag_t* rtagsel,
                             psm2_mq_status2_t* status) {
  return Probe(mq, src, rtag, rtagsel, nullptr, status, FillStatus2);
}

psm2_error_t psm2_mq_iprobe(psm2_mq_t mq, uint64_t rtag, uint64_t rtagsel,
                            psm2_mq_status_t* status) {
  psm2_mq_tag_t t = Tag64(rtag);
  psm2_mq_tag_t sel = Selector64(rtagsel);
  return Probe(mq, nullptr, &t, &sel, nullptr, status, FillStatus);
}

psm2_error_t psm2_mq_improbe2(psm2_mq_t mq, psm2_epaddr_t src,
                              psm2_mq_tag_t* rtag, psm2_mq_tag_t* rtagsel,
                              psm2_mq_req_t* reqo, psm2_mq_status2_t* status) {
  if (reqo == nullptr)
    return Library::BadArgument("psm2_mq_improbe2", "reqo is null");
  return Probe(mq, src, rtag, rtagsel, reqo, status, FillStatus2);
}

psm2_error_t psm2_mq_improbe(psm2_mq_t mq, uint64_t rtag, uint64_t rtagsel,
                             psm2_mq_req_t* req, psm2_mq_status_t* status) {
  if (req == nullptr)
    return Library::BadArgument("psm2_mq_improbe", "req is null");
  psm2_mq_tag_t t = Tag64(rtag);
  psm2_mq_tag_t sel = Selector64(rtagsel);
  return Probe(mq, nullptr, &t, &sel, req, status, FillStatus);
}

psm2_error_t psm2_mq_ipeek(psm2_mq_t mq, psm2_mq_req_t* req,
                           psm2_mq_status_t* status) {
  return Peek(mq, req, status, FillStatus);
}

psm2_error_t psm2_mq_ipeek2(psm2_mq_t mq, psm2_mq_req_t* req,
                            psm2_mq_status2_t* status) {
  return Peek(mq, req, status, FillStatus2);
}

psm2_error_t psm2_mq_ipeek_dequeue(psm2_mq_t mq, psm2_mq_req_t* req) {
  if (mq == nullptr || req == nullptr)
    return Library::BadArgument("psm2_mq_ipeek_dequeue",
                                "mq and req must not be null");
  psm2_ep_t ep = mq->ep;
  psmd::client::EndpointLock lock(&ep->mu);
  if (mq->done_head == nullptr) ep->Progress();
  psm2_mq_req* r = mq->done_head;
  if (r == nullptr) return PSM2_MQ_NO_COMPLETIONS;
  ep->RemoveFromDoneList(r);
  *req = r;
  return PSM2_OK;
}

psm2_error_t psm2_mq_ipeek_dequeue_multi(psm2_mq_t mq, void* status_array,
                                         psmi_mq_status_copy_user_t status_copy,
                                         int* count) {
  if (mq == nullptr || status_copy == nullptr || count == nullptr) {
    return Library::BadArgument("psm2_mq_ipeek_dequeue_multi",
                                "mq, status_copy and count must not be null");
  }
  psm2_ep_t ep = mq->ep;
  psmd::client::EndpointLock lock(&ep->mu);
  int wanted = *count;
  int stored = 0;
  if (wanted > 0 && mq->done_head == nullptr) ep->Progress();
  while (stored < wanted && mq->done_head != nullptr) {
    psm2_mq_req* r = mq->done_head;
    int rc = status_copy(&r->user, status_array, stored);
    ep->FreeRequest(r);  // consumed whatever the callback said, as Intel's
    if (rc < 0) {
      // The application's callback failed: its error, not the library's,
      // so nothing to report; Intel's returns the same.
      *count = rc;
      return PSM2_INTERNAL_ERR;
    }
    if (rc == 0) continue;  // processed, not stored
    stored++;
    if (rc > 1) {  // stored, and the callback ends the batch
      *count = stored;
      return PSM2_OK;
    }
  }
  if (stored == wanted) return PSM2_OK;
  *count = stored;
  return PSM2_MQ_NO_COMPLETIONS;
}

psm2_error_t psm2_mq_req_free(psm2_mq_t mq, psm2_mq_req_t req) {
  if (req == nullptr) return PSM2_OK;
  if (mq == nullptr || req->mq != mq) {
    return Library::BadArgument("psm2_mq_req_free",
                                "mq is null or not the request's");
  }
  psmd::client::EndpointLock lock(&mq->ep->mu);
  if (req->freed) {
    lock.Unlock();  // a handler may close the endpoint
    return Library::Report(PSM2_PARAM_ERR,
                           "psm2_mq_req_free: the request was already freed");
  }
  mq->ep->FreeRequest(req);
  return PSM2_OK;
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

psm2_error_t psm2_mq_cancel(psm2_mq_req_t* request) {
  if (request == nullptr)
    return Library::BadArgument("psm2_mq_cancel", "request is null");
  if (*request == PSM2_MQ_REQINVALID)
    return PSM2_MQ_NO_COMPLETIONS;  // as Intel's
  psm2_mq_req* r = *request;
  psm2_ep_t ep = r->mq->ep;
  psmd::client::EndpointLock lock(&ep->mu);
  if (r->kind != psm2_mq_req::Kind::kRecv) {
    lock.Unlock();  // a handler may close the endpoint
    return Library::Report(PSM2_PARAM_ERR,
                           "psm2_mq_cancel: only receives can be cancelled");
  }
  if (r->state == State::kDeferred) {
    // Never reached psmd: take it out of the queue ourselves.
    ep->publisher().Forget(r);
  } else if (r->state == State::kPosted) {
    psm2_mq_req* c = ep->NewRequest(psm2_mq_req::Kind::kInternal, nullptr);
    psm2_error_t err = ep->RoundTrip(
        c, shm::PrepCancel(psmd::client::TokenOf(c), psmd::client::TokenOf(r)));
    ep->FreeRequest(c);
    if (err != PSM2_OK) return PSM2_MQ_NO_COMPLETIONS;  // matched meanwhile
    if (r->holds_credit) {  // psmd will never answer the receive now
      r->holds_credit = false;
      ep->publisher().ReturnCredit();
    }
  } else {
    return PSM2_MQ_NO_COMPLETIONS;  // matched (or complete) already
  }
  r->user.error_code = PSM2_OK;  // as Intel's: the status says nothing arrived
  r->user.send_msglen = 0;
  r->user.recv_msglen = 0;
  ep->MarkComplete(r);
  return PSM2_OK;
}

void psm2_mq_get_stats(psm2_mq_t mq, psm2_mq_stats_t* stats) {
  if (mq == nullptr || stats == nullptr) return;
  psmd::client::EndpointLock lock(&mq->ep->mu);
  *stats = mq->stats;
}

}  // extern "C"
