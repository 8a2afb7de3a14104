// handover_hold: endpoints with deep queues for scripts/bench_handover.sh,
// which hands psmd over (psmctl upgrade) while they are held open and
// reports the blackout; then checks that every queued message and posted
// receive came through intact.
//
//   handover_hold --endpoints N --depth D --dir DIR
//
// Opens N endpoints in this process (PSM2_MULTI_EP), in jobs of 32
// endpoints, each connected to its partner (i ^ 1). Each posts D receives
// that nothing matches yet and sends its partner D 8-byte messages that
// nothing receives yet (unexpected there), then writes DIR/ready and waits
// for DIR/go. Then each sends its partner the D messages its receives wait
// for, and receives the D messages queued for it, checking every payload;
// prints "verified N endpoints D deep" and exits 0, or names what failed
// and exits 1.
#include <psm2.h>
#include <psm2_mq.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "tests/programs/rendezvous.h"

using psmd::testing::CheckPsm;

namespace {

constexpr int kJobSize = 32;
constexpr uint32_t kQueued = 0xbeef;  // sent first, received after
constexpr uint32_t kPosted = 0xdead;  // received first, sent after
constexpr int64_t kTimeoutNs = 60'000'000'000LL;

struct Ep {
  psm2_ep_t ep;
  psm2_epid_t epid;
  psm2_mq_t mq;
  psm2_epaddr_t partner;
};

uint64_t Payload(uint32_t kind, int from, int i) {
  return (uint64_t{kind} << 48) ^ (uint64_t(from) << 24) ^ uint64_t(i);
}

psm2_mq_tag_t Tag(uint32_t kind, int from, int i) {
  psm2_mq_tag_t t;
  t.tag0 = kind;
  t.tag1 = static_cast<uint32_t>(from);
  t.tag2 = static_cast<uint32_t>(i);
  return t;
}

void WaitAll(std::vector<psm2_mq_req_t>& reqs, const char* what) {
  for (psm2_mq_req_t& r : reqs) {
    psm2_mq_status2_t st;
    CheckPsm(psm2_mq_wait2(&r, &st), what);
    if (st.error_code != PSM2_OK) {
      fprintf(stderr, "handover_hold: %s ended with %d\n", what, st.error_code);
      exit(1);
    }
  }
  reqs.clear();
}

// Each endpoint i posts `depth` receives of `recv_kind` from its partner
// (into its part of *bufs) and sends its partner `depth` messages of
// `send_kind` (from its part of *out, which must outlive the sends).
void PostAndSend(std::vector<Ep>& eps, int depth, uint32_t recv_kind,
                 uint32_t send_kind, std::vector<uint64_t>* bufs,
                 std::vector<uint64_t>* out, std::vector<psm2_mq_req_t>* recvs,
                 std::vector<psm2_mq_req_t>* sends) {
  psm2_mq_tag_t all;
  all.tag0 = all.tag1 = all.tag2 = 0xffffffffu;
  const int n = static_cast<int>(eps.size());
  for (int i = 0; i < n; i++) {
    for (int k = 0; k < depth; k++) {
      psm2_mq_tag_t t = Tag(recv_kind, i ^ 1, k);
      psm2_mq_req_t r;
      CheckPsm(psm2_mq_irecv2(eps[i].mq, PSM2_MQ_ANY_ADDR, &t, &all, 0,
                              &(*bufs)[size_t(i) * depth + k], 8, nullptr, &r),
               "psm2_mq_irecv2");
      recvs->push_back(r);
      uint64_t& v = (*out)[size_t(i) * depth + k];
      v = Payload(send_kind, i, k);
      psm2_mq_tag_t q = Tag(send_kind, i, k);
      CheckPsm(
          psm2_mq_isend2(eps[i].mq, eps[i].partner, 0, &q, &v, 8, nullptr, &r),
          "psm2_mq_isend2");
      sends->push_back(r);
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  int n = 2, depth = 100;
  std::string dir;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string a = argv[i];
    if (a == "--endpoints") n = atoi(argv[i + 1]);
    if (a == "--depth") depth = atoi(argv[i + 1]);
    if (a == "--dir") dir = argv[i + 1];
  }
  if (n < 2 || n % 2 != 0 || depth < 0 || dir.empty()) {
    fprintf(stderr,
            "usage: handover_hold --endpoints N (even) --depth D --dir DIR\n");
    return 2;
  }
  setenv("PSM2_MULTI_EP", "1", 1);
  int major = PSM2_VERNO_MAJOR, minor = PSM2_VERNO_MINOR;
  CheckPsm(psm2_init(&major, &minor), "psm2_init");
  std::vector<Ep> eps(n);
  for (int i = 0; i < n; i++) {
    psm2_uuid_t uuid = {0x50, 0x53, 0x68, 0x6f};
    uuid[15] = static_cast<uint8_t>(i / kJobSize);
    struct psm2_ep_open_opts opts;
    CheckPsm(psm2_ep_open_opts_get_defaults(&opts), "defaults");
    CheckPsm(psm2_ep_open(uuid, &opts, &eps[i].ep, &eps[i].epid),
             "psm2_ep_open");
    CheckPsm(
        psm2_mq_init(eps[i].ep, PSM2_MQ_ORDERMASK_ALL, nullptr, 0, &eps[i].mq),
        "psm2_mq_init");
  }
  for (int i = 0; i < n; i++) {
    psm2_error_t err;
    CheckPsm(psm2_ep_connect(eps[i].ep, 1, &eps[i ^ 1].epid, nullptr, &err,
                             &eps[i].partner, kTimeoutNs),
             "psm2_ep_connect");
  }
  const size_t total = size_t(n) * depth;
  std::vector<uint64_t> posted_buf(total), queued_buf(total);
  std::vector<uint64_t> queued_out(total), posted_out(total);
  std::vector<psm2_mq_req_t> posted, sends, recvs;
  // Before the handover: receives of kPosted that nothing matches yet, and
  // kQueued messages that nothing receives yet.
  PostAndSend(eps, depth, kPosted, kQueued, &posted_buf, &queued_out, &posted,
              &sends);
  WaitAll(sends, "a queued send");  // eager: buffered once psmd has it
  FILE* ready = fopen((dir + "/ready").c_str(), "w");
  if (ready != nullptr) fclose(ready);
  while (access((dir + "/go").c_str(), F_OK) != 0) usleep(10000);
  // After it: the other way round.
  PostAndSend(eps, depth, kQueued, kPosted, &queued_buf, &posted_out, &recvs,
              &sends);
  WaitAll(sends, "a send");
  WaitAll(posted, "a receive posted before the handover");
  WaitAll(recvs, "a receive of a message queued before the handover");
  for (int i = 0; i < n; i++) {
    for (int k = 0; k < depth; k++) {
      if (posted_buf[size_t(i) * depth + k] != Payload(kPosted, i ^ 1, k) ||
          queued_buf[size_t(i) * depth + k] != Payload(kQueued, i ^ 1, k)) {
        fprintf(stderr, "handover_hold: endpoint %d message %d corrupted\n", i,
                k);
        return 1;
      }
    }
  }
  for (Ep& e : eps) psm2_ep_close(e.ep, PSM2_EP_CLOSE_GRACEFUL, kTimeoutNs);
  psm2_finalize();
  printf("verified %d endpoints %d deep\n", n, depth);
  return 0;
}
