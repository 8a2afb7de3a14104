/*
 * psm2_mq.h -- PSM2 Matched Queues: tagged point-to-point messaging.
 *
 * This is psmd's ABI-compatible rendition of the PSM2 2.2 API: every type,
 * constant and function declared here matches the layout, value and
 * signature of Intel's libpsm2.so.2 (libpsm2 11.2.x). The wording is psmd's
 * own. Where psmd behaves differently from Intel's implementation, the
 * difference is documented in docs/compat.md.
 *
 * Matching model: a receive matches a message when
 *   (message_tag & selector) == (receive_tag & selector)
 * (and, for the *2 variants, the source matches or is PSM2_MQ_ANY_ADDR).
 * Messages between one sender and one receiver match in send order.
 *
 * The ABI is checked mechanically against Intel's headers by //tests/abi.
 */
#ifndef PSM2_MQ_H
#define PSM2_MQ_H

#include <psm2.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------------ */
/* Queue lifetime                                                             */
/* ------------------------------------------------------------------------ */

/* Create the matched queue of endpoint ep, applying numopts options from
 * opts (PSM2_MQ_OPT_* keys). The second argument is unused (pass
 * PSM2_MQ_ORDERMASK_ALL). Returns PSM2_OK or PSM2_PARAM_ERR. */
psm2_error_t psm2_mq_init(psm2_ep_t ep, uint64_t ignored,
                          const struct psm2_optkey* opts, int numopts,
                          psm2_mq_t* mq);

/* Historical values for psm2_mq_init's unused argument. */
#define PSM2_MQ_ORDERMASK_NONE 0ULL
#define PSM2_MQ_ORDERMASK_ALL 0xffffffffffffffffULL

/* Release a matched queue. Returns PSM2_OK. */
psm2_error_t psm2_mq_finalize(psm2_mq_t mq);

/* ------------------------------------------------------------------------ */
/* Tags, status and requests                                                  */
/* ------------------------------------------------------------------------ */

/* Words in a psm2_mq_tag_t. Only the first three carry tag bits (96-bit
 * tags); the fourth is padding. */
#define PSM2_MQ_TAG_ELEMENTS 4

/* 96-bit message tag (and tag selector) of the *2 API variants. */
typedef union psm2_mq_tag {
  uint32_t tag[PSM2_MQ_TAG_ELEMENTS];
  struct {
    uint32_t tag0;
    uint32_t tag1;
    uint32_t tag2;
  };
} psm2_mq_tag_t;

/* Completion status of a 64-bit-tag operation. */
typedef struct psm2_mq_status {
  uint64_t msg_tag;        /* tag of the matched message */
  uint32_t msg_length;     /* length the sender sent */
  uint32_t nbytes;         /* bytes actually delivered */
  psm2_error_t error_code; /* PSM2_OK or PSM2_MQ_TRUNCATION */
  void* context;           /* context given when posting */
} psm2_mq_status_t;

/* Completion status of a 96-bit-tag (*2) operation. */
typedef struct psm2_mq_status2 {
  psm2_epaddr_t msg_peer; /* sender (receives) / destination (sends) */
  psm2_mq_tag_t msg_tag __attribute__((aligned(16)));
  uint32_t msg_length;
  uint32_t nbytes;
  psm2_error_t error_code;
  void* context;
} psm2_mq_status2_t;

/* Handle of a non-blocking operation (opaque). */
typedef struct psm2_mq_req* psm2_mq_req_t;

/* Public view of a completed request, handed to the callback of
 * psm2_mq_ipeek_dequeue_multi. */
struct psm2_mq_req_user {
  psm2_epaddr_t peer; /* source or destination */
  psm2_mq_tag_t tag __attribute__((aligned(16)));
  psm2_mq_tag_t tagsel; /* receive selector */
  uint8_t* buf;         /* data buffer */
  uint32_t buf_len;
  uint32_t error_code;  /* psm2_error_t value */
  uint32_t recv_msglen; /* bytes the receiver accepts */
  uint32_t send_msglen; /* bytes the sender sent */
  void* context;        /* user context given when posting */
  uint64_t user_reserved[4];
};

/* Deprecated: read MQ option `option` into value; prefer psm2_getopt with
 * PSM2_COMPONENT_MQ. Returns PSM2_OK or PSM2_PARAM_ERR. */
psm2_error_t psm2_mq_getopt(psm2_mq_t mq, int option, void* value);

/* Deprecated: set MQ option `option` from value; prefer psm2_setopt with
 * PSM2_COMPONENT_MQ. Returns PSM2_OK, PSM2_PARAM_ERR or PSM2_OPT_READONLY. */
psm2_error_t psm2_mq_setopt(psm2_mq_t mq, int option, const void* value);

/* Send flag: complete only once the receiver has matched the message. */
#define PSM2_MQ_FLAG_SENDSYNC 0x01

/* The "no request" value; completed requests are reset to it. */
#define PSM2_MQ_REQINVALID ((psm2_mq_req_t)(NULL))

/* Wildcard source for the *2 receive and probe calls. */
#define PSM2_MQ_ANY_ADDR ((psm2_epaddr_t)NULL)

/* Operation selector of psm2_mq_fp_msg. */
enum psm2_mq_fp_op {
  PSM2_MQ_ISEND_FP = 1,
  PSM2_MQ_IRECV_FP,
};

/* ------------------------------------------------------------------------ */
/* Posting sends and receives                                                 */
/* ------------------------------------------------------------------------ */

/* Fast-path isend or irecv (fp_type) with 96-bit tags; addr is used for
 * sends, tagsel for receives. The caller must serialise calls on mq; the
 * operation may be deferred until the next progress call. Returns PSM2_OK. */
psm2_error_t psm2_mq_fp_msg(psm2_ep_t ep, psm2_mq_t mq, psm2_epaddr_t addr,
                            psm2_mq_tag_t* tag, psm2_mq_tag_t* tagsel,
                            uint32_t flags, void* buf, uint32_t len,
                            void* context, enum psm2_mq_fp_op fp_type,
                            psm2_mq_req_t* req);

/* Post a receive of up to len bytes into buf for any source whose 64-bit
 * tag matches rtag under rtagsel; completion via wait/test/ipeek.
 * Returns PSM2_OK. */
psm2_error_t psm2_mq_irecv(psm2_mq_t mq, uint64_t rtag, uint64_t rtagsel,
                           uint32_t flags, void* buf, uint32_t len,
                           void* context, psm2_mq_req_t* req);

/* Post a receive with a 96-bit tag/selector, restricted to src unless it is
 * PSM2_MQ_ANY_ADDR. Returns PSM2_OK. */
psm2_error_t psm2_mq_irecv2(psm2_mq_t mq, psm2_epaddr_t src,
                            psm2_mq_tag_t* rtag, psm2_mq_tag_t* rtagsel,
                            uint32_t flags, void* buf, uint32_t len,
                            void* context, psm2_mq_req_t* req);

/* Receive the message previously claimed by psm2_mq_improbe{,2}; *reqo is
 * the request that probe returned and is completed like any receive.
 * Returns PSM2_OK. */
psm2_error_t psm2_mq_imrecv(psm2_mq_t mq, uint32_t flags, void* buf,
                            uint32_t len, void* context, psm2_mq_req_t* reqo);

/* Blocking send of len bytes with 64-bit tag stag to dest; returns when buf
 * may be reused (with PSM2_MQ_FLAG_SENDSYNC: once matched). Returns PSM2_OK. */
psm2_error_t psm2_mq_send(psm2_mq_t mq, psm2_epaddr_t dest, uint32_t flags,
                          uint64_t stag, const void* buf, uint32_t len);

/* Blocking send with a 96-bit tag. Returns PSM2_OK. */
psm2_error_t psm2_mq_send2(psm2_mq_t mq, psm2_epaddr_t dest, uint32_t flags,
                           psm2_mq_tag_t* stag, const void* buf, uint32_t len);

/* Start a non-blocking send with a 64-bit tag; buf must stay valid until
 * the request completes. Returns PSM2_OK. */
psm2_error_t psm2_mq_isend(psm2_mq_t mq, psm2_epaddr_t dest, uint32_t flags,
                           uint64_t stag, const void* buf, uint32_t len,
                           void* context, psm2_mq_req_t* req);

/* Start a non-blocking send with a 96-bit tag. Returns PSM2_OK. */
psm2_error_t psm2_mq_isend2(psm2_mq_t mq, psm2_epaddr_t dest, uint32_t flags,
                            psm2_mq_tag_t* stag, const void* buf, uint32_t len,
                            void* context, psm2_mq_req_t* req);

/* ------------------------------------------------------------------------ */
/* Probing                                                                    */
/* ------------------------------------------------------------------------ */

/* Check, without receiving, for an unexpected message matching rtag/rtagsel;
 * fills *status if non-NULL. Returns PSM2_OK if one is waiting, else
 * PSM2_MQ_NO_COMPLETIONS. */
psm2_error_t psm2_mq_iprobe(psm2_mq_t mq, uint64_t rtag, uint64_t rtagsel,
                            psm2_mq_status_t* status);

/* 96-bit-tag, source-filtered psm2_mq_iprobe. */
psm2_error_t psm2_mq_iprobe2(psm2_mq_t mq, psm2_epaddr_t src,
                             psm2_mq_tag_t* rtag, psm2_mq_tag_t* rtagsel,
                             psm2_mq_status2_t* status);

/* Like psm2_mq_iprobe, but also removes the matched message from the queue
 * and returns it in *req for psm2_mq_imrecv. Returns PSM2_OK or
 * PSM2_MQ_NO_COMPLETIONS. */
psm2_error_t psm2_mq_improbe(psm2_mq_t mq, uint64_t rtag, uint64_t rtagsel,
                             psm2_mq_req_t* req, psm2_mq_status_t* status);

/* 96-bit-tag, source-filtered psm2_mq_improbe. */
psm2_error_t psm2_mq_improbe2(psm2_mq_t mq, psm2_epaddr_t src,
                              psm2_mq_tag_t* rtag, psm2_mq_tag_t* rtagsel,
                              psm2_mq_req_t* reqo, psm2_mq_status2_t* status);

/* ------------------------------------------------------------------------ */
/* Completion                                                                 */
/* ------------------------------------------------------------------------ */

/* Return in *req (without completing it) the oldest request that is ready
 * to complete, and its status if status is non-NULL. Returns PSM2_OK or
 * PSM2_MQ_NO_COMPLETIONS. */
psm2_error_t psm2_mq_ipeek(psm2_mq_t mq, psm2_mq_req_t* req,
                           psm2_mq_status_t* status);

/* psm2_mq_ipeek reporting a psm2_mq_status2_t. */
psm2_error_t psm2_mq_ipeek2(psm2_mq_t mq, psm2_mq_req_t* req,
                            psm2_mq_status2_t* status);

/* Callback of psm2_mq_ipeek_dequeue_multi: convert req into entry
 * entry_index of status_array. Return < 0 on error, 0 if the entry was
 * consumed but not stored, 1 if stored, > 1 if stored and the batch should
 * stop. */
typedef int (*psmi_mq_status_copy_user_t)(struct psm2_mq_req_user* req,
                                          void* status_array, int entry_index);

/* Dequeue up to *count completed requests, converting each with status_copy
 * into status_array; *count returns the number stored. Returns PSM2_OK
 * (array filled), PSM2_MQ_NO_COMPLETIONS (fewer available) or
 * PSM2_INTERNAL_ERR (callback failed; *count holds its return value). */
psm2_error_t psm2_mq_ipeek_dequeue_multi(psm2_mq_t mq, void* status_array,
                                         psmi_mq_status_copy_user_t status_copy,
                                         int* count);

/* Remove the oldest completed request from the completion queue into *req;
 * pair with psm2_mq_req_free. Returns PSM2_OK or PSM2_MQ_NO_COMPLETIONS. */
psm2_error_t psm2_mq_ipeek_dequeue(psm2_mq_t mq, psm2_mq_req_t* req);

/* Give back a request obtained from psm2_mq_ipeek_dequeue (NULL is a no-op).
 * Returns PSM2_OK. */
psm2_error_t psm2_mq_req_free(psm2_mq_t mq, psm2_mq_req_t req);

/* Block until *request completes, fill *status if non-NULL, release the
 * request and set *request to PSM2_MQ_REQINVALID. Returns PSM2_OK (also when
 * *request already was PSM2_MQ_REQINVALID). */
psm2_error_t psm2_mq_wait(psm2_mq_req_t* request, psm2_mq_status_t* status);

/* psm2_mq_wait reporting a psm2_mq_status2_t. */
psm2_error_t psm2_mq_wait2(psm2_mq_req_t* request, psm2_mq_status2_t* status);

/* Non-blocking psm2_mq_wait: returns PSM2_OK (completed, released,
 * *request reset) or PSM2_MQ_NO_COMPLETIONS (still pending, untouched). */
psm2_error_t psm2_mq_test(psm2_mq_req_t* request, psm2_mq_status_t* status);

/* psm2_mq_test reporting a psm2_mq_status2_t. */
psm2_error_t psm2_mq_test2(psm2_mq_req_t* request, psm2_mq_status2_t* status);

/* Cancel a posted receive that has not been matched yet; the request must
 * still be completed with wait/test. Returns PSM2_OK if cancelled, else
 * PSM2_MQ_NO_COMPLETIONS (already matched, or a send). */
psm2_error_t psm2_mq_cancel(psm2_mq_req_t* req);

/* ------------------------------------------------------------------------ */
/* Statistics                                                                 */
/* ------------------------------------------------------------------------ */

/* Traffic counters of a matched queue. */
struct psm2_mq_stats {
  uint64_t rx_user_bytes; /* bytes received into posted buffers */
  uint64_t rx_user_num;   /* messages received into posted buffers */
  uint64_t rx_sys_bytes;  /* bytes buffered as unexpected */
  uint64_t rx_sys_num;    /* messages buffered as unexpected */

  uint64_t tx_num;         /* messages sent, all paths */
  uint64_t tx_eager_num;   /* messages sent eagerly */
  uint64_t tx_eager_bytes; /* bytes sent eagerly */
  uint64_t tx_rndv_num;    /* messages sent by rendezvous */
  uint64_t tx_rndv_bytes;  /* bytes sent by rendezvous */
  uint64_t tx_shm_num;     /* messages sent over shared memory */
  uint64_t rx_shm_num;     /* messages received over shared memory */

  uint64_t rx_sysbuf_num;   /* unexpected-message buffers allocated */
  uint64_t rx_sysbuf_bytes; /* bytes in those buffers */

  uint64_t _reserved[16]; /* for future counters; zero */
};

/* Number of meaningful counters at the start of struct psm2_mq_stats. */
#define PSM2_MQ_NUM_STATS 13

typedef struct psm2_mq_stats psm2_mq_stats_t;

/* Copy the current counters of mq into *stats. */
void psm2_mq_get_stats(psm2_mq_t mq, psm2_mq_stats_t* stats);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* PSM2_MQ_H */
