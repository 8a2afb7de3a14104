// churn: one rank of a pair that runs mixed traffic (eager and rendezvous
// messages both ways, active-message request/reply, matched probes) in
// rounds until its peer is killed, for the kill tests (tests/kill_test.cc).
//
//   churn --rank R --dir DIR --uuid UUID [--seed S] [--quit-after-round N]
//
// Each rank keeps a sentinel receive posted from its peer, with a tag
// nobody sends: psmd fails it when the peer's endpoint goes (invariant 7 of
// daemon/engine/mq_engine.h), which is how the survivor learns of a death while
// it waits for anything. Every wait polls the request and the sentinel.
// After its first round a rank creates DIR/running.R. When any request
// ends with an error the rank prints "ended <error> at <monotonic ms>" and
// exits 4; a data mismatch exits 1, a failed call 2 (survivor.h).
// --quit-after-round N makes the rank exit 0 on its own after round N: a
// pair that breaks without a kill, the kill test's negative control.
#include <psm2.h>
#include <psm2_am.h>
#include <psm2_mq.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "tests/programs/rendezvous.h"
#include "tests/programs/survivor.h"

namespace {

using psmd::testing::CheckPsm;

constexpr uint32_t kSentinelTag = 0xdead;
constexpr uint32_t kEagerMax = 48u << 10;
constexpr uint32_t kRndvMax = 2u << 20;

psm2_mq_t g_mq;
psm2_ep_t g_ep;
psm2_mq_req_t g_sentinel;
int g_replies = 0;

[[noreturn]] void Ended(uint32_t error) {
  psmd::testing::EndWithRequestError(error);
}

psm2_mq_tag_t Tag(uint32_t kind, uint32_t round) {
  psm2_mq_tag_t t;
  memset(&t, 0, sizeof(t));
  t.tag0 = kind;
  t.tag1 = round;
  return t;
}

// Ends the process if the peer is known to be gone.
void CheckSentinel() {
  psm2_mq_status2_t st;
  if (psm2_mq_test2(&g_sentinel, &st) == PSM2_OK) Ended(st.error_code);
}

// Polls `req` to completion; ends the process on an error.
void Await(psm2_mq_req_t* req) {
  for (;;) {
    psm2_mq_status2_t st;
    psm2_error_t err = psm2_mq_test2(req, &st);
    if (err == PSM2_OK) {
      if (st.error_code != PSM2_OK) Ended(st.error_code);
      return;
    }
    if (err != PSM2_MQ_NO_COMPLETIONS) Ended(err);
    CheckSentinel();
  }
}

void Fill(std::vector<uint8_t>* buf, uint32_t len, uint32_t seed) {
  buf->resize(len);
  for (uint32_t i = 0; i < len; i++)
    (*buf)[i] = static_cast<uint8_t>(seed * 131 + i * 7);
}

void Verify(const std::vector<uint8_t>& buf, uint32_t len, uint32_t seed,
            const char* what) {
  for (uint32_t i = 0; i < len; i++) {
    if (buf[i] != static_cast<uint8_t>(seed * 131 + i * 7)) {
      fprintf(stderr, "churn: %s: byte %u of %u is wrong\n", what, i, len);
      exit(psmd::testing::kExitDataMismatch);
    }
  }
}

// AM handlers: a request is answered with a reply carrying its argument.
int OnRequest(psm2_am_token_t token, psm2_amarg_t* args, int nargs, void* src,
              uint32_t len) {
  psm2_am_reply_short(token, 1, args, nargs, src, len, 0, nullptr, nullptr);
  return 0;
}
int OnReply(psm2_am_token_t, psm2_amarg_t*, int, void*, uint32_t) {
  g_replies++;
  return 0;
}

// One round; both ranks draw the same sizes from the round's seed.
void Round(psmd::testing::ConnectedPair& c, int rank, uint32_t round,
           uint32_t seed) {
  std::mt19937 rng(seed * 1000003u + round);
  const uint32_t eager = rng() % kEagerMax;
  const uint32_t rndv = 64001 + rng() % (kRndvMax - 64001);
  const uint32_t back = rng() % kEagerMax;
  psm2_mq_tag_t exact = psmd::testing::ExactSelector();
  std::vector<uint8_t> a, b, in_a, in_b;
  if (rank == 0) {
    Fill(&a, eager, round);
    Fill(&b, rndv, round + 1);
    psm2_mq_req_t s1, s2;
    psm2_mq_tag_t t1 = Tag(1, round), t2 = Tag(2, round);
    CheckPsm(
        psm2_mq_isend2(c.mq, c.peer, 0, &t1, a.data(), eager, nullptr, &s1),
        "isend2 eager");
    CheckPsm(psm2_mq_isend2(c.mq, c.peer, 0, &t2, b.data(), rndv, nullptr, &s2),
             "isend2 rendezvous");
    // An active message and its reply.
    const int before = g_replies;
    psm2_amarg_t arg;
    arg.u64 = round;
    CheckPsm(psm2_am_request_short(c.peer, 0, &arg, 1, nullptr, 0, 0, nullptr,
                                   nullptr),
             "am_request_short");
    while (g_replies == before) {
      psm2_poll(c.ep);
      CheckSentinel();
    }
    // A matched probe of what rank 1 sends back, then its receive.
    psm2_mq_tag_t t3 = Tag(3, round);
    psm2_mq_req_t claimed;
    psm2_mq_status2_t st;
    for (;;) {
      psm2_error_t err =
          psm2_mq_improbe2(c.mq, c.peer, &t3, &exact, &claimed, &st);
      if (err == PSM2_OK) break;
      if (err != PSM2_MQ_NO_COMPLETIONS) Ended(err);
      CheckSentinel();
    }
    in_a.resize(st.msg_length);
    CheckPsm(
        psm2_mq_imrecv(c.mq, 0, in_a.data(), st.msg_length, nullptr, &claimed),
        "imrecv");
    Await(&claimed);
    Verify(in_a, back, round + 2, "probed message");
    Await(&s1);
    Await(&s2);
  } else {
    in_a.resize(eager);
    in_b.resize(rndv);
    psm2_mq_req_t r1, r2, s3;
    psm2_mq_tag_t t1 = Tag(1, round), t2 = Tag(2, round), t3 = Tag(3, round);
    CheckPsm(psm2_mq_irecv2(c.mq, c.peer, &t1, &exact, 0, in_a.data(), eager,
                            nullptr, &r1),
             "irecv2 eager");
    CheckPsm(psm2_mq_irecv2(c.mq, c.peer, &t2, &exact, 0, in_b.data(), rndv,
                            nullptr, &r2),
             "irecv2 rendezvous");
    Fill(&a, back, round + 2);
    CheckPsm(psm2_mq_isend2(c.mq, c.peer, 0, &t3, a.data(), back, nullptr, &s3),
             "isend2 back");
    Await(&r1);
    Await(&r2);
    Verify(in_a, eager, round, "eager message");
    Verify(in_b, rndv, round + 1, "rendezvous message");
    Await(&s3);
  }
}

}  // namespace

int main(int argc, char** argv) {
  int rank = -1;
  uint32_t seed = 1;
  long long quit_after = -1;
  std::string dir, uuid_text;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string flag = argv[i];
    if (flag == "--rank") rank = atoi(argv[i + 1]);
    if (flag == "--dir") dir = argv[i + 1];
    if (flag == "--uuid") uuid_text = argv[i + 1];
    if (flag == "--seed") seed = static_cast<uint32_t>(atoi(argv[i + 1]));
    if (flag == "--quit-after-round") quit_after = atoll(argv[i + 1]);
  }
  psm2_uuid_t uuid;
  if ((rank != 0 && rank != 1) || dir.empty() ||
      !psmd::testing::ParseUuid(uuid_text, uuid)) {
    fprintf(stderr,
            "usage: churn --rank 0|1 --dir DIR --uuid UUID [--seed S] "
            "[--quit-after-round N]\n");
    return 2;
  }
  psmd::testing::ConnectedPair c =
      psmd::testing::OpenAndConnect(uuid, dir, rank);
  g_ep = c.ep;
  g_mq = c.mq;
  psm2_am_handler_fn_t handlers[2] = {OnRequest, OnReply};
  int indices[2];
  CheckPsm(psm2_am_register_handlers(c.ep, handlers, 2, indices),
           "am_register_handlers");
  psm2_mq_tag_t sentinel = Tag(kSentinelTag, 0),
                exact = psmd::testing::ExactSelector();
  CheckPsm(psm2_mq_irecv2(c.mq, c.peer, &sentinel, &exact, 0, nullptr, 0,
                          nullptr, &g_sentinel),
           "irecv2 sentinel");
  for (uint32_t round = 0;; round++) {
    Round(c, rank, round, seed);
    if (round == 0) std::ofstream(dir + "/running." + std::to_string(rank));
    if (static_cast<long long>(round) == quit_after) return 0;
  }
}
