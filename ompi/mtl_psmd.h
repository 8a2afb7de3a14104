/*
 * mtl psmd: an Open MPI 4.1 Matching Transport Layer component that carries
 * MPI point-to-point traffic through psmd, over libpsmclient's PSM2 API
 * (linked into the component, its symbols kept private).
 *
 * An MPI message maps onto one PSM2 MQ message whose 96-bit tag is
 * (MPI tag, sender's rank in the communicator, communicator context id);
 * MPI_ANY_SOURCE and MPI_ANY_TAG become tag selector bits.
 *
 * Thread-safety: as Open MPI's other MTLs, the module relies on its caller
 * (pml cm) for MPI_THREAD_MULTIPLE; libpsmclient's calls are themselves
 * thread-safe, and the module keeps no mutable state besides the PSM2
 * handles set up once at init.
 */
#ifndef PSMD_OMPI_MTL_PSMD_H_
#define PSMD_OMPI_MTL_PSMD_H_

#include <psm2.h>
#include <psm2_mq.h>
#include <stdbool.h>

#include "ompi/mca/mtl/mtl.h"
#include "ompi_config.h"

BEGIN_C_DECLS

typedef struct {
  mca_mtl_base_module_t super;
  psm2_ep_t ep;
  psm2_mq_t mq;
  psm2_epid_t epid;
} mca_mtl_psmd_module_t;

typedef struct {
  mca_mtl_base_component_2_0_0_t super;
} mca_mtl_psmd_component_t;

extern mca_mtl_psmd_module_t ompi_mtl_psmd;
OMPI_DECLSPEC extern mca_mtl_psmd_component_t mca_mtl_psmd_component;

/* What pml cm reserves behind its mca_mtl_request_t for us. */
typedef struct {
  mca_mtl_request_t super;
  psm2_mq_req_t psm_req;
  struct opal_convertor_t* convertor;
  /* The bytes PSM2 reads or writes: the user's buffer when the datatype is
   * contiguous, else a packed copy (free_buf) owned by the request. */
  void* buf;
  size_t length;
  bool free_buf;
  bool is_recv;
} mca_mtl_psmd_request_t;

/* Opens the endpoint and its MQ and publishes the epid through the modex. */
int ompi_mtl_psmd_module_init(void);

/* Called by opal_progress: completes finished PSM2 requests. */
int ompi_mtl_psmd_progress(void);

END_C_DECLS

#endif /* PSMD_OMPI_MTL_PSMD_H_ */
