/*
 * psm2_am.h -- PSM2 Active Messages: short requests and replies that run a
 * registered handler in the target process.
 *
 * This is psmd's ABI-compatible rendition of the PSM2 2.2 API: every type,
 * constant and function declared here matches the layout, value and
 * signature of Intel's libpsm2.so.2 (libpsm2 11.2.x). The wording is psmd's
 * own. Where psmd behaves differently from Intel's implementation, the
 * difference is documented in docs/compat.md.
 *
 * Handlers run from within the target's progress calls (psm2_poll and the
 * MQ completion functions). A request handler may send at most one reply,
 * through psm2_am_reply_short with the token it was given; reply handlers
 * must not send anything.
 *
 * The ABI is checked mechanically against Intel's headers by //tests/abi.
 */
#ifndef PSM2_AM_H
#define PSM2_AM_H

#include <psm2.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Index of a registered handler, as returned by psm2_am_register_handlers. */
typedef uint32_t psm2_handler_t;

/* Identifies the request being handled; valid only inside the handler. */
typedef void* psm2_am_token_t;

/* Flags of psm2_am_request_short / psm2_am_reply_short (bitwise-or). */
#define PSM2_AM_FLAG_NONE 0
/* The payload buffer stays valid until completion: no copy needed. */
#define PSM2_AM_FLAG_ASYNC 1
/* The request handler will not reply. */
#define PSM2_AM_FLAG_NOREPLY 2

/* One 64-bit handler argument, also addressable as 2x32 or 4x16 bits. */
typedef struct psm2_amarg {
  union {
    struct {
      uint16_t u16w3;
      uint16_t u16w2;
      uint16_t u16w1;
      uint16_t u16w0;
    };
    struct {
      uint32_t u32w1;
      uint32_t u32w0;
    };
    uint64_t u64w0;
    uint64_t u64;
  };
} psm2_amarg_t;

/* Handler: receives the token, nargs arguments and a len-byte payload at
 * src (valid only during the call). Must return 0. */
typedef int (*psm2_am_handler_fn_t)(psm2_am_token_t token, psm2_amarg_t* args,
                                    int nargs, void* src, uint32_t len);

/* Handler with the per-handler context pointer given at registration. */
typedef int (*psm2_am_handler_2_fn_t)(psm2_am_token_t token, psm2_amarg_t* args,
                                      int nargs, void* src, uint32_t len,
                                      void* hctx);

/* Local completion callback: the target has run the handler. */
typedef void (*psm2_am_completion_fn_t)(void* context);

/* Register num_handlers handlers on ep; handlers_idx[i] receives the index
 * to use for handlers[i]. Returns PSM2_OK or PSM2_EP_NO_RESOURCES. */
psm2_error_t psm2_am_register_handlers(psm2_ep_t ep,
                                       const psm2_am_handler_fn_t* handlers,
                                       int num_handlers, int* handlers_idx);

/* Like psm2_am_register_handlers; handler i is called with hctx[i].
 * Returns PSM2_OK or PSM2_EP_NO_RESOURCES. */
psm2_error_t psm2_am_register_handlers_2(psm2_ep_t ep,
                                         const psm2_am_handler_2_fn_t* handlers,
                                         int num_handlers, void** hctx,
                                         int* handlers_idx);

/* Remove every handler registered on ep. */
void psm2_am_unregister_handlers(psm2_ep_t ep);

/* Run handler `handler` at epaddr with nargs args and a len-byte payload.
 * completion_fn(completion_ctxt), if non-NULL, runs locally once the target
 * handler has run. Returns PSM2_OK. */
psm2_error_t psm2_am_request_short(psm2_epaddr_t epaddr, psm2_handler_t handler,
                                   psm2_amarg_t* args, int nargs, void* src,
                                   size_t len, int flags,
                                   psm2_am_completion_fn_t completion_fn,
                                   void* completion_ctxt);

/* From a request handler, send the single permitted reply to the requester
 * identified by token. Returns PSM2_OK or PSM2_AM_INVALID_REPLY. */
psm2_error_t psm2_am_reply_short(psm2_am_token_t token, psm2_handler_t handler,
                                 psm2_amarg_t* args, int nargs, void* src,
                                 size_t len, int flags,
                                 psm2_am_completion_fn_t completion_fn,
                                 void* completion_ctxt);

/* Store the address of the requester behind token in *epaddr_out.
 * Returns PSM2_OK or PSM2_PARAM_ERR. */
psm2_error_t psm2_am_get_source(psm2_am_token_t token,
                                psm2_epaddr_t* epaddr_out);

/* Limits of the active-message implementation (psm2_am_get_parameters).
 * Guaranteed minimums: 64 handlers, 2 args, 256-byte request and reply. */
struct psm2_am_parameters {
  uint32_t max_handlers;      /* handlers per endpoint */
  uint32_t max_nargs;         /* arguments per message */
  uint32_t max_request_short; /* request payload bytes */
  uint32_t max_reply_short;   /* reply payload bytes */
};

/* Copy min(sizeof_parameters_in, sizeof(struct psm2_am_parameters)) bytes
 * of ep's limits to *parameters (zeroing the rest of a larger struct); that
 * count goes to *sizeof_parameters_out. Returns PSM2_OK. */
psm2_error_t psm2_am_get_parameters(psm2_ep_t ep,
                                    struct psm2_am_parameters* parameters,
                                    size_t sizeof_parameters_in,
                                    size_t* sizeof_parameters_out);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* PSM2_AM_H */
