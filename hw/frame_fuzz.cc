// libFuzzer target for the frame decoder: arbitrary bytes go through the
// header and every handshake-payload decoder. Besides crashes and
// sanitizer reports, it checks that whatever decodes re-encodes to the
// same bytes (the decoder accepts nothing the encoder would not write).
// Built and run for a bounded time by scripts/fuzz_frame.sh.
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "hw/frame.h"

namespace {

void Check(bool ok) {
  if (!ok) std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace psmd::hw;
  FrameLimits limits;
  if (size > 0) {  // the first byte picks tighter limits now and then
    limits.max_payload = data[0] & 1 ? 4096 : limits.max_payload;
    limits.max_offset = data[0] & 2 ? 1 << 20 : limits.max_offset;
  }
  FrameHeader h;
  if (DecodeFrameHeader(data, size, limits, &h) == FrameError::kOk) {
    Check(size >= kFrameHeaderSize);
    uint8_t again[kFrameHeaderSize];
    EncodeFrameHeader(h, again);
    Check(std::memcmp(again, data, kFrameHeaderSize) == 0);
    if (h.type == FrameType::kData) {
      Check(h.length <= limits.max_payload);
      Check(h.fields.offset + h.length <= limits.max_offset);
    } else {
      Check(h.length <= kMaxControlPayload);
    }
  }
  const uint8_t* p = size > 0 ? data + 1 : data;
  size_t n = size > 0 ? size - 1 : 0;
  ChallengePayload ch;
  if (DecodeChallenge(p, n, &ch) == FrameError::kOk) {
    Check(EncodeChallenge(ch) ==
          std::string(reinterpret_cast<const char*>(p), n));
  }
  HelloPayload hello;
  if (DecodeHello(p, n, &hello) == FrameError::kOk) {
    Check(EncodeHello(hello) ==
          std::string(reinterpret_cast<const char*>(p), n));
  }
  WelcomePayload w;
  if (DecodeWelcome(p, n, &w) == FrameError::kOk) {
    Check(EncodeWelcome(w) == std::string(reinterpret_cast<const char*>(p), n));
  }
  RefuseReason r;
  if (DecodeRefuse(p, n, &r) == FrameError::kOk) {
    Check(EncodeRefuse(r) == std::string(reinterpret_cast<const char*>(p), n));
  }
  CredentialPayload cp;
  if (DecodeCredentialPayload(p, n, &cp) == FrameError::kOk) {
    Check(EncodeCredentialPayload(cp) ==
          std::string(reinterpret_cast<const char*>(p), n));
  }
  return 0;
}
