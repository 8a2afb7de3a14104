/* open_endpoint [SECONDS [EPIDFILE]]: opens a PSM2 endpoint with the job
 * key in OMPI_MCA_orte_precondition_transports (what psmd's SPANK plugin
 * sets in a step's tasks; "%016llx-%016llx", read as Open MPI's mtl psm2
 * reads it), says what happened on one line, holds the endpoint SECONDS
 * (default 0), then closes it. With EPIDFILE: waits up to SECONDS for that
 * file (epids, one per line in hex, written by the test once every task of
 * both jobs has opened: write it whole, then rename it into place), connects
 * to each epid in it and says "connect EPID: ok" or "connect EPID: refused:
 * REASON" per epid, then holds the endpoint until the test removes EPIDFILE
 * (once every task has connected: an endpoint closed earlier would refuse
 * the connects of its own job's later tasks), at most SECONDS, and closes. Exit
 * 0: opened (whatever the connects did); 3: psmd refused the endpoint (the line
 * carries psmd's reason, which libpsmclient also prints); 2: bad usage or no
 * EPIDFILE in time. For tests/slurm/cluster_test.sh; single-threaded. */
#include <psm2.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

enum { kMaxEpids = 64 };

/* Waits up to `seconds` for `path`, connects `ep` to every epid it lists
 * and prints one line per epid. 0, or 2 when the file did not come. */
static int connect_all(psm2_ep_t ep, const char* path, int seconds) {
  FILE* f = NULL;
  for (int i = 0; i < seconds * 20 && f == NULL; i++) {
    f = fopen(path, "r");
    if (f == NULL) usleep(50000);
  }
  if (f == NULL) {
    fprintf(stderr, "open_endpoint: no %s within %d s\n", path, seconds);
    return 2;
  }
  psm2_epid_t epids[kMaxEpids];
  int n = 0;
  unsigned long long v;
  while (n < kMaxEpids && fscanf(f, "%llx", &v) == 1) epids[n++] = v;
  fclose(f);
  psm2_error_t errors[kMaxEpids];
  psm2_epaddr_t addrs[kMaxEpids];
  /* 5 s: a refusal is an answer, not a timeout, and comes at once. */
  psm2_ep_connect(ep, n, epids, NULL, errors, addrs, 5000000000LL);
  for (int i = 0; i < n; i++) {
    if (errors[i] == PSM2_OK) {
      printf("connect %#llx: ok\n", (unsigned long long)epids[i]);
    } else {
      printf("connect %#llx: refused: %s\n", (unsigned long long)epids[i],
             psm2_error_get_string(errors[i]));
    }
  }
  fflush(stdout);
  for (int i = 0; i < seconds * 20 && access(path, F_OK) == 0; i++) {
    usleep(50000);
  }
  return 0;
}

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
  const char* epid_file = argc > 2 ? argv[2] : NULL;
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
  int status = 0;
  if (epid_file != NULL) {
    status = connect_all(ep, epid_file, hold);
  } else if (hold > 0) {
    sleep((unsigned)hold);
  }
  psm2_ep_close(ep, PSM2_EP_CLOSE_GRACEFUL, 0);
  psm2_finalize();
  return status;
}
