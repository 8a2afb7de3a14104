/*
 * psm2.h -- core PSM2 API (initialisation, endpoints, connections, options,
 * information queries).
 *
 * This is psmd's ABI-compatible rendition of the PSM2 2.2 API: every type,
 * constant and function declared here matches the layout, value and
 * signature of Intel's libpsm2.so.2 (libpsm2 11.2.x), so applications built
 * against Intel's headers run unchanged on psmd's client library and vice
 * versa. The wording is psmd's own. Where psmd behaves differently from
 * Intel's implementation, the difference is documented in docs/compat.md.
 *
 * The ABI is checked mechanically against Intel's headers by //tests/abi.
 */
#ifndef PSM2_H
#define PSM2_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------------ */
/* Opaque handles                                                             */
/* ------------------------------------------------------------------------ */

/* A locally opened endpoint. */
typedef struct psm2_ep* psm2_ep_t;

/* A matched queue bound to an endpoint (see psm2_mq.h). */
typedef struct psm2_mq* psm2_mq_t;

/* ------------------------------------------------------------------------ */
/* Versioning                                                                 */
/* ------------------------------------------------------------------------ */

/* API version these headers describe: 2.2, as (major << 8) | minor. */
#define PSM2_VERNO 0x0202
#define PSM2_VERNO_MAJOR 0x02
#define PSM2_VERNO_MINOR 0x02
/* Oldest major version (PSM 1.x) a caller may request from psm2_init. */
#define PSM2_VERNO_COMPAT_MAJOR 0x01

/* ------------------------------------------------------------------------ */
/* Error codes                                                                */
/* ------------------------------------------------------------------------ */

/* Return codes of every PSM2 call. Zero is success; values are stable ABI. */
enum psm2_error {
  PSM2_OK = 0,                   /* success */
  PSM2_OK_NO_PROGRESS = 1,       /* psm2_poll found nothing to do */
  PSM2_PARAM_ERR = 3,            /* invalid argument */
  PSM2_NO_MEMORY = 4,            /* allocation failed / buffer too small */
  PSM2_INIT_NOT_INIT = 5,        /* psm2_init has not been called */
  PSM2_INIT_BAD_API_VERSION = 6, /* requested API version unsupported */
  PSM2_NO_AFFINITY = 7,          /* CPU affinity could not be set */
  PSM2_INTERNAL_ERR = 8,         /* unexpected internal failure */
  PSM2_SHMEM_SEGMENT_ERR = 9,    /* shared-memory setup failed */
  PSM2_OPT_READONLY = 10,        /* option cannot be written */
  PSM2_TIMEOUT = 11,             /* operation timed out */
  PSM2_TOO_MANY_ENDPOINTS = 12,  /* endpoint limit reached */
  PSM2_IS_FINALIZED = 13,        /* library already finalized */

  PSM2_EP_WAS_CLOSED = 20,       /* endpoint has been closed */
  PSM2_EP_NO_DEVICE = 21,        /* no usable device */
  PSM2_EP_UNIT_NOT_FOUND = 22,   /* bad unit or port number */
  PSM2_EP_DEVICE_FAILURE = 23,   /* endpoint initialisation failed */
  PSM2_EP_CLOSE_TIMEOUT = 24,    /* endpoint close timed out */
  PSM2_EP_NO_PORTS_AVAIL = 25,   /* no free hardware context/port */
  PSM2_EP_NO_NETWORK = 26,       /* network not reachable */
  PSM2_EP_INVALID_UUID_KEY = 27, /* job UUID key rejected */
  PSM2_EP_NO_RESOURCES = 28,     /* out of internal resources */

  PSM2_EPID_UNKNOWN = 40,           /* connect status unknown */
  PSM2_EPID_UNREACHABLE = 41,       /* peer not reachable */
  PSM2_EPID_INVALID_NODE = 43,      /* peer endianness mismatch */
  PSM2_EPID_INVALID_MTU = 44,       /* peer reported a bad MTU */
  PSM2_EPID_INVALID_UUID_KEY = 45,  /* peer uses a different job key */
  PSM2_EPID_INVALID_VERSION = 46,   /* peer protocol version mismatch */
  PSM2_EPID_INVALID_CONNECT = 47,   /* malformed connect information */
  PSM2_EPID_ALREADY_CONNECTED = 48, /* peer already connected */
  PSM2_EPID_NETWORK_ERROR = 49,     /* duplicate epid / network problem */
  PSM2_EPID_INVALID_PKEY = 50,      /* partition key mismatch */
  PSM2_EPID_PATH_RESOLUTION = 51,   /* no path to peer */

  PSM2_MQ_NO_COMPLETIONS = 60, /* non-blocking request not complete */
  PSM2_MQ_TRUNCATION = 61,     /* message truncated at the receiver */

  PSM2_AM_INVALID_REPLY = 70, /* AM reply not allowed here */

  PSM2_IQ_INVALID_QUERY = 71, /* psm2_info_query: bad query */

  PSM2_ERROR_LAST = 80 /* reserved: above every error code */
};

/* Historical alias of PSM2_MQ_NO_COMPLETIONS. */
#define PSM2_MQ_INCOMPLETE PSM2_MQ_NO_COMPLETIONS

typedef enum psm2_error psm2_error_t;

/* Components addressed by psm2_setopt / psm2_getopt. */
enum psm2_component {
  PSM2_COMPONENT_CORE = 0,
  PSM2_COMPONENT_MQ = 1,
  PSM2_COMPONENT_AM = 2,
  PSM2_COMPONENT_IB = 3
};

typedef enum psm2_component psm2_component_t;

/* Path-resolution mechanisms selectable in psm2_ep_open_opts. */
enum psm2_path_res {
  PSM2_PATH_RES_NONE = 0,
  PSM2_PATH_RES_OPP = 1,
  PSM2_PATH_RES_UMAD = 2
};

typedef enum psm2_path_res psm2_path_res_t;

/* ------------------------------------------------------------------------ */
/* Library initialisation                                                     */
/* ------------------------------------------------------------------------ */

/* Initialise the library. On input the caller's API version; on output the
 * library's. May be called more than once (reference counted).
 * Returns PSM2_OK or PSM2_INIT_BAD_API_VERSION. */
psm2_error_t psm2_init(int* api_verno_major, int* api_verno_minor);

/* Capability bits for psm2_get_capability_mask. */
#define PSM2_MULTI_EP_CAP 0x1
#define PSM2_LIB_REFCOUNT_CAP 0x2

/* Return the subset of req_cap_mask the library supports. Callable before
 * psm2_init. */
uint64_t psm2_get_capability_mask(uint64_t req_cap_mask);

/* Drop one psm2_init reference; the last one tears the library down.
 * Returns PSM2_OK, or PSM2_INIT_NOT_INIT if not initialised. */
psm2_error_t psm2_finalize(void);

/* ------------------------------------------------------------------------ */
/* Error handling                                                             */
/* ------------------------------------------------------------------------ */

/* Opaque token passed to an error handler; usable with psm2_error_defer. */
typedef struct psm2_error_token* psm2_error_token_t;

/* Error handler callback: receives the failing endpoint (or NULL), the error,
 * a readable message and a token; its return value is returned to the
 * caller of the failing function. */
typedef psm2_error_t (*psm2_ep_errhandler_t)(psm2_ep_t ep,
                                             const psm2_error_t error,
                                             const char* error_string,
                                             psm2_error_token_t token);

/* Special handler values for psm2_error_register_handler. */
#define PSM2_ERRHANDLER_DEFAULT ((psm2_ep_errhandler_t)-1)
#define PSM2_ERRHANDLER_NOP ((psm2_ep_errhandler_t)-2)
#define PSM2_ERRHANDLER_PSM_HANDLER ((psm2_ep_errhandler_t)-1)
#define PSM2_ERRHANDLER_NO_HANDLER ((psm2_ep_errhandler_t)-2)

/* Longest message an error handler is given, including the terminator. */
#define PSM2_ERRSTRING_MAXLEN 512

/* Install errhandler for ep, or the global default when ep is NULL.
 * PSM2_ERRHANDLER_NO_HANDLER makes all errors plain return values.
 * Callable before psm2_init. Returns PSM2_OK. */
psm2_error_t psm2_error_register_handler(psm2_ep_t ep,
                                         const psm2_ep_errhandler_t errhandler);

/* From inside a custom handler, hand the error to the library's built-in
 * handler (which normally reports it and aborts). */
psm2_error_t psm2_error_defer(psm2_error_token_t err_token);

/* Static, human-readable description of an error code (never NULL). */
const char* psm2_error_get_string(psm2_error_t error);

/* Key/value option pair, e.g. for psm2_mq_init. */
struct psm2_optkey {
  uint32_t key;
  void* value;
};

/* ------------------------------------------------------------------------ */
/* Endpoints                                                                  */
/* ------------------------------------------------------------------------ */

/* Globally unique 64-bit endpoint identifier, exchanged out of band. */
typedef uint64_t psm2_epid_t;

/* Handle for a connected remote endpoint (opaque). */
typedef struct psm2_epaddr* psm2_epaddr_t;

/* 16-byte job key shared by all processes of a job. */
typedef uint8_t psm2_uuid_t[16];

/* Node identifier encoded in an epid. */
uint64_t psm2_epid_nid(psm2_epid_t epid);

/* Context (local endpoint slot) number encoded in an epid. */
uint64_t psm2_epid_context(psm2_epid_t epid);

/* Port number encoded in an epid (deprecated; see psm2_epid_context). */
uint64_t psm2_epid_port(psm2_epid_t epid);

/* Store the number of available units in *num_units.
 * Returns PSM2_OK or PSM2_EP_NO_DEVICE. */
psm2_error_t psm2_ep_num_devunits(uint32_t* num_units);

/* Fill uuid_out with a fresh random UUID. Callable before psm2_init. */
void psm2_uuid_generate(psm2_uuid_t uuid_out);

/* Values for psm2_ep_open_opts.affinity. */
#define PSM2_EP_OPEN_AFFINITY_SKIP 0
#define PSM2_EP_OPEN_AFFINITY_SET 1
#define PSM2_EP_OPEN_AFFINITY_FORCE 2

/* Default for psm2_ep_open_opts.network_pkey. */
#define PSM2_EP_OPEN_PKEY_DEFAULT 0xffffffffffffffffULL

/* Options for psm2_ep_open; initialise with psm2_ep_open_opts_get_defaults. */
struct psm2_ep_open_opts {
  int64_t timeout;               /* open timeout in ns */
  int unit;                      /* unit to open, -1 = any */
  int affinity;                  /* PSM2_EP_OPEN_AFFINITY_* */
  int shm_mbytes;                /* deprecated, ignored */
  int sendbufs_num;              /* preallocated send buffers */
  uint64_t network_pkey;         /* partition key */
  int port;                      /* port to use, <= 0 = any */
  int outsl;                     /* service level for outgoing packets */
  uint64_t service_id;           /* service id for path resolution */
  psm2_path_res_t path_res_type; /* path resolution mechanism */
  int senddesc_num;              /* preallocated send descriptors */
  int imm_size;                  /* immediate-data size */
};

/* Open an endpoint for job unique_job_key; opts may be NULL for defaults.
 * Returns the handle in *ep and its identifier in *epid.
 * Errors include PSM2_EP_NO_DEVICE, PSM2_TIMEOUT, PSM2_TOO_MANY_ENDPOINTS. */
psm2_error_t psm2_ep_open(const psm2_uuid_t unique_job_key,
                          const struct psm2_ep_open_opts* opts, psm2_ep_t* ep,
                          psm2_epid_t* epid);

/* Fill *opts with the default endpoint open options. */
psm2_error_t psm2_ep_open_opts_get_defaults(struct psm2_ep_open_opts* opts);

/* Set *result non-zero if ep reaches epid through shared memory. */
psm2_error_t psm2_ep_epid_share_memory(psm2_ep_t ep, psm2_epid_t epid,
                                       int* result);

/* Close an endpoint; mode is PSM2_EP_CLOSE_GRACEFUL or _FORCE, timeout in ns
 * (0 or less: up to 60 s, as Intel's). Returns PSM2_OK or
 * PSM2_EP_CLOSE_TIMEOUT. */
psm2_error_t psm2_ep_close(psm2_ep_t ep, int mode, int64_t timeout);

#define PSM2_EP_CLOSE_GRACEFUL 0
#define PSM2_EP_CLOSE_FORCE 1

/* Supply hostnames for num node ids, used in diagnostics. */
psm2_error_t psm2_map_nid_hostname(int num, const uint64_t* nids,
                                   const char** hostnames);

/* Connect ep to num_of_epid remote epids (those whose mask entry is non-zero,
 * or all if the mask is NULL), storing addresses in array_of_epaddr and
 * per-peer status in array_of_errors. timeout in ns, <= 0 = forever.
 * Returns PSM2_OK, PSM2_TIMEOUT or the most significant per-peer error. */
psm2_error_t psm2_ep_connect(psm2_ep_t ep, int num_of_epid,
                             const psm2_epid_t* array_of_epid,
                             const int* array_of_epid_mask,
                             psm2_error_t* array_of_errors,
                             psm2_epaddr_t* array_of_epaddr, int64_t timeout);

/* Gracefully disconnect from the selected epaddrs and release them
 * (entries are reset to NULL on success). Same as psm2_ep_disconnect2
 * with PSM2_EP_DISCONNECT_GRACEFUL. */
psm2_error_t psm2_ep_disconnect(psm2_ep_t ep, int num_of_epaddr,
                                psm2_epaddr_t* array_of_epaddr,
                                const int* array_of_epaddr_mask,
                                psm2_error_t* array_of_errors, int64_t timeout);

/* Disconnect from the selected epaddrs with the given mode
 * (PSM2_EP_DISCONNECT_GRACEFUL or _FORCE). Per-peer status goes to
 * array_of_errors; returns PSM2_OK when every selected peer is released. */
psm2_error_t psm2_ep_disconnect2(psm2_ep_t ep, int num_of_epaddr,
                                 psm2_epaddr_t* array_of_epaddr,
                                 const int* array_of_epaddr_mask,
                                 psm2_error_t* array_of_errors, int mode,
                                 int64_t timeout);

#define PSM2_EP_DISCONNECT_GRACEFUL PSM2_EP_CLOSE_GRACEFUL
#define PSM2_EP_DISCONNECT_FORCE PSM2_EP_CLOSE_FORCE

/* Make progress on all outstanding communication of ep.
 * Returns PSM2_OK if something progressed, PSM2_OK_NO_PROGRESS otherwise. */
psm2_error_t psm2_poll(psm2_ep_t ep);

/* Attach a label to epaddr, used in diagnostics. */
void psm2_epaddr_setlabel(psm2_epaddr_t epaddr,
                          const char* epaddr_label_string);

/* Attach an opaque user pointer to epaddr. */
void psm2_epaddr_setctxt(psm2_epaddr_t epaddr, void* ctxt);

/* Return the user pointer set by psm2_epaddr_setctxt (NULL if none). */
void* psm2_epaddr_getctxt(psm2_epaddr_t epaddr);

/* ------------------------------------------------------------------------ */
/* Component options for psm2_setopt / psm2_getopt                           */
/* ------------------------------------------------------------------------ */

/* CORE: debug mask (uint32_t); component object NULL. */
#define PSM2_CORE_OPT_DEBUG 0x101
/* CORE: user context of an epaddr; component object is the psm2_epaddr_t. */
#define PSM2_CORE_OPT_EP_CTXT 0x102

/* IB: default service level of an endpoint (uint32_t); object psm2_ep_t. */
#define PSM2_IB_OPT_DF_SL 0x201
/* IB: service level towards one peer (uint32_t); object psm2_epaddr_t. */
#define PSM2_IB_OPT_EP_SL 0x202

/* MQ: message size at which the fabric path switches to rendezvous. */
#define PSM2_MQ_OPT_RNDV_IB_SZ 0x301
#define PSM2_MQ_RNDV_HFI_SZ PSM2_MQ_OPT_RNDV_IB_SZ
#define PSM2_MQ_RNDV_IPATH_SZ PSM2_MQ_OPT_RNDV_IB_SZ
/* MQ: message size at which the shared-memory path switches to rendezvous. */
#define PSM2_MQ_OPT_RNDV_SHM_SZ 0x302
#define PSM2_MQ_RNDV_SHM_SZ PSM2_MQ_OPT_RNDV_SHM_SZ
/* MQ: upper bound on memory buffering unexpected messages. */
#define PSM2_MQ_OPT_SYSBUF_MYBYTES 0x303
#define PSM2_MQ_MAX_SYSBUF_MBYTES PSM2_MQ_OPT_SYSBUF_MYBYTES

/* AM (read-only): largest short-message payload. */
#define PSM2_AM_OPT_FRAG_SZ 0x401
#define PSM2_AM_MAX_FRAG_SZ PSM2_AM_OPT_FRAG_SZ
/* AM (read-only): most arguments per short message. */
#define PSM2_AM_OPT_NARGS 0x402
#define PSM2_AM_MAX_NARGS PSM2_AM_OPT_NARGS
/* AM (read-only): most handlers per endpoint. */
#define PSM2_AM_OPT_HANDLERS 0x403
#define PSM2_AM_MAX_HANDLERS PSM2_AM_OPT_HANDLERS

/* Set option optname of component on component_obj from optval/optlen.
 * Returns PSM2_OK, PSM2_PARAM_ERR or PSM2_OPT_READONLY. */
psm2_error_t psm2_setopt(psm2_component_t component, const void* component_obj,
                         int optname, const void* optval, uint64_t optlen);

/* Read option optname into optval; *optlen is the buffer size on input and
 * the value size on output. Returns PSM2_OK, PSM2_PARAM_ERR, or
 * PSM2_NO_MEMORY (buffer too small, *optlen holds the size needed). */
psm2_error_t psm2_getopt(psm2_component_t component, const void* component_obj,
                         int optname, void* optval, uint64_t* optlen);

/* ------------------------------------------------------------------------ */
/* Endpoint queries                                                           */
/* ------------------------------------------------------------------------ */

/* Description of one open local endpoint (psm2_ep_query). */
typedef struct psm2_epinfo {
  psm2_ep_t ep;
  psm2_epid_t epid;
  psm2_uuid_t uuid;
  uint16_t jkey;
  char uuid_str[64];
} psm2_epinfo_t;

/* Description of one connection (psm2_ep_epid_lookup). */
typedef struct psm2_epconn {
  psm2_epaddr_t addr;
  psm2_ep_t ep;
  psm2_mq_t mq;
} psm2_epconn_t;

/* List open endpoints: *num_of_epinfo is the array capacity on input and the
 * number filled on output. Returns PSM2_OK, PSM2_PARAM_ERR or
 * PSM2_EP_WAS_CLOSED. */
psm2_error_t psm2_ep_query(int* num_of_epinfo, psm2_epinfo_t* array_of_epinfo);

/* Find the connection to epid across all local endpoints.
 * Returns PSM2_OK, PSM2_EP_WAS_CLOSED or PSM2_EPID_UNKNOWN. */
psm2_error_t psm2_ep_epid_lookup(psm2_epid_t epid, psm2_epconn_t* epconn);

/* Like psm2_ep_epid_lookup but restricted to endpoint ep.
 * Returns PSM2_OK, PSM2_EP_WAS_CLOSED, PSM2_EPID_UNKNOWN or PSM2_PARAM_ERR. */
psm2_error_t psm2_ep_epid_lookup2(psm2_ep_t ep, psm2_epid_t epid,
                                  psm2_epconn_t* epconn);

/* Store the epid behind epaddr in *epid. Returns PSM2_OK or PSM2_PARAM_ERR. */
psm2_error_t psm2_epaddr_to_epid(psm2_epaddr_t epaddr, psm2_epid_t* epid);

/* ------------------------------------------------------------------------ */
/* Information queries (psm2_info_query)                                      */
/* ------------------------------------------------------------------------ */

/* What psm2_info_query reports. The arguments each query needs (fields of
 * psm2_info_query_arg_t, in order) and the type written to *out: */
typedef enum psm2_info_query_et {
  PSM2_INFO_QUERY_NUM_UNITS,         /* ()                  -> uint32_t */
  PSM2_INFO_QUERY_NUM_PORTS,         /* ()                  -> uint32_t */
  PSM2_INFO_QUERY_UNIT_STATUS,       /* (unit)              -> uint32_t */
  PSM2_INFO_QUERY_UNIT_PORT_STATUS,  /* (unit, port)        -> uint32_t */
  PSM2_INFO_QUERY_NUM_FREE_CONTEXTS, /* (unit)              -> uint32_t */
  PSM2_INFO_QUERY_NUM_CONTEXTS,      /* (unit)              -> uint32_t */
  PSM2_INFO_QUERY_CONFIG,            /* (mq, epaddr)        -> uint32_t,
                                        psm2_info_query_config bits */
  PSM2_INFO_QUERY_THRESH,            /* (mq, epaddr, mstq)  -> uint32_t */
  PSM2_INFO_QUERY_DEVICE_NAME,       /* (mq, epaddr, length)-> char[] */
  PSM2_INFO_QUERY_MTU,               /* (mq, epaddr)        -> uint32_t */
  PSM2_INFO_QUERY_LINK_SPEED,        /* (mq, epaddr)        -> uint32_t */
  PSM2_INFO_QUERY_NETWORK_TYPE,      /* (length)            -> char[] */
  PSM2_INFO_QUERY_FEATURE_MASK,      /* ()                  -> uint32_t,
                                        psm2_info_query_feature_mask */
  PSM2_INFO_QUERY_LAST,              /* count of queries; keep last */
} psm2_info_query_t;

/* Bits reported by PSM2_INFO_QUERY_CONFIG for a connection. */
enum psm2_info_query_config {
  PSM2_INFO_QUERY_CONFIG_IPS = (1 << 0),      /* fabric transport */
  PSM2_INFO_QUERY_CONFIG_AMSH = (1 << 1),     /* shared-memory transport */
  PSM2_INFO_QUERY_CONFIG_SELF = (1 << 2),     /* loopback transport */
  PSM2_INFO_QUERY_CONFIG_CUDA = (1 << 3),     /* IPS sub-config */
  PSM2_INFO_QUERY_CONFIG_PIO = (1 << 4),      /* IPS sub-config */
  PSM2_INFO_QUERY_CONFIG_DMA = (1 << 5),      /* IPS sub-config */
  PSM2_INFO_QUERY_CONFIG_GDR_COPY = (1 << 6), /* IPS+CUDA sub-config */
};

/* Which threshold PSM2_INFO_QUERY_THRESH reports (argument mstq). */
enum psm2_info_query_thresh_et {
  PSM2_INFO_QUERY_THRESH_IPS_START,
  /* size at which sends move from PIO to DMA */
  PSM2_INFO_QUERY_THRESH_IPS_PIO_DMA = PSM2_INFO_QUERY_THRESH_IPS_START,
  /* largest "tiny" message */
  PSM2_INFO_QUERY_THRESH_IPS_TINY,
  /* largest single-fragment message, PIO and DMA paths */
  PSM2_INFO_QUERY_THRESH_IPS_PIO_FRAG_SIZE,
  PSM2_INFO_QUERY_THRESH_IPS_DMA_FRAG_SIZE,
  /* size from which rendezvous is used */
  PSM2_INFO_QUERY_THRESH_IPS_RNDV,
  PSM2_INFO_QUERY_THRESH_IPS_END = PSM2_INFO_QUERY_THRESH_IPS_RNDV,

  PSM2_INFO_QUERY_THRESH_AMSH_START,
  PSM2_INFO_QUERY_THRESH_AMSH_END = PSM2_INFO_QUERY_THRESH_AMSH_START,

  PSM2_INFO_QUERY_THRESH_SELF_START,
  PSM2_INFO_QUERY_THRESH_SELF_END = PSM2_INFO_QUERY_THRESH_SELF_START,
};

/* Bits reported by PSM2_INFO_QUERY_FEATURE_MASK. */
enum psm2_info_query_feature_mask {
  PSM2_INFO_QUERY_FEATURE_CUDA = (1 << 0), /* library can handle GPU memory */
};

/* One argument of psm2_info_query; which member is used depends on the
 * query (see psm2_info_query_t). */
typedef union psm2_info_query_arg {
  uint32_t unit;
  uint32_t port;
  size_t length;
  psm2_mq_t mq;
  psm2_epaddr_t epaddr;
  enum psm2_info_query_thresh_et mstq;
} psm2_info_query_arg_t;

/* Answer query q into *out using nargs arguments from args.
 * Returns PSM2_OK, PSM2_IQ_INVALID_QUERY or PSM2_PARAM_ERR. */
psm2_error_t psm2_info_query(psm2_info_query_t q, void* out, size_t nargs,
                             psm2_info_query_arg_t args[]);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* PSM2_H */
