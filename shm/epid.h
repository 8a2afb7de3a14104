// The epid codec: how psmd packs an endpoint's identity into the 64-bit
// psm2_epid_t that applications exchange (Open MPI's modex carries nothing
// else). The daemon mints epids; the library only takes them apart (for
// psm2_epid_nid, psm2_epid_context, psm2_epid_port and host names).
//
//   bits 63..48  node id     (psmd --node-id; psm2_epid_nid)
//   bits 47..32  boot nonce  (random per daemon start: an epid from an
//                             earlier run of psmd never names a new endpoint)
//   bits 31..0   endpoint id (psm2_epid_context and psm2_epid_port)
//
// Thread-safety: pure functions.
#ifndef PSMD_SHM_EPID_H_
#define PSMD_SHM_EPID_H_

#include <cstdint>

namespace psmd::shm {

constexpr uint64_t MakeEpid(uint16_t node_id, uint16_t boot_nonce,
                            uint32_t endpoint_id) {
  return (uint64_t{node_id} << 48) | (uint64_t{boot_nonce} << 32) | endpoint_id;
}
constexpr uint16_t NodeIdOf(uint64_t epid) {
  return static_cast<uint16_t>(epid >> 48);
}
constexpr uint16_t BootNonceOf(uint64_t epid) {
  return static_cast<uint16_t>(epid >> 32);
}
constexpr uint32_t EndpointIdOf(uint64_t epid) {
  return static_cast<uint32_t>(epid);
}

static_assert(NodeIdOf(MakeEpid(0xabcd, 0x1234, 0x89abcdef)) == 0xabcd);
static_assert(BootNonceOf(MakeEpid(0xabcd, 0x1234, 0x89abcdef)) == 0x1234);
static_assert(EndpointIdOf(MakeEpid(0xabcd, 0x1234, 0x89abcdef)) == 0x89abcdef);

}  // namespace psmd::shm

#endif  // PSMD_SHM_EPID_H_
