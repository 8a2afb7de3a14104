#include "hw/ofi/ofi_wire.h"

namespace psmd::hw::ofi {
namespace {

void Put32(uint8_t* p, uint32_t v) {
  for (int i = 0; i < 4; i++) p[i] = static_cast<uint8_t>(v >> (8 * i));
}
void Put64(uint8_t* p, uint64_t v) {
  for (int i = 0; i < 8; i++) p[i] = static_cast<uint8_t>(v >> (8 * i));
}
uint32_t Get32(const uint8_t* p) {
  uint32_t v = 0;
  for (int i = 0; i < 4; i++) v |= uint32_t{p[i]} << (8 * i);
  return v;
}
uint64_t Get64(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; i++) v |= uint64_t{p[i]} << (8 * i);
  return v;
}

}  // namespace

void EncodePrefix(const Prefix& m, uint8_t* p) {
  Put32(p, kMsgMagic);
  p[4] = m.kind;
  p[5] = kMsgVersion;
  p[6] = p[7] = 0;
  Put64(p + 8, m.dst);
  Put64(p + 16, m.src);
  Put64(p + 24, m.seq);
}

bool DecodePrefix(const uint8_t* p, size_t n, Prefix* m) {
  if (n < kPrefix || Get32(p) != kMsgMagic || p[5] != kMsgVersion ||
      p[4] < kContact || p[4] > kAccept || p[6] != 0 || p[7] != 0) {
    return false;
  }
  m->kind = p[4];
  m->dst = Get64(p + 8);
  m->src = Get64(p + 16);
  m->seq = Get64(p + 24);
  return m->src != 0 && (m->kind == kContact) == (m->dst == 0);
}

bool DecodeAddress(const uint8_t* p, size_t n, std::string* name) {
  if (n == 0 || n > kMaxName) return false;
  name->assign(reinterpret_cast<const char*>(p), n);
  return true;
}

Segment PlaceSegment(uint64_t seq, size_t n, uint64_t rx_off, uint64_t consumed,
                     uint64_t window) {
  // seq + n and consumed + window may wrap for values a peer chooses (a
  // wrapped sum once let a segment at seq near 2^64 be held as "ahead",
  // never to be joined: memory a peer could grow at will). Compare
  // distances from consumed instead, which rx_off >= consumed bounds.
  if (seq < rx_off || n == 0 || n > window) return Segment::kRefused;
  if (seq - consumed > window - n) return Segment::kRefused;
  return seq == rx_off ? Segment::kInOrder : Segment::kAhead;
}

}  // namespace psmd::hw::ofi
