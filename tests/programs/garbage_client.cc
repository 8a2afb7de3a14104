// garbage_client: a hostile client. It opens a real endpoint through the
// PSM2 API, then writes malformed descriptors straight into its submission
// ring, checks that each request it can name fails with an error completion,
// that its endpoint still works for valid traffic, and finally scribbles on
// its completion ring's index. Exit 0 when every expectation held.
// With --doorbell-flood SECONDS it only rings its doorbell, in a loop.
#include <psm2.h>
#include <psm2_mq.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>

#include "client/endpoint.h"
#include "shm/doorbell.h"
#include "tests/programs/rendezvous.h"

namespace shm = psmd::shm;

namespace {

int failures = 0;

void Expect(bool ok, const char* what) {
  if (!ok) {
    fprintf(stderr, "garbage_client: FAILED: %s\n", what);
    failures++;
  }
}

// Publishes a raw descriptor on one of the rings (whatever its opcode says)
// without waiting.
void PushRaw(psm2_ep_t ep, const shm::SubmissionDesc& d, bool message_ring) {
  const shm::Ring ring =
      message_ring ? shm::Ring::kMessage : shm::Ring::kControl;
  while (!ep->publisher().TryPushRaw(d, ring)) ep->Progress();
  psmd::shm::RingEventFd(
      ep->doorbell_fd());  // unconditionally: the daemon may sleep
}

// Publishes a raw descriptor for a fresh request and waits for its completion.
psm2_error_t SubmitRaw(psm2_ep_t ep, shm::SubmissionDesc d,
                       bool message_ring = false) {
  psmd::client::EndpointLock lock(&ep->mu);
  psm2_mq_req* r = ep->NewRequest(psm2_mq_req::Kind::kInternal, nullptr);
  r->state = psm2_mq_req::State::kPosted;
  d.req = psmd::client::TokenOf(r);
  PushRaw(ep, d, message_ring);
  ep->WaitUntil([r] { return r->state == psm2_mq_req::State::kComplete; });
  psm2_error_t err = static_cast<psm2_error_t>(r->user.error_code);
  ep->FreeRequest(r);
  return err;
}

}  // namespace

int main(int argc, char** argv) {
  alarm(60);
  psm2_uuid_t uuid;
  psmd::testing::ParseUuid("9a4bade5c0000000000000000000dead", uuid);
  psm2_ep_t ep;
  psm2_epid_t epid;
  psmd::testing::InitAndOpen(uuid, &ep, &epid);
  if (argc == 3 && strcmp(argv[1], "--doorbell-flood") == 0) {
    // Rings its doorbell with nothing submitted, as fast as it can.
    auto end = std::chrono::steady_clock::now() +
               std::chrono::duration<double>(atof(argv[2]));
    while (std::chrono::steady_clock::now() < end)
      psmd::shm::RingEventFd(ep->doorbell_fd());
    return 0;
  }
  psm2_epaddr_t self;
  psm2_error_t conn_err;
  if (psm2_ep_connect(ep, 1, &epid, nullptr, &conn_err, &self, 0) != PSM2_OK)
    return 2;
  psm2_mq_t mq;
  psm2_mq_init(ep, PSM2_MQ_ORDERMASK_ALL, nullptr, 0, &mq);

  shm::SubmissionDesc d{};
  d.op = static_cast<shm::SubmitOp>(77);
  Expect(SubmitRaw(ep, d) == PSM2_PARAM_ERR,
         "unknown opcode fails with PSM2_PARAM_ERR");

  d = {};
  d.op = shm::SubmitOp::kSend;
  d.peer = 999;
  Expect(SubmitRaw(ep, d, true) == PSM2_EPID_UNKNOWN,
         "send to an unconnected slot fails");

  d = {};
  d.op = shm::SubmitOp::kSend;
  d.peer = self->slot;
  d.len = 1000;
  d.body.pool.pool_offset = 0;  // outside (before) our region, or its header
  Expect(SubmitRaw(ep, d, true) == PSM2_PARAM_ERR,
         "payload offset outside own region fails");

  d.body.pool.pool_offset = ~uint64_t{0} - 63;  // would overflow offset + len
  Expect(SubmitRaw(ep, d, true) == PSM2_PARAM_ERR,
         "overflowing payload offset fails");

  d.len = 0xffffffffu;
  d.body.pool.pool_offset = ep->publisher().MaxPayload();
  Expect(SubmitRaw(ep, d, true) == PSM2_PARAM_ERR,
         "length beyond the region fails");

  d = {};
  d.op = shm::SubmitOp::kRecv;
  d.flags = 0xff;
  Expect(SubmitRaw(ep, d) == PSM2_PARAM_ERR,
         "receive with unknown flags fails");

  d = {};
  d.op = shm::SubmitOp::kRndvData;
  d.len = 64;
  d.body.rndv.transfer = 12345;
  d.body.rndv.pool_offset =
      ep->publisher().MaxPayload();  // inside nobody's transfer
  Expect(SubmitRaw(ep, d) == PSM2_PARAM_ERR,
         "rendezvous chunk of no transfer fails");

  d = {};
  d.op = shm::SubmitOp::kClaimedRecv;
  Expect(SubmitRaw(ep, d) == PSM2_MQ_NO_COMPLETIONS,
         "receive of an unclaimed message fails");

  d = {};
  d.op = shm::SubmitOp::kSetOption;
  d.body.option.key = 999;
  Expect(SubmitRaw(ep, d) == PSM2_PARAM_ERR, "unknown option fails");
  d.body.option.key =
      static_cast<uint32_t>(shm::QueueOption::kUnexpectedBudgetBytes);
  d.body.option.value = ~uint64_t{0};
  Expect(SubmitRaw(ep, d) == PSM2_PARAM_ERR, "budget above psmd's cap fails");

  // Random bytes: the daemon must reject whatever it cannot use; their
  // completions carry tokens we never issued and are ignored.
  std::mt19937_64 rng(42);
  for (int i = 0; i < 5000; i++) {
    shm::SubmissionDesc junk;
    uint64_t words[8];
    for (auto& w : words) w = rng();
    memcpy(&junk, words, sizeof(junk));
    if (junk.op == shm::SubmitOp::kRecv || junk.op == shm::SubmitOp::kCancel ||
        junk.op == shm::SubmitOp::kProbe ||
        junk.op == shm::SubmitOp::kRndvSend ||
        junk.op == shm::SubmitOp::kSetOption) {
      junk.op =
          shm::SubmitOp::kInvalid;  // these could be valid and just be queued
    }
    psmd::client::EndpointLock lock(&ep->mu);
    PushRaw(ep, junk, i % 2 == 0);
  }

  // The endpoint still serves valid requests.
  psm2_mq_tag_t tag{}, sel;
  tag.tag0 = 7;
  memset(&sel, 0xff, sizeof(sel));
  char out[100], in[100] = {};
  memset(out, 'x', sizeof(out));
  psm2_mq_req_t rreq;
  psm2_mq_irecv2(mq, self, &tag, &sel, 0, in, sizeof(in), nullptr, &rreq);
  Expect(psm2_mq_send2(mq, self, 0, &tag, out, sizeof(out)) == PSM2_OK,
         "valid send works");
  psm2_mq_status2_t st;
  Expect(psm2_mq_wait2(&rreq, &st) == PSM2_OK && st.error_code == PSM2_OK &&
             memcmp(in, out, sizeof(in)) == 0,
         "valid receive after garbage delivers intact data");

  // Finally break the completion ring's index (the one index a client
  // writes: submission rings have none, shm/ring.h) and never reap again:
  // once psmd has filled the ring by its own count, it reads the index back,
  // finds it impossible and stops serving this endpoint.
  ep->segment_control()->cq.head.value.store(0x7fffffff);
  shm::SubmissionDesc junk{};
  junk.op = static_cast<shm::SubmitOp>(0xee);
  for (int pushed = 0, idle = 0; pushed < 4096 && idle < 200;) {
    if (ep->publisher().TryPushRaw(junk, shm::Ring::kControl)) {
      pushed++;
      idle = 0;
    } else {
      psmd::shm::RingEventFd(ep->doorbell_fd());
      usleep(1000);
      idle++;
    }
  }
  printf("garbage_client: %d failures\n", failures);
  fflush(stdout);
  return failures == 0 ? 0 : 1;
}
