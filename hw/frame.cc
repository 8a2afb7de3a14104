#include "hw/frame.h"

#include <cstring>

namespace psmd::hw {
namespace {

// Explicit little-endian so the format does not depend on the host.
void Put16(uint8_t* p, uint16_t v) {
  for (int i = 0; i < 2; i++) p[i] = static_cast<uint8_t>(v >> (8 * i));
}
void Put32(uint8_t* p, uint32_t v) {
  for (int i = 0; i < 4; i++) p[i] = static_cast<uint8_t>(v >> (8 * i));
}
void Put64(uint8_t* p, uint64_t v) {
  for (int i = 0; i < 8; i++) p[i] = static_cast<uint8_t>(v >> (8 * i));
}
uint16_t Get16(const uint8_t* p) {
  return static_cast<uint16_t>(p[0] | (p[1] << 8));
}
uint32_t Get32(const uint8_t* p) {
  uint32_t v = 0;
  for (int i = 3; i >= 0; i--) v = (v << 8) | p[i];
  return v;
}
uint64_t Get64(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; i--) v = (v << 8) | p[i];
  return v;
}

constexpr uint32_t kCredentialMagic = 0x31435350;  // "PSC1"

}  // namespace

const char* FrameErrorName(FrameError error) {
  switch (error) {
    case FrameError::kOk:
      return "ok";
    case FrameError::kShort:
      return "truncated";
    case FrameError::kBadMagic:
      return "bad magic";
    case FrameError::kBadVersion:
      return "unsupported version";
    case FrameError::kBadType:
      return "unknown frame type";
    case FrameError::kTooLong:
      return "length beyond the limit";
    case FrameError::kBadOffset:
      return "offset + length beyond the limit";
    case FrameError::kBadFields:
      return "user fields set in a handshake frame";
    case FrameError::kBadPayload:
      return "malformed handshake payload";
  }
  return "unknown frame error";
}

void EncodeFrameHeader(const FrameHeader& h, uint8_t out[kFrameHeaderSize]) {
  Put32(out + 0, kFrameMagic);
  out[4] = kFrameVersion;
  out[5] = static_cast<uint8_t>(h.type);
  Put16(out + 6, h.fields.op);
  Put32(out + 8, h.length);
  Put32(out + 12, h.fields.uid);
  Put64(out + 16, h.fields.src);
  Put64(out + 24, h.fields.dst);
  std::memcpy(out + 32, h.fields.job, 16);
  Put64(out + 48, h.fields.offset);
  Put64(out + 56, h.fields.aux);
}

FrameError DecodeFrameHeader(const uint8_t* in, size_t size,
                             const FrameLimits& limits, FrameHeader* out) {
  if (size < kFrameHeaderSize) return FrameError::kShort;
  if (Get32(in) != kFrameMagic) return FrameError::kBadMagic;
  if (in[4] != kFrameVersion) return FrameError::kBadVersion;
  uint8_t type = in[5];
  if (type < static_cast<uint8_t>(FrameType::kData) ||
      type > static_cast<uint8_t>(FrameType::kClose)) {
    return FrameError::kBadType;
  }
  FrameHeader h;
  h.type = static_cast<FrameType>(type);
  h.length = Get32(in + 8);
  h.fields.op = Get16(in + 6);
  h.fields.uid = Get32(in + 12);
  h.fields.src = Get64(in + 16);
  h.fields.dst = Get64(in + 24);
  std::memcpy(h.fields.job, in + 32, 16);
  h.fields.offset = Get64(in + 48);
  h.fields.aux = Get64(in + 56);
  if (h.type == FrameType::kData) {
    if (h.length > limits.max_payload) return FrameError::kTooLong;
    if (h.fields.offset > limits.max_offset ||
        h.length > limits.max_offset - h.fields.offset) {
      return FrameError::kBadOffset;
    }
  } else {
    if (h.length > kMaxControlPayload) return FrameError::kTooLong;
    // Handshake and ack frames carry nothing of the user's: bytes 6-7 and
    // 12-63.
    if (h.fields.op != 0) return FrameError::kBadFields;
    for (size_t i = 12; i < kFrameHeaderSize; i++) {
      if (in[i] != 0) return FrameError::kBadFields;
    }
  }
  *out = h;
  return FrameError::kOk;
}

std::string EncodeChallenge(const ChallengePayload& p) {
  std::string s(kChallengeSize, '\0');
  auto* b = reinterpret_cast<uint8_t*>(s.data());
  Put64(b, p.node);
  Put64(b + 8, p.incarnation);
  std::memcpy(b + 16, p.nonce, kNonceSize);
  return s;
}

FrameError DecodeChallenge(const uint8_t* in, size_t size,
                           ChallengePayload* out) {
  if (size != kChallengeSize) return FrameError::kBadPayload;
  out->node = Get64(in);
  out->incarnation = Get64(in + 8);
  std::memcpy(out->nonce, in + 16, kNonceSize);
  if (out->node == 0 || out->incarnation == 0) return FrameError::kBadPayload;
  return FrameError::kOk;
}

std::string EncodeHello(const HelloPayload& p) {
  std::string s(kHelloFixedSize, '\0');
  auto* b = reinterpret_cast<uint8_t*>(s.data());
  Put64(b, p.node);
  Put64(b + 8, p.incarnation);
  Put64(b + 16, p.target_node);
  b[24] = static_cast<uint8_t>(p.auth);
  b[25] = (p.resume ? 1 : 0) | (p.sessions ? 2 : 0);
  Put32(b + 28, static_cast<uint32_t>(p.credential.size()));
  Put64(b + 32, p.delivered);
  return s + p.credential;
}

FrameError DecodeHello(const uint8_t* in, size_t size, HelloPayload* out) {
  if (size < kHelloFixedSize || size > kMaxControlPayload) {
    return FrameError::kBadPayload;
  }
  out->node = Get64(in);
  out->incarnation = Get64(in + 8);
  out->target_node = Get64(in + 16);
  uint8_t auth = in[24];
  if (auth > static_cast<uint8_t>(AuthMode::kMunge)) {
    return FrameError::kBadPayload;
  }
  if (in[25] > 3 || in[26] != 0 || in[27] != 0) return FrameError::kBadPayload;
  out->auth = static_cast<AuthMode>(auth);
  out->resume = (in[25] & 1) != 0;
  out->sessions = (in[25] & 2) != 0;
  if (out->resume && !out->sessions) return FrameError::kBadPayload;
  out->delivered = Get64(in + 32);
  if (!out->resume && out->delivered != 0) return FrameError::kBadPayload;
  uint32_t cred_len = Get32(in + 28);
  if (cred_len != size - kHelloFixedSize) return FrameError::kBadPayload;
  if ((out->auth == AuthMode::kNone) != (cred_len == 0)) {
    return FrameError::kBadPayload;
  }
  // A MUNGE credential is printable ASCII; anything else is not one.
  for (uint32_t i = 0; i < cred_len; i++) {
    uint8_t c = in[kHelloFixedSize + i];
    if (c < 0x21 || c > 0x7e) return FrameError::kBadPayload;
  }
  if (out->node == 0 || out->incarnation == 0 || out->target_node == 0) {
    return FrameError::kBadPayload;
  }
  out->credential.assign(reinterpret_cast<const char*>(in) + kHelloFixedSize,
                         cred_len);
  return FrameError::kOk;
}

std::string EncodeWelcome(const WelcomePayload& p) {
  std::string s(kWelcomeSize, '\0');
  auto* b = reinterpret_cast<uint8_t*>(s.data());
  Put64(b, p.node);
  Put64(b + 8, p.incarnation);
  Put64(b + 16, p.delivered);
  return s;
}

FrameError DecodeWelcome(const uint8_t* in, size_t size, WelcomePayload* out) {
  if (size != kWelcomeSize) return FrameError::kBadPayload;
  out->node = Get64(in);
  out->incarnation = Get64(in + 8);
  out->delivered = Get64(in + 16);
  if (out->node == 0 || out->incarnation == 0) return FrameError::kBadPayload;
  return FrameError::kOk;
}

std::string EncodeAck(uint64_t delivered) {
  std::string s(kAckSize, '\0');
  Put64(reinterpret_cast<uint8_t*>(s.data()), delivered);
  return s;
}

FrameError DecodeAck(const uint8_t* in, size_t size, uint64_t* delivered) {
  if (size != kAckSize) return FrameError::kBadPayload;
  *delivered = Get64(in);
  return FrameError::kOk;
}

std::string EncodeRefuse(RefuseReason reason) {
  std::string s(kRefuseSize, '\0');
  Put32(reinterpret_cast<uint8_t*>(s.data()), static_cast<uint32_t>(reason));
  return s;
}

FrameError DecodeRefuse(const uint8_t* in, size_t size, RefuseReason* out) {
  if (size != kRefuseSize) return FrameError::kBadPayload;
  uint32_t r = Get32(in);
  if (r < static_cast<uint32_t>(RefuseReason::kAuth) ||
      r > static_cast<uint32_t>(RefuseReason::kSessions)) {
    return FrameError::kBadPayload;
  }
  *out = static_cast<RefuseReason>(r);
  return FrameError::kOk;
}

std::string EncodeCredentialPayload(const CredentialPayload& p) {
  std::string s(kCredentialPayloadSize, '\0');
  auto* b = reinterpret_cast<uint8_t*>(s.data());
  Put32(b, kCredentialMagic);
  std::memcpy(b + 4, p.challenge, kNonceSize);
  std::memcpy(b + 20, p.nonce, kNonceSize);
  Put64(b + 36, p.connector_node);
  Put64(b + 44, p.acceptor_node);
  return s;
}

FrameError DecodeCredentialPayload(const uint8_t* in, size_t size,
                                   CredentialPayload* out) {
  if (size != kCredentialPayloadSize || Get32(in) != kCredentialMagic) {
    return FrameError::kBadPayload;
  }
  std::memcpy(out->challenge, in + 4, kNonceSize);
  std::memcpy(out->nonce, in + 20, kNonceSize);
  out->connector_node = Get64(in + 36);
  out->acceptor_node = Get64(in + 44);
  return FrameError::kOk;
}

}  // namespace psmd::hw
