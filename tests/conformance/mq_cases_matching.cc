// Matched-queue conformance cases: which receive a message matches (tags of
// 64 and 96 bits, selectors, sources, ordering). See mq_cases_util.h for the
// conventions.
#include <algorithm>
#include <cinttypes>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "tests/conformance/mq_cases_util.h"

namespace psmd::conformance::mq {
namespace {

// A 64-bit tag is the 96-bit tag {low word, high word, 0}, so the 64-bit and
// 96-bit calls interoperate. A 64-bit receive's selector covers tag0 and
// tag1 only: Intel matches it with a 96-bit message whatever its tag2.
void TagsInteroperate(Pair& p) {
  const uint64_t kA = 0x1122334455667788ull;                    // isend, 64-bit
  const psm2_mq_tag_t kAas96 = Tag(0x55667788, 0x11223344, 0);  // kA as 96 bits
  const psm2_mq_tag_t kB = Tag(0x01020304, 0x05060708, 0);  // isend2, tag2 = 0
  const psm2_mq_tag_t kX =
      Tag(0x55667788, 0x11223344, 7);              // kA's words, tag2 = 7
  const psm2_mq_tag_t kC = Tag(0x11, 0x22, 0x33);  // isend2, tag2 != 0
  if (p.rank == kSender) {
    p.Barrier("receives posted");
    psm2_mq_req_t ra, rb;
    MQ_CHECK_ERR(psm2_mq_isend(p.mq, p.peer, 0, kA, "A64", 4, nullptr, &ra),
                 PSM2_OK);
    MQ_CHECK_ERR(Isend2(p, 0, kB, "B96", 4, nullptr, &rb), PSM2_OK);
    Finish(p, &ra, "isend A");
    Finish(p, &rb, "isend2 B");
    p.Barrier("A and B received");
    MQ_CHECK_ERR(Send2(p, 0, kX, "X96", 4), PSM2_OK);
    p.Barrier("C posted");
    MQ_CHECK_ERR(Send2(p, 0, kC, "C96", 4), PSM2_OK);
    return;
  }
  char bx[8] = {}, ba[8] = {}, bb[8] = {}, bc[8] = {};
  psm2_mq_req_t rx, ra, rb, rc;
  // Posted first so that it would win if a 64-bit message had tag2 != 0.
  MQ_CHECK_ERR(Irecv2(p, PSM2_MQ_ANY_ADDR, kX, kExact, bx, 8, nullptr, &rx),
               PSM2_OK);
  MQ_CHECK_ERR(Irecv2(p, PSM2_MQ_ANY_ADDR, kAas96, kExact, ba, 8, nullptr, &ra),
               PSM2_OK);
  MQ_CHECK_ERR(psm2_mq_irecv(p.mq, Tag64(kB), ~0ull, 0, bb, 8, nullptr, &rb),
               PSM2_OK);
  p.Barrier("receives posted");

  psm2_mq_status2_t st;
  if (Finish(p, &ra, &st, "irecv2 of a 64-bit isend")) {
    MQ_CHECK(SameTag(st.msg_tag, kAas96),
             "64-bit tag %016" PRIx64 " arrived as %s, want %s", kA,
             Str(st.msg_tag).c_str(), Str(kAas96).c_str());
    MQ_CHECK(st.msg_length == 4 && strcmp(ba, "A64") == 0,
             "irecv2 got %u bytes '%s', want "
             "4 bytes 'A64'",
             st.msg_length, ba);
  }
  psm2_mq_status_t st64;
  if (Finish(p, &rb, &st64, "64-bit irecv of an isend2 with tag2 = 0")) {
    MQ_CHECK(st64.msg_tag == Tag64(kB),
             "isend2 %s arrived as 64-bit tag %016" PRIx64, Str(kB).c_str(),
             st64.msg_tag);
    MQ_CHECK(strcmp(bb, "B96") == 0, "64-bit irecv got '%s', want 'B96'", bb);
  }
  MQ_CHECK_ERR(psm2_mq_test2(&rx, &st), PSM2_MQ_NO_COMPLETIONS);
  p.Barrier("A and B received");
  if (Finish(p, &rx, &st, "irecv2 with tag2 = 7")) {
    MQ_CHECK(SameTag(st.msg_tag, kX) && strcmp(bx, "X96") == 0,
             "receive for %s got %s '%s'", Str(kX).c_str(),
             Str(st.msg_tag).c_str(), bx);
  }

  // 64-bit receive, 96-bit message with tag2 = 0x33.
  MQ_CHECK_ERR(psm2_mq_irecv(p.mq, Tag64(kC), ~0ull, 0, bc, 8, nullptr, &rc),
               PSM2_OK);
  p.Barrier("C posted");
  if (PollUntilDone(p, &rc, &st, 2.0)) {
    MQ_CHECK(SameTag(st.msg_tag, kC),
             "status2 of the 64-bit receive shows tag %s, want the "
             "sent %s (tag2 included)",
             Str(st.msg_tag).c_str(), Str(kC).c_str());
    MQ_CHECK(strcmp(bc, "C96") == 0, "64-bit irecv got '%s', want 'C96'", bc);
  } else {
    MQ_CHECK(
        false,
        "a 64-bit psm2_mq_irecv did not match an isend2 whose tag2 != 0 (Intel "
        "ignores tag2 for 64-bit receives)");
    MQ_CHECK_ERR(psm2_mq_cancel(&rc), PSM2_OK);
    PollUntilDone(p, &rc, &st, 1.0);
    MQ_CHECK_ERR(Irecv2(p, PSM2_MQ_ANY_ADDR, kC, kExact, bc, 8, nullptr, &rc),
                 PSM2_OK);
    Finish(p, &rc, "receiving C with irecv2");
  }
}

// A selector may wildcard any bits of any tag word; a message that differs
// in a selected bit must stay unexpected.
struct WildcardScenario {
  const char* name;
  bool recv64;  // post with psm2_mq_irecv: only tag0/tag1 of rtag, rsel count
  psm2_mq_tag_t rtag, rsel;
  std::vector<psm2_mq_tag_t> misses;  // sent first; must not match
  psm2_mq_tag_t hit;                  // sent last; must match
};

void RunWildcardScenario(Pair& p, const WildcardScenario& sc) {
  const std::string name = sc.name;
  if (p.rank == kSender) {
    p.Barrier(name + ": posted");
    for (size_t i = 0; i < sc.misses.size(); i++) {
      std::string payload = "miss" + std::to_string(i);
      if (sc.recv64) {
        MQ_CHECK_ERR(psm2_mq_send(p.mq, p.peer, 0, Tag64(sc.misses[i]),
                                  payload.c_str(), payload.size() + 1),
                     PSM2_OK);
      } else {
        MQ_CHECK_ERR(
            Send2(p, 0, sc.misses[i], payload.c_str(), payload.size() + 1),
            PSM2_OK);
      }
    }
    p.Barrier(name + ": misses sent");
    p.Barrier(name + ": misses checked");
    if (sc.recv64) {
      MQ_CHECK_ERR(psm2_mq_send(p.mq, p.peer, 0, Tag64(sc.hit), "hit", 4),
                   PSM2_OK);
    } else {
      MQ_CHECK_ERR(Send2(p, 0, sc.hit, "hit", 4), PSM2_OK);
    }
    return;
  }
  char buf[16] = {};
  psm2_mq_req_t w;
  if (sc.recv64) {
    MQ_CHECK_ERR(psm2_mq_irecv(p.mq, Tag64(sc.rtag), Tag64(sc.rsel), 0, buf,
                               sizeof(buf), nullptr, &w),
                 PSM2_OK);
  } else {
    MQ_CHECK_ERR(Irecv2(p, PSM2_MQ_ANY_ADDR, sc.rtag, sc.rsel, buf, sizeof(buf),
                        nullptr, &w),
                 PSM2_OK);
  }
  p.Barrier(name + ": posted");
  p.Barrier(name + ": misses sent");
  for (const psm2_mq_tag_t& miss : sc.misses)
    AwaitUnexpected(p, miss, name + ": miss");
  psm2_mq_status2_t st;
  psm2_error_t err = psm2_mq_test2(&w, &st);
  MQ_CHECK(err == PSM2_MQ_NO_COMPLETIONS,
           "%s: receive %s/%s took message %s, which differs in "
           "a selected bit",
           sc.name, Str(sc.rtag).c_str(), Str(sc.rsel).c_str(),
           err == PSM2_OK ? Str(st.msg_tag).c_str() : "?");
  p.Barrier(name + ": misses checked");
  if (err != PSM2_OK && Finish(p, &w, &st, name + ": wildcard receive")) {
    MQ_CHECK(SameTag(st.msg_tag, sc.hit) && strcmp(buf, "hit") == 0,
             "%s: wildcard receive got %s '%s', want %s 'hit'", sc.name,
             Str(st.msg_tag).c_str(), buf, Str(sc.hit).c_str());
  }
  for (size_t i = 0; i < sc.misses.size(); i++) {
    char mb[16] = {};
    psm2_mq_req_t r;
    MQ_CHECK_ERR(Irecv2(p, PSM2_MQ_ANY_ADDR, sc.misses[i], kExact, mb,
                        sizeof(mb), nullptr, &r),
                 PSM2_OK);
    if (Finish(p, &r, name + ": receiving a miss")) {
      std::string want = "miss" + std::to_string(i);
      MQ_CHECK(want == mb, "%s: exact receive of %s got '%s', want '%s'",
               sc.name, Str(sc.misses[i]).c_str(), mb, want.c_str());
    }
  }
}

void SelectorWildcards(Pair& p) {
  const std::vector<WildcardScenario> scenarios = {
      {"irecv2: low byte of tag0, all of tag1, high half of tag2 wildcarded",
       false,
       Tag(0xABCDEF00, 0, 0x00001234),
       Tag(0xFFFFFF00, 0, 0x0000FFFF),
       {Tag(0xABCDEE5A, 0xDEADBEEF, 0x77771234),  // bit 8 of tag0
        Tag(0xABCDEF5A, 0, 0x77771235),           // bit 0 of tag2
        Tag(0x2BCDEF00, 0, 0x00001234)},          // bit 31 of tag0
       Tag(0xABCDEF5A, 0xDEADBEEF, 0x77771234)},
      {"irecv2: high bits of every word wildcarded",
       false,
       Tag(0x00001111, 0x02222222, 0x00333333),
       Tag(0x0000FFFF, 0x0FFFFFFF, 0x00FFFFFF),
       {Tag(0xFFFF1110, 0x02222222, 0x00333333),   // bit 0 of tag0
        Tag(0x00001111, 0x02222223, 0x00333333),   // bit 0 of tag1
        Tag(0x00001111, 0x02222222, 0x00B33333)},  // bit 23 of tag2
       Tag(0xFFFF1111, 0xF2222222, 0xAB333333)},
      {"irecv2: only tag2 selected",
       false,
       Tag(0, 0, 5),
       Tag(0, 0, kAll),
       {Tag(0x5, 0x5, 6), Tag(0, 0, 0x80000005)},
       Tag(0x12345678, 0x9ABCDEF0, 5)},
      {"irecv (64-bit): low byte and high word wildcarded",
       true,
       Tag(0xABCDEF00, 0),
       Tag(0xFFFFFF00, 0),
       {Tag(0xABCDEE42, 0xFEEDFACE),  // bit 8
        Tag(0xABCDFF42, 0)},          // bit 12
       Tag(0xABCDEF42, 0xFEEDFACE)},
  };
  for (const WildcardScenario& sc : scenarios) RunWildcardScenario(p, sc);
}

// PSM2_MQ_ANY_ADDR matches any sender, a specific source only that sender.
void AnyAddrAndSpecificSource(Pair& p) {
  if (p.rank == kSender) {
    p.Barrier("posted");
    MQ_CHECK_ERR(Send2(p, 0, Tag(31), "any", 4), PSM2_OK);
    MQ_CHECK_ERR(Send2(p, 0, Tag(32), "src", 4), PSM2_OK);
    MQ_CHECK_ERR(Send2(p, 0, Tag(33), "usrc", 5), PSM2_OK);
    MQ_CHECK_ERR(Send2(p, 0, Tag(34), "uany", 5), PSM2_OK);
    p.Barrier("sent");
    p.Barrier("self receives posted");
    MQ_CHECK_ERR(Send2(p, 0, Tag(35), "peer", 5), PSM2_OK);
    return;
  }
  char b1[8] = {}, b2[8] = {};
  psm2_mq_req_t r1, r2;
  psm2_mq_status2_t st;
  MQ_CHECK_ERR(
      Irecv2(p, PSM2_MQ_ANY_ADDR, Tag(31), kExact, b1, 8, nullptr, &r1),
      PSM2_OK);
  MQ_CHECK_ERR(Irecv2(p, p.peer, Tag(32), kExact, b2, 8, nullptr, &r2),
               PSM2_OK);
  p.Barrier("posted");
  if (Finish(p, &r1, &st, "expected, PSM2_MQ_ANY_ADDR")) {
    MQ_CHECK(st.msg_peer == p.peer && strcmp(b1, "any") == 0,
             "ANY_ADDR receive: peer %s, "
             "payload '%s'",
             st.msg_peer == p.peer ? "right" : "wrong", b1);
  }
  if (Finish(p, &r2, &st, "expected, specific source")) {
    MQ_CHECK(st.msg_peer == p.peer && strcmp(b2, "src") == 0,
             "source receive: peer %s, "
             "payload '%s'",
             st.msg_peer == p.peer ? "right" : "wrong", b2);
  }
  p.Barrier("sent");
  AwaitUnexpected(p, Tag(33), "unexpected for a specific source");
  AwaitUnexpected(p, Tag(34), "unexpected for ANY_ADDR");
  MQ_CHECK_ERR(Iprobe2(p, p.peer, Tag(33), kExact, &st), PSM2_OK);
  memset(b1, 0, sizeof(b1));
  memset(b2, 0, sizeof(b2));
  MQ_CHECK_ERR(Irecv2(p, p.peer, Tag(33), kExact, b1, 8, nullptr, &r1),
               PSM2_OK);
  MQ_CHECK_ERR(
      Irecv2(p, PSM2_MQ_ANY_ADDR, Tag(34), kExact, b2, 8, nullptr, &r2),
      PSM2_OK);
  if (Finish(p, &r1, &st, "unexpected, specific source")) {
    MQ_CHECK(st.msg_peer == p.peer && strcmp(b1, "usrc") == 0, "payload '%s'",
             b1);
  }
  if (Finish(p, &r2, &st, "unexpected, ANY_ADDR")) {
    MQ_CHECK(st.msg_peer == p.peer && strcmp(b2, "uany") == 0, "payload '%s'",
             b2);
  }

  // A receive for another source must not take the peer's message. The only
  // other source at hand is this endpoint itself (the "self" device).
  psm2_epaddr_t self = nullptr;
  psm2_error_t conn_err = PSM2_OK;
  psm2_error_t err = psm2_ep_connect(p.ep, 1, &p.self_epid, nullptr, &conn_err,
                                     &self, 10 * 1000000000LL);
  MQ_CHECK(err == PSM2_OK && self != nullptr,
           "psm2_ep_connect to this endpoint's own epid "
           "failed: %s / %s",
           psm2_error_get_string(err), psm2_error_get_string(conn_err));
  char bs[8] = {}, ba[8] = {};
  psm2_mq_req_t rs = PSM2_MQ_REQINVALID, ra;
  if (self != nullptr) {
    MQ_CHECK_ERR(Irecv2(p, self, Tag(35), kExact, bs, 8, nullptr, &rs),
                 PSM2_OK);
  }
  MQ_CHECK_ERR(
      Irecv2(p, PSM2_MQ_ANY_ADDR, Tag(35), kExact, ba, 8, nullptr, &ra),
      PSM2_OK);
  p.Barrier("self receives posted");
  if (Finish(p, &ra, &st, "ANY_ADDR receive posted after a self-only one")) {
    MQ_CHECK(st.msg_peer == p.peer && strcmp(ba, "peer") == 0,
             "the peer's message went "
             "elsewhere: ANY_ADDR receive got '%s'",
             ba);
  }
  if (self != nullptr) {
    MQ_CHECK_ERR(psm2_mq_test2(&rs, &st), PSM2_MQ_NO_COMPLETIONS);
    // Satisfy the self-only receive from this endpoint.
    psm2_mq_req_t sreq;
    psm2_mq_tag_t t35 = Tag(35);
    MQ_CHECK_ERR(psm2_mq_isend2(p.mq, self, 0, &t35, "self", 5, nullptr, &sreq),
                 PSM2_OK);
    if (Finish(p, &rs, &st, "self-only receive")) {
      MQ_CHECK(st.msg_peer == self && strcmp(bs, "self") == 0,
               "self-only receive got '%s' "
               "from %s",
               bs, st.msg_peer == self ? "self" : "another address");
    }
    Finish(p, &sreq, "send to self");
  }
}

// MPI non-overtaking: messages from one sender with the same tag match
// receives in send order, whatever their sizes (eager or rendezvous) and
// whether they arrive before or after the receives are posted.
void NonOvertakingOrder(Pair& p) {
  constexpr int kN = 200;
  const psm2_mq_tag_t kOrderTag = Tag(0x500);
  const psm2_mq_tag_t kMarker = Tag(0x501);
  auto size_of = [](int i) -> uint32_t {
    if (i % 25 == 3) return 1u << 20;  // rendezvous everywhere
    if (i % 25 == 14) return 20000;    // just above Intel's shm threshold
    return static_cast<uint32_t>(i * 97 % 3000);  // 0 .. 2999, eager
  };
  std::vector<size_t> offset(kN + 1, 0);
  for (int i = 0; i < kN; i++) offset[i + 1] = offset[i] + size_of(i) + 1;
  enum Mode { kAllExpected, kAllUnexpected, kHalfAndHalf, kRacing };
  const char* names[] = {"all expected", "all unexpected",
                         "first half expected", "posting while arriving"};
  std::vector<uint8_t> arena(offset[kN]);

  for (int mode = kAllExpected; mode <= kRacing; mode++) {
    const std::string name = names[mode];
    const uint32_t seed_base = 1000u * (mode + 1);
    // Receives posted before the sender starts.
    const int pre = mode == kAllExpected     ? kN
                    : mode == kAllUnexpected ? 0
                    : mode == kHalfAndHalf   ? kN / 2
                                             : 60;
    if (p.rank == kSender) {
      for (int i = 0; i < kN; i++)
        Fill(&arena[offset[i]], size_of(i), seed_base + i);
      std::vector<psm2_mq_req_t> reqs(kN);
      p.Barrier(name + ": posted");
      for (int i = 0; i < kN; i++) {
        MQ_CHECK_ERR(Isend2(p, 0, kOrderTag, &arena[offset[i]], size_of(i),
                            nullptr, &reqs[i]),
                     PSM2_OK);
      }
      psm2_mq_req_t marker;
      MQ_CHECK_ERR(Isend2(p, 0, kMarker, "m", 2, nullptr, &marker), PSM2_OK);
      p.Barrier(name + ": sent");
      for (int i = 0; i < kN; i++) Finish(p, &reqs[i], name + ": isend");
      Finish(p, &marker, name + ": marker isend");
      continue;
    }
    std::fill(arena.begin(), arena.end(), 0);
    std::vector<psm2_mq_req_t> reqs(kN);
    auto post = [&](int i) {
      MQ_CHECK_ERR(Irecv2(p, PSM2_MQ_ANY_ADDR, kOrderTag, kExact,
                          &arena[offset[i]], size_of(i), Ctx(i + 1), &reqs[i]),
                   PSM2_OK);
    };
    for (int i = 0; i < pre; i++) post(i);
    p.Barrier(name + ": posted");
    if (mode == kRacing) {
      for (int i = pre; i < kN; i++) post(i);
    }
    p.Barrier(name + ": sent");
    if (mode == kAllUnexpected || mode == kHalfAndHalf) {
      // Messages are delivered in order: once the marker is there, so is
      // every message before it.
      AwaitUnexpected(p, kMarker, name + ": marker");
      for (int i = pre; i < kN; i++) post(i);
    }
    int bad = 0;
    for (int i = 0; i < kN; i++) {
      psm2_mq_status2_t st;
      if (!Finish(p, &reqs[i], &st, name + ": receive " + std::to_string(i))) {
        bad++;
        continue;
      }
      long mismatch =
          FirstMismatch(&arena[offset[i]], size_of(i), seed_base + i);
      if (st.msg_length != size_of(i) || st.error_code != PSM2_OK ||
          mismatch >= 0) {
        if (bad++ == 0) {
          MQ_CHECK(false,
                   "%s: receive %d got a %u-byte message (want %u), error %d, "
                   "payload "
                   "mismatch at %ld: messages overtook each other",
                   name.c_str(), i, st.msg_length, size_of(i), st.error_code,
                   mismatch);
        }
      }
    }
    MQ_CHECK(bad == 0, "%s: %d of %d receives were wrong", name.c_str(), bad,
             kN);
    char m[4];
    psm2_mq_req_t mr;
    MQ_CHECK_ERR(Irecv2(p, PSM2_MQ_ANY_ADDR, kMarker, kExact, m, sizeof(m),
                        nullptr, &mr),
                 PSM2_OK);
    Finish(p, &mr, name + ": marker");
  }
}

// The earliest posted receive that matches wins, whatever mix of exact and
// wildcard selectors (and so, in Intel, whatever mix of hash tables and
// lists) the posted receives use.
void EarliestPostedReceiveWins(Pair& p) {
  // Receives never matched, posted first so that matching works over a long
  // posted queue (Intel moves from one list to hash tables at 65 entries).
  constexpr int kDummies = 100;
  const psm2_mq_tag_t kMsg = Tag(0x6001, 0x42, 0);
  struct Recv {
    const char* name;
    psm2_epaddr_t src;  // PSM2_MQ_ANY_ADDR or the peer
    psm2_mq_tag_t tag, sel;
  };
  const std::vector<Recv> kinds = {
      {"low-byte wildcard", PSM2_MQ_ANY_ADDR, Tag(0x6000, 0x42, 0),
       Tag(0xFFFFFF00, kAll, kAll)},
      {"exact from peer", p.peer, kMsg, kExact},
      {"tag0 exact, tag1 wildcard", PSM2_MQ_ANY_ADDR, Tag(0x6001, 0, 0),
       Tag(kAll, 0, kAll)},
      {"tag1 exact, tag0 wildcard", p.peer, Tag(0, 0x42, 0),
       Tag(0, kAll, kAll)},
      {"full wildcard", PSM2_MQ_ANY_ADDR, Tag(0, 0, 0), kAnyTag},
  };
  const int n = static_cast<int>(kinds.size());
  // Round 0 posts the kinds in the order above, round 1 in reverse.
  for (int round = 0; round < 2; round++) {
    const std::string name = round == 0 ? "forward" : "reverse";
    if (p.rank == kSender) {
      p.Barrier(name + ": posted");
      for (int i = 0; i < n; i++) {
        uint8_t b = static_cast<uint8_t>('a' + i);
        MQ_CHECK_ERR(Send2(p, 0, kMsg, &b, 1), PSM2_OK);
      }
      continue;
    }
    std::vector<psm2_mq_req_t> dummies(kDummies);
    std::vector<uint8_t> dummy_buf(kDummies);
    for (int i = 0; i < kDummies; i++) {
      MQ_CHECK_ERR(Irecv2(p, PSM2_MQ_ANY_ADDR, Tag(0x6F00 + i, 0x42, 0), kExact,
                          &dummy_buf[i], 1, nullptr, &dummies[i]),
                   PSM2_OK);
    }
    std::vector<psm2_mq_req_t> reqs(n);
    std::vector<uint8_t> bufs(n, 0);
    std::vector<int> order(n);
    for (int k = 0; k < n; k++) order[k] = round == 0 ? k : n - 1 - k;
    for (int k = 0; k < n; k++) {
      const Recv& r = kinds[order[k]];
      MQ_CHECK_ERR(
          Irecv2(p, r.src, r.tag, r.sel, &bufs[k], 1, nullptr, &reqs[k]),
          PSM2_OK);
    }
    p.Barrier(name + ": posted");
    for (int k = 0; k < n; k++) {
      if (Finish(p, &reqs[k], name + ": " + kinds[order[k]].name)) {
        MQ_CHECK(bufs[k] == 'a' + k,
                 "%s: receive #%d (%s) got message '%c', want '%c' (the "
                 "earliest posted matching receive must win)",
                 name.c_str(), k, kinds[order[k]].name, bufs[k], 'a' + k);
      }
    }
    for (int i = 0; i < kDummies; i++) {
      MQ_CHECK_ERR(psm2_mq_cancel(&dummies[i]), PSM2_OK);
      Finish(p, &dummies[i], "cancelled dummy");
    }
  }

  // An earlier exact receive that does not match is passed over.
  if (p.rank == kSender) {
    p.Barrier("exact then wildcards posted");
    MQ_CHECK_ERR(Send2(p, 0, Tag(0x6002), "w1", 3), PSM2_OK);
    MQ_CHECK_ERR(Send2(p, 0, Tag(0x6001), "ex", 3), PSM2_OK);
    MQ_CHECK_ERR(Send2(p, 0, Tag(0x6001), "w2", 3), PSM2_OK);
    return;
  }
  char be[4] = {}, bw1[4] = {}, bw2[4] = {};
  psm2_mq_req_t re, rw1, rw2;
  MQ_CHECK_ERR(
      Irecv2(p, PSM2_MQ_ANY_ADDR, Tag(0x6001), kExact, be, 4, nullptr, &re),
      PSM2_OK);
  MQ_CHECK_ERR(Irecv2(p, PSM2_MQ_ANY_ADDR, Tag(0x6000),
                      Tag(0xFFFFFF00, kAll, kAll), bw1, 4, nullptr, &rw1),
               PSM2_OK);
  MQ_CHECK_ERR(Irecv2(p, PSM2_MQ_ANY_ADDR, Tag(0x6000),
                      Tag(0xFFFFFF00, kAll, kAll), bw2, 4, nullptr, &rw2),
               PSM2_OK);
  p.Barrier("exact then wildcards posted");
  Finish(p, &re, "exact receive");
  Finish(p, &rw1, "first wildcard receive");
  Finish(p, &rw2, "second wildcard receive");
  MQ_CHECK(
      strcmp(be, "ex") == 0 && strcmp(bw1, "w1") == 0 && strcmp(bw2, "w2") == 0,
      "exact, wildcard, wildcard got '%s' '%s' '%s', want 'ex' 'w1' 'w2'", be,
      bw1, bw2);
}

// Among unexpected messages, a receive takes the earliest arrived match.
void EarliestArrivedUnexpectedWins(Pair& p) {
  // Unexpected messages with other tags, sent first so that matching works
  // over a long unexpected queue (Intel adds hash tables at 65 entries).
  constexpr int kFillers = 100;
  struct Msg {
    uint32_t tag;
    const char* payload;
  };
  const Msg msgs[] = {{5, "5a"}, {6, "6"}, {5, "5b"}, {7, "7"}};
  if (p.rank == kSender) {
    for (int i = 0; i < kFillers; i++) {
      uint8_t b = static_cast<uint8_t>(i);
      MQ_CHECK_ERR(Send2(p, 0, Tag(0x7F00 + i), &b, 1), PSM2_OK);
    }
    for (const Msg& m : msgs) {
      MQ_CHECK_ERR(Send2(p, 0, Tag(m.tag), m.payload, strlen(m.payload) + 1),
                   PSM2_OK);
    }
    p.Barrier("sent");
    return;
  }
  p.Barrier("sent");
  AwaitUnexpected(p, Tag(7), "last message");
  const psm2_mq_tag_t kFourToSeven = Tag(~3u, kAll, kAll);  // tags 4, 5, 6, 7
  struct Step {
    const char* what;
    psm2_epaddr_t src;
    psm2_mq_tag_t tag, sel;
    const char* want;
  };
  const Step steps[] = {
      {"wildcard (4..7)", PSM2_MQ_ANY_ADDR, Tag(4), kFourToSeven, "5a"},
      {"exact 6", PSM2_MQ_ANY_ADDR, Tag(6), kExact, "6"},
      {"wildcard (4..7) from peer", p.peer, Tag(4), kFourToSeven, "5b"},
      {"exact 7", PSM2_MQ_ANY_ADDR, Tag(7), kExact, "7"},
  };
  for (const Step& s : steps) {
    char buf[8] = {};
    psm2_mq_req_t r;
    MQ_CHECK_ERR(Irecv2(p, s.src, s.tag, s.sel, buf, sizeof(buf), nullptr, &r),
                 PSM2_OK);
    if (Finish(p, &r, s.what)) {
      MQ_CHECK(strcmp(buf, s.want) == 0,
               "%s receive got '%s', want '%s' (the earliest arrived "
               "match)",
               s.what, buf, s.want);
    }
  }
  // The fillers, through a wildcard on the low byte: in arrival order.
  int out_of_order = 0;
  for (int i = 0; i < kFillers; i++) {
    uint8_t b = 0xFF;
    psm2_mq_req_t r;
    psm2_mq_status2_t st;
    MQ_CHECK_ERR(Irecv2(p, PSM2_MQ_ANY_ADDR, Tag(0x7F00),
                        Tag(0xFFFFFF00, kAll, kAll), &b, 1, nullptr, &r),
                 PSM2_OK);
    if (Finish(p, &r, &st, "filler") &&
        (b != i || st.msg_tag.tag0 != 0x7F00u + i)) {
      out_of_order++;
    }
  }
  MQ_CHECK(out_of_order == 0,
           "%d of %d wildcard receives did not get the earliest arrived "
           "filler",
           out_of_order, kFillers);
}

// Thousands of queued receives, then of queued messages, each with its own
// tag, matched in an order unrelated to the queueing order: the matcher's
// hash path at depth (and, in psmd, the daemon's batch prefetch, which
// starts at 4096 queued entries).
void DeepQueuesMatchInAnyOrder(Pair& p) {
  constexpr uint32_t kDepth = 6000;
  constexpr uint32_t kTagBase = 0x51000;
  auto shuffled = [](uint32_t seed) {
    std::vector<uint32_t> v(kDepth);
    for (uint32_t i = 0; i < kDepth; i++) v[i] = kTagBase + i;
    std::mt19937 rng(seed);
    std::shuffle(v.begin(), v.end(), rng);
    return v;
  };
  const std::vector<uint32_t> post_order = shuffled(1),
                              send_order = shuffled(2);

  // Receives every tag in `order`: posts them all, calls after_posting(),
  // then waits for each and checks it got the message carrying its own tag.
  auto receive_all = [&](const std::vector<uint32_t>& order, const char* what,
                         const std::function<void()>& after_posting) {
    std::vector<uint32_t> got(kDepth, 0);
    std::vector<psm2_mq_req_t> reqs(kDepth);
    for (uint32_t i = 0; i < kDepth; i++) {
      MQ_CHECK_ERR(Irecv2(p, PSM2_MQ_ANY_ADDR, Tag(order[i]), kExact, &got[i],
                          sizeof(got[i]), nullptr, &reqs[i]),
                   PSM2_OK);
    }
    after_posting();
    int wrong = 0;
    for (uint32_t i = 0; i < kDepth; i++) {
      psm2_mq_status2_t st;
      if (!Finish(p, &reqs[i], &st, what)) continue;
      if (got[i] != order[i] || st.msg_tag.tag0 != order[i] ||
          st.nbytes != sizeof(uint32_t)) {
        wrong++;
      }
    }
    MQ_CHECK(wrong == 0, "%s: %d of %u receives got another tag's message",
             what, wrong, kDepth);
  };
  auto send_all = [&](const std::vector<uint32_t>& order) {
    for (uint32_t tag : order)
      MQ_CHECK_ERR(Send2(p, 0, Tag(tag), &tag, sizeof(tag)), PSM2_OK);
  };

  // Deep posted queue: receives first, then the messages.
  if (p.rank == kSender) {
    p.Barrier("posted");
    send_all(send_order);
  } else {
    receive_all(post_order, "deep posted queue", [&] {
      MQ_CHECK_ERR(AwaitPosted(p), PSM2_MQ_NO_COMPLETIONS);
      p.Barrier("posted");
    });
  }
  p.Barrier("posted queue drained");

  // Deep unexpected queue: messages first, then the receives.
  if (p.rank == kSender) {
    send_all(send_order);
    p.Barrier("sent");
    return;
  }
  p.Barrier("sent");
  if (!AwaitUnexpected(p, Tag(send_order.back()), "last message")) return;
  receive_all(post_order, "deep unexpected queue", [] {});
}

}  // namespace

std::vector<Case> MatchingCases() {
  return {
      {"tags_64_and_96_bit_interoperate", Checked(TagsInteroperate)},
      {"selector_wildcards", Checked(SelectorWildcards)},
      {"any_addr_and_specific_source", Checked(AnyAddrAndSpecificSource)},
      {"non_overtaking_order", Checked(NonOvertakingOrder)},
      {"earliest_posted_receive_wins", Checked(EarliestPostedReceiveWins)},
      {"earliest_arrived_unexpected_wins",
       Checked(EarliestArrivedUnexpectedWins)},
      {"deep_queues_match_in_any_order", Checked(DeepQueuesMatchInAnyOrder)},
  };
}

}  // namespace psmd::conformance::mq
