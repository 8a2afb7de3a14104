// The TCP backend of hw::Fabric, on io_uring (liburing).
//
// Every socket operation (accept, connect, sendmsg, recv) is an io_uring
// submission; nothing ever blocks the caller on a socket. Operations
// posted between two Poll calls are submitted together by the next Poll
// (one io_uring_enter for the batch). Poll reads completions from the
// shared completion ring in memory, so a spinning progress loop that finds
// nothing pays no syscall. The ring's completions also signal event_fd().
//
// Per connection: one sendmsg in flight at a time, covering as many queued
// frames as fit (up to 256 iovecs), so frames stay in order and small
// frames are batched. Each read takes up to 128 KiB (kStageSize in
// socket_fabric.cc) into a per-connection staging buffer, so that many small
// frames arrive with one completion, and their payloads are copied from it
// into the posted receives; the unread rest of a payload is received
// straight into the posted iovecs. After a frame whose payload exceeds
// 64 KiB the next read takes only 16 KiB, so that a stream of rendezvous
// chunks is not copied through the stage. See hw/fabric.h for the contract
// and docs/design.md for the handshake and limits.
//
// Thread-safety: as hw::Fabric (one thread), plus a private MUNGE helper
// thread when authentication is on.
#ifndef PSMD_HW_SOCKET_SOCKET_FABRIC_H_
#define PSMD_HW_SOCKET_SOCKET_FABRIC_H_

#include <memory>
#include <string>

#include "hw/fabric.h"

namespace psmd::hw {

// Null with *error (what is wrong and the fix) when the options are bad, no
// port in a range is free, or io_uring is unavailable.
std::unique_ptr<Fabric> OpenSocketFabric(const FabricOptions& options,
                                         std::string* error);

}  // namespace psmd::hw

#endif  // PSMD_HW_SOCKET_SOCKET_FABRIC_H_
