// psm2_am.h: active messages. psmd routes them (daemon/engine/mq_engine.h,
// invariant 6); handlers run in this library, inside the application's
// progress calls (psm2_poll, psm2_mq_wait*, psm2_mq_test*, ...), on the
// application's thread.
#include <psm2.h>
#include <psm2_am.h>

#include <cstring>
#include <mutex>
#include <string>
#include <vector>

#include "client/endpoint.h"
#include "client/library.h"

namespace shm = psmd::shm;
using psmd::client::AmDispatcher;
using psmd::client::AmToken;
using psmd::client::Library;

namespace {

template <typename Fill>
psm2_error_t Register(psm2_ep_t ep, int num, int* indices, Fill fill) {
  if (ep == nullptr || num < 0 || (num > 0 && indices == nullptr)) {
    return Library::BadArgument("psm2_am_register_handlers",
                                "ep and handlers_idx must not be null, "
                                "num_handlers not negative");
  }
  std::vector<AmDispatcher::Handler> handlers(static_cast<size_t>(num));
  for (int i = 0; i < num; i++) fill(i, &handlers[i]);
  psmd::Status s;
  {
    psmd::client::EndpointLock lock(&ep->mu);
    s = ep->am().Register(handlers, indices);
  }
  return Library::Report(ep, s);  // outside the lock: handlers call back
}

// Checks what a request or reply may carry. Over a limit is an error, never
// a truncation.
psm2_error_t CheckMessage(psm2_handler_t handler, const psm2_amarg_t* args,
                          int nargs, const void* src, size_t len, int flags) {
  if (nargs < 0 || static_cast<uint32_t>(nargs) > shm::kAmMaxArgs) {
    return Library::Report(
        PSM2_PARAM_ERR, "active message with " + std::to_string(nargs) +
                            " arguments; at most " +
                            std::to_string(shm::kAmMaxArgs) + " are allowed");
  }
  if (len > shm::kAmMaxPayload) {
    return Library::Report(PSM2_PARAM_ERR,
                           "active message payload of " + std::to_string(len) +
                               " bytes; at most " +
                               std::to_string(shm::kAmMaxPayload) +
                               " (psm2_am_get_parameters)");
  }
  if (handler >= shm::kAmMaxHandlers || (nargs > 0 && args == nullptr) ||
      (len > 0 && src == nullptr) ||
      (flags & ~(PSM2_AM_FLAG_ASYNC | PSM2_AM_FLAG_NOREPLY)) != 0) {
    return Library::BadArgument(
        "psm2_am_request_short/reply_short",
        "handler index below " + std::to_string(shm::kAmMaxHandlers) +
            ", args and src not null when nargs and len are not 0, flags "
            "only PSM2_AM_FLAG_ASYNC and PSM2_AM_FLAG_NOREPLY");
  }
  return PSM2_OK;
}

// Builds and submits a request (to connection slot `peer`) or a reply (to
// endpoint id `peer`).
void SubmitActiveMessage(psm2_ep_t ep, shm::SubmitOp op, uint32_t peer,
                         psm2_handler_t handler, const psm2_amarg_t* args,
                         int nargs, const void* src, size_t len, int flags,
                         psm2_am_completion_fn_t completion_fn, void* context)
    PSMD_REQUIRES(ep->mu) {
  shm::SubmissionDesc d = shm::PrepActiveMessage(
      op == shm::SubmitOp::kAmReply, peer, 0, handler,
      static_cast<uint32_t>(nargs), static_cast<uint32_t>(len));
  const uint32_t arg_bytes = static_cast<uint32_t>(nargs) * shm::kAmArgBytes;
  if (op == shm::SubmitOp::kAmRequest && (flags & PSM2_AM_FLAG_NOREPLY))
    d.flags |= shm::kAmNoReply;
  psm2_mq_req* r = nullptr;
  if (completion_fn != nullptr) {
    d.flags |= shm::kAmWantsAck;
    r = ep->NewRequest(psm2_mq_req::Kind::kAm, nullptr);
    r->am_done = completion_fn;
    r->am_done_context = context;
    d.req = psmd::client::TokenOf(r);
  }
  if (shm::IsInline(d.len)) {
    if (arg_bytes > 0) std::memcpy(d.body.inline_data, args, arg_bytes);
    if (len > 0) std::memcpy(d.body.inline_data + arg_bytes, src, len);
    ep->publisher().Submit(r, d, nullptr);
    return;
  }
  psmd::client::Deferred* queued =
      ep->publisher().Submit(r, d, src, args, arg_bytes);
  if (queued != nullptr && !(flags & PSM2_AM_FLAG_ASYNC)) {
    // Not in the pool yet, and the caller may reuse its buffers as soon as
    // we return: keep our own copy.
    queued->owned.resize(d.len);
    if (arg_bytes > 0) std::memcpy(queued->owned.data(), args, arg_bytes);
    if (len > 0) std::memcpy(queued->owned.data() + arg_bytes, src, len);
    queued->prefix = nullptr;
    queued->prefix_len = 0;
    queued->payload = queued->owned.data();
  }
}

}  // namespace

extern "C" {

psm2_error_t psm2_am_register_handlers(psm2_ep_t ep,
                                       const psm2_am_handler_fn_t* handlers,
                                       int num_handlers, int* handlers_idx) {
  if (num_handlers > 0 && handlers == nullptr)
    return Library::BadArgument("psm2_am_register_handlers",
                                "handlers is null");
  return Register(
      ep, num_handlers, handlers_idx,
      [&](int i, AmDispatcher::Handler* h) { h->fn = handlers[i]; });
}

psm2_error_t psm2_am_register_handlers_2(psm2_ep_t ep,
                                         const psm2_am_handler_2_fn_t* handlers,
                                         int num_handlers, void** hctx,
                                         int* handlers_idx) {
  if (num_handlers > 0 && handlers == nullptr) {
    return Library::BadArgument("psm2_am_register_handlers_2",
                                "handlers is null");
  }
  return Register(ep, num_handlers, handlers_idx,
                  [&](int i, AmDispatcher::Handler* h) {
                    h->fn2 = handlers[i];
                    h->hctx = hctx != nullptr ? hctx[i] : nullptr;
                  });
}

void psm2_am_unregister_handlers(psm2_ep_t ep) {
  if (ep == nullptr) return;
  psmd::client::EndpointLock lock(&ep->mu);
  ep->am().Clear();
}

psm2_error_t psm2_am_request_short(psm2_epaddr_t epaddr, psm2_handler_t handler,
                                   psm2_amarg_t* args, int nargs, void* src,
                                   size_t len, int flags,
                                   psm2_am_completion_fn_t completion_fn,
                                   void* completion_ctxt) {
  if (epaddr == nullptr)
    return Library::BadArgument("psm2_am_request_short", "epaddr is null");
  psm2_error_t err = CheckMessage(handler, args, nargs, src, len, flags);
  if (err != PSM2_OK) return err;
  psm2_ep_t ep = epaddr->ep;
  psmd::client::EndpointLock lock(&ep->mu);
  // Under the lock: psm2_ep_connect sets the slot under it.
  if (epaddr->slot == psmd::client::kNoSlot) {
    lock.Unlock();  // a handler may close the endpoint
    return Library::Report(
        PSM2_EPID_UNKNOWN,
        "active message to an epaddr that this endpoint has not connected "
        "(call psm2_ep_connect first)");
  }
  if (ep->daemon_lost()) {
    lock.Unlock();
    return Library::DaemonGone(ep, "psm2_am_request_short");
  }
  SubmitActiveMessage(ep, shm::SubmitOp::kAmRequest, epaddr->slot, handler,
                      args, nargs, src, len, flags, completion_fn,
                      completion_ctxt);
  return PSM2_OK;
}

psm2_error_t psm2_am_reply_short(psm2_am_token_t token, psm2_handler_t handler,
                                 psm2_amarg_t* args, int nargs, void* src,
                                 size_t len, int flags,
                                 psm2_am_completion_fn_t completion_fn,
                                 void* completion_ctxt) {
  if (token == nullptr)
    return Library::BadArgument("psm2_am_reply_short", "token is null");
  auto* t = static_cast<AmToken*>(token);
  if (!t->is_request || t->no_reply || t->replied) {
    const char* why = !t->is_request ? "from a reply handler"
                      : t->no_reply
                          ? "to a request sent with PSM2_AM_FLAG_NOREPLY"
                          : "a second time to the same request";
    return Library::Report(
        PSM2_AM_INVALID_REPLY,
        std::string("psm2_am_reply_short: cannot reply ") + why);
  }
  psm2_error_t err = CheckMessage(handler, args, nargs, src, len, flags);
  if (err != PSM2_OK) return err;
  psm2_ep_t ep = t->ep;
  psmd::client::EndpointLock lock(&ep->mu);
  if (ep->daemon_lost()) {
    lock.Unlock();
    return Library::DaemonGone(ep, "psm2_am_reply_short");
  }
  t->replied = true;
  SubmitActiveMessage(ep, shm::SubmitOp::kAmReply, t->src_endpoint, handler,
                      args, nargs, src, len, flags, completion_fn,
                      completion_ctxt);
  return PSM2_OK;
}

psm2_error_t psm2_am_get_source(psm2_am_token_t token,
                                psm2_epaddr_t* epaddr_out) {
  if (token == nullptr || epaddr_out == nullptr) {
    return Library::BadArgument("psm2_am_get_source",
                                "token and epaddr_out must not be null");
  }
  auto* t = static_cast<AmToken*>(token);
  psmd::client::EndpointLock lock(&t->ep->mu);
  *epaddr_out = t->ep->EpaddrFor(t->src_epid);
  return PSM2_OK;
}

psm2_error_t psm2_am_get_parameters(psm2_ep_t ep,
                                    struct psm2_am_parameters* parameters,
                                    size_t sizeof_parameters_in,
                                    size_t* sizeof_parameters_out) {
  if (ep == nullptr || parameters == nullptr ||
      sizeof_parameters_out == nullptr) {
    return Library::BadArgument(
        "psm2_am_get_parameters",
        "ep, parameters and sizeof_parameters_out must not be null");
  }
  struct psm2_am_parameters p;
  p.max_handlers = shm::kAmMaxHandlers;
  p.max_nargs = shm::kAmMaxArgs;
  p.max_request_short = shm::kAmMaxPayload;
  p.max_reply_short = shm::kAmMaxPayload;
  // As Intel's: a smaller (older) struct gets its prefix, a larger (newer)
  // one ours and zeros; the size reported is what was filled from ours.
  size_t n = std::min(sizeof_parameters_in, sizeof(p));
  std::memcpy(parameters, &p, n);
  if (sizeof_parameters_in > n) {
    std::memset(reinterpret_cast<uint8_t*>(parameters) + n, 0,
                sizeof_parameters_in - n);
  }
  *sizeof_parameters_out = n;
  return PSM2_OK;
}

}  // extern "C"
