/*
 * The mtl psmd module: MPI point-to-point over libpsmclient's PSM2 MQ API.
 * See mtl_psmd.h for the tag layout and the thread-safety contract.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mtl_psmd.h"
#include "ompi/communicator/communicator.h"
#include "ompi/mca/mtl/base/base.h"
#include "ompi/mca/mtl/base/mtl_base_datatype.h"
#include "ompi/mca/rte/rte.h"
#include "ompi/message/message.h"
#include "ompi/proc/proc.h"
#include "ompi/request/request.h"
#include "opal/datatype/opal_convertor.h"
#include "opal/mca/pmix/pmix.h"
#include "opal/runtime/opal_progress.h"
#include "opal/util/output.h"

static int mtl_add_procs(struct mca_mtl_base_module_t* mtl, size_t nprocs,
                         struct ompi_proc_t** procs);
static int mtl_del_procs(struct mca_mtl_base_module_t* mtl, size_t nprocs,
                         struct ompi_proc_t** procs);
static int mtl_finalize(struct mca_mtl_base_module_t* mtl);
static int mtl_send(struct mca_mtl_base_module_t* mtl,
                    struct ompi_communicator_t* comm, int dest, int tag,
                    struct opal_convertor_t* convertor,
                    mca_pml_base_send_mode_t mode);
static int mtl_isend(struct mca_mtl_base_module_t* mtl,
                     struct ompi_communicator_t* comm, int dest, int tag,
                     struct opal_convertor_t* convertor,
                     mca_pml_base_send_mode_t mode, bool blocking,
                     mca_mtl_request_t* mtl_request);
static int mtl_irecv(struct mca_mtl_base_module_t* mtl,
                     struct ompi_communicator_t* comm, int src, int tag,
                     struct opal_convertor_t* convertor,
                     mca_mtl_request_t* mtl_request);
static int mtl_iprobe(struct mca_mtl_base_module_t* mtl,
                      struct ompi_communicator_t* comm, int src, int tag,
                      int* flag, struct ompi_status_public_t* status);
static int mtl_improbe(struct mca_mtl_base_module_t* mtl,
                       struct ompi_communicator_t* comm, int src, int tag,
                       int* matched, struct ompi_message_t** message,
                       struct ompi_status_public_t* status);
static int mtl_imrecv(struct mca_mtl_base_module_t* mtl,
                      struct opal_convertor_t* convertor,
                      struct ompi_message_t** message,
                      mca_mtl_request_t* mtl_request);
static int mtl_cancel(struct mca_mtl_base_module_t* mtl,
                      mca_mtl_request_t* mtl_request, int flag);
static int mtl_add_comm(struct mca_mtl_base_module_t* mtl,
                        struct ompi_communicator_t* comm);
static int mtl_del_comm(struct mca_mtl_base_module_t* mtl,
                        struct ompi_communicator_t* comm);

mca_mtl_psmd_module_t ompi_mtl_psmd = {
    .super =
        {
            /* The context id is a whole 32-bit tag word; Open MPI's cids
             * are ints. */
            .mtl_max_contextid = INT32_MAX,
            /* MPI tags, including Open MPI's negative internal ones, are
             * the other 32-bit word. */
            .mtl_max_tag = INT32_MAX,
            .mtl_add_procs = mtl_add_procs,
            .mtl_del_procs = mtl_del_procs,
            .mtl_finalize = mtl_finalize,
            .mtl_send = mtl_send,
            .mtl_isend = mtl_isend,
            .mtl_irecv = mtl_irecv,
            .mtl_iprobe = mtl_iprobe,
            .mtl_imrecv = mtl_imrecv,
            .mtl_improbe = mtl_improbe,
            .mtl_cancel = mtl_cancel,
            .mtl_add_comm = mtl_add_comm,
            .mtl_del_comm = mtl_del_comm,
        },
};

#define MTL_OUTPUT ompi_mtl_base_framework.framework_output

/* The largest message one PSM2 MQ call carries (its length is 32 bits). */
#define MAX_MESSAGE_BYTES 0xffffffffULL

static void make_tag(psm2_mq_tag_t* tag, uint32_t cid, int rank, int mpi_tag) {
  tag->tag0 = (uint32_t)mpi_tag;
  tag->tag1 = (uint32_t)rank;
  tag->tag2 = cid;
}

/* The tag and selector a receive or probe matches with. MPI_ANY_TAG must
 * match user tags (>= 0) but never Open MPI's negative collective tags, so
 * it keeps only the sign bit. */
static void make_match(psm2_mq_tag_t* tag, psm2_mq_tag_t* sel, uint32_t cid,
                       int src, int mpi_tag) {
  make_tag(tag, cid, src, mpi_tag);
  sel->tag0 = sel->tag1 = sel->tag2 = 0xffffffffu;
  if (mpi_tag == MPI_ANY_TAG) {
    tag->tag0 = 0;
    sel->tag0 = 0x80000000u;
  }
  if (src == MPI_ANY_SOURCE) {
    tag->tag1 = 0;
    sel->tag1 = 0;
  }
}

static int error_of(psm2_error_t err) {
  switch (err) {
    case PSM2_OK:
      return OMPI_SUCCESS;
    case PSM2_MQ_TRUNCATION:
      return MPI_ERR_TRUNCATE;
    default:
      return MPI_ERR_INTERN;
  }
}

static void fill_status(struct ompi_status_public_t* status,
                        const psm2_mq_status2_t* ps) {
  status->MPI_SOURCE = (int)ps->msg_tag.tag1;
  status->MPI_TAG = (int)ps->msg_tag.tag0;
  status->_ucount = ps->msg_length;
  status->MPI_ERROR = error_of(ps->error_code);
}

/* Set while add_procs connects: that call's failures are its return value. */
static volatile int connecting;

/* psmd tells an endpoint when a node it had connected to is lost (that
 * node's psmd or the link to it down, PSM2_EPID_UNREACHABLE, or silent,
 * PSM2_TIMEOUT), through this handler, from whichever call learnt it. The
 * ranks there cannot be reached, and what they sent and was not received yet
 * is lost, so a receive from MPI_ANY_SOURCE could wait forever: end the job,
 * as Open MPI does when a process dies. Other errors go back to their call. */
static psm2_error_t mtl_errhandler(psm2_ep_t ep, const psm2_error_t error,
                                   const char* error_string,
                                   psm2_error_token_t token) {
  (void)ep;
  (void)token;
  if (!connecting &&
      (error == PSM2_EPID_UNREACHABLE || error == PSM2_TIMEOUT)) {
    /* libpsmclient has printed error_string (unless PSM2_NO_VERBOSE_ERRORS). */
    (void)error_string;
    opal_output(0, "mtl psmd: ending the job: %s",
                psm2_error_get_string(error));
    ompi_rte_abort(1, NULL);
  }
  return error;
}

int ompi_mtl_psmd_module_init(void) {
  /* mpirun's per-job key: every rank of the job opens with the same one. */
  const char* key = getenv(OPAL_MCA_PREFIX "orte_precondition_transports");
  psm2_uuid_t uuid;
  unsigned long long words[2];
  if (key == NULL || strlen(key) != 33 ||
      sscanf(key, "%016llx-%016llx", &words[0], &words[1]) != 2) {
    opal_output(0, "mtl psmd: no job key in " OPAL_MCA_PREFIX
                   "orte_precondition_transports (is this program started by "
                   "mpirun?)");
    return OMPI_ERROR;
  }
  memcpy(uuid, words, sizeof(uuid));

  psm2_ep_t ep;
  psm2_epid_t epid;
  psm2_error_t err = psm2_ep_open(uuid, NULL, &ep, &epid);
  if (err != PSM2_OK) {
    opal_output(0, "mtl psmd: cannot open an endpoint on psmd: %s",
                psm2_error_get_string(err));
    return OMPI_ERROR;
  }
  psm2_mq_t mq;
  err = psm2_mq_init(ep, PSM2_MQ_ORDERMASK_ALL, NULL, 0, &mq);
  if (err != PSM2_OK) {
    opal_output(0, "mtl psmd: psm2_mq_init: %s", psm2_error_get_string(err));
    psm2_ep_close(ep, PSM2_EP_CLOSE_FORCE, 0);
    return OMPI_ERROR;
  }
  psm2_error_register_handler(ep, mtl_errhandler);
  ompi_mtl_psmd.ep = ep;
  ompi_mtl_psmd.mq = mq;
  ompi_mtl_psmd.epid = epid;

  int rc;
  OPAL_MODEX_SEND(rc, OPAL_PMIX_GLOBAL,
                  &mca_mtl_psmd_component.super.mtl_version, &epid,
                  sizeof(epid));
  if (rc != OMPI_SUCCESS) {
    opal_output(0, "mtl psmd: cannot publish the endpoint id (modex)");
    mtl_finalize(&ompi_mtl_psmd.super);
    return OMPI_ERROR;
  }
  opal_progress_register(ompi_mtl_psmd_progress);
  return OMPI_SUCCESS;
}

static int mtl_finalize(struct mca_mtl_base_module_t* mtl) {
  opal_progress_unregister(ompi_mtl_psmd_progress);
  int rc = OMPI_SUCCESS;
  if (ompi_mtl_psmd.mq != NULL) {
    psm2_mq_finalize(ompi_mtl_psmd.mq);
    ompi_mtl_psmd.mq = NULL;
  }
  if (ompi_mtl_psmd.ep != NULL) {
    psm2_error_t err =
        psm2_ep_close(ompi_mtl_psmd.ep, PSM2_EP_CLOSE_GRACEFUL, 1000000000LL);
    if (err != PSM2_OK) {
      opal_output(0, "mtl psmd: psm2_ep_close: %s", psm2_error_get_string(err));
      rc = OMPI_ERROR;
    }
    ompi_mtl_psmd.ep = NULL;
  }
  /* The psm2_init reference is the component's (released at close). */
  return rc;
}

/* Connects to every proc not connected yet, in one psm2_ep_connect (one
 * control call to psmd), with the epids the peers published. */
static int mtl_add_procs(struct mca_mtl_base_module_t* mtl, size_t nprocs,
                         struct ompi_proc_t** procs) {
  if (nprocs == 0) return OMPI_SUCCESS;
  psm2_epid_t* epids = calloc(nprocs, sizeof(*epids));
  int* mask = calloc(nprocs, sizeof(*mask));
  psm2_error_t* errs = calloc(nprocs, sizeof(*errs));
  psm2_epaddr_t* addrs = calloc(nprocs, sizeof(*addrs));
  int rc = OMPI_ERR_OUT_OF_RESOURCE;
  if (epids == NULL || mask == NULL || errs == NULL || addrs == NULL) goto out;

  int wanted = 0;
  for (size_t i = 0; i < nprocs; i++) {
    if (procs[i]->proc_endpoints[OMPI_PROC_ENDPOINT_TAG_MTL] != NULL) continue;
    psm2_epid_t* epid = NULL;
    size_t size = 0;
    OPAL_MODEX_RECV(rc, &mca_mtl_psmd_component.super.mtl_version,
                    &procs[i]->super.proc_name, (void**)&epid, &size);
    if (rc != OMPI_SUCCESS || epid == NULL || size != sizeof(*epid)) {
      opal_output(0,
                  "mtl psmd: %s published no psmd endpoint id (does every "
                  "rank use mtl psmd?)",
                  OPAL_NAME_PRINT(procs[i]->super.proc_name));
      free(epid);
      rc = OMPI_ERR_UNREACH;
      goto out;
    }
    epids[i] = *epid;
    free(epid);
    mask[i] = 1;
    wanted++;
  }
  rc = OMPI_SUCCESS;
  if (wanted == 0) goto out;

  connecting = 1;
  psm2_error_t err = psm2_ep_connect(ompi_mtl_psmd.ep, (int)nprocs, epids, mask,
                                     errs, addrs, 30000000000LL);
  connecting = 0;
  if (err != PSM2_OK) {
    for (size_t i = 0; i < nprocs; i++) {
      if (mask[i] && errs[i] != PSM2_OK) {
        opal_output(0, "mtl psmd: cannot connect to %s (epid %#llx): %s",
                    OPAL_NAME_PRINT(procs[i]->super.proc_name),
                    (unsigned long long)epids[i],
                    psm2_error_get_string(errs[i]));
      }
    }
    rc = OMPI_ERR_UNREACH;
    goto out;
  }
  for (size_t i = 0; i < nprocs; i++) {
    if (mask[i])
      procs[i]->proc_endpoints[OMPI_PROC_ENDPOINT_TAG_MTL] = addrs[i];
  }
out:
  free(epids);
  free(mask);
  free(errs);
  free(addrs);
  return rc;
}

static int mtl_del_procs(struct mca_mtl_base_module_t* mtl, size_t nprocs,
                         struct ompi_proc_t** procs) {
  for (size_t i = 0; i < nprocs; i++) {
    psm2_epaddr_t addr = procs[i]->proc_endpoints[OMPI_PROC_ENDPOINT_TAG_MTL];
    if (addr == NULL) continue;
    psm2_error_t err;
    psm2_ep_disconnect2(ompi_mtl_psmd.ep, 1, &addr, NULL, &err,
                        PSM2_EP_DISCONNECT_GRACEFUL, 0);
    procs[i]->proc_endpoints[OMPI_PROC_ENDPOINT_TAG_MTL] = NULL;
  }
  return OMPI_SUCCESS;
}

/* The peer's address; a peer not met before (Open MPI adds procs lazily
 * past mpi_add_procs_cutoff) is connected now. */
static psm2_epaddr_t peer_addr(struct ompi_communicator_t* comm, int rank) {
  ompi_proc_t* proc = ompi_comm_peer_lookup(comm, rank);
  if (proc->proc_endpoints[OMPI_PROC_ENDPOINT_TAG_MTL] == NULL &&
      mtl_add_procs(&ompi_mtl_psmd.super, 1, &proc) != OMPI_SUCCESS) {
    return NULL;
  }
  return proc->proc_endpoints[OMPI_PROC_ENDPOINT_TAG_MTL];
}

/* Buffered and ready sends are standard sends to PSM2 (pml cm has already
 * copied a buffered send's data); synchronous ones complete only once
 * matched. */
static uint32_t send_flags(mca_pml_base_send_mode_t mode) {
  return mode == MCA_PML_BASE_SEND_SYNCHRONOUS ? PSM2_MQ_FLAG_SENDSYNC : 0;
}

/* The bytes to send: the user's own when the datatype is contiguous, else a
 * packed copy. */
static int pack(mca_mtl_psmd_request_t* req,
                struct opal_convertor_t* convertor) {
  int rc = ompi_mtl_datatype_pack(convertor, &req->buf, &req->length,
                                  &req->free_buf);
  if (rc != OMPI_SUCCESS) return rc;
  if (req->length > MAX_MESSAGE_BYTES) {
    opal_output(0, "mtl psmd: a %zu-byte message is over PSM2's 4 GiB limit",
                req->length);
    if (req->free_buf) free(req->buf);
    return OMPI_ERR_NOT_SUPPORTED;
  }
  return OMPI_SUCCESS;
}

static int mtl_send(struct mca_mtl_base_module_t* mtl,
                    struct ompi_communicator_t* comm, int dest, int tag,
                    struct opal_convertor_t* convertor,
                    mca_pml_base_send_mode_t mode) {
  psm2_epaddr_t addr = peer_addr(comm, dest);
  if (addr == NULL) return OMPI_ERR_UNREACH;
  mca_mtl_psmd_request_t req;
  int rc = pack(&req, convertor);
  if (rc != OMPI_SUCCESS) return rc;
  psm2_mq_tag_t mqtag;
  make_tag(&mqtag, ompi_comm_get_cid(comm), comm->c_my_rank, tag);
  psm2_error_t err = psm2_mq_send2(ompi_mtl_psmd.mq, addr, send_flags(mode),
                                   &mqtag, req.buf, (uint32_t)req.length);
  if (req.free_buf) free(req.buf);
  /* While the send blocked in PSM2, receives may have completed there (a
   * synchronous send to self, for one): hand them to MPI now rather than at
   * the next progress call, so that a test right after the send sees them. */
  ompi_mtl_psmd_progress();
  return err == PSM2_OK ? OMPI_SUCCESS : OMPI_ERROR;
}

static int mtl_isend(struct mca_mtl_base_module_t* mtl,
                     struct ompi_communicator_t* comm, int dest, int tag,
                     struct opal_convertor_t* convertor,
                     mca_pml_base_send_mode_t mode, bool blocking,
                     mca_mtl_request_t* mtl_request) {
  mca_mtl_psmd_request_t* req = (mca_mtl_psmd_request_t*)mtl_request;
  psm2_epaddr_t addr = peer_addr(comm, dest);
  if (addr == NULL) return OMPI_ERR_UNREACH;
  int rc = pack(req, convertor);
  if (rc != OMPI_SUCCESS) return rc;
  req->convertor = convertor;
  req->is_recv = false;
  psm2_mq_tag_t mqtag;
  make_tag(&mqtag, ompi_comm_get_cid(comm), comm->c_my_rank, tag);
  psm2_error_t err =
      psm2_mq_isend2(ompi_mtl_psmd.mq, addr, send_flags(mode), &mqtag, req->buf,
                     (uint32_t)req->length, req, &req->psm_req);
  if (err != PSM2_OK) {
    if (req->free_buf) free(req->buf);
    return OMPI_ERROR;
  }
  return OMPI_SUCCESS;
}

/* Where a receive lands: the user's buffer for a contiguous datatype, else a
 * bounce buffer unpacked at completion. */
static int recv_buffer(mca_mtl_psmd_request_t* req,
                       struct opal_convertor_t* convertor) {
  int rc = ompi_mtl_datatype_recv_buf(convertor, &req->buf, &req->length,
                                      &req->free_buf);
  if (rc != OMPI_SUCCESS) return rc;
  if (req->free_buf && req->buf == NULL) return OMPI_ERR_OUT_OF_RESOURCE;
  if (req->length > MAX_MESSAGE_BYTES) req->length = MAX_MESSAGE_BYTES;
  req->convertor = convertor;
  req->is_recv = true;
  return OMPI_SUCCESS;
}

static int mtl_irecv(struct mca_mtl_base_module_t* mtl,
                     struct ompi_communicator_t* comm, int src, int tag,
                     struct opal_convertor_t* convertor,
                     mca_mtl_request_t* mtl_request) {
  mca_mtl_psmd_request_t* req = (mca_mtl_psmd_request_t*)mtl_request;
  int rc = recv_buffer(req, convertor);
  if (rc != OMPI_SUCCESS) return rc;
  psm2_mq_tag_t mqtag, sel;
  make_match(&mqtag, &sel, ompi_comm_get_cid(comm), src, tag);
  psm2_error_t err =
      psm2_mq_irecv2(ompi_mtl_psmd.mq, PSM2_MQ_ANY_ADDR, &mqtag, &sel, 0,
                     req->buf, (uint32_t)req->length, req, &req->psm_req);
  if (err != PSM2_OK) {
    if (req->free_buf) free(req->buf);
    return OMPI_ERROR;
  }
  return OMPI_SUCCESS;
}

static int mtl_iprobe(struct mca_mtl_base_module_t* mtl,
                      struct ompi_communicator_t* comm, int src, int tag,
                      int* flag, struct ompi_status_public_t* status) {
  psm2_mq_tag_t mqtag, sel;
  psm2_mq_status2_t ps;
  make_match(&mqtag, &sel, ompi_comm_get_cid(comm), src, tag);
  psm2_error_t err =
      psm2_mq_iprobe2(ompi_mtl_psmd.mq, PSM2_MQ_ANY_ADDR, &mqtag, &sel, &ps);
  if (err == PSM2_MQ_NO_COMPLETIONS) {
    *flag = 0;
    return OMPI_SUCCESS;
  }
  if (err != PSM2_OK) return OMPI_ERROR;
  *flag = 1;
  if (status != MPI_STATUS_IGNORE) fill_status(status, &ps);
  return OMPI_SUCCESS;
}

static int mtl_improbe(struct mca_mtl_base_module_t* mtl,
                       struct ompi_communicator_t* comm, int src, int tag,
                       int* matched, struct ompi_message_t** message,
                       struct ompi_status_public_t* status) {
  psm2_mq_tag_t mqtag, sel;
  psm2_mq_status2_t ps;
  psm2_mq_req_t psm_req;
  make_match(&mqtag, &sel, ompi_comm_get_cid(comm), src, tag);
  psm2_error_t err = psm2_mq_improbe2(ompi_mtl_psmd.mq, PSM2_MQ_ANY_ADDR,
                                      &mqtag, &sel, &psm_req, &ps);
  if (err == PSM2_MQ_NO_COMPLETIONS) {
    *matched = 0;
    *message = MPI_MESSAGE_NULL;
    return OMPI_SUCCESS;
  }
  if (err != PSM2_OK) return OMPI_ERROR;
  ompi_message_t* msg = ompi_message_alloc();
  if (msg == NULL) {
    /* The message is already dequeued: a lost message must not pass
     * silently. */
    opal_output(0, "mtl psmd: out of memory for an MPI_Message");
    return OMPI_ERR_OUT_OF_RESOURCE;
  }
  msg->comm = comm;
  msg->req_ptr = psm_req;
  msg->peer = (int)ps.msg_tag.tag1;
  msg->count = ps.msg_length;
  *message = msg;
  *matched = 1;
  if (status != MPI_STATUS_IGNORE) fill_status(status, &ps);
  return OMPI_SUCCESS;
}

static int mtl_imrecv(struct mca_mtl_base_module_t* mtl,
                      struct opal_convertor_t* convertor,
                      struct ompi_message_t** message,
                      mca_mtl_request_t* mtl_request) {
  mca_mtl_psmd_request_t* req = (mca_mtl_psmd_request_t*)mtl_request;
  int rc = recv_buffer(req, convertor);
  if (rc != OMPI_SUCCESS) return rc;
  psm2_mq_req_t psm_req = (*message)->req_ptr;
  psm2_error_t err = psm2_mq_imrecv(ompi_mtl_psmd.mq, 0, req->buf,
                                    (uint32_t)req->length, req, &psm_req);
  if (err != PSM2_OK) {
    if (req->free_buf) free(req->buf);
    return OMPI_ERROR;
  }
  req->psm_req = psm_req;
  ompi_message_return(*message);
  *message = MPI_MESSAGE_NULL;
  return OMPI_SUCCESS;
}

/* Only a receive not yet matched can be cancelled; a send always goes. */
static int mtl_cancel(struct mca_mtl_base_module_t* mtl,
                      mca_mtl_request_t* mtl_request, int flag) {
  mca_mtl_psmd_request_t* req = (mca_mtl_psmd_request_t*)mtl_request;
  if (!req->is_recv) return OMPI_SUCCESS;
  if (psm2_mq_cancel(&req->psm_req) != PSM2_OK) return OMPI_SUCCESS;
  psm2_mq_status2_t ps;
  psm2_mq_test2(&req->psm_req, &ps);
  if (req->free_buf) free(req->buf);
  mtl_request->ompi_req->req_status._cancelled = true;
  mtl_request->completion_callback(mtl_request);
  return OMPI_SUCCESS;
}

static int mtl_add_comm(struct mca_mtl_base_module_t* mtl,
                        struct ompi_communicator_t* comm) {
  return OMPI_SUCCESS;
}

static int mtl_del_comm(struct mca_mtl_base_module_t* mtl,
                        struct ompi_communicator_t* comm) {
  return OMPI_SUCCESS;
}

int ompi_mtl_psmd_progress(void) {
  int completed = 0;
  for (;;) {
    psm2_mq_req_t psm_req;
    psm2_error_t err = psm2_mq_ipeek2(ompi_mtl_psmd.mq, &psm_req, NULL);
    if (err == PSM2_MQ_NO_COMPLETIONS) break;
    psm2_mq_status2_t ps;
    if (err == PSM2_OK) err = psm2_mq_test2(&psm_req, &ps);
    if (err != PSM2_OK) {
      opal_output(0, "mtl psmd: polling psmd failed: %s",
                  psm2_error_get_string(err));
      break;
    }
    mca_mtl_psmd_request_t* req = ps.context;
    struct ompi_request_t* ompi_req = req->super.ompi_req;
    if (req->is_recv) {
      ompi_req->req_status.MPI_SOURCE = (int)ps.msg_tag.tag1;
      ompi_req->req_status.MPI_TAG = (int)ps.msg_tag.tag0;
      ompi_req->req_status._ucount = ps.nbytes;
      /* Unpacks (and frees) the bounce buffer of a non-contiguous type. */
      if (ps.nbytes > 0) {
        ompi_mtl_datatype_unpack(req->convertor, req->buf, ps.nbytes);
      } else if (req->free_buf) {
        free(req->buf);
      }
    } else if (req->free_buf) {
      free(req->buf);
    }
    ompi_req->req_status.MPI_ERROR = error_of(ps.error_code);
    req->super.completion_callback(&req->super);
    completed++;
  }
  return completed;
}
