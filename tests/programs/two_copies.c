// two_copies LIB_A LIB_B: two private copies of libpsmclient in one process,
// as Open MPI has them when mca_mtl_psm2 loads the drop-in libpsm2.so.2 and
// mca_mtl_psmd.so carries its own (tests/two_copies_test.sh). Each is
// dlopened RTLD_LOCAL, initialized, and opens an endpoint on psmd
// ($PSMD_SOCKET); copy A sends 100000 bytes (rendezvous) to copy B, which
// checks them. Both copies make gRPC control calls; before control.proto
// became lite, the second dlopen aborted (a second registration of its
// descriptors in libprotobuf's process-wide pool).
#include <dlfcn.h>
#include <psm2.h>
#include <psm2_mq.h>
#include <stdio.h>
#include <string.h>

// The PSM2 calls used, from one copy.
typedef struct {
  psm2_error_t (*init)(int*, int*);
  psm2_error_t (*ep_open)(const psm2_uuid_t, const struct psm2_ep_open_opts*,
                          psm2_ep_t*, psm2_epid_t*);
  psm2_error_t (*ep_connect)(psm2_ep_t, int, const psm2_epid_t*, const int*,
                             psm2_error_t*, psm2_epaddr_t*, int64_t);
  psm2_error_t (*mq_init)(psm2_ep_t, uint64_t, const struct psm2_optkey*, int,
                          psm2_mq_t*);
  psm2_error_t (*mq_send)(psm2_mq_t, psm2_epaddr_t, uint32_t, uint64_t,
                          const void*, uint32_t);
  psm2_error_t (*mq_irecv)(psm2_mq_t, uint64_t, uint64_t, uint32_t, void*,
                           uint32_t, void*, psm2_mq_req_t*);
  psm2_error_t (*mq_wait)(psm2_mq_req_t*, psm2_mq_status_t*);
  psm2_error_t (*ep_close)(psm2_ep_t, int, int64_t);
  psm2_error_t (*finalize)(void);
} api;

// Looks up psm2_<f> in the copy at h.
#define L(f)                                   \
  do {                                         \
    *(void**)&a->f = dlsym(h, "psm2_" #f);     \
    if (a->f == NULL) {                        \
      printf("%s has no psm2_%s\n", path, #f); \
      return 1;                                \
    }                                          \
  } while (0)

static int load(const char* path, api* a) {
  void* h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (h == NULL) {
    printf("dlopen %s: %s\n", path, dlerror());
    return 1;
  }
  L(init);
  L(ep_open);
  L(ep_connect);
  L(mq_init);
  L(mq_send);
  L(mq_irecv);
  L(mq_wait);
  L(ep_close);
  L(finalize);
  return 0;
}

int main(int argc, char** argv) {
  if (argc != 3) {
    fprintf(stderr, "usage: two_copies LIB_A LIB_B\n");
    return 2;
  }
  api A, B;
  if (load(argv[1], &A) || load(argv[2], &B)) return 1;
  int ma = 2, na = 0, mb = 2, nb = 0;
  if (A.init(&ma, &na) || B.init(&mb, &nb)) {
    printf("init\n");
    return 1;
  }
  psm2_uuid_t u;
  memset(u, 5, sizeof u);
  psm2_ep_t ea, eb;
  psm2_epid_t ia, ib;
  if (A.ep_open(u, NULL, &ea, &ia) || B.ep_open(u, NULL, &eb, &ib)) {
    printf("ep_open\n");
    return 1;
  }
  psm2_epaddr_t ab, ba;
  psm2_error_t e;
  if (A.ep_connect(ea, 1, &ib, NULL, &e, &ab, 0) ||
      B.ep_connect(eb, 1, &ia, NULL, &e, &ba, 0)) {
    printf("connect\n");
    return 1;
  }
  psm2_mq_t qa, qb;
  A.mq_init(ea, PSM2_MQ_ORDERMASK_ALL, NULL, 0, &qa);
  B.mq_init(eb, PSM2_MQ_ORDERMASK_ALL, NULL, 0, &qb);
  char out[100000], in[100000];
  for (size_t i = 0; i < sizeof out; i++) out[i] = (char)(i * 7 + i / 251);
  memset(in, 0, sizeof in);
  psm2_mq_req_t r;
  B.mq_irecv(qb, 42, ~0ull, 0, in, sizeof in, NULL, &r);
  if (A.mq_send(qa, ab, 0, 42, out, sizeof out)) {
    printf("send\n");
    return 1;
  }
  psm2_mq_status_t st;
  if (B.mq_wait(&r, &st) || st.nbytes != sizeof in ||
      memcmp(in, out, sizeof in)) {
    printf("recv\n");
    return 1;
  }
  A.ep_close(ea, PSM2_EP_CLOSE_GRACEFUL, 0);
  B.ep_close(eb, PSM2_EP_CLOSE_GRACEFUL, 0);
  A.finalize();
  B.finalize();
  printf("two copies: OK, %zu bytes\n", sizeof in);
  return 0;
}
