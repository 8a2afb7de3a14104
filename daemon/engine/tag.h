// tag.h: message keys and receive patterns for PSM2 matched-queue (MQ) tag
// matching.
//
// A message carries a source endpoint id and a 96-bit tag. A receive pattern
// carries a source filter (one endpoint id, or kAnySource), a 96-bit tag and a
// 96-bit selector; it matches a message iff the source filter accepts the
// message's source and ((stag ^ rtag) & rsel) == 0 in every word, exactly as
// documented for psm2_mq_irecv2 (psm2_mq.h).
//
// 64-bit PSM tags are 96-bit tags with w[2] == 0 (PSM2 does the same; see
// Tag64()).
//
// Everything here is a plain value type with no state: safe to use from any
// thread.

#ifndef PSMD_DAEMON_ENGINE_TAG_H_
#define PSMD_DAEMON_ENGINE_TAG_H_

#include <cstddef>
#include <cstdint>

namespace psmd {

// Three 32-bit words, same layout as psm2_mq_tag_t's tag0..tag2.
struct Tag96 {
  uint32_t w[3];
};

inline constexpr bool operator==(const Tag96& a, const Tag96& b) {
  return a.w[0] == b.w[0] && a.w[1] == b.w[1] && a.w[2] == b.w[2];
}
inline constexpr bool operator!=(const Tag96& a, const Tag96& b) {
  return !(a == b);
}

// Hash functor for unordered containers and the matcher's tag index. Mixes
// all 96 bits so that tags differing only in the high or low word (common in
// MPI's context|rank|tag packing) still spread over the table.
struct Tag96Hash {
  size_t operator()(const Tag96& t) const noexcept {
    uint64_t h = (uint64_t{t.w[1]} << 32) | t.w[0];
    h ^= uint64_t{t.w[2]} * 0x9E3779B97F4A7C15ULL;
    // MurmurHash3 fmix64 finalizer: full avalanche, so low bits are usable
    // directly as a power-of-two table index.
    h ^= h >> 33;
    h *= 0xFF51AFD7ED558CCDULL;
    h ^= h >> 33;
    h *= 0xC4CEB9FE1A85EC53ULL;
    h ^= h >> 33;
    return static_cast<size_t>(h);
  }
};

// Source filter value meaning "any source" (PSM2_MQ_ANY_ADDR). Never a real
// endpoint id.
inline constexpr uint64_t kAnySource = ~uint64_t{0};

// Selector that compares every tag bit: a receive with this selector is an
// "exact tag" receive.
inline constexpr Tag96 kTagSelAll{{~0u, ~0u, ~0u}};
// Selector that ignores every tag bit (matches any tag).
inline constexpr Tag96 kTagSelNone{{0u, 0u, 0u}};

// A 64-bit PSM tag as a 96-bit tag: tag0 = low half, tag1 = high half,
// tag2 = 0.
inline constexpr Tag96 Tag64(uint64_t tag) {
  return Tag96{
      {static_cast<uint32_t>(tag), static_cast<uint32_t>(tag >> 32), 0u}};
}

// What an arriving message is matched on.
struct MsgKey {
  uint64_t source;  // never kAnySource
  Tag96 tag;
};

inline constexpr bool operator==(const MsgKey& a, const MsgKey& b) {
  return a.source == b.source && a.tag == b.tag;
}
inline constexpr bool operator!=(const MsgKey& a, const MsgKey& b) {
  return !(a == b);
}

// The key of a message from `source` with the three tag words of a
// descriptor or a wire record (both lay them out as psm2_mq_tag_t does).
inline constexpr MsgKey KeyOf(uint64_t source, const uint32_t tag[3]) {
  return MsgKey{source, Tag96{{tag[0], tag[1], tag[2]}}};
}

// What a posted receive (or a probe) matches with.
struct RecvPattern {
  uint64_t source;  // a specific endpoint id, or kAnySource
  Tag96 tag;
  Tag96 sel;  // 1 bits are compared, 0 bits are wildcards
};

inline constexpr bool source_matches(uint64_t filter, uint64_t source) {
  return filter == kAnySource || filter == source;
}

inline constexpr bool tag_matches(const Tag96& rtag, const Tag96& rsel,
                                  const Tag96& stag) {
  return (((stag.w[0] ^ rtag.w[0]) & rsel.w[0]) |
          ((stag.w[1] ^ rtag.w[1]) & rsel.w[1]) |
          ((stag.w[2] ^ rtag.w[2]) & rsel.w[2])) == 0;
}

inline constexpr bool matches(const RecvPattern& p, const MsgKey& m) {
  return source_matches(p.source, m.source) && tag_matches(p.tag, p.sel, m.tag);
}

// True if `sel` compares every tag bit, i.e. a receive with it matches exactly
// one tag and can be found by hashing that tag.
inline constexpr bool is_exact_selector(const Tag96& sel) {
  return sel == kTagSelAll;
}

}  // namespace psmd

#endif  // PSMD_DAEMON_ENGINE_TAG_H_
