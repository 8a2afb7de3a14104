// The attach handshake: how a client that opened an endpoint over gRPC gets
// the segment file descriptors. It runs on a plain connection to the daemon's
// control socket, so the daemon can pass fds (SCM_RIGHTS) and read the
// caller's credentials (SO_PEERCRED); gRPC can do neither.
//
//   client -> daemon : AttachRequest  (magic "PSMDATT1", one-time token)
//   daemon -> client : AttachReply + fds [segment, pool, doorbell eventfd]
//
// The connection then stays open, silent, for the endpoint's lifetime: the
// daemon treats its hang-up as the client's death and reclaims the endpoint.
#ifndef PSMD_SHM_ATTACH_H_
#define PSMD_SHM_ATTACH_H_

#include <cstddef>
#include <cstdint>

namespace psmd::shm {

// Where psmd listens (gRPC control and the attach handshake) unless told
// otherwise (psmd --socket; clients and psmctl: $PSMD_SOCKET).
inline constexpr char kDefaultSocketPath[] = "/run/psmd/psmd.sock";

// The most epids one Connect call names; the library splits larger
// psm2_ep_connect calls. Bounds what one call makes psmd build under its
// registry mutex and the reply (each failure carries a message): well under
// gRPC's 4 MiB message limit.
inline constexpr int kMaxEpidsPerConnect = 8192;

inline constexpr char kAttachMagic[8] = {'P', 'S', 'M', 'D',
                                         'A', 'T', 'T', '1'};
inline constexpr size_t kAttachTokenBytes = 16;
inline constexpr int kAttachFdCount = 3;

struct AttachRequest {
  char magic[8];
  uint8_t token[kAttachTokenBytes];
};
static_assert(sizeof(AttachRequest) == 24);

struct AttachReply {
  int32_t status;  // a psm2_error_t: PSM2_OK, or why the attach failed
  uint32_t nfds;
};

// Sends `len` bytes plus `nfds` descriptors in one message. Returns false on
// any short write or error.
bool SendWithFds(int sock, const void* data, size_t len, const int* fds,
                 int nfds);

// Receives exactly `len` bytes (blocking) and up to `max_fds` descriptors,
// which are stored in fds (CLOEXEC); *nfds receives the count. Returns false
// on EOF, error, or truncated control data (any fds received are closed).
bool RecvWithFds(int sock, void* data, size_t len, int* fds, int max_fds,
                 int* nfds);

}  // namespace psmd::shm

#endif  // PSMD_SHM_ATTACH_H_
