// Matched-queue conformance cases: how requests complete (status fields,
// probes, ipeek and its dequeue variants, test, cancel, SENDSYNC, invalid
// requests, progress without polling). See mq_cases_util.h for the
// conventions.
#include <cinttypes>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "tests/conformance/mq_cases_util.h"

namespace psmd::conformance::mq {
namespace {

// Zero-length messages (NULL and non-NULL buffers), and every status field,
// through wait/test and wait2/test2, for receives and for sends. For sends,
// psm2_mq_status_t has only error_code and context defined; a
// psm2_mq_status2_t also gives the destination, the tag and the length.
void ZeroLengthAndStatusFields(Pair& p) {
  const psm2_mq_tag_t k90 =
      Tag(90, 0x9A, 0x9B);                     // 0 bytes, NULL buffers, 96-bit
  const uint64_t k91 = 0x0000009100000091ull;  // 0 bytes, non-NULL, 64-bit
  const psm2_mq_tag_t k92 = Tag(92, 0, 0x9C);  // unexpected, 0 bytes, NULL
  const uint64_t k93 = 93;                     // unexpected, 0 bytes, non-NULL
  const psm2_mq_tag_t k94 = Tag(94, 0x94, 0x77);  // 5 bytes, tag2 != 0
  char five[6] = "fives";
  if (p.rank == kSender) {
    char nonnull[4] = "xyz";
    psm2_mq_req_t s[5];
    p.Barrier("posted");
    MQ_CHECK_ERR(Isend2(p, 0, k90, nullptr, 0, Ctx(0x9101), &s[0]), PSM2_OK);
    MQ_CHECK_ERR(
        psm2_mq_isend(p.mq, p.peer, 0, k91, nonnull, 0, Ctx(0x9102), &s[1]),
        PSM2_OK);
    MQ_CHECK_ERR(Isend2(p, 0, k92, nullptr, 0, Ctx(0x9103), &s[2]), PSM2_OK);
    MQ_CHECK_ERR(
        psm2_mq_isend(p.mq, p.peer, 0, k93, nonnull, 0, Ctx(0x9104), &s[3]),
        PSM2_OK);
    MQ_CHECK_ERR(Isend2(p, 0, k94, five, 5, Ctx(0x9105), &s[4]), PSM2_OK);
    p.Barrier("sent");

    psm2_mq_status2_t st2;
    auto check2 = [&](const char* what, psm2_mq_tag_t tag, uint32_t len,
                      uintptr_t ctx) {
      MQ_CHECK(st2.msg_peer == p.peer && SameTag(st2.msg_tag, tag) &&
                   st2.msg_length == len && st2.error_code == PSM2_OK &&
                   st2.context == Ctx(ctx),
               "%s: send status2 peer %s, tag %s (want %s), length %u (want "
               "%u), error %d, "
               "context %p (want %p)",
               what, st2.msg_peer == p.peer ? "ok" : "WRONG",
               Str(st2.msg_tag).c_str(), Str(tag).c_str(), st2.msg_length, len,
               st2.error_code, st2.context, Ctx(ctx));
    };
    MQ_CHECK_ERR(psm2_mq_wait2(&s[0], &st2), PSM2_OK);
    MQ_CHECK(s[0] == PSM2_MQ_REQINVALID,
             "psm2_mq_wait2 did not reset the send request");
    check2("0-byte NULL isend2, wait2", k90, 0, 0x9101);
    if (PollUntilDone(p, &s[2], &st2, kCompleteTimeoutS)) {
      check2("0-byte NULL isend2, test2", k92, 0, 0x9103);
    } else {
      MQ_CHECK(false, "0-byte isend2 did not complete");
    }
    if (Finish(p, &s[4], &st2, "5-byte isend2"))
      check2("5-byte isend2, test2", k94, 5, 0x9105);

    psm2_mq_status_t st;
    MQ_CHECK_ERR(psm2_mq_wait(&s[1], &st), PSM2_OK);
    MQ_CHECK(st.error_code == PSM2_OK && st.context == Ctx(0x9102),
             "0-byte isend, wait: "
             "error %d, context %p",
             st.error_code, st.context);
    if (Finish(p, &s[3], &st, "0-byte isend")) {
      MQ_CHECK(st.error_code == PSM2_OK && st.context == Ctx(0x9104),
               "0-byte isend, test: "
               "error %d, context %p",
               st.error_code, st.context);
    }
    return;
  }
  char b91[16], b93[16], b94[16] = {};
  memset(b91, 'u', sizeof(b91));
  memset(b93, 'u', sizeof(b93));
  psm2_mq_req_t r[5];
  MQ_CHECK_ERR(
      Irecv2(p, PSM2_MQ_ANY_ADDR, k90, kExact, nullptr, 0, Ctx(0x9001), &r[0]),
      PSM2_OK);
  MQ_CHECK_ERR(
      psm2_mq_irecv(p.mq, k91, ~0ull, 0, b91, sizeof(b91), Ctx(0x9002), &r[1]),
      PSM2_OK);
  MQ_CHECK_ERR(Irecv2(p, PSM2_MQ_ANY_ADDR, k94, kExact, b94, sizeof(b94),
                      Ctx(0x9005), &r[4]),
               PSM2_OK);
  p.Barrier("posted");
  p.Barrier("sent");
  AwaitUnexpected(p, k92, "unexpected 0-byte NULL");
  AwaitUnexpected(p, Tag(static_cast<uint32_t>(k93)),
                  "unexpected 0-byte non-NULL");
  MQ_CHECK_ERR(
      Irecv2(p, PSM2_MQ_ANY_ADDR, k92, kExact, nullptr, 0, Ctx(0x9003), &r[2]),
      PSM2_OK);
  MQ_CHECK_ERR(
      psm2_mq_irecv(p.mq, k93, ~0ull, 0, b93, sizeof(b93), Ctx(0x9004), &r[3]),
      PSM2_OK);

  psm2_mq_status2_t st2;
  auto check2 = [&](const char* what, psm2_mq_tag_t tag, uint32_t len,
                    uintptr_t ctx) {
    MQ_CHECK(st2.msg_peer == p.peer && SameTag(st2.msg_tag, tag) &&
                 st2.msg_length == len && st2.nbytes == len &&
                 st2.error_code == PSM2_OK && st2.context == Ctx(ctx),
             "%s: status2 peer %s, tag %s (want %s), length %u, nbytes %u "
             "(want %u), error %d, "
             "context %p (want %p)",
             what, st2.msg_peer == p.peer ? "ok" : "WRONG",
             Str(st2.msg_tag).c_str(), Str(tag).c_str(), st2.msg_length,
             st2.nbytes, len, st2.error_code, st2.context, Ctx(ctx));
  };
  MQ_CHECK_ERR(psm2_mq_wait2(&r[0], &st2), PSM2_OK);
  MQ_CHECK(r[0] == PSM2_MQ_REQINVALID,
           "psm2_mq_wait2 did not reset the receive request");
  check2("expected 0-byte NULL, wait2", k90, 0, 0x9001);
  if (PollUntilDone(p, &r[2], &st2, kCompleteTimeoutS)) {
    MQ_CHECK(r[2] == PSM2_MQ_REQINVALID,
             "psm2_mq_test2 did not reset the request");
    check2("unexpected 0-byte NULL, test2", k92, 0, 0x9003);
  } else {
    MQ_CHECK(false, "unexpected 0-byte receive did not complete");
  }
  if (PollUntilDone(p, &r[4], &st2, kCompleteTimeoutS)) {
    check2("5-byte with tag2, test2", k94, 5, 0x9005);
    MQ_CHECK(memcmp(b94, five, 5) == 0, "payload '%.5s', want 'fives'", b94);
  } else {
    MQ_CHECK(false, "5-byte receive did not complete");
  }

  psm2_mq_status_t st;
  auto check = [&](const char* what, uint64_t tag, uintptr_t ctx,
                   const char* buf) {
    MQ_CHECK(st.msg_tag == tag && st.msg_length == 0 && st.nbytes == 0 &&
                 st.error_code == PSM2_OK && st.context == Ctx(ctx),
             "%s: status tag %016" PRIx64 " (want %016" PRIx64
             "), length %u, nbytes %u, error "
             "%d, context %p (want %p)",
             what, st.msg_tag, tag, st.msg_length, st.nbytes, st.error_code,
             st.context, Ctx(ctx));
    MQ_CHECK(buf[0] == 'u' && buf[15] == 'u',
             "%s: a 0-byte message wrote into the buffer", what);
  };
  if (PollUntilDone(p, &r[1], &st, kCompleteTimeoutS)) {
    MQ_CHECK(r[1] == PSM2_MQ_REQINVALID,
             "psm2_mq_test did not reset the request");
    check("expected 0-byte non-NULL, test", k91, 0x9002, b91);
  } else {
    MQ_CHECK(false, "expected 0-byte receive did not complete");
  }
  MQ_CHECK_ERR(psm2_mq_wait(&r[3], &st), PSM2_OK);
  MQ_CHECK(r[3] == PSM2_MQ_REQINVALID,
           "psm2_mq_wait did not reset the request");
  check("unexpected 0-byte non-NULL, wait", k93, 0x9004, b93);
}

// iprobe/iprobe2 report a message and leave it queued; improbe/improbe2
// remove it from matching, and imrecv receives it.
void ProbeAndMatchedProbe(Pair& p) {
  constexpr uint32_t kLen100 = 64, kLen101 = 1000, kLen102 = 1u << 20;
  if (p.rank == kSender) {
    std::vector<uint8_t> a(kLen100), b(kLen101), c(kLen102);
    Fill(a.data(), kLen100, 100);
    Fill(b.data(), kLen101, 101);
    Fill(c.data(), kLen102, 102);
    p.Barrier("nothing-there checks done");
    MQ_CHECK_ERR(psm2_mq_send(p.mq, p.peer, 0, 100, a.data(), kLen100),
                 PSM2_OK);
    MQ_CHECK_ERR(psm2_mq_send(p.mq, p.peer, 0, 101, b.data(), kLen101),
                 PSM2_OK);
    psm2_mq_req_t rc;  // rendezvous: completes once received
    MQ_CHECK_ERR(
        psm2_mq_isend(p.mq, p.peer, 0, 102, c.data(), kLen102, nullptr, &rc),
        PSM2_OK);
    p.Barrier("sent");
    Finish(p, &rc, "1 MiB isend");
    return;
  }
  // Nothing there: NO_COMPLETIONS and status untouched.
  psm2_mq_status_t st;
  psm2_mq_status2_t st2;
  memset(&st, 0xAB, sizeof(st));
  memset(&st2, 0xAB, sizeof(st2));
  psm2_mq_req_t req = PSM2_MQ_REQINVALID;
  MQ_CHECK_ERR(psm2_mq_iprobe(p.mq, 100, ~0ull, &st), PSM2_MQ_NO_COMPLETIONS);
  MQ_CHECK_ERR(Iprobe2(p, PSM2_MQ_ANY_ADDR, kAnyTag, kAnyTag, &st2),
               PSM2_MQ_NO_COMPLETIONS);
  // A matched probe that finds nothing sets the request to NULL (MPI
  // libraries test it, as Open MPI's MPI_Improbe does).
  psm2_mq_req_t stale = reinterpret_cast<psm2_mq_req_t>(&st);
  req = stale;
  MQ_CHECK_ERR(psm2_mq_improbe(p.mq, 0, 0, &req, &st), PSM2_MQ_NO_COMPLETIONS);
  MQ_CHECK(req == PSM2_MQ_REQINVALID,
           "improbe that found nothing left the request as it was");
  {
    psm2_mq_tag_t t = kAnyTag, s = kAnyTag;
    req = stale;
    MQ_CHECK_ERR(psm2_mq_improbe2(p.mq, PSM2_MQ_ANY_ADDR, &t, &s, &req, &st2),
                 PSM2_MQ_NO_COMPLETIONS);
    MQ_CHECK(req == PSM2_MQ_REQINVALID,
             "improbe2 that found nothing left the request as it was");
  }
  MQ_CHECK(st.msg_length == 0xABABABABu && st2.msg_length == 0xABABABABu,
           "a probe that found nothing wrote its status");
  p.Barrier("nothing-there checks done");
  p.Barrier("sent");
  AwaitUnexpected(p, Tag(100), "64-byte message");
  AwaitUnexpected(p, Tag(101), "1000-byte message");
  AwaitUnexpected(p, Tag(102), "1 MiB message");

  // iprobe twice: both see message 100, which stays queued. For a message
  // without a buffer yet, Intel reports nbytes = msg_length.
  for (int i = 0; i < 2; i++) {
    memset(&st, 0, sizeof(st));
    MQ_CHECK_ERR(psm2_mq_iprobe(p.mq, 100, ~0ull, &st), PSM2_OK);
    MQ_CHECK(st.msg_tag == 100 && st.msg_length == kLen100 &&
                 st.nbytes == kLen100 && st.error_code == PSM2_OK,
             "iprobe #%d: tag %" PRIu64
             ", length %u, nbytes %u, "
             "error %d",
             i + 1, st.msg_tag, st.msg_length, st.nbytes, st.error_code);
  }
  memset(&st2, 0, sizeof(st2));
  MQ_CHECK_ERR(Iprobe2(p, p.peer, Tag(100), kExact, &st2), PSM2_OK);
  MQ_CHECK(st2.msg_peer == p.peer && SameTag(st2.msg_tag, Tag(100)) &&
               st2.msg_length == kLen100,
           "iprobe2: tag %s, length %u, peer %s", Str(st2.msg_tag).c_str(),
           st2.msg_length, st2.msg_peer == p.peer ? "ok" : "WRONG");
  // A wildcard probe sees the earliest arrived message.
  MQ_CHECK_ERR(Iprobe2(p, PSM2_MQ_ANY_ADDR, kAnyTag, kAnyTag, &st2), PSM2_OK);
  MQ_CHECK(st2.msg_tag.tag0 == 100,
           "wildcard iprobe2 saw tag %s, want the earliest (100)",
           Str(st2.msg_tag).c_str());

  GuardedBuf a(kLen100), b(kLen101), c(kLen102);
  MQ_CHECK_ERR(
      psm2_mq_irecv(p.mq, 100, ~0ull, 0, a.data(), kLen100, nullptr, &req),
      PSM2_OK);
  if (Finish(p, &req, "receiving the probed message")) {
    MQ_CHECK(FirstMismatch(a.data(), kLen100, 100) < 0 && a.GuardIntact(),
             "probed 64-byte message received wrong");
  }
  MQ_CHECK_ERR(psm2_mq_iprobe(p.mq, 100, ~0ull, &st), PSM2_MQ_NO_COMPLETIONS);

  // improbe takes message 101 out of matching.
  memset(&st, 0, sizeof(st));
  req = PSM2_MQ_REQINVALID;
  MQ_CHECK_ERR(psm2_mq_improbe(p.mq, 101, ~0ull, &req, &st), PSM2_OK);
  MQ_CHECK(req != PSM2_MQ_REQINVALID && st.msg_tag == 101 &&
               st.msg_length == kLen101,
           "improbe: tag %" PRIu64 ", length %u, request %s", st.msg_tag,
           st.msg_length, req ? "set" : "NULL");
  MQ_CHECK_ERR(psm2_mq_iprobe(p.mq, 101, ~0ull, &st), PSM2_MQ_NO_COMPLETIONS);
  MQ_CHECK_ERR(Iprobe2(p, PSM2_MQ_ANY_ADDR, kAnyTag, kAnyTag, &st2), PSM2_OK);
  MQ_CHECK(st2.msg_tag.tag0 == 102,
           "after improbe of 101, a wildcard iprobe2 saw %s, want 102",
           Str(st2.msg_tag).c_str());
  {
    // A receive posted now must not get the claimed message either.
    char w[8];
    psm2_mq_req_t wr;
    MQ_CHECK_ERR(psm2_mq_irecv(p.mq, 101, ~0ull, 0, w, sizeof(w), nullptr, &wr),
                 PSM2_OK);
    PollFor(p, 0.02);
    psm2_error_t err = psm2_mq_test2(&wr, &st2);
    MQ_CHECK(err == PSM2_MQ_NO_COMPLETIONS,
             "a receive posted after improbe took the claimed "
             "message");
    if (err != PSM2_OK) {
      MQ_CHECK_ERR(psm2_mq_cancel(&wr), PSM2_OK);
      Finish(p, &wr, "cancelled receive");
    }
  }
  if (req != PSM2_MQ_REQINVALID) {
    MQ_CHECK_ERR(psm2_mq_imrecv(p.mq, 0, b.data(), kLen101, Ctx(0x101), &req),
                 PSM2_OK);
    memset(&st, 0, sizeof(st));
    MQ_CHECK_ERR(psm2_mq_wait(&req, &st), PSM2_OK);
    MQ_CHECK(st.msg_tag == 101 && st.msg_length == kLen101 &&
                 st.nbytes == kLen101 && st.error_code == PSM2_OK &&
                 st.context == Ctx(0x101),
             "imrecv status: tag %" PRIu64
             ", length %u, nbytes %u, error %d, context %p",
             st.msg_tag, st.msg_length, st.nbytes, st.error_code, st.context);
    MQ_CHECK(FirstMismatch(b.data(), kLen101, 101) < 0 && b.GuardIntact(),
             "imrecv payload wrong");
  }

  // improbe2 on the rendezvous message: its data moves only after imrecv.
  req = PSM2_MQ_REQINVALID;
  memset(&st2, 0, sizeof(st2));
  {
    psm2_mq_tag_t t = Tag(102), s = kExact;
    MQ_CHECK_ERR(psm2_mq_improbe2(p.mq, p.peer, &t, &s, &req, &st2), PSM2_OK);
  }
  MQ_CHECK(req != PSM2_MQ_REQINVALID && st2.msg_length == kLen102 &&
               st2.msg_peer == p.peer && SameTag(st2.msg_tag, Tag(102)),
           "improbe2: tag %s, length %u, request %s", Str(st2.msg_tag).c_str(),
           st2.msg_length, req ? "set" : "NULL");
  MQ_CHECK_ERR(Iprobe2(p, PSM2_MQ_ANY_ADDR, Tag(102), kExact, &st2),
               PSM2_MQ_NO_COMPLETIONS);
  if (req != PSM2_MQ_REQINVALID) {
    MQ_CHECK_ERR(psm2_mq_imrecv(p.mq, 0, c.data(), kLen102, Ctx(0x102), &req),
                 PSM2_OK);
    memset(&st2, 0, sizeof(st2));
    MQ_CHECK_ERR(psm2_mq_wait2(&req, &st2), PSM2_OK);
    MQ_CHECK(st2.msg_length == kLen102 && st2.nbytes == kLen102 &&
                 st2.error_code == PSM2_OK && st2.context == Ctx(0x102) &&
                 st2.msg_peer == p.peer,
             "imrecv of 1 MiB: length %u, nbytes %u, error %d, context %p",
             st2.msg_length, st2.nbytes, st2.error_code, st2.context);
    MQ_CHECK(FirstMismatch(c.data(), kLen102, 102) < 0 && c.GuardIntact(),
             "imrecv of 1 MiB: payload wrong at %ld",
             FirstMismatch(c.data(), kLen102, 102));
  }
  MQ_CHECK_ERR(Iprobe2(p, PSM2_MQ_ANY_ADDR, kAnyTag, kAnyTag, &st2),
               PSM2_MQ_NO_COMPLETIONS);
}

// Calls psm2_mq_ipeek until it returns a request (ipeek itself makes
// progress while the completion queue is empty).
psm2_error_t PeekOne(Pair& p, psm2_mq_req_t* req, psm2_mq_status_t* st) {
  auto t0 = Clock::now();
  psm2_error_t err;
  while ((err = psm2_mq_ipeek(p.mq, req, st)) == PSM2_MQ_NO_COMPLETIONS &&
         SecondsSince(t0) < kCompleteTimeoutS) {
  }
  return err;
}

psm2_error_t PeekOne(Pair& p, psm2_mq_req_t* req, psm2_mq_status2_t* st) {
  auto t0 = Clock::now();
  psm2_error_t err;
  while ((err = psm2_mq_ipeek2(p.mq, req, st)) == PSM2_MQ_NO_COMPLETIONS &&
         SecondsSince(t0) < kCompleteTimeoutS) {
  }
  return err;
}

// ipeek/ipeek2 return requests in the order they completed, without
// dequeuing them; test/wait (or ipeek_dequeue + req_free) dequeue them.
void IpeekCompletionOrder(Pair& p) {
  // Round 0 uses ipeek + test, round 1 ipeek2 + wait2.
  const uint32_t kPostOrder[] = {110, 111, 112, 113};
  const uint32_t kSendOrder[2][4] = {{112, 110, 113, 111},
                                     {111, 113, 110, 112}};
  for (int round = 0; round < 2; round++) {
    const std::string name = round == 0 ? "ipeek" : "ipeek2";
    if (p.rank == kSender) {
      p.Barrier(name + ": posted");
      for (uint32_t tag : kSendOrder[round]) {
        MQ_CHECK_ERR(psm2_mq_send(p.mq, p.peer, 0, tag, &tag, 4), PSM2_OK);
      }
      continue;
    }
    psm2_mq_req_t reqs[4];
    uint32_t bufs[4] = {};
    for (int i = 0; i < 4; i++) {
      MQ_CHECK_ERR(psm2_mq_irecv(p.mq, kPostOrder[i], ~0ull, 0, &bufs[i], 4,
                                 Ctx(kPostOrder[i]), &reqs[i]),
                   PSM2_OK);
    }
    p.Barrier(name + ": posted");
    for (int k = 0; k < 4; k++) {
      const uint32_t want = kSendOrder[round][k];
      psm2_mq_req_t peeked = PSM2_MQ_REQINVALID, again = PSM2_MQ_REQINVALID;
      void* ctx = nullptr;
      psm2_error_t err;
      if (round == 0) {
        psm2_mq_status_t st;
        err = PeekOne(p, &peeked, &st);
        ctx = st.context;
        if (err == PSM2_OK) {
          // Peeking again returns the same request: ipeek does not dequeue.
          MQ_CHECK_ERR(psm2_mq_ipeek(p.mq, &again, nullptr), PSM2_OK);
        }
      } else {
        psm2_mq_status2_t st;
        err = PeekOne(p, &peeked, &st);
        ctx = st.context;
        if (err == PSM2_OK)
          MQ_CHECK_ERR(psm2_mq_ipeek2(p.mq, &again, nullptr), PSM2_OK);
      }
      MQ_CHECK_ERR(err, PSM2_OK);
      if (err != PSM2_OK) break;
      int idx = -1;
      for (int i = 0; i < 4; i++) {
        if (reqs[i] != PSM2_MQ_REQINVALID && reqs[i] == peeked) idx = i;
      }
      MQ_CHECK(idx >= 0 && kPostOrder[idx] == want && ctx == Ctx(want) &&
                   again == peeked,
               "%s #%d returned the receive for tag %u (context %p), want %u "
               "(completion "
               "order); a second peek returned %s request",
               name.c_str(), k, idx >= 0 ? kPostOrder[idx] : 0, ctx, want,
               again == peeked ? "the same" : "another");
      if (idx < 0) break;
      if (round == 0) {
        psm2_mq_status_t st;
        MQ_CHECK_ERR(psm2_mq_test(&reqs[idx], &st), PSM2_OK);
        MQ_CHECK(st.msg_tag == kPostOrder[idx] && bufs[idx] == kPostOrder[idx],
                 "test after ipeek: tag %" PRIu64 ", payload %u", st.msg_tag,
                 bufs[idx]);
      } else {
        psm2_mq_status2_t st;
        MQ_CHECK_ERR(psm2_mq_wait2(&reqs[idx], &st), PSM2_OK);
        MQ_CHECK(
            st.msg_tag.tag0 == kPostOrder[idx] && bufs[idx] == kPostOrder[idx],
            "wait2 after ipeek2: tag %s, payload %u", Str(st.msg_tag).c_str(),
            bufs[idx]);
      }
      MQ_CHECK(reqs[idx] == PSM2_MQ_REQINVALID,
               "completing a peeked request did not reset it");
    }
    for (int i = 0; i < 4; i++) {
      if (reqs[i] != PSM2_MQ_REQINVALID)
        Finish(p, &reqs[i], name + ": leftover receive");
    }
  }

  // ipeek_dequeue removes the head of the completion queue; req_free
  // returns it.
  if (p.rank == kSender) {
    p.Barrier("dequeue: posted");
    for (uint32_t tag : {117u, 116u}) {
      MQ_CHECK_ERR(psm2_mq_send(p.mq, p.peer, 0, tag, &tag, 4), PSM2_OK);
    }
    return;
  }
  psm2_mq_req_t r116, r117;
  uint32_t b116 = 0, b117 = 0;
  MQ_CHECK_ERR(psm2_mq_irecv(p.mq, 116, ~0ull, 0, &b116, 4, nullptr, &r116),
               PSM2_OK);
  MQ_CHECK_ERR(psm2_mq_irecv(p.mq, 117, ~0ull, 0, &b117, 4, nullptr, &r117),
               PSM2_OK);
  p.Barrier("dequeue: posted");
  for (psm2_mq_req_t want : {r117, r116}) {
    psm2_mq_req_t peeked = PSM2_MQ_REQINVALID, dequeued = PSM2_MQ_REQINVALID;
    psm2_mq_status_t st;
    MQ_CHECK_ERR(PeekOne(p, &peeked, &st), PSM2_OK);
    MQ_CHECK_ERR(psm2_mq_ipeek_dequeue(p.mq, &dequeued), PSM2_OK);
    MQ_CHECK(peeked == want && dequeued == want,
             "ipeek/ipeek_dequeue returned the %s request, "
             "want the receive for tag %d (completed first)",
             peeked == r116   ? "tag-116"
             : peeked == r117 ? "tag-117"
                              : "unknown",
             want == r117 ? 117 : 116);
    if (dequeued != PSM2_MQ_REQINVALID)
      MQ_CHECK_ERR(psm2_mq_req_free(p.mq, dequeued), PSM2_OK);
  }
  MQ_CHECK(b116 == 116 && b117 == 117, "dequeued receives hold %u and %u", b116,
           b117);
  psm2_mq_req_t sentinel = reinterpret_cast<psm2_mq_req_t>(0x5EA1);
  MQ_CHECK_ERR(psm2_mq_ipeek_dequeue(p.mq, &sentinel), PSM2_MQ_NO_COMPLETIONS);
  MQ_CHECK(sentinel == reinterpret_cast<psm2_mq_req_t>(0x5EA1),
           "ipeek_dequeue on an empty queue changed *req");
}

// State of the status_copy callback of IpeekDequeueMulti (a plain function
// pointer cannot carry a closure).
struct MultiEntry {
  uint32_t tag0;
  void* context;
};
struct MultiCall {
  uint32_t tag0;
  int index;
  bool fields_ok;
};
struct MultiState {
  int ret_for[16];  // callback's return value, by tag0 & 15
  std::vector<MultiCall> calls;
  psm2_epaddr_t peer;
  uint32_t (*bufs)[2];  // receive buffers, by tag0 & 15
};
MultiState g_multi;

int MultiCopy(struct psm2_mq_req_user* req, void* status_array,
              int entry_index) {
  uint32_t i = req->tag.tag0 & 15;
  bool ok = req->peer == g_multi.peer && req->tag.tag0 == (0xB0u | i) &&
            req->tag.tag1 == 0 && req->context == Ctx(0x100 + i) &&
            req->send_msglen == 8 && req->recv_msglen == 8 &&
            req->error_code == static_cast<uint32_t>(PSM2_OK) &&
            req->buf == reinterpret_cast<uint8_t*>(g_multi.bufs[i]);
  g_multi.calls.push_back({req->tag.tag0, entry_index, ok});
  int ret = g_multi.ret_for[i];
  if (ret >= 1) {
    static_cast<MultiEntry*>(status_array)[entry_index] = {req->tag.tag0,
                                                           req->context};
  }
  return ret;
}

// psm2_mq_ipeek_dequeue_multi: count semantics and the callback's return
// values (0: consumed, not stored; 1: stored; > 1: stored, stop; < 0: error).
void IpeekDequeueMulti(Pair& p) {
  constexpr int kN = 9;  // tags 0xB0..0xB8
  const psm2_mq_tag_t kMarker = Tag(0xBF);
  uint32_t bufs[16][2] = {};
  if (p.rank == kSender) {
    p.Barrier("posted");
    for (uint32_t i = 0; i < kN; i++) {
      uint32_t payload[2] = {0xB0 + i, i};
      MQ_CHECK_ERR(psm2_mq_send(p.mq, p.peer, 0, 0xB0 + i, payload, 8),
                   PSM2_OK);
    }
    MQ_CHECK_ERR(Send2(p, 0, kMarker, "m", 2), PSM2_OK);
    return;
  }
  psm2_mq_req_t reqs[kN];
  for (uint32_t i = 0; i < kN; i++) {
    MQ_CHECK_ERR(psm2_mq_irecv(p.mq, 0xB0 + i, ~0ull, 0, bufs[i], 8,
                               Ctx(0x100 + i), &reqs[i]),
                 PSM2_OK);
  }
  p.Barrier("posted");
  // Messages are delivered in order: once the (unexpected) marker is there,
  // all nine receives have completed and wait in the completion queue.
  AwaitUnexpected(p, kMarker, "marker");
  {
    char m[4];
    psm2_mq_req_t mr;
    MQ_CHECK_ERR(Irecv2(p, PSM2_MQ_ANY_ADDR, kMarker, kExact, m, sizeof(m),
                        nullptr, &mr),
                 PSM2_OK);
    Finish(p, &mr, "marker");
  }
  g_multi = MultiState{};
  g_multi.peer = p.peer;
  g_multi.bufs = bufs;
  MultiEntry arr[8];
  struct Step {
    const char* what;
    int count_in;
    int special_tag;  // -1: none
    int special_ret;
    psm2_error_t want_err;
    int want_count;
    std::vector<std::pair<uint32_t, int>> want_calls;  // (tag0, entry_index)
    std::vector<uint32_t> want_stored;
  };
  const std::vector<Step> steps = {
      {"count 0 processes nothing", 0, -1, 1, PSM2_OK, 0, {}, {}},
      {"count 2, callback returns 1",
       2,
       -1,
       1,
       PSM2_OK,
       2,
       {{0xB0, 0}, {0xB1, 1}},
       {0xB0, 0xB1}},
      {"callback returns 0 for B2 (consumed, not stored)",
       2,
       2,
       0,
       PSM2_OK,
       2,
       {{0xB2, 0}, {0xB3, 0}, {0xB4, 1}},
       {0xB3, 0xB4}},
      {"callback returns 2 for B5 (stored, stop)",
       5,
       5,
       2,
       PSM2_OK,
       1,
       {{0xB5, 0}},
       {0xB5}},
      {"callback returns -5 for B6 (error)",
       1,
       6,
       -5,
       PSM2_INTERNAL_ERR,
       -5,
       {{0xB6, 0}},
       {}},
      {"fewer than count available",
       5,
       -1,
       1,
       PSM2_MQ_NO_COMPLETIONS,
       2,
       {{0xB7, 0}, {0xB8, 1}},
       {0xB7, 0xB8}},
      {"empty queue", 3, -1, 1, PSM2_MQ_NO_COMPLETIONS, 0, {}, {}},
  };
  for (const Step& s : steps) {
    for (int& r : g_multi.ret_for) r = 1;
    if (s.special_tag >= 0) g_multi.ret_for[s.special_tag] = s.special_ret;
    g_multi.calls.clear();
    memset(arr, 0, sizeof(arr));
    int count = s.count_in;
    psm2_error_t err =
        psm2_mq_ipeek_dequeue_multi(p.mq, arr, MultiCopy, &count);
    MQ_CHECK(err == s.want_err && count == s.want_count,
             "%s: returned %d (%s) with count %d, "
             "want %d (%s) with count %d",
             s.what, err, psm2_error_get_string(err), count, s.want_err,
             psm2_error_get_string(s.want_err), s.want_count);
    bool calls_ok = g_multi.calls.size() == s.want_calls.size();
    for (size_t i = 0; calls_ok && i < s.want_calls.size(); i++) {
      calls_ok = g_multi.calls[i].tag0 == s.want_calls[i].first &&
                 g_multi.calls[i].index == s.want_calls[i].second;
    }
    std::string got;
    for (const MultiCall& c : g_multi.calls) {
      char one[32];
      snprintf(one, sizeof(one), " (%x,%d)", c.tag0, c.index);
      got += one;
      MQ_CHECK(c.fields_ok,
               "%s: psm2_mq_req_user of tag %x has wrong peer, tag, context, "
               "lengths, error_code or buf",
               s.what, c.tag0);
    }
    MQ_CHECK(calls_ok, "%s: callback calls (tag, entry_index):%s", s.what,
             got.c_str());
    for (size_t i = 0; i < s.want_stored.size(); i++) {
      MQ_CHECK(arr[i].tag0 == s.want_stored[i] &&
                   arr[i].context == Ctx(0x100 + (s.want_stored[i] & 15)),
               "%s: status_array[%zu] holds tag %x, want "
               "%x",
               s.what, i, arr[i].tag0, s.want_stored[i]);
    }
  }
  for (uint32_t i = 0; i < kN; i++) {
    MQ_CHECK(bufs[i][0] == 0xB0 + i && bufs[i][1] == i,
             "receive %x holds %x/%u", 0xB0 + i, bufs[i][0], bufs[i][1]);
  }
}

// psm2_mq_test never blocks and never completes a request that cannot
// complete; the request stays valid and completes later.
void TestNeverBlocks(Pair& p) {
  constexpr int kCalls = 1000;
  if (p.rank == kSender) {
    p.Barrier("tested");
    MQ_CHECK_ERR(psm2_mq_send(p.mq, p.peer, 0, 130, "late", 5), PSM2_OK);
    return;
  }
  char buf[8] = {};
  psm2_mq_req_t req;
  MQ_CHECK_ERR(
      psm2_mq_irecv(p.mq, 130, ~0ull, 0, buf, sizeof(buf), nullptr, &req),
      PSM2_OK);
  const psm2_mq_req_t posted = req;
  int wrong = 0;
  auto t0 = Clock::now();
  for (int i = 0; i < kCalls; i++) {
    psm2_mq_status_t st;
    if (psm2_mq_test(&req, &st) != PSM2_MQ_NO_COMPLETIONS || req != posted)
      wrong++;
    psm2_mq_status2_t st2;
    if (psm2_mq_test2(&req, &st2) != PSM2_MQ_NO_COMPLETIONS || req != posted)
      wrong++;
  }
  double elapsed = SecondsSince(t0);
  MQ_CHECK(wrong == 0,
           "%d of %d tests of an unmatched receive did not return "
           "PSM2_MQ_NO_COMPLETIONS with the request unchanged",
           wrong, 2 * kCalls);
  MQ_CHECK(elapsed < 0.05,
           "%d tests took %.1f ms (want < 50 ms): test must not block",
           2 * kCalls, elapsed * 1e3);
  p.Barrier("tested");
  psm2_mq_status_t st;
  if (Finish(p, &req, &st, "receive after the tests")) {
    MQ_CHECK(strcmp(buf, "late") == 0 && st.msg_length == 5, "got '%s'", buf);
  }
}

// psm2_mq_cancel: an unmatched receive is withdrawn (PSM2_OK) and must still
// be completed; Intel then reports it ready for completion (ipeek sees it)
// with error_code PSM2_OK (there is no "cancelled" code) and the context.
// A receive that already matched cannot be cancelled
// (PSM2_MQ_NO_COMPLETIONS) and completes normally.
void Cancel(Pair& p) {
  if (p.rank == kSender) {
    p.Barrier("cancelled");
    MQ_CHECK_ERR(psm2_mq_send(p.mq, p.peer, 0, 140, "for-new", 8), PSM2_OK);
    p.Barrier("posted 141");
    MQ_CHECK_ERR(psm2_mq_send(p.mq, p.peer, 0, 141, "matched", 8), PSM2_OK);
    return;
  }
  char buf[8];
  memset(buf, 'u', sizeof(buf));
  psm2_mq_req_t req, peeked = PSM2_MQ_REQINVALID;
  psm2_mq_status2_t st2;
  MQ_CHECK_ERR(
      Irecv2(p, PSM2_MQ_ANY_ADDR, Tag(140), kExact, buf, 8, Ctx(0x140), &req),
      PSM2_OK);
  MQ_CHECK_ERR(psm2_mq_cancel(&req), PSM2_OK);
  MQ_CHECK(req != PSM2_MQ_REQINVALID, "psm2_mq_cancel changed the request");
  MQ_CHECK_ERR(psm2_mq_ipeek2(p.mq, &peeked, &st2), PSM2_OK);
  MQ_CHECK(peeked == req,
           "ipeek2 after cancel did not return the cancelled receive");
  memset(&st2, 0xAB, sizeof(st2));
  MQ_CHECK_ERR(psm2_mq_test2(&req, &st2), PSM2_OK);
  MQ_CHECK(req == PSM2_MQ_REQINVALID,
           "test2 of a cancelled receive did not reset it");
  MQ_CHECK(st2.error_code == PSM2_OK && st2.context == Ctx(0x140),
           "cancelled receive: status "
           "error_code %d (Intel: PSM2_OK), context %p",
           st2.error_code, st2.context);
  // The same through psm2_mq_wait.
  psm2_mq_req_t req2;
  MQ_CHECK_ERR(psm2_mq_irecv(p.mq, 140, ~0ull, 0, buf, 8, Ctx(0x1402), &req2),
               PSM2_OK);
  MQ_CHECK_ERR(psm2_mq_cancel(&req2), PSM2_OK);
  psm2_mq_status_t st;
  memset(&st, 0xAB, sizeof(st));
  MQ_CHECK_ERR(psm2_mq_wait(&req2, &st), PSM2_OK);
  MQ_CHECK(req2 == PSM2_MQ_REQINVALID && st.error_code == PSM2_OK &&
               st.context == Ctx(0x1402),
           "cancelled receive through wait: error_code %d, context %p",
           st.error_code, st.context);
  MQ_CHECK(buf[0] == 'u' && buf[7] == 'u',
           "a cancelled receive wrote into its buffer");
  p.Barrier("cancelled");
  // The message for tag 140 goes to a new receive, not to the cancelled ones.
  char nb[8] = {};
  MQ_CHECK_ERR(psm2_mq_irecv(p.mq, 140, ~0ull, 0, nb, 8, nullptr, &req),
               PSM2_OK);
  if (Finish(p, &req, "receive after the cancelled ones")) {
    MQ_CHECK(strcmp(nb, "for-new") == 0, "new receive got '%s'", nb);
  }

  // Cancel after the match: wait for the completion through ipeek (which
  // does not dequeue), then cancel.
  char mb[8] = {};
  MQ_CHECK_ERR(psm2_mq_irecv(p.mq, 141, ~0ull, 0, mb, 8, Ctx(0x141), &req),
               PSM2_OK);
  p.Barrier("posted 141");
  peeked = PSM2_MQ_REQINVALID;
  MQ_CHECK_ERR(PeekOne(p, &peeked, &st), PSM2_OK);
  MQ_CHECK(peeked == req,
           "ipeek returned another request than the matched receive");
  MQ_CHECK_ERR(psm2_mq_cancel(&req), PSM2_MQ_NO_COMPLETIONS);
  MQ_CHECK(req != PSM2_MQ_REQINVALID, "a failed cancel changed the request");
  memset(&st, 0, sizeof(st));
  MQ_CHECK_ERR(psm2_mq_wait(&req, &st), PSM2_OK);
  MQ_CHECK(st.error_code == PSM2_OK && st.msg_length == 8 &&
               st.context == Ctx(0x141) && strcmp(mb, "matched") == 0,
           "matched receive after a failed cancel: error %d, "
           "length %u, payload '%s'",
           st.error_code, st.msg_length, mb);
}

// PSM2_MQ_FLAG_SENDSYNC: even a small send completes only once the receiver
// has matched it. Without the flag, a small send completes locally.
void SendSync(Pair& p) {
  if (p.rank == kSender) {
    psm2_mq_req_t req;
    MQ_CHECK_ERR(
        Isend2(p, PSM2_MQ_FLAG_SENDSYNC, Tag(150), "sync", 5, Ctx(0x150), &req),
        PSM2_OK);
    PollFor(p, 0.1);
    psm2_mq_status2_t st2;
    psm2_error_t err = psm2_mq_test2(&req, &st2);
    MQ_CHECK(err == PSM2_MQ_NO_COMPLETIONS,
             "a SENDSYNC isend2 completed before the receiver "
             "posted a receive");
    p.Barrier("sync isend2 tested");
    if (err != PSM2_OK) {
      MQ_CHECK_ERR(psm2_mq_wait2(&req, &st2), PSM2_OK);
      MQ_CHECK(st2.error_code == PSM2_OK && st2.context == Ctx(0x150),
               "SENDSYNC isend2 status: error %d, context %p", st2.error_code,
               st2.context);
    }

    // Blocking send with SENDSYNC returns only after the receiver, which
    // waits 150 ms before posting, has matched it.
    p.Barrier("blocking");
    auto t0 = Clock::now();
    MQ_CHECK_ERR(
        psm2_mq_send(p.mq, p.peer, PSM2_MQ_FLAG_SENDSYNC, 151, "bsync", 6),
        PSM2_OK);
    double elapsed = SecondsSince(t0);
    MQ_CHECK(elapsed >= 0.05,
             "blocking SENDSYNC send returned after %.1f ms, before the "
             "receiver posted (150 ms)",
             elapsed * 1e3);
    p.Barrier("blocking done");
    t0 = Clock::now();
    MQ_CHECK_ERR(Send2(p, PSM2_MQ_FLAG_SENDSYNC, Tag(152), "bsync2", 7),
                 PSM2_OK);
    elapsed = SecondsSince(t0);
    MQ_CHECK(elapsed >= 0.05,
             "blocking SENDSYNC send2 returned after %.1f ms, before the "
             "receiver posted (150 ms)",
             elapsed * 1e3);

    // A plain small isend completes without a posted receive.
    MQ_CHECK_ERR(Isend2(p, 0, Tag(153), "plain", 6, nullptr, &req), PSM2_OK);
    MQ_CHECK(PollUntilDone(p, &req, &st2, 2.0),
             "a plain 6-byte isend2 did not complete "
             "locally while no receive was posted");
    p.Barrier("plain sent");
    if (req != PSM2_MQ_REQINVALID) Finish(p, &req, "plain isend2");
    return;
  }
  char b[8] = {};
  psm2_mq_req_t r;
  p.Barrier("sync isend2 tested");
  MQ_CHECK_ERR(Irecv2(p, PSM2_MQ_ANY_ADDR, Tag(150), kExact, b, 8, nullptr, &r),
               PSM2_OK);
  if (Finish(p, &r, "SENDSYNC receive"))
    MQ_CHECK(strcmp(b, "sync") == 0, "got '%s'", b);
  p.Barrier("blocking");
  for (uint32_t tag : {151u, 152u}) {
    // Post late (the message arrives unexpected meanwhile): the blocking
    // SENDSYNC send must still be waiting when this returns.
    PollFor(p, 0.15);
    memset(b, 0, sizeof(b));
    MQ_CHECK_ERR(
        Irecv2(p, PSM2_MQ_ANY_ADDR, Tag(tag), kExact, b, 8, nullptr, &r),
        PSM2_OK);
    if (Finish(p, &r, "blocking SENDSYNC receive")) {
      MQ_CHECK(strcmp(b, tag == 151 ? "bsync" : "bsync2") == 0, "got '%s'", b);
    }
    if (tag == 151) p.Barrier("blocking done");
  }
  p.Barrier("plain sent");
  MQ_CHECK_ERR(Irecv2(p, PSM2_MQ_ANY_ADDR, Tag(153), kExact, b, 8, nullptr, &r),
               PSM2_OK);
  if (Finish(p, &r, "plain receive"))
    MQ_CHECK(strcmp(b, "plain") == 0, "got '%s'", b);
}

// A SENDSYNC send to oneself returns once a receive matched it, and that
// receive is complete then too: a test right after the send finds it done
// (Intel's self device copies during the send). MPI_Ssend to one's own
// rank followed by MPI_Testsome relies on it (mpi4py's testWaitSomeRecv
// and testTestSomeRecv). Each rank on itself, receives posted in order and
// matched out of order, many rounds (the completions of the send and of
// its receive reach psmd's client one after the other).
void SendSyncToSelf(Pair& p) {
  psm2_epaddr_t self = nullptr;
  psm2_error_t conn_err = PSM2_OK;
  psm2_error_t err = psm2_ep_connect(p.ep, 1, &p.self_epid, nullptr, &conn_err,
                                     &self, 10 * 1000000000LL);
  MQ_CHECK(err == PSM2_OK && self != nullptr,
           "psm2_ep_connect to this endpoint's own epid failed: %s / %s",
           psm2_error_get_string(err), psm2_error_get_string(conn_err));
  if (self == nullptr) return;
  constexpr int kRounds = 1000;
  constexpr uint32_t kRecvs = 6;
  int pending_after_send = 0;
  for (int round = 0; round < kRounds; round++) {
    char b[kRecvs][8] = {};
    psm2_mq_req_t r[kRecvs];
    for (uint32_t i = 0; i < kRecvs; i++) {
      MQ_CHECK_ERR(
          Irecv2(p, self, Tag(160 + i), kExact, b[i], 8, nullptr, &r[i]),
          PSM2_OK);
    }
    for (uint32_t i : {5u, 3u, 1u, 2u, 0u, 4u}) {
      psm2_mq_tag_t t = Tag(160 + i);
      MQ_CHECK_ERR(
          psm2_mq_send2(p.mq, self, PSM2_MQ_FLAG_SENDSYNC, &t, "abc", 4),
          PSM2_OK);
      psm2_mq_status2_t st;
      psm2_error_t got = psm2_mq_test2(&r[i], &st);
      if (got != PSM2_OK) {
        pending_after_send++;
        MQ_CHECK_ERR(psm2_mq_wait2(&r[i], &st), PSM2_OK);
      }
      MQ_CHECK(st.error_code == PSM2_OK && strcmp(b[i], "abc") == 0,
               "receive %u of round %d: error %d, payload '%s'", i, round,
               st.error_code, b[i]);
    }
  }
  MQ_CHECK(pending_after_send == 0,
           "%d of %d receives were still pending right after the SENDSYNC "
           "send to self that they matched had returned",
           pending_after_send, kRounds * static_cast<int>(kRecvs));
}

// More SENDSYNC sends outstanding than a completion ring has slots (psmd's
// default is 1024): a probe and a cancel issued meanwhile still answer at
// once, and every send completes once the receiver matches it.
void ManySyncSendsDoNotBlockProbes(Pair& p) {
  constexpr uint32_t kSends = 1500;
  constexpr uint32_t kTagBase = 0x52000;
  if (p.rank == kSender) {
    std::vector<psm2_mq_req_t> reqs(kSends);
    std::vector<uint32_t> payload(kSends);
    for (uint32_t i = 0; i < kSends; i++) {
      payload[i] = kTagBase + i;
      MQ_CHECK_ERR(Isend2(p, PSM2_MQ_FLAG_SENDSYNC, Tag(payload[i]),
                          &payload[i], sizeof(uint32_t), nullptr, &reqs[i]),
                   PSM2_OK);
    }
    psm2_mq_status2_t st;
    auto t0 = Clock::now();
    MQ_CHECK_ERR(Iprobe2(p, PSM2_MQ_ANY_ADDR, Tag(kTagBase - 1), kExact, &st),
                 PSM2_MQ_NO_COMPLETIONS);
    // A receive nobody sends to, cancelled: a second round trip.
    uint32_t unused;
    psm2_mq_req_t r;
    MQ_CHECK_ERR(Irecv2(p, PSM2_MQ_ANY_ADDR, Tag(kTagBase - 2), kExact, &unused,
                        sizeof(unused), nullptr, &r),
                 PSM2_OK);
    MQ_CHECK_ERR(psm2_mq_cancel(&r), PSM2_OK);
    MQ_CHECK_ERR(psm2_mq_wait2(&r, &st), PSM2_OK);
    MQ_CHECK(SecondsSince(t0) < 5.0,
             "probe and cancel behind %u unmatched SENDSYNC sends "
             "took %.1f s",
             kSends, SecondsSince(t0));
    p.Barrier("sends posted");
    for (uint32_t i = 0; i < kSends; i++)
      Finish(p, &reqs[i], "SENDSYNC isend2");
    return;
  }
  p.Barrier("sends posted");
  int wrong = 0;
  for (uint32_t i = 0; i < kSends; i++) {
    uint32_t got = 0;
    psm2_mq_req_t r;
    MQ_CHECK_ERR(Irecv2(p, PSM2_MQ_ANY_ADDR, Tag(kTagBase + i), kExact, &got,
                        sizeof(got), nullptr, &r),
                 PSM2_OK);
    if (Finish(p, &r, "receive of a SENDSYNC send") && got != kTagBase + i)
      wrong++;
  }
  MQ_CHECK(wrong == 0, "%d of %u receives got another message", wrong, kSends);
}

// Corner cases of request handling the documentation spells out, and two
// Intel answers it leaves open.
void RequestCornerCases(Pair& p) {
  // wait/test on PSM2_MQ_REQINVALID return PSM2_OK at once, status untouched.
  psm2_mq_req_t none = PSM2_MQ_REQINVALID;
  psm2_mq_status_t st;
  psm2_mq_status2_t st2;
  memset(&st, 0xAB, sizeof(st));
  memset(&st2, 0xAB, sizeof(st2));
  MQ_CHECK_ERR(psm2_mq_wait(&none, &st), PSM2_OK);
  MQ_CHECK_ERR(psm2_mq_wait2(&none, &st2), PSM2_OK);
  MQ_CHECK_ERR(psm2_mq_test(&none, &st), PSM2_OK);
  MQ_CHECK_ERR(psm2_mq_test2(&none, &st2), PSM2_OK);
  MQ_CHECK(st.msg_length == 0xABABABABu && st2.msg_length == 0xABABABABu,
           "wait/test of PSM2_MQ_REQINVALID wrote a status");
  MQ_CHECK(none == PSM2_MQ_REQINVALID,
           "wait/test changed a PSM2_MQ_REQINVALID request");
  // Intel: cancelling PSM2_MQ_REQINVALID reports PSM2_MQ_NO_COMPLETIONS.
  MQ_CHECK_ERR(psm2_mq_cancel(&none), PSM2_MQ_NO_COMPLETIONS);
  MQ_CHECK_ERR(psm2_mq_req_free(p.mq, nullptr), PSM2_OK);
  // Nothing completed: ipeek/ipeek2/ipeek_dequeue report no completions.
  psm2_mq_req_t r = PSM2_MQ_REQINVALID;
  MQ_CHECK_ERR(psm2_mq_ipeek(p.mq, &r, &st), PSM2_MQ_NO_COMPLETIONS);
  MQ_CHECK_ERR(psm2_mq_ipeek2(p.mq, &r, &st2), PSM2_MQ_NO_COMPLETIONS);
  MQ_CHECK_ERR(psm2_mq_ipeek_dequeue(p.mq, &r), PSM2_MQ_NO_COMPLETIONS);

  // A blocking send returns with the buffer reusable: overwriting it at once
  // must not change what arrives, eager (unexpected) or rendezvous
  // (expected: a blocking rendezvous send needs the receive posted).
  constexpr uint32_t kSmall = 64, kBig = 1u << 20;
  if (p.rank == kSender) {
    std::vector<uint8_t> small(kSmall), big(kBig);
    Fill(small.data(), kSmall, 180);
    Fill(big.data(), kBig, 181);
    MQ_CHECK_ERR(psm2_mq_send(p.mq, p.peer, 0, 180, small.data(), kSmall),
                 PSM2_OK);
    memset(small.data(), 0, kSmall);
    p.Barrier("small sent, big posted");
    MQ_CHECK_ERR(psm2_mq_send(p.mq, p.peer, 0, 181, big.data(), kBig), PSM2_OK);
    memset(big.data(), 0, kBig);
    // wait with a NULL status on a send.
    psm2_mq_req_t s;
    MQ_CHECK_ERR(psm2_mq_isend(p.mq, p.peer, 0, 182, "n", 2, nullptr, &s),
                 PSM2_OK);
    MQ_CHECK_ERR(psm2_mq_wait(&s, nullptr), PSM2_OK);
    MQ_CHECK(s == PSM2_MQ_REQINVALID,
             "wait(NULL status) did not reset the send request");
    return;
  }
  GuardedBuf small(kSmall), big(kBig);
  MQ_CHECK_ERR(
      psm2_mq_irecv(p.mq, 181, ~0ull, 0, big.data(), kBig, nullptr, &r),
      PSM2_OK);
  p.Barrier("small sent, big posted");
  if (Finish(p, &r, "1 MiB receive from a blocking send")) {
    MQ_CHECK(FirstMismatch(big.data(), kBig, 181) < 0,
             "1 MiB from a blocking send changed at "
             "%ld: the send returned before the data was taken",
             FirstMismatch(big.data(), kBig, 181));
  }
  AwaitUnexpected(p, Tag(180), "64 bytes from a blocking send");
  MQ_CHECK_ERR(
      psm2_mq_irecv(p.mq, 180, ~0ull, 0, small.data(), kSmall, nullptr, &r),
      PSM2_OK);
  if (Finish(p, &r, "64-byte receive from a blocking send")) {
    MQ_CHECK(FirstMismatch(small.data(), kSmall, 180) < 0,
             "64 bytes from a blocking send "
             "changed after the send returned");
  }
  char n[4] = {};
  MQ_CHECK_ERR(psm2_mq_irecv(p.mq, 182, ~0ull, 0, n, sizeof(n), nullptr, &r),
               PSM2_OK);
  auto t0 = Clock::now();
  MQ_CHECK_ERR(psm2_mq_wait(&r, nullptr), PSM2_OK);
  MQ_CHECK(
      r == PSM2_MQ_REQINVALID && strcmp(n, "n") == 0 && SecondsSince(t0) < 10,
      "wait(NULL status) on a receive: payload '%s'", n);
}

// psmd progresses requests in the daemon: a receive it completed is seen
// complete by psm2_mq_test without any psm2_poll. Intel makes progress only
// inside PSM2 calls (the documented model), so there the loop polls.
void CompletesWithoutPoll(Pair& p) {
  if (p.rank == kSender) {
    p.Barrier("posted");
    MQ_CHECK_ERR(psm2_mq_send(p.mq, p.peer, 0, 190, "nopoll", 7), PSM2_OK);
    p.Barrier("received");
    return;
  }
  char buf[8] = {};
  psm2_mq_req_t req;
  psm2_mq_status_t st;
  MQ_CHECK_ERR(
      psm2_mq_irecv(p.mq, 190, ~0ull, 0, buf, sizeof(buf), nullptr, &req),
      PSM2_OK);
  // The message is sent after this barrier, and the loop below is the only
  // thing this rank does until it completes: no barrier polls for it.
  p.Barrier("posted");
  // psmd completes requests on its own; Intel needs psm2_poll.
  const bool poll = p.impl != "psmd";
  bool done = false;
  auto t0 = Clock::now();
  while (!done && SecondsSince(t0) < 2.0) {
    done = psm2_mq_test(&req, &st) == PSM2_OK;
    if (!done && poll) psm2_poll(p.ep);
  }
  MQ_CHECK(done,
           "a receive did not complete within 2 s of psm2_mq_test calls%s",
           poll ? " and psm2_poll" : " without psm2_poll");
  if (done) MQ_CHECK(strcmp(buf, "nopoll") == 0, "got '%s'", buf);
  p.Barrier("received");
  if (!done) Finish(p, &req, "receive, completed with polling");
}

}  // namespace

std::vector<Case> CompletionCases() {
  return {
      {"zero_length_and_status_fields", Checked(ZeroLengthAndStatusFields)},
      {"probe_and_matched_probe", Checked(ProbeAndMatchedProbe)},
      {"ipeek_completion_order", Checked(IpeekCompletionOrder)},
      {"ipeek_dequeue_multi", Checked(IpeekDequeueMulti)},
      {"test_never_blocks", Checked(TestNeverBlocks)},
      {"cancel", Checked(Cancel)},
      {"sendsync", Checked(SendSync)},
      {"sendsync_to_self", Checked(SendSyncToSelf)},
      {"many_sync_sends_do_not_block_probes",
       Checked(ManySyncSendsDoNotBlockProbes)},
      {"request_corner_cases", Checked(RequestCornerCases)},
      {"completes_without_poll", Checked(CompletesWithoutPoll)},
  };
}

}  // namespace psmd::conformance::mq
