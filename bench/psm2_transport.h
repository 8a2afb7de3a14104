// bench/pt2pt.h's transport over the PSM2 matched queue: one connected
// endpoint pair (tests/programs/rendezvous.h), data on tag 0, the
// acknowledgement on tag2 = 1. Works on psmd's libpsm2.so.2 and on Intel's
// alike (choose with LD_LIBRARY_PATH).
#ifndef PSMD_BENCH_PSM2_TRANSPORT_H_
#define PSMD_BENCH_PSM2_TRANSPORT_H_

#include <psm2.h>
#include <psm2_mq.h>

#include <cstring>
#include <string>

#include "bench/pt2pt.h"
#include "tests/programs/rendezvous.h"

namespace psmd::bench {

class Psm2Transport {
 public:
  Psm2Transport(const psm2_uuid_t uuid, const std::string& dir, int rank)
      : pair_(psmd::testing::OpenAndConnect(uuid, dir, rank)) {
    ack_tag_.tag2 = 1;
    memset(&sel_, 0xff, sizeof(sel_));
    for (auto& r : reqs_) r = PSM2_MQ_REQINVALID;
  }
  ~Psm2Transport() {
    psm2_mq_finalize(pair_.mq);
    psm2_ep_close(pair_.ep, PSM2_EP_CLOSE_GRACEFUL, 0);
    psm2_finalize();
  }

  void Send(const char* p, size_t n) {
    psmd::testing::CheckPsm(
        psm2_mq_send2(pair_.mq, pair_.peer, 0, &data_tag_, p, n), "send");
  }
  void Recv(char* p, size_t n) {
    psm2_mq_req_t req;
    psmd::testing::CheckPsm(psm2_mq_irecv2(pair_.mq, pair_.peer, &data_tag_,
                                           &sel_, 0, p, n, nullptr, &req),
                            "irecv");
    psmd::testing::CheckPsm(psm2_mq_wait2(&req, nullptr), "wait");
  }
  void Isend(int slot, const char* p, size_t n) {
    psmd::testing::CheckPsm(psm2_mq_isend2(pair_.mq, pair_.peer, 0, &data_tag_,
                                           p, n, nullptr, &reqs_[slot]),
                            "isend2");
  }
  void WaitSend(int slot) {
    psmd::testing::CheckPsm(psm2_mq_wait2(&reqs_[slot], nullptr), "wait send");
  }
  void Irecv(int slot, char* p, size_t n) {
    psmd::testing::CheckPsm(
        psm2_mq_irecv2(pair_.mq, pair_.peer, &data_tag_, &sel_, 0, p, n,
                       nullptr, &reqs_[slot]),
        "irecv2");
  }
  void WaitRecv(int slot) {
    psmd::testing::CheckPsm(psm2_mq_wait2(&reqs_[slot], nullptr), "wait recv");
  }
  void PostAck() {
    psmd::testing::CheckPsm(
        psm2_mq_irecv2(pair_.mq, pair_.peer, &ack_tag_, &sel_, 0, &ack_, 1,
                       nullptr, &ack_req_),
        "irecv ack");
  }
  void WaitAck() {
    psmd::testing::CheckPsm(psm2_mq_wait2(&ack_req_, nullptr), "wait ack");
  }
  void SendAck() {
    psmd::testing::CheckPsm(
        psm2_mq_send2(pair_.mq, pair_.peer, 0, &ack_tag_, &ack_, 1),
        "send ack");
  }

 private:
  psmd::testing::ConnectedPair pair_;
  psm2_mq_tag_t data_tag_{}, ack_tag_{}, sel_;
  psm2_mq_req_t reqs_[kWindow];
  psm2_mq_req_t ack_req_ = PSM2_MQ_REQINVALID;
  char ack_ = 0;
};

}  // namespace psmd::bench

#endif  // PSMD_BENCH_PSM2_TRANSPORT_H_
