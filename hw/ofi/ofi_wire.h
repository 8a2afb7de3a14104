// What the ofi backend (ofi_fabric.cc) reads from the network before the
// frames of frame.h: the 32-byte prefix of every message, the libfabric
// address a contact or accept carries, and where a stream segment goes.
// Apart from libfabric so that a fuzz target (ofi_wire_fuzz.cc) can build
// it alone; nothing here trusts its input.
//
// Thread-safety: pure functions.
#ifndef PSMD_HW_OFI_OFI_WIRE_H_
#define PSMD_HW_OFI_OFI_WIRE_H_

#include <cstddef>
#include <cstdint>
#include <string>

namespace psmd::hw::ofi {

// Every message starts with this prefix (little-endian, 32 bytes):
//   0 magic u32 "PSMO"  4 kind u8  5 version u8  6 zero u16
//   8 dst_key u64 (the receiver's connection key; 0 in kContact)
//  16 src_key u64 (the sender's)  24 seq u64 (kStream: the stream offset
//  of the first byte; kCredit: bytes consumed; kClose: stream length)
// Version 2: contacts go to the listen endpoint, everything else between
// data endpoints (kAccept names the acceptor's).
inline constexpr uint32_t kMsgMagic = 0x4f4d5350;
inline constexpr uint8_t kMsgVersion = 2;
inline constexpr size_t kPrefix = 32;
enum MsgKind : uint8_t {
  kContact = 1,    // connector -> acceptor's listen endpoint: the
                   // connector's data endpoint address
  kStream = 2,     // bytes of the connection's frame stream
  kCredit = 3,     // the receiver consumed `seq` bytes: the window moves
  kClose = 4,      // no bytes after `seq`; the connection is gone
  kKeepalive = 5,  // `seq`: the credit again
  kAccept = 6,     // acceptor -> connector: the acceptor's data endpoint
                   // address
};
inline constexpr size_t kMaxName = 256;  // address bytes in kContact/kAccept

struct Prefix {
  uint8_t kind = 0;
  uint64_t dst = 0, src = 0, seq = 0;
};

void EncodePrefix(const Prefix& m, uint8_t* p);
// False unless p[0, n) starts with a prefix the encoder writes: magic,
// version, a known kind, zero padding, a non-zero sender key, and a zero
// receiver key exactly in a contact.
bool DecodePrefix(const uint8_t* p, size_t n, Prefix* m);

// The address after a contact's or accept's prefix (p[0, n)): false when
// empty or longer than kMaxName.
bool DecodeAddress(const uint8_t* p, size_t n, std::string* name);

// Where n > 0 stream bytes at offset `seq` go, for a receiver that has the
// stream in order up to rx_off and lets a sender be `window` bytes past
// what it consumed (consumed <= rx_off): kInOrder (seq == rx_off), kAhead
// (a later part, held until the gap fills), or kRefused (before rx_off, or
// any byte past consumed + window: a peer that does not honour the
// window). Exact for every 64-bit value: no sum wraps.
enum class Segment { kInOrder, kAhead, kRefused };
Segment PlaceSegment(uint64_t seq, size_t n, uint64_t rx_off, uint64_t consumed,
                     uint64_t window);

}  // namespace psmd::hw::ofi

#endif  // PSMD_HW_OFI_OFI_WIRE_H_
