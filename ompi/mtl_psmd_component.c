/*
 * The mtl psmd component: registration, the open-time check that psmd
 * answers, and module creation. See mtl_psmd.h.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "mtl_psmd.h"
#include "ompi/mca/mtl/base/base.h"
#include "opal/util/output.h"

/* Above ob1's 20 and psm2's 40: when psmd answers, pml cm with this MTL is
 * what Open MPI picks without flags. */
static int param_priority = 45;
/* Whether open took a psm2_init reference that close must give back. */
static bool psm2_initialized = false;

static int component_register(void);
static int component_open(void);
static int component_close(void);
static int component_query(mca_base_module_t** module, int* priority);
static mca_mtl_base_module_t* component_init(bool enable_progress_threads,
                                             bool enable_mpi_threads);

mca_mtl_psmd_component_t mca_mtl_psmd_component = {
    .super =
        {
            .mtl_version =
                {
                    MCA_MTL_BASE_VERSION_2_0_0,
                    .mca_component_name = "psmd",
                    MCA_BASE_MAKE_VERSION(component, OMPI_MAJOR_VERSION,
                                          OMPI_MINOR_VERSION,
                                          OMPI_RELEASE_VERSION),
                    .mca_open_component = component_open,
                    .mca_close_component = component_close,
                    .mca_query_component = component_query,
                    .mca_register_component_params = component_register,
                },
            .mtl_data = {MCA_BASE_METADATA_PARAM_NONE},
            .mtl_init = component_init,
        },
};

#define VERBOSE(...)                                                \
  opal_output_verbose(10, ompi_mtl_base_framework.framework_output, \
                      "mtl:psmd: " __VA_ARGS__)

static const char* socket_description(void) {
  const char* env = getenv("PSMD_SOCKET");
  return env != NULL && env[0] != '\0'
             ? env
             : "/run/psmd/psmd.sock (the default; set PSMD_SOCKET for another)";
}

static int component_register(void) {
  (void)mca_base_component_var_register(
      &mca_mtl_psmd_component.super.mtl_version, "priority",
      "Priority of the psmd MTL (pml cm takes it over ob1's 20 when higher)",
      MCA_BASE_VAR_TYPE_INT, NULL, 0, 0, OPAL_INFO_LVL_9,
      MCA_BASE_VAR_SCOPE_READONLY, &param_priority);
  return OMPI_SUCCESS;
}

/* Whether the user named this component in "--mca mtl LIST" (an include
 * list; "^..." excludes): then a psmd that is not there is their problem to
 * fix, not a quiet fallback, and Open MPI's own message for it ("Data unpack
 * would read past end of buffer") does not name psmd. */
static bool explicitly_selected(void) {
  const char* list = ompi_mtl_base_framework.framework_selection;
  if (list == NULL || list[0] == '^') return false;
  for (const char* p = list; *p != '\0';) {
    const size_t n = strcspn(p, ",");
    if (n == 4 && strncmp(p, "psmd", 4) == 0) return true;
    p += n + (p[n] == ',');
  }
  return false;
}

/* Available only when psmd's control socket answers a health call; anything
 * else declines quietly (a line at mtl_base_verbose 10 says why) so that
 * Open MPI falls back to its own transports, unless the user asked for this
 * component by name: then one line says what is missing and how to fix it. */
static int component_open(void) {
  int major = PSM2_VERNO_MAJOR, minor = PSM2_VERNO_MINOR;
  if (psm2_init(&major, &minor) != PSM2_OK) {
    VERBOSE("not available: libpsmclient's psm2_init failed");
    return OPAL_ERR_NOT_AVAILABLE;
  }
  psm2_initialized = true;
  psm2_info_query_arg_t unit = {.unit = 0};
  uint32_t status = 0;
  psm2_error_t err =
      psm2_info_query(PSM2_INFO_QUERY_UNIT_STATUS, &status, 1, &unit);
  if (err != PSM2_OK || status != 1) {
    const char* what = err == PSM2_OK && status == 0 ? "does not answer"
                                                     : "has no control socket";
    VERBOSE("not available: psmd %s at %s", what, socket_description());
    if (explicitly_selected()) {
      opal_output(0,
                  "mtl psmd: asked for (--mca mtl psmd), but psmd %s at %s: "
                  "start it (systemctl start psmd) or set PSMD_SOCKET to its "
                  "socket (mpirun -x PSMD_SOCKET)",
                  what, socket_description());
    }
    component_close();
    return OPAL_ERR_NOT_AVAILABLE;
  }
  VERBOSE("available: psmd answers at %s; priority %d", socket_description(),
          param_priority);
  return OMPI_SUCCESS;
}

static int component_close(void) {
  if (psm2_initialized) {
    psm2_initialized = false;
    psm2_finalize();
  }
  return OMPI_SUCCESS;
}

static int component_query(mca_base_module_t** module, int* priority) {
  *priority = param_priority;
  *module = (mca_base_module_t*)&ompi_mtl_psmd.super;
  return OMPI_SUCCESS;
}

static mca_mtl_base_module_t* component_init(bool enable_progress_threads,
                                             bool enable_mpi_threads) {
  if (ompi_mtl_psmd_module_init() != OMPI_SUCCESS) return NULL;
  ompi_mtl_psmd.super.mtl_request_size =
      sizeof(mca_mtl_psmd_request_t) - sizeof(mca_mtl_request_t);
  VERBOSE("selected: endpoint %#llx open on psmd at %s",
          (unsigned long long)ompi_mtl_psmd.epid, socket_description());
  return &ompi_mtl_psmd.super;
}
