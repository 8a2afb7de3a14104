#include "client/am_dispatcher.h"

#include <cstdio>
#include <cstring>
#include <string>

namespace psmd::client {

Status AmDispatcher::Register(const std::vector<Handler>& handlers,
                              int* indices) {
  if (handlers_.size() + handlers.size() > shm::kAmMaxHandlers) {
    return Status{
        PSM2_EP_NO_RESOURCES,
        "psm2_am_register_handlers: " + std::to_string(handlers.size()) +
            " more handlers would exceed the limit of " +
            std::to_string(shm::kAmMaxHandlers) + " per endpoint"};
  }
  for (const Handler& h : handlers) {
    *indices++ = static_cast<int>(handlers_.size());
    handlers_.push_back(h);
  }
  return {};
}

psm2_error_t AmDispatcher::Deliver(psm2_ep_t ep, uint32_t ep_id,
                                   const shm::CompletionDesc& c,
                                   const shm::PoolPayload& payload) const {
  const bool request = c.op == shm::CompleteOp::kAmRequest;
  const uint32_t index = c.tag[0], nargs = c.tag[1];
  const Handler* h =
      index < handlers_.size() && (handlers_[index].fn || handlers_[index].fn2)
          ? &handlers_[index]
          : nullptr;
  if (h == nullptr) {
    fprintf(stderr,
            "libpsmclient: endpoint %u: active %s for handler %u from epid "
            "0x%llx dropped: no such handler is registered "
            "(psm2_am_register_handlers)\n",
            ep_id, request ? "request" : "reply", index,
            static_cast<unsigned long long>(c.src_epid));
    return PSM2_PARAM_ERR;
  }
  const bool inline_payload = !payload;
  const uint8_t* blob = inline_payload ? c.body.inline_data : payload.data();
  const uint32_t arg_bytes = nargs * shm::kAmArgBytes;
  // Copied out: the handler may keep neither, and the arguments in the blob
  // need not be aligned for psm2_amarg_t.
  psm2_amarg_t args[shm::kAmMaxArgs];
  std::memcpy(args, blob, arg_bytes);
  const uint32_t len = c.msg_len - arg_bytes;
  // An inline payload lives in the completion ring's slot, which the caller
  // releases after we return; the handler gets a stack copy, writable as the
  // PSM2 signature (void*) allows.
  uint8_t inline_copy[shm::kInlineMax];
  void* src = nullptr;
  if (len > 0) {
    if (inline_payload) {
      std::memcpy(inline_copy, blob + arg_bytes, len);
      src = inline_copy;
    } else {
      src = const_cast<uint8_t*>(blob) + arg_bytes;
    }
  }
  AmToken token{ep,
                c.tag[2],
                c.src_epid,
                request,
                (c.flags & shm::kAmRequestNoReply) != 0,
                false};
  if (h->fn2 != nullptr) {
    h->fn2(&token, args, static_cast<int>(nargs), src, len, h->hctx);
  } else {
    h->fn(&token, args, static_cast<int>(nargs), src, len);
  }
  return PSM2_OK;
}

}  // namespace psmd::client
