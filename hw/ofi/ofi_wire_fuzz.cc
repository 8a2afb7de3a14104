// libFuzzer target for what the ofi backend reads from the network before
// frame.h's decoders (which hw/frame_fuzz.cc covers): the message prefix,
// the address a contact or accept carries, and the placement of a stream
// segment (ofi_wire.h). Besides crashes and sanitizer reports it checks
// that a prefix that decodes re-encodes to the same bytes, and that
// PlaceSegment's verdict is the one computed without any 64-bit sum (the
// window check once wrapped). Built and run for a bounded time by
// hw/ofi/ofi_wire_fuzz.sh, from the seed corpus hw/ofi/ofi_wire_fuzz_corpus/
// (OFI_WIRE_FUZZ_WRITE_SEEDS=DIR writes it).
//
// Input: 16 bytes of receiver state (rx_off u64, then how far consumed is
// behind it, u64 modulo rx_off + 1), then the message as received. At exit
// the target prints what the run got to ("ofi_wire_fuzz: reached ..."), so
// that its script can fail a run that never got past the magic.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "hw/ofi/ofi_wire.h"
#include "tests/fuzz_seeds.h"

namespace {

using namespace psmd::hw::ofi;

// The backend's window (ofi_fabric.cc kWindow).
constexpr uint64_t kWindow = 2u << 20;

void Check(bool ok) {
  if (!ok) std::abort();
}

uint64_t Get64(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; i++) v |= uint64_t{p[i]} << (8 * i);
  return v;
}

struct Reached {
  uint64_t kinds[7] = {};  // prefixes decoded, per kind (1..6)
  uint64_t addresses = 0;  // contact/accept addresses decoded
  uint64_t in_order = 0, ahead = 0, refused = 0;  // stream segments
  ~Reached() {
    printf(
        "ofi_wire_fuzz: reached kinds=%llu,%llu,%llu,%llu,%llu,%llu "
        "addresses=%llu segments=%llu,%llu,%llu\n",
        static_cast<unsigned long long>(kinds[1]),
        static_cast<unsigned long long>(kinds[2]),
        static_cast<unsigned long long>(kinds[3]),
        static_cast<unsigned long long>(kinds[4]),
        static_cast<unsigned long long>(kinds[5]),
        static_cast<unsigned long long>(kinds[6]),
        static_cast<unsigned long long>(addresses),
        static_cast<unsigned long long>(in_order),
        static_cast<unsigned long long>(ahead),
        static_cast<unsigned long long>(refused));
  }
} reached;

std::string State(uint64_t rx_off, uint64_t behind) {
  std::string s(16, '\0');
  for (int i = 0; i < 8; i++) {
    s[i] = static_cast<char>(rx_off >> (8 * i));
    s[8 + i] = static_cast<char>(behind >> (8 * i));
  }
  return s;
}

std::string Message(uint8_t kind, uint64_t dst, uint64_t src, uint64_t seq,
                    const std::string& payload) {
  Prefix m;
  m.kind = kind;
  m.dst = dst;
  m.src = src;
  m.seq = seq;
  uint8_t p[kPrefix];
  EncodePrefix(m, p);
  return std::string(reinterpret_cast<const char*>(p), kPrefix) + payload;
}

std::vector<std::string> Seeds() {
  const std::string sockaddr(16, '\x02');  // an address's worth of bytes
  const std::string none = State(0, 0), busy = State(1 << 20, 4096);
  std::vector<std::string> seeds = {
      none + Message(kContact, 0, 7, 0, sockaddr),
      none + Message(kAccept, 7, 9, 0, sockaddr),
      none + Message(kStream, 7, 9, 0, std::string(100, 'x')),
      busy + Message(kStream, 7, 9, 1 << 20, std::string(100, 'x')),
      busy + Message(kStream, 7, 9, (1 << 20) + 4096, std::string(100, 'x')),
      busy + Message(kStream, 7, 9, 100, std::string(100, 'x')),
      // At the top of the offsets, where a sum wraps.
      busy + Message(kStream, 7, 9, ~uint64_t{0} - 50, std::string(100, 'x')),
      busy + Message(kCredit, 7, 9, 4096, ""),
      busy + Message(kClose, 7, 9, 1 << 20, ""),
      busy + Message(kKeepalive, 7, 9, 4096, ""),
  };
  return seeds;
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  psmd::fuzz::WriteSeedsIfAsked("OFI_WIRE_FUZZ_WRITE_SEEDS", "ofi_wire_fuzz",
                                Seeds);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 16) return 0;
  const uint64_t rx_off = Get64(data);
  const uint64_t behind = Get64(data + 8);
  // consumed <= rx_off, as in the backend.
  const uint64_t consumed =
      rx_off - (rx_off == ~uint64_t{0} ? behind : behind % (rx_off + 1));
  const uint8_t* p = data + 16;
  const size_t n = size - 16;
  Prefix m;
  if (!DecodePrefix(p, n, &m)) return 0;
  Check(n >= kPrefix && m.kind >= kContact && m.kind <= kAccept);
  Check(m.src != 0 && (m.kind == kContact) == (m.dst == 0));
  uint8_t again[kPrefix];
  EncodePrefix(m, again);
  Check(std::memcmp(again, p, kPrefix) == 0);
  ++reached.kinds[m.kind];
  const uint8_t* body = p + kPrefix;
  const size_t len = n - kPrefix;
  if (m.kind == kContact || m.kind == kAccept) {
    std::string name;
    const bool ok = DecodeAddress(body, len, &name);
    Check(ok == (len > 0 && len <= kMaxName));
    if (ok) {
      Check(name.size() == len && std::memcmp(name.data(), body, len) == 0);
      ++reached.addresses;
    }
  } else if (m.kind == kStream) {
    const Segment s = PlaceSegment(m.seq, len, rx_off, consumed, kWindow);
    // The verdict in arithmetic that cannot wrap.
    using u128 = unsigned __int128;
    const bool refused = m.seq < rx_off || len == 0 ||
                         u128{m.seq} + len > u128{consumed} + kWindow;
    Check((s == Segment::kRefused) == refused);
    if (!refused) Check((s == Segment::kInOrder) == (m.seq == rx_off));
    (s == Segment::kRefused   ? reached.refused
     : s == Segment::kInOrder ? reached.in_order
                              : reached.ahead)++;
  }
  return 0;
}
