/* corrupt_rx.c: an LD_PRELOAD interposer for the negative control of
 * fi_pingpong's data check (//tests/mpi:fi_pingpong_corrupted). It sits
 * between the application (libfabric's psm2 provider) and libpsm2.so.2,
 * remembers the buffer of every receive posted with psm2_mq_irecv2 or
 * psm2_mq_imrecv, and when the Nth receive that delivered at least one byte
 * completes (psm2_mq_test2, psm2_mq_wait2, psm2_mq_test, psm2_mq_wait;
 * N = CORRUPT_RX_NTH, default 3) it inverts the middle byte of what was
 * delivered, as a library that delivered a wrong payload would, and says so
 * on stderr ("corrupt_rx: inverted byte ..."). The library itself is not
 * touched; test builds only (never installed). */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

#include "psm2.h"
#include "psm2_mq.h"

enum { kSlots = 256 };
static struct {
  psm2_mq_req_t req;
  unsigned char* buf;
} posted[kSlots];
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static long completed; /* receives that delivered a byte or more */

static void* real(const char* name) {
  void* f = dlvsym(RTLD_NEXT, name, "PSM2_1.0");
  if (!f) f = dlsym(RTLD_NEXT, name);
  if (!f) {
    fprintf(stderr, "corrupt_rx: no %s after this library\n", name);
    abort();
  }
  return f;
}

static void remember(psm2_mq_req_t req, void* buf) {
  pthread_mutex_lock(&lock);
  for (int i = 0; i < kSlots; i++) {
    if (!posted[i].req) {
      posted[i].req = req;
      posted[i].buf = buf;
      break;
    }
  }
  pthread_mutex_unlock(&lock);
}

/* `req` (the handle before the call) completed with `nbytes` delivered. */
static void completed_req(psm2_mq_req_t req, uint32_t nbytes) {
  pthread_mutex_lock(&lock);
  for (int i = 0; i < kSlots; i++) {
    if (req && posted[i].req == req) {
      posted[i].req = NULL;
      const char* nth = getenv("CORRUPT_RX_NTH");
      if (nbytes > 0 && ++completed == (nth ? atol(nth) : 3)) {
        posted[i].buf[nbytes / 2] ^= 0xff;
        fprintf(stderr,
                "corrupt_rx: inverted byte %u of receive %ld (%u bytes)\n",
                nbytes / 2, completed, nbytes);
      }
      break;
    }
  }
  pthread_mutex_unlock(&lock);
}

psm2_error_t psm2_mq_irecv2(psm2_mq_t mq, psm2_epaddr_t src,
                            psm2_mq_tag_t* rtag, psm2_mq_tag_t* rtagsel,
                            uint32_t flags, void* buf, uint32_t len,
                            void* context, psm2_mq_req_t* req) {
  static psm2_error_t (*f)(psm2_mq_t, psm2_epaddr_t, psm2_mq_tag_t*,
                           psm2_mq_tag_t*, uint32_t, void*, uint32_t, void*,
                           psm2_mq_req_t*);
  if (!f) f = real("psm2_mq_irecv2");
  psm2_error_t err = f(mq, src, rtag, rtagsel, flags, buf, len, context, req);
  if (err == PSM2_OK) remember(*req, buf);
  return err;
}

psm2_error_t psm2_mq_imrecv(psm2_mq_t mq, uint32_t flags, void* buf,
                            uint32_t len, void* context, psm2_mq_req_t* reqo) {
  static psm2_error_t (*f)(psm2_mq_t, uint32_t, void*, uint32_t, void*,
                           psm2_mq_req_t*);
  if (!f) f = real("psm2_mq_imrecv");
  psm2_error_t err = f(mq, flags, buf, len, context, reqo);
  if (err == PSM2_OK) remember(*reqo, buf);
  return err;
}

#define COMPLETION(name, status_t)                                            \
  psm2_error_t name(psm2_mq_req_t* request, status_t* status) {               \
    static psm2_error_t (*f)(psm2_mq_req_t*, status_t*);                      \
    if (!f) f = real(#name);                                                  \
    psm2_mq_req_t req = *request;                                             \
    status_t own;                                                             \
    psm2_error_t err = f(request, status ? status : &own);                    \
    if (err == PSM2_OK) completed_req(req, (status ? status : &own)->nbytes); \
    return err;                                                               \
  }
COMPLETION(psm2_mq_test2, psm2_mq_status2_t)
COMPLETION(psm2_mq_wait2, psm2_mq_status2_t)
COMPLETION(psm2_mq_test, psm2_mq_status_t)
COMPLETION(psm2_mq_wait, psm2_mq_status_t)
