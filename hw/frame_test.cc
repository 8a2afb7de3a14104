#include "hw/frame.h"

#include <gtest/gtest.h>

#include <cstring>

namespace psmd::hw {
namespace {

FrameHeader Data(uint32_t length) {
  FrameHeader h;
  h.length = length;
  h.fields.op = 3;
  h.fields.uid = 1000;
  h.fields.src = 0x0123456789abcdefull;
  h.fields.dst = 42;
  for (int i = 0; i < 16; i++) h.fields.job[i] = static_cast<uint8_t>(i);
  h.fields.offset = 1 << 20;
  h.fields.aux = ~0ull;
  return h;
}

TEST(Frame, HeaderRoundTripsLittleEndian) {
  uint8_t bytes[kFrameHeaderSize];
  EncodeFrameHeader(Data(77), bytes);
  EXPECT_EQ(std::memcmp(bytes, "PSMF", 4), 0);
  EXPECT_EQ(bytes[8], 77);  // length, least significant byte first
  FrameHeader out;
  ASSERT_EQ(DecodeFrameHeader(bytes, sizeof bytes, {}, &out), FrameError::kOk);
  EXPECT_EQ(out.type, FrameType::kData);
  EXPECT_EQ(out.length, 77u);
  EXPECT_EQ(out.fields.op, 3);
  EXPECT_EQ(out.fields.uid, 1000u);
  EXPECT_EQ(out.fields.src, 0x0123456789abcdefull);
  EXPECT_EQ(out.fields.dst, 42u);
  EXPECT_EQ(out.fields.job[15], 15);
  EXPECT_EQ(out.fields.offset, 1u << 20);
  EXPECT_EQ(out.fields.aux, ~0ull);
}

TEST(Frame, DecoderRejectsWhatItCannotTrust) {
  uint8_t bytes[kFrameHeaderSize];
  FrameHeader out;
  FrameLimits limits;
  limits.max_payload = 1000;
  limits.max_offset = 1 << 20;

  EncodeFrameHeader(Data(10), bytes);
  EXPECT_EQ(DecodeFrameHeader(bytes, 63, limits, &out), FrameError::kShort);
  bytes[0] ^= 1;
  EXPECT_EQ(DecodeFrameHeader(bytes, 64, limits, &out), FrameError::kBadMagic);
  bytes[0] ^= 1;
  bytes[4] = 1;  // before sessions
  EXPECT_EQ(DecodeFrameHeader(bytes, 64, limits, &out),
            FrameError::kBadVersion);
  bytes[4] = kFrameVersion;
  for (uint8_t t : {0, 8, 255}) {
    bytes[5] = t;
    EXPECT_EQ(DecodeFrameHeader(bytes, 64, limits, &out), FrameError::kBadType);
  }

  EncodeFrameHeader(Data(1001), bytes);
  EXPECT_EQ(DecodeFrameHeader(bytes, 64, limits, &out), FrameError::kTooLong);
  FrameHeader h = Data(10);
  h.fields.offset = (1 << 20) - 9;  // offset + length one past the limit
  EncodeFrameHeader(h, bytes);
  EXPECT_EQ(DecodeFrameHeader(bytes, 64, limits, &out), FrameError::kBadOffset);
  h.fields.offset = ~0ull - 5;  // would wrap
  EncodeFrameHeader(h, bytes);
  EXPECT_EQ(DecodeFrameHeader(bytes, 64, limits, &out), FrameError::kBadOffset);

  // Handshake frames: short, and nothing of the user's.
  h = Data(0);
  h.type = FrameType::kHello;
  EncodeFrameHeader(h, bytes);
  EXPECT_EQ(DecodeFrameHeader(bytes, 64, limits, &out), FrameError::kBadFields);
  h = FrameHeader{};
  h.type = FrameType::kHello;
  h.length = kMaxControlPayload + 1;
  EncodeFrameHeader(h, bytes);
  EXPECT_EQ(DecodeFrameHeader(bytes, 64, limits, &out), FrameError::kTooLong);
  h.length = kMaxControlPayload;
  EncodeFrameHeader(h, bytes);
  EXPECT_EQ(DecodeFrameHeader(bytes, 64, limits, &out), FrameError::kOk);
}

TEST(Frame, HandshakePayloads) {
  ChallengePayload ch{9, 10, {1, 2, 3}};
  std::string s = EncodeChallenge(ch);
  ChallengePayload ch2;
  auto* p = reinterpret_cast<const uint8_t*>(s.data());
  ASSERT_EQ(DecodeChallenge(p, s.size(), &ch2), FrameError::kOk);
  EXPECT_EQ(ch2.node, 9u);
  EXPECT_EQ(ch2.nonce[2], 3);
  EXPECT_EQ(DecodeChallenge(p, s.size() - 1, &ch2), FrameError::kBadPayload);

  HelloPayload hello{5, 6, 9, AuthMode::kMunge, "MUNGE:abc=:"};
  s = EncodeHello(hello);
  p = reinterpret_cast<const uint8_t*>(s.data());
  HelloPayload hello2;
  ASSERT_EQ(DecodeHello(p, s.size(), &hello2), FrameError::kOk);
  EXPECT_EQ(hello2.credential, "MUNGE:abc=:");
  EXPECT_EQ(hello2.target_node, 9u);
  // A credential length that disagrees with the frame, a non-printable
  // credential, a credential with auth none, and no credential with munge.
  EXPECT_EQ(DecodeHello(p, s.size() - 1, &hello2), FrameError::kBadPayload);
  std::string bad = s;
  bad.back() = '\n';
  EXPECT_EQ(DecodeHello(reinterpret_cast<const uint8_t*>(bad.data()),
                        bad.size(), &hello2),
            FrameError::kBadPayload);
  hello.auth = AuthMode::kNone;
  s = EncodeHello(hello);
  EXPECT_EQ(DecodeHello(reinterpret_cast<const uint8_t*>(s.data()), s.size(),
                        &hello2),
            FrameError::kBadPayload);
  hello.auth = AuthMode::kMunge;
  hello.credential.clear();
  s = EncodeHello(hello);
  EXPECT_EQ(DecodeHello(reinterpret_cast<const uint8_t*>(s.data()), s.size(),
                        &hello2),
            FrameError::kBadPayload);

  // A resuming hello carries what the connector delivered; a fresh one
  // carries zero there, and anything else is refused.
  HelloPayload resume{5, 6, 9, AuthMode::kMunge, "MUNGE:abc=:", true, 41, true};
  s = EncodeHello(resume);
  ASSERT_EQ(DecodeHello(reinterpret_cast<const uint8_t*>(s.data()), s.size(),
                        &hello2),
            FrameError::kOk);
  EXPECT_TRUE(hello2.resume);
  EXPECT_TRUE(hello2.sessions);
  EXPECT_EQ(hello2.delivered, 41u);
  EXPECT_EQ(hello2.credential, "MUNGE:abc=:");
  resume.resume = false;
  s = EncodeHello(resume);
  EXPECT_EQ(DecodeHello(reinterpret_cast<const uint8_t*>(s.data()), s.size(),
                        &hello2),
            FrameError::kBadPayload);
  s = EncodeHello(hello);
  s[25] = 4;  // the flags byte: only bits 0 (resume) and 1 (sessions)
  EXPECT_EQ(DecodeHello(reinterpret_cast<const uint8_t*>(s.data()), s.size(),
                        &hello2),
            FrameError::kBadPayload);

  WelcomePayload w;
  s = EncodeWelcome({1, 2, 99});
  ASSERT_EQ(
      DecodeWelcome(reinterpret_cast<const uint8_t*>(s.data()), s.size(), &w),
      FrameError::kOk);
  EXPECT_EQ(w.delivered, 99u);

  uint64_t delivered = 0;
  s = EncodeAck(1ull << 40);
  ASSERT_EQ(DecodeAck(reinterpret_cast<const uint8_t*>(s.data()), s.size(),
                      &delivered),
            FrameError::kOk);
  EXPECT_EQ(delivered, 1ull << 40);
  EXPECT_EQ(
      DecodeAck(reinterpret_cast<const uint8_t*>(s.data()), 7, &delivered),
      FrameError::kBadPayload);

  RefuseReason r;
  s = EncodeRefuse(RefuseReason::kRetry);
  ASSERT_EQ(
      DecodeRefuse(reinterpret_cast<const uint8_t*>(s.data()), s.size(), &r),
      FrameError::kOk);
  EXPECT_EQ(r, RefuseReason::kRetry);
  s = EncodeRefuse(RefuseReason::kDuplicate);
  ASSERT_EQ(
      DecodeRefuse(reinterpret_cast<const uint8_t*>(s.data()), s.size(), &r),
      FrameError::kOk);
  EXPECT_EQ(r, RefuseReason::kDuplicate);
  uint8_t zero[4] = {};
  EXPECT_EQ(DecodeRefuse(zero, 4, &r), FrameError::kBadPayload);

  CredentialPayload cp;
  cp.connector_node = 3;
  cp.acceptor_node = 4;
  cp.nonce[0] = 7;
  s = EncodeCredentialPayload(cp);
  CredentialPayload cp2;
  ASSERT_EQ(DecodeCredentialPayload(reinterpret_cast<const uint8_t*>(s.data()),
                                    s.size(), &cp2),
            FrameError::kOk);
  EXPECT_EQ(cp2.acceptor_node, 4u);
  EXPECT_EQ(cp2.nonce[0], 7);
  s[0] ^= 1;
  EXPECT_EQ(DecodeCredentialPayload(reinterpret_cast<const uint8_t*>(s.data()),
                                    s.size(), &cp2),
            FrameError::kBadPayload);
}

}  // namespace
}  // namespace psmd::hw
