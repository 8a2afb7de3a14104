#include "tests/conformance/mq_cases_util.h"

#include <stdarg.h>

#include <cstdio>

namespace psmd::conformance::mq {

void CheckMsg(bool ok, const char* expr, const char* file, int line,
              const char* fmt, ...) {
  if (ok) {
    Check(true, expr, file, line);
    return;
  }
  char msg[768];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof(msg), fmt, ap);
  va_end(ap);
  Check(false, (std::string(msg) + " [" + expr + "]").c_str(), file, line);
}

void CheckErr(psm2_error_t got, psm2_error_t want, const char* expr,
              const char* file, int line) {
  if (got == want) {
    Check(true, expr, file, line);
    return;
  }
  char msg[768];
  snprintf(msg, sizeof(msg), "%s returned %d (%s), want %d (%s)", expr,
           static_cast<int>(got), psm2_error_get_string(got),
           static_cast<int>(want), psm2_error_get_string(want));
  Check(false, msg, file, line);
}

std::string Str(const psm2_mq_tag_t& t) {
  char s[40];
  snprintf(s, sizeof(s), "%08x.%08x.%08x", t.tag0, t.tag1, t.tag2);
  return s;
}

psm2_error_t Irecv2(Pair& p, psm2_epaddr_t src, psm2_mq_tag_t tag,
                    psm2_mq_tag_t sel, void* buf, uint32_t len, void* ctx,
                    psm2_mq_req_t* req) {
  return psm2_mq_irecv2(p.mq, src, &tag, &sel, 0, buf, len, ctx, req);
}

psm2_error_t Isend2(Pair& p, uint32_t flags, psm2_mq_tag_t tag, const void* buf,
                    uint32_t len, void* ctx, psm2_mq_req_t* req) {
  return psm2_mq_isend2(p.mq, p.peer, flags, &tag, buf, len, ctx, req);
}

psm2_error_t Send2(Pair& p, uint32_t flags, psm2_mq_tag_t tag, const void* buf,
                   uint32_t len) {
  return psm2_mq_send2(p.mq, p.peer, flags, &tag, buf, len);
}

psm2_error_t Iprobe2(Pair& p, psm2_epaddr_t src, psm2_mq_tag_t tag,
                     psm2_mq_tag_t sel, psm2_mq_status2_t* st) {
  return psm2_mq_iprobe2(p.mq, src, &tag, &sel, st);
}

namespace {

// Multiplicative hashing of the position: every byte of a block differs
// from the bytes a few, 256 or 4096 positions away.
uint8_t PatternByte(size_t i, uint32_t seed) {
  uint32_t x = static_cast<uint32_t>(i) * 2654435761u + seed * 40503u + seed;
  return static_cast<uint8_t>((x >> 24) ^ (x >> 11));
}

}  // namespace

int RndvThresholdKey(const Pair& p) {
  return p.OneNode() ? PSM2_MQ_RNDV_SHM_SZ : PSM2_MQ_RNDV_HFI_SZ;
}

void Fill(void* buf, size_t len, uint32_t seed) {
  auto* b = static_cast<uint8_t*>(buf);
  for (size_t i = 0; i < len; i++) b[i] = PatternByte(i, seed);
}

long FirstMismatch(const void* buf, size_t len, uint32_t seed) {
  const auto* b = static_cast<const uint8_t*>(buf);
  for (size_t i = 0; i < len; i++) {
    if (b[i] != PatternByte(i, seed)) return static_cast<long>(i);
  }
  return -1;
}

bool GuardedBuf::GuardIntact() const {
  for (size_t i = len_; i < bytes_.size(); i++) {
    if (bytes_[i] != kGuardByte) return false;
  }
  return true;
}

double SecondsSince(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

void PollFor(Pair& p, double seconds) {
  auto t0 = Clock::now();
  while (SecondsSince(t0) < seconds) psm2_poll(p.ep);
}

void Abandon(Pair& p, psm2_mq_req_t* req) {
  psm2_mq_status2_t ignored;
  if (psm2_mq_cancel(req) == PSM2_OK) PollUntilDone(p, req, &ignored, 1.0);
}

bool Finish(Pair& p, psm2_mq_req_t* req, const std::string& what) {
  psm2_mq_status2_t st;
  return Finish(p, req, &st, what);
}

bool AwaitUnexpected(Pair& p, psm2_mq_tag_t tag, const std::string& what,
                     psm2_mq_tag_t sel) {
  auto t0 = Clock::now();
  while (SecondsSince(t0) < kArrivalTimeoutS) {
    if (Iprobe2(p, PSM2_MQ_ANY_ADDR, tag, sel, nullptr) == PSM2_OK) return true;
    psm2_poll(p.ep);
  }
  MQ_CHECK(false, "%s: message %s never became visible to psm2_mq_iprobe2",
           what.c_str(), Str(tag).c_str());
  return false;
}

psm2_error_t AwaitPosted(Pair& p) {
  return Iprobe2(p, PSM2_MQ_ANY_ADDR, Tag(kAll, kAll, kAll), kExact, nullptr);
}

namespace {

void DrainLeftovers(Pair& p) {
  for (int n = 0; n < 1000; n++) {
    psm2_mq_req_t req = PSM2_MQ_REQINVALID;
    psm2_mq_status2_t st;
    psm2_mq_tag_t tag = kAnyTag, sel = kAnyTag;
    if (psm2_mq_improbe2(p.mq, PSM2_MQ_ANY_ADDR, &tag, &sel, &req, &st) !=
        PSM2_OK)
      return;
    MQ_CHECK(
        false,
        "rank %d: message %s (%u bytes) left unreceived at the end of the case",
        p.rank, Str(st.msg_tag).c_str(), st.msg_length);
    std::vector<uint8_t> sink(st.msg_length + 1);
    if (psm2_mq_imrecv(p.mq, 0, sink.data(), st.msg_length, nullptr, &req) ==
        PSM2_OK) {
      Finish(p, &req, "draining a leftover message");
    }
  }
}

}  // namespace

CaseFn Checked(void (*fn)(Pair&)) {
  return [fn](Pair& p) {
    fn(p);
    DrainLeftovers(p);
  };
}

}  // namespace psmd::conformance::mq
