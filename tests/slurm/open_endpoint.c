/* open_endpoint [SECONDS]: opens a PSM2 endpoint with the job key in
 * OMPI_MCA_orte_precondition_transports (what psmd's SPANK plugin sets in a
 * step's tasks; "%016llx-%016llx", read as Open MPI's mtl psm2 reads it),
 * says what happened on one line, holds the endpoint SECONDS (default 0),
 * then closes it. Exit 0: opened; 3: psmd refused it (the line carries
 * psmd's reason, which libpsmclient also prints); 2: bad usage.
 * For tests/slurm/cluster_test.sh; single-threaded. */
#include <psm2.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int main(int argc, char** argv) {
  const char* key = getenv("OMPI_MCA_orte_precondition_transports");
  unsigned long long words[2];
  if (key == NULL || strlen(key) != 33 ||
      sscanf(key, "%016llx-%016llx", &words[0], &words[1]) != 2) {
    fprintf(stderr,
            "open_endpoint: no job key in "
            "OMPI_MCA_orte_precondition_transports\n");
    return 2;
  }
  int hold = argc > 1 ? atoi(argv[1]) : 0;
  psm2_uuid_t uuid;
  memcpy(uuid, words, sizeof(uuid));
  int major = PSM2_VERNO_MAJOR, minor = PSM2_VERNO_MINOR;
  if (psm2_init(&major, &minor) != PSM2_OK) {
    fprintf(stderr, "open_endpoint: psm2_init failed\n");
    return 2;
  }
  psm2_ep_t ep;
  psm2_epid_t epid;
  psm2_error_t err = psm2_ep_open(uuid, NULL, &ep, &epid);
  if (err != PSM2_OK) {
    printf("refused: key %s: %s\n", key, psm2_error_get_string(err));
    fflush(stdout);
    psm2_finalize();
    return 3;
  }
  printf("opened: key %s epid %#llx\n", key, (unsigned long long)epid);
  fflush(stdout);
  if (hold > 0) sleep((unsigned)hold);
  psm2_ep_close(ep, PSM2_EP_CLOSE_GRACEFUL, 0);
  psm2_finalize();
  return 0;
}
