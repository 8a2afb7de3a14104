// The wire format of the inter-node fabric: a fixed 64-byte frame header
// followed by `length` payload bytes, and the payloads of the handshake
// frames the backend exchanges before any data frame. Everything here is a
// pure function over bytes: the decoders trust nothing they are given
// (every length, type and offset is checked against explicit limits) and
// never read outside the buffer they are handed, so they are what the
// fuzzer (frame_fuzz.cc) drives.
//
// Header layout (little-endian, 64 bytes):
//   0 magic u32 "PSMF"   4 version u8   5 type u8   6 op u16
//   8 length u32        12 uid u32     16 src u64  24 dst u64
//  32 job[16]           48 offset u64  56 aux u64
// `op`, `uid`, `src`, `dst`, `job`, `offset` and `aux` belong to the user of
// the fabric (the daemon); hw/ only bounds `offset` and requires them all to
// be zero in handshake and ack frames.
//
// Version 2 added sessions (docs/design.md, "Sessions: a broken connection
// resumes"): the ack frame, and in the handshake what a resuming connector
// and its acceptor have delivered of each other's data frames. A daemon of
// version 1 and one of version 2 refuse each other's frames (kBadVersion).
// Version 3: the daemon's kXon carries a credit of the receiver's window
// (daemon/remote/remote.h, back-pressure 5), which a sending daemon of
// version 3 waits for and one of version 2 never sends; so they refuse
// each other too, as a rolling upgrade across sessions does
// (docs/operations.md).
//
// Thread-safety: stateless; every function may be called from any thread.
#ifndef PSMD_HW_FRAME_H_
#define PSMD_HW_FRAME_H_

#include <cstddef>
#include <cstdint>
#include <string>

namespace psmd::hw {

inline constexpr uint32_t kFrameMagic = 0x464d5350;  // "PSMF" on the wire
inline constexpr uint8_t kFrameVersion = 3;
inline constexpr size_t kFrameHeaderSize = 64;
// Handshake payloads are small; anything longer is an attack or a bug.
inline constexpr uint32_t kMaxControlPayload = 1024;
inline constexpr size_t kNonceSize = 16;

enum class FrameType : uint8_t {
  kData = 1,       // the user's frame
  kChallenge = 2,  // acceptor -> connector: who I am and a fresh nonce
  kHello = 3,      // connector -> acceptor: who I am and my credential
  kWelcome = 4,    // acceptor -> connector: accepted, the link is open
  kRefuse = 5,     // acceptor -> connector: refused (a RefuseReason)
  kAck = 6,        // on an open connection: the data frames delivered so
                   // far (EncodeAck)
  kClose = 7,      // on an open connection, empty: its user closed it, so
                   // the session ends with it (no resume)
};

// The fields a data frame carries for the fabric's user.
struct FrameFields {
  uint16_t op = 0;       // the user's message kind
  uint32_t uid = 0;      // sending endpoint's uid
  uint64_t src = 0;      // sending endpoint id
  uint64_t dst = 0;      // destination endpoint id
  uint8_t job[16] = {};  // job uuid
  uint64_t offset = 0;   // e.g. where a rendezvous chunk lands
  uint64_t aux = 0;      // free for the user (a request id, ...)
};

struct FrameHeader {
  FrameType type = FrameType::kData;
  uint32_t length = 0;  // payload bytes after the header
  FrameFields fields;
};

struct FrameLimits {
  uint32_t max_payload = 4u << 20;  // data frames
  // offset + length of a data frame must not pass this (no wrap-around).
  uint64_t max_offset = uint64_t{1} << 48;
};

enum class FrameError {
  kOk = 0,
  kShort,  // fewer bytes than the structure needs
  kBadMagic,
  kBadVersion,
  kBadType,
  kTooLong,     // length beyond the limit for this type
  kBadOffset,   // offset + length beyond max_offset
  kBadFields,   // non-zero user fields in a handshake frame
  kBadPayload,  // a handshake payload of the wrong size or content
};
const char* FrameErrorName(FrameError error);

void EncodeFrameHeader(const FrameHeader& header,
                       uint8_t out[kFrameHeaderSize]);
// Decodes the first kFrameHeaderSize bytes of `in` (`size` is what the
// caller has; fewer than a header is kShort).
FrameError DecodeFrameHeader(const uint8_t* in, size_t size,
                             const FrameLimits& limits, FrameHeader* out);

// ---- handshake payloads ----

// Node ids and incarnations are never zero on the wire.

// Acceptor -> connector, first frame on a new connection.
struct ChallengePayload {
  uint64_t node = 0;         // acceptor's node id
  uint64_t incarnation = 0;  // acceptor's random boot id
  uint8_t nonce[kNonceSize] = {};
};
inline constexpr size_t kChallengeSize = 32;

enum class AuthMode : uint8_t { kNone = 0, kMunge = 1 };

// Connector -> acceptor. `credential` is the MUNGE credential (text) whose
// payload is a CredentialPayload; empty with AuthMode::kNone.
struct HelloPayload {
  uint64_t node = 0;  // connector's node id
  uint64_t incarnation = 0;
  uint64_t target_node = 0;  // the node the connector meant to reach
  AuthMode auth = AuthMode::kNone;
  std::string credential;
  // A connection that broke resumes its session: the acceptor must hold
  // one with this node at this incarnation, else it refuses (kNoSession).
  bool resume = false;
  // With resume: the acceptor's data frames the connector has delivered;
  // the acceptor sends again what follows them. Zero otherwise.
  uint64_t delivered = 0;
  // The connector runs sessions; the acceptor refuses one that differs
  // from its own (kSessions).
  bool sessions = false;
};
inline constexpr size_t kHelloFixedSize = 40;  // before the credential
inline constexpr size_t kMaxCredential = kMaxControlPayload - kHelloFixedSize;

struct WelcomePayload {
  uint64_t node = 0;
  uint64_t incarnation = 0;
  // Resuming: the connector's data frames the acceptor has delivered.
  uint64_t delivered = 0;
};
inline constexpr size_t kWelcomeSize = 24;

enum class RefuseReason : uint32_t {
  kAuth = 1,       // credential missing, invalid, replayed or wrong uid
  kDuplicate = 2,  // a connection between the two nodes already exists
  kWrongNode = 3,  // the connector meant another node
  kBusy = 4,       // too many connections
  kNoSession = 5,  // nothing to resume: the session ended here
  kRetry = 6,      // the session's old connection is still closing here
  kSessions = 7,   // sessions on one side and off on the other
};
inline constexpr size_t kRefuseSize = 4;

// What the connector's MUNGE credential carries: it binds the credential to
// this connection (the acceptor's one-time challenge) and to both nodes, and
// adds the connector's own fresh nonce that the acceptor remembers.
struct CredentialPayload {
  uint8_t challenge[kNonceSize] = {};
  uint8_t nonce[kNonceSize] = {};
  uint64_t connector_node = 0;
  uint64_t acceptor_node = 0;
};
inline constexpr size_t kCredentialPayloadSize = 52;  // with a 4-byte magic

std::string EncodeChallenge(const ChallengePayload& p);
FrameError DecodeChallenge(const uint8_t* in, size_t size,
                           ChallengePayload* out);
std::string EncodeHello(const HelloPayload& p);
FrameError DecodeHello(const uint8_t* in, size_t size, HelloPayload* out);
std::string EncodeWelcome(const WelcomePayload& p);
FrameError DecodeWelcome(const uint8_t* in, size_t size, WelcomePayload* out);
// An ack frame's payload: the count of data frames delivered so far.
inline constexpr size_t kAckSize = 8;
std::string EncodeAck(uint64_t delivered);
FrameError DecodeAck(const uint8_t* in, size_t size, uint64_t* delivered);
std::string EncodeRefuse(RefuseReason reason);
FrameError DecodeRefuse(const uint8_t* in, size_t size, RefuseReason* out);
std::string EncodeCredentialPayload(const CredentialPayload& p);
FrameError DecodeCredentialPayload(const uint8_t* in, size_t size,
                                   CredentialPayload* out);

}  // namespace psmd::hw

#endif  // PSMD_HW_FRAME_H_
