// libFuzzer target for the frame decoder: arbitrary bytes go through the
// header and every handshake-payload decoder. Besides crashes and
// sanitizer reports, it checks that whatever decodes re-encodes to the
// same bytes (the decoder accepts nothing the encoder would not write).
// Built and run for a bounded time by hw/frame_fuzz.sh, from the seed
// corpus hw/frame_fuzz_corpus/ (FRAME_FUZZ_WRITE_SEEDS=DIR writes it).
//
// Input: byte 0 picks the limits (bit 0: a 4 KiB payload limit, bit 1: a
// 1 MiB offset limit), the rest is what every decoder is handed. At exit
// the target prints how many inputs decoded under each of the four limit
// sets and how many each limit refused ("frame_fuzz: reached ..."), so
// that its script can fail a run that never got past the magic.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "hw/frame.h"
#include "tests/fuzz_seeds.h"

namespace {

using namespace psmd::hw;

void Check(bool ok) {
  if (!ok) std::abort();
}

struct Reached {
  uint64_t decoded[4] = {};  // headers decoded, per limit set
  uint64_t too_long = 0;     // refused by max_payload under the 4 KiB set
  uint64_t bad_offset = 0;   // refused by max_offset under the 1 MiB set
  uint64_t payloads = 0;     // handshake payloads decoded
  ~Reached() {
    printf(
        "frame_fuzz: reached decoded=%llu,%llu,%llu,%llu too_long=%llu "
        "bad_offset=%llu payloads=%llu\n",
        static_cast<unsigned long long>(decoded[0]),
        static_cast<unsigned long long>(decoded[1]),
        static_cast<unsigned long long>(decoded[2]),
        static_cast<unsigned long long>(decoded[3]),
        static_cast<unsigned long long>(too_long),
        static_cast<unsigned long long>(bad_offset),
        static_cast<unsigned long long>(payloads));
  }
} reached;

std::string Bytes(const uint8_t* p, size_t n) {
  return std::string(reinterpret_cast<const char*>(p), n);
}

// One seed: the limits byte, a header, its payload.
std::string Seed(uint8_t limits, const FrameHeader& h,
                 const std::string& payload) {
  uint8_t header[kFrameHeaderSize];
  EncodeFrameHeader(h, header);
  return std::string(1, static_cast<char>(limits)) +
         Bytes(header, sizeof(header)) + payload;
}

std::vector<std::string> Seeds() {
  std::vector<std::string> seeds;
  FrameHeader data;
  data.fields.op = 3;
  data.fields.uid = 1000;
  data.fields.src = 7;
  data.fields.dst = 9;
  data.fields.offset = 4096;
  data.length = 64;
  for (uint8_t limits = 0; limits < 4; ++limits) {
    seeds.push_back(Seed(limits, data, std::string(64, 'x')));
  }
  FrameHeader long_frame = data;  // over the 4 KiB limit only
  long_frame.length = 8192;
  seeds.push_back(Seed(1, long_frame, ""));
  FrameHeader far = data;  // over the 1 MiB offset limit only
  far.fields.offset = 2u << 20;
  seeds.push_back(Seed(2, far, std::string(64, 'x')));
  ChallengePayload ch{1, 2, {}};
  std::string payload = EncodeChallenge(ch);
  FrameHeader control;
  control.type = FrameType::kChallenge;
  control.length = static_cast<uint32_t>(payload.size());
  seeds.push_back(Seed(0, control, payload));
  HelloPayload hello{2, 3, 1, AuthMode::kMunge, "MUNGE:cred"};
  payload = EncodeHello(hello);
  control.type = FrameType::kHello;
  control.length = static_cast<uint32_t>(payload.size());
  seeds.push_back(Seed(0, control, payload));
  HelloPayload resume{2, 3, 1, AuthMode::kMunge, "MUNGE:cred", true, 77, true};
  payload = EncodeHello(resume);
  control.type = FrameType::kHello;
  control.length = static_cast<uint32_t>(payload.size());
  seeds.push_back(Seed(0, control, payload));
  payload = EncodeAck(12345);
  control.type = FrameType::kAck;
  control.length = static_cast<uint32_t>(payload.size());
  seeds.push_back(Seed(0, control, payload));
  payload = EncodeWelcome(WelcomePayload{1, 2, 3});
  control.type = FrameType::kWelcome;
  control.length = static_cast<uint32_t>(payload.size());
  seeds.push_back(Seed(0, control, payload));
  payload = EncodeRefuse(RefuseReason::kBusy);
  control.type = FrameType::kRefuse;
  control.length = static_cast<uint32_t>(payload.size());
  seeds.push_back(Seed(0, control, payload));
  // The payload decoders see the bytes after the limits byte: bare payloads.
  seeds.push_back(std::string(1, '\0') + EncodeChallenge(ch));
  seeds.push_back(std::string(1, '\0') + EncodeHello(hello));
  seeds.push_back(std::string(1, '\0') +
                  EncodeCredentialPayload(CredentialPayload{{}, {}, 1, 2}));
  return seeds;
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  psmd::fuzz::WriteSeedsIfAsked("FRAME_FUZZ_WRITE_SEEDS", "frame_fuzz", Seeds);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const int set = data[0] & 3;
  FrameLimits limits;
  if (set & 1) limits.max_payload = 4096;
  if (set & 2) limits.max_offset = 1 << 20;
  const uint8_t* p = data + 1;
  const size_t n = size - 1;
  FrameHeader h;
  FrameError error = DecodeFrameHeader(p, n, limits, &h);
  if (error == FrameError::kOk) {
    ++reached.decoded[set];
    Check(n >= kFrameHeaderSize);
    uint8_t again[kFrameHeaderSize];
    EncodeFrameHeader(h, again);
    Check(std::memcmp(again, p, kFrameHeaderSize) == 0);
    if (h.type == FrameType::kData) {
      Check(h.length <= limits.max_payload);
      Check(h.fields.offset + h.length <= limits.max_offset);
    } else {
      Check(h.length <= kMaxControlPayload);
    }
  } else if (error == FrameError::kTooLong && (set & 1)) {
    ++reached.too_long;
  } else if (error == FrameError::kBadOffset && (set & 2)) {
    ++reached.bad_offset;
  }
  ChallengePayload ch;
  if (DecodeChallenge(p, n, &ch) == FrameError::kOk) {
    ++reached.payloads;
    Check(EncodeChallenge(ch) == Bytes(p, n));
  }
  HelloPayload hello;
  if (DecodeHello(p, n, &hello) == FrameError::kOk) {
    ++reached.payloads;
    Check(EncodeHello(hello) == Bytes(p, n));
  }
  WelcomePayload w;
  if (DecodeWelcome(p, n, &w) == FrameError::kOk) {
    ++reached.payloads;
    Check(EncodeWelcome(w) == Bytes(p, n));
  }
  uint64_t delivered;
  if (DecodeAck(p, n, &delivered) == FrameError::kOk) {
    ++reached.payloads;
    Check(EncodeAck(delivered) == Bytes(p, n));
  }
  RefuseReason r;
  if (DecodeRefuse(p, n, &r) == FrameError::kOk) {
    ++reached.payloads;
    Check(EncodeRefuse(r) == Bytes(p, n));
  }
  CredentialPayload cp;
  if (DecodeCredentialPayload(p, n, &cp) == FrameError::kOk) {
    ++reached.payloads;
    Check(EncodeCredentialPayload(cp) == Bytes(p, n));
  }
  return 0;
}
