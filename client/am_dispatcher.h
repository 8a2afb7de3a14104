// The receiving half of PSM2 active messages in the library: the endpoint's
// handler table (psm2_am_register_handlers{,_2}) and the delivery of an
// arrived request or reply to its handler, with the token that
// psm2_am_reply_short and psm2_am_get_source take.
//
// psmd routes active messages and checks every limit before delivering
// (daemon/engine/mq_engine.h, invariant 6); what reaches Deliver has a handler
// index below kAmMaxHandlers, at most kAmMaxArgs arguments and a length
// that covers them.
//
// Thread-safety: none of its own; the endpoint uses it under its mutex.
// Handlers run on the caller's thread with that (recursive) mutex held, so
// they may call PSM2 on the same endpoint.
#ifndef PSMD_CLIENT_AM_DISPATCHER_H_
#define PSMD_CLIENT_AM_DISPATCHER_H_

#include <psm2.h>
#include <psm2_am.h>

#include <cstdint>
#include <vector>

#include "shm/descriptor.h"
#include "shm/payload.h"
#include "shm/status.h"

namespace psmd::client {

// What a psm2_am_token_t points to: the message being handled. Lives on the
// stack of Deliver, valid only during the handler.
struct AmToken {
  psm2_ep_t ep;
  uint32_t src_endpoint;  // psmd endpoint id of the sender (replies go there)
  psm2_epid_t src_epid;
  bool is_request;
  bool no_reply;
  bool replied;
};

class AmDispatcher {
 public:
  // A registered handler (one of the two signatures).
  struct Handler {
    psm2_am_handler_fn_t fn = nullptr;
    psm2_am_handler_2_fn_t fn2 = nullptr;
    void* hctx = nullptr;
  };

  // Appends `handlers` and writes their indices to `indices`; fails, adding
  // none, when the table would exceed kAmMaxHandlers.
  Status Register(const std::vector<Handler>& handlers, int* indices);
  // psm2_am_unregister_handlers.
  void Clear() { handlers_.clear(); }

  // Runs the handler of the request or reply `c` (its arguments and payload
  // inline or in `payload`) on behalf of endpoint `ep`. Returns PSM2_OK when
  // it ran, PSM2_PARAM_ERR when no handler has that index (reported on
  // stderr: the message is dropped, and a request's sender is told).
  psm2_error_t Deliver(psm2_ep_t ep, uint32_t ep_id,
                       const shm::CompletionDesc& c,
                       const shm::PoolPayload& payload) const;

 private:
  std::vector<Handler> handlers_;  // by index
};

}  // namespace psmd::client

#endif  // PSMD_CLIENT_AM_DISPATCHER_H_
