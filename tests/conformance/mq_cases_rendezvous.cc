// Matched-queue conformance cases for the paths a large message can take
// besides a plain posted receive: claimed by a matched probe and received
// with imrecv, and sent to the endpoint itself. Each was a drop-in bug that
// Open MPI programs hit (MPI_Mprobe/MPI_Mrecv, MPI_Send to one's own rank).
// See mq_cases_util.h for the conventions.
#include <cinttypes>
#include <cstring>
#include <string>
#include <vector>

#include "tests/conformance/mq_cases_util.h"

namespace psmd::conformance::mq {
namespace {

constexpr uint32_t kEagerA = 500, kEagerB = 600, kRndvLen = 300000,
                   kTag64Len = 1000;

// Completes *req and checks that its status reports success: a sender whose
// message was delivered must not see an error.
void FinishOk(Pair& p, psm2_mq_req_t* req, const std::string& what) {
  psm2_mq_status2_t st;
  st.error_code = PSM2_INTERNAL_ERR;
  if (Finish(p, req, &st, what)) {
    MQ_CHECK(st.error_code == PSM2_OK, "%s: completed with error %d (%s)",
             what.c_str(), st.error_code, psm2_error_get_string(st.error_code));
  }
}

// The endpoint's address for itself (psm2_ep_connect to its own epid), or
// null after a failed check.
psm2_epaddr_t ConnectSelf(Pair& p) {
  psm2_epaddr_t self = nullptr;
  psm2_error_t conn_err = PSM2_OK;
  MQ_CHECK_ERR(psm2_ep_connect(p.ep, 1, &p.self_epid, nullptr, &conn_err, &self,
                               static_cast<int64_t>(5e9)),
               PSM2_OK);
  return self;
}

// Receives into a fresh buffer of `len` and checks the bytes against `seed`.
void CheckReceived(Pair& p, psm2_mq_req_t* req, const std::vector<uint8_t>& buf,
                   uint32_t len, uint32_t seed, const std::string& what) {
  psm2_mq_status2_t st;
  if (!Finish(p, req, &st, what)) return;
  MQ_CHECK(st.error_code == PSM2_OK && st.msg_length == len && st.nbytes == len,
           "%s: error %d, length %u, nbytes %u, want %u", what.c_str(),
           st.error_code, st.msg_length, st.nbytes, len);
  MQ_CHECK(FirstMismatch(buf.data(), len, seed) < 0,
           "%s: payload wrong at byte %ld", what.c_str(),
           FirstMismatch(buf.data(), len, seed));
}

// The sequence of the drop-in bug report: two eager messages P, a
// rendezvous message Q, a 64-bit-tag message and a marker; the receiver
// claims the first P, receives the second with irecv2, imrecvs the first,
// then claims Q by its source and imrecvs it. `between` adds receives of
// the other messages between claiming Q and receiving it. Every sender
// request must complete with PSM2_OK.
void ClaimedRendezvous(Pair& p, bool between) {
  const psm2_mq_tag_t kP = Tag(0x51, 7), kQ = Tag(0x52, 7),
                      kMarker = Tag(0x53, 7);
  const uint64_t kTag64 = 0x54;
  if (p.rank == kSender) {
    std::vector<uint8_t> a(kEagerA), b(kEagerB), q(kRndvLen), t(kTag64Len);
    Fill(a.data(), a.size(), 1);
    Fill(b.data(), b.size(), 2);
    Fill(q.data(), q.size(), 3);
    Fill(t.data(), t.size(), 4);
    psm2_mq_req_t r[5];
    MQ_CHECK_ERR(Isend2(p, 0, kP, a.data(), kEagerA, nullptr, &r[0]), PSM2_OK);
    MQ_CHECK_ERR(Isend2(p, 0, kP, b.data(), kEagerB, nullptr, &r[1]), PSM2_OK);
    MQ_CHECK_ERR(Isend2(p, 0, kQ, q.data(), kRndvLen, nullptr, &r[2]), PSM2_OK);
    MQ_CHECK_ERR(psm2_mq_isend(p.mq, p.peer, 0, kTag64, t.data(), kTag64Len,
                               nullptr, &r[3]),
                 PSM2_OK);
    MQ_CHECK_ERR(Isend2(p, 0, kMarker, nullptr, 0, nullptr, &r[4]), PSM2_OK);
    const char* names[] = {"first eager P", "second eager P", "rendezvous Q",
                           "64-bit message", "marker"};
    // Blocking waits, as MPI_Wait: the variant the bug report used.
    for (int i = 0; i < 5; i++) {
      psm2_mq_status2_t st;
      MQ_CHECK_ERR(psm2_mq_wait2(&r[i], &st), PSM2_OK);
      MQ_CHECK(st.error_code == PSM2_OK,
               "send of %s: completed with error %d (%s)", names[i],
               st.error_code, psm2_error_get_string(st.error_code));
    }
    p.Barrier("received");
    return;
  }
  AwaitUnexpected(p, kMarker, "marker");
  std::vector<uint8_t> a(kEagerA), b(kEagerB), q(kRndvLen), t(kTag64Len);
  psm2_mq_status2_t st;
  psm2_mq_req_t claimed_p = PSM2_MQ_REQINVALID, recv_b,
                claimed_q = PSM2_MQ_REQINVALID;
  psm2_mq_tag_t tag = kP, sel = kExact;
  MQ_CHECK_ERR(
      psm2_mq_improbe2(p.mq, PSM2_MQ_ANY_ADDR, &tag, &sel, &claimed_p, &st),
      PSM2_OK);
  MQ_CHECK(st.msg_length == kEagerA, "improbe2 of P: length %u, want %u",
           st.msg_length, kEagerA);
  MQ_CHECK_ERR(Irecv2(p, PSM2_MQ_ANY_ADDR, kP, kExact, b.data(), kEagerB,
                      nullptr, &recv_b),
               PSM2_OK);
  if (claimed_p != PSM2_MQ_REQINVALID) {
    MQ_CHECK_ERR(
        psm2_mq_imrecv(p.mq, 0, a.data(), kEagerA, nullptr, &claimed_p),
        PSM2_OK);
  }
  tag = kQ;
  MQ_CHECK_ERR(psm2_mq_improbe2(p.mq, p.peer, &tag, &sel, &claimed_q, &st),
               PSM2_OK);
  MQ_CHECK(st.msg_length == kRndvLen && st.msg_peer == p.peer,
           "improbe2 of Q: length %u, want %u; peer %s", st.msg_length,
           kRndvLen, st.msg_peer == p.peer ? "ok" : "WRONG");
  psm2_mq_req_t recv_t, recv_marker;
  char marker;
  auto receive_rest = [&] {
    MQ_CHECK_ERR(psm2_mq_irecv(p.mq, kTag64, ~0ull, 0, t.data(), kTag64Len,
                               nullptr, &recv_t),
                 PSM2_OK);
    MQ_CHECK_ERR(
        Irecv2(p, p.peer, kMarker, kExact, &marker, 0, nullptr, &recv_marker),
        PSM2_OK);
    CheckReceived(p, &recv_t, t, kTag64Len, 4, "64-bit message");
    FinishOk(p, &recv_marker, "marker");
  };
  if (between) receive_rest();
  if (claimed_q != PSM2_MQ_REQINVALID) {
    MQ_CHECK_ERR(
        psm2_mq_imrecv(p.mq, 0, q.data(), kRndvLen, nullptr, &claimed_q),
        PSM2_OK);
    CheckReceived(p, &claimed_q, q, kRndvLen, 3, "imrecv of Q");
  }
  if (claimed_p != PSM2_MQ_REQINVALID)
    CheckReceived(p, &claimed_p, a, kEagerA, 1, "imrecv of P");
  CheckReceived(p, &recv_b, b, kEagerB, 2, "irecv2 of the second P");
  if (!between) receive_rest();
  p.Barrier("received");
}

void ClaimedRendezvousSenderStatus(Pair& p) {
  ClaimedRendezvous(p, /*between=*/false);
}
void ClaimedRendezvousAfterOtherReceives(Pair& p) {
  ClaimedRendezvous(p, /*between=*/true);
}

// A claimed rendezvous message whose receive buffer is smaller than the
// message: the receiver reports truncation, the sender success.
void ClaimedRendezvousTruncated(Pair& p) {
  const psm2_mq_tag_t kQ = Tag(0x55, 7);
  constexpr uint32_t kShort = kRndvLen / 3;
  if (p.rank == kSender) {
    std::vector<uint8_t> q(kRndvLen);
    Fill(q.data(), q.size(), 5);
    psm2_mq_req_t r;
    MQ_CHECK_ERR(Isend2(p, 0, kQ, q.data(), kRndvLen, nullptr, &r), PSM2_OK);
    FinishOk(p, &r, "send of the truncated rendezvous message");
    p.Barrier("received");
    return;
  }
  AwaitUnexpected(p, kQ, "rendezvous message");
  std::vector<uint8_t> q(kShort);
  psm2_mq_status2_t st;
  psm2_mq_req_t claimed = PSM2_MQ_REQINVALID;
  psm2_mq_tag_t tag = kQ, sel = kExact;
  MQ_CHECK_ERR(
      psm2_mq_improbe2(p.mq, PSM2_MQ_ANY_ADDR, &tag, &sel, &claimed, &st),
      PSM2_OK);
  if (claimed != PSM2_MQ_REQINVALID) {
    MQ_CHECK_ERR(psm2_mq_imrecv(p.mq, 0, q.data(), kShort, nullptr, &claimed),
                 PSM2_OK);
    if (Finish(p, &claimed, &st, "truncated imrecv")) {
      MQ_CHECK(st.error_code == PSM2_MQ_TRUNCATION &&
                   st.msg_length == kRndvLen && st.nbytes == kShort,
               "truncated imrecv: error %d, length %u, nbytes %u",
               st.error_code, st.msg_length, st.nbytes);
      MQ_CHECK(FirstMismatch(q.data(), kShort, 5) < 0,
               "truncated imrecv: payload wrong");
    }
  }
  p.Barrier("received");
}

// psm2_mq_imrecv of a claimed eager message completes within the call: the
// message had arrived, so its bytes are in the buffer before imrecv returns
// (Intel copies them out of its system buffer). mpi4py's pkl5 tests drop
// such a request after one test and free the buffer; a library that copies
// later writes into freed memory.
void ImrecvOfEagerMessageCompletesAtOnce(Pair& p) {
  const uint32_t kLens[] = {0, 16, 227, 4096};
  if (p.rank == kSender) {
    for (uint32_t len : kLens) {
      std::vector<uint8_t> out(len);
      Fill(out.data(), len, len);
      MQ_CHECK_ERR(Send2(p, 0, Tag(0x56, len), out.data(), len), PSM2_OK);
    }
    p.Barrier("received");
    return;
  }
  for (uint32_t len : kLens) {
    const std::string what =
        "imrecv of a claimed " + std::to_string(len) + "-byte message";
    AwaitUnexpected(p, Tag(0x56, len), what);
    psm2_mq_req_t req = PSM2_MQ_REQINVALID;
    psm2_mq_status2_t st;
    psm2_mq_tag_t tag = Tag(0x56, len), sel = kExact;
    MQ_CHECK_ERR(
        psm2_mq_improbe2(p.mq, PSM2_MQ_ANY_ADDR, &tag, &sel, &req, &st),
        PSM2_OK);
    if (req == PSM2_MQ_REQINVALID) continue;
    std::vector<uint8_t> in(len + 1, 0xEE);
    MQ_CHECK_ERR(psm2_mq_imrecv(p.mq, 0, in.data(), len, nullptr, &req),
                 PSM2_OK);
    MQ_CHECK(FirstMismatch(in.data(), len, len) < 0 && in[len] == 0xEE,
             "%s: payload not in the buffer when imrecv returned (first wrong "
             "byte %ld)",
             what.c_str(), FirstMismatch(in.data(), len, len));
    psm2_error_t err = psm2_mq_test2(&req, &st);
    MQ_CHECK(err == PSM2_OK,
             "%s: psm2_mq_test2 right after imrecv returned %d, want PSM2_OK",
             what.c_str(), err);
    if (err == PSM2_OK) {
      MQ_CHECK(
          st.error_code == PSM2_OK && st.msg_length == len && st.nbytes == len,
          "%s: error %d, length %u, nbytes %u", what.c_str(), st.error_code,
          st.msg_length, st.nbytes);
    } else {
      Finish(p, &req, what);
    }
  }
  p.Barrier("received");
}

// A send from a NULL buffer with a length (what Open MPI 4.1's mtl psm2
// passes for MPI_BOTTOM with absolute-address datatypes) fails, and so does
// its matching receive, instead of leaving the receiver waiting for good.
// psmd only: Intel's library dereferences the NULL pointer.
void NullBufferSendFailsBothEnds(Pair& p) {
  if (p.impl != "psmd") return;
  const psm2_mq_tag_t kTag = Tag(0x57, 7);
  if (p.rank == kSender) {
    psm2_mq_req_t r;
    MQ_CHECK_ERR(Isend2(p, 0, kTag, nullptr, 8, nullptr, &r), PSM2_OK);
    psm2_mq_status2_t st;
    if (Finish(p, &r, &st, "send from NULL"))
      MQ_CHECK_ERR(st.error_code, PSM2_PARAM_ERR);
    p.Barrier("received");
    return;
  }
  uint64_t buf = 0;
  psm2_mq_req_t r;
  MQ_CHECK_ERR(Irecv2(p, PSM2_MQ_ANY_ADDR, kTag, kExact, &buf, 8, nullptr, &r),
               PSM2_OK);
  psm2_mq_status2_t st;
  if (Finish(p, &r, &st, "receive of a send from NULL")) {
    MQ_CHECK_ERR(st.error_code, PSM2_PARAM_ERR);
  }
  p.Barrier("received");
}

// A send to the endpoint's own address completes before any receive is
// posted, at every size (Intel's self device buffers the message), and a
// receive posted afterwards gets the data. Codes that MPI_Send to their own
// rank before posting the receive depend on it.
void SendToSelfCompletesUnposted(Pair& p) {
  psm2_epaddr_t self = ConnectSelf(p);
  if (self == nullptr) return;
  const uint32_t kSizes[] = {8, 4096, 100000, 1u << 20, 16u << 20};
  uint32_t seed = 60;
  for (uint32_t len : kSizes) {
    const std::string what = "send of " + std::to_string(len) + " B to self";
    std::vector<uint8_t> out(len), in(len);
    Fill(out.data(), len, ++seed);
    psm2_mq_tag_t tag = Tag(0x60, len, static_cast<uint32_t>(p.rank));
    psm2_mq_req_t send;
    MQ_CHECK_ERR(
        psm2_mq_isend2(p.mq, self, 0, &tag, out.data(), len, nullptr, &send),
        PSM2_OK);
    FinishOk(p, &send, what);
    // The application may reuse its buffer once the send completed.
    memset(out.data(), 0, len);
    psm2_mq_req_t recv;
    MQ_CHECK_ERR(Irecv2(p, self, tag, kExact, in.data(), len, nullptr, &recv),
                 PSM2_OK);
    CheckReceived(p, &recv, in, len, seed, "receive of " + what);
  }
}

// A send to oneself is complete for psm2_mq_test right away, but psm2_mq_ipeek
// returns it only once a receive matched it (Intel's self device; Open MPI,
// which collects completions through ipeek, then sees the send and its
// receive finish together).
void SelfSendJoinsIpeekWhenMatched(Pair& p) {
  psm2_epaddr_t self = ConnectSelf(p);
  if (self == nullptr) return;
  for (uint32_t len : {8u, 1u << 20}) {
    const std::string what = std::to_string(len) + "-byte send to self";
    std::vector<uint8_t> out(len), in(len);
    Fill(out.data(), len, len);
    psm2_mq_tag_t tag = Tag(0x61, len, static_cast<uint32_t>(p.rank));
    psm2_mq_req_t send, peeked;
    MQ_CHECK_ERR(
        psm2_mq_isend2(p.mq, self, 0, &tag, out.data(), len, Ctx(1), &send),
        PSM2_OK);
    PollFor(p, 0.05);
    MQ_CHECK(psm2_mq_ipeek2(p.mq, &peeked, nullptr) == PSM2_MQ_NO_COMPLETIONS,
             "%s: ipeek returned a request before any receive was posted",
             what.c_str());
    psm2_mq_req_t recv;
    MQ_CHECK_ERR(Irecv2(p, self, tag, kExact, in.data(), len, Ctx(2), &recv),
                 PSM2_OK);
    // Both complete, and ipeek returns both.
    int seen = 0;
    auto t0 = Clock::now();
    while (seen < 2 && SecondsSince(t0) < kCompleteTimeoutS) {
      psm2_mq_status2_t st;
      if (psm2_mq_ipeek2(p.mq, &peeked, &st) != PSM2_OK) continue;
      MQ_CHECK(peeked == send || peeked == recv,
               "%s: ipeek returned a stranger", what.c_str());
      MQ_CHECK_ERR(psm2_mq_test2(&peeked, &st), PSM2_OK);
      seen++;
    }
    MQ_CHECK(seen == 2, "%s: ipeek returned %d of the send and its receive",
             what.c_str(), seen);
    MQ_CHECK(FirstMismatch(in.data(), len, len) < 0, "%s: payload wrong",
             what.c_str());
  }
}

}  // namespace

std::vector<Case> RendezvousCases() {
  return {
      {"claimed_rendezvous_sender_status",
       Checked(ClaimedRendezvousSenderStatus)},
      {"claimed_rendezvous_after_other_receives",
       Checked(ClaimedRendezvousAfterOtherReceives)},
      {"claimed_rendezvous_truncated", Checked(ClaimedRendezvousTruncated)},
      {"imrecv_of_eager_message_completes_at_once",
       Checked(ImrecvOfEagerMessageCompletesAtOnce)},
      {"null_buffer_send_fails_both_ends",
       Checked(NullBufferSendFailsBothEnds)},
      {"send_to_self_completes_unposted", Checked(SendToSelfCompletesUnposted)},
      {"self_send_joins_ipeek_when_matched",
       Checked(SelfSendJoinsIpeekWhenMatched)},
  };
}

}  // namespace psmd::conformance::mq
