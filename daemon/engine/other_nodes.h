// OtherNodes: what the matching engine asks of the transport that reaches
// endpoints on other nodes (the inter-node engine, daemon/remote/remote.h).
// The engine owns matching; the transport sits beside it and reaches back
// only through MqEngine's public surface (Arrive, FindEndpoint, ...). This
// interface is the other direction, so that the engine depends on no
// transport and the transport on the engine, never both ways.
//
// Thread-safety: every call is made on the progress worker that owns the
// engine, and the implementation is owned by that worker too.
#ifndef PSMD_DAEMON_ENGINE_OTHER_NODES_H_
#define PSMD_DAEMON_ENGINE_OTHER_NODES_H_

#include <cstdint>

#include "daemon/engine/endpoint.h"
#include "shm/descriptor.h"

namespace psmd {

// Active-message completions name their sender by endpoint id (tag[2]),
// which the client names in its reply or ack; a sender on another node gets
// a proxy id from this range instead. A proxy lives while its epid may still
// be answered: it is dropped when that endpoint is gone or its node's
// connection ends, and ids are handed out in a circle, so a reply with a
// stale one finds nothing (or, after 2^31 others were handed out, a
// requester of the same job and uid at worst).
inline constexpr uint32_t kProxyBase = 0x80000000u;
inline bool IsProxy(uint32_t id) {
  return id >= kProxyBase && id != kRemotePeer;
}

class OtherNodes {
 public:
  virtual ~OtherNodes() = default;

  // Send/AmRequest to the endpoint behind `to` (a kRemotePeer link; one that
  // is gone fails the request): false = hold the sender, which only
  // `may_hold` allows (a closing sender's last sends are taken regardless:
  // it saw them complete).
  virtual bool Send(Endpoint& sender, const shm::SubmissionDesc& d,
                    const PeerLink& to, bool may_hold) = 0;
  virtual bool AmRequest(Endpoint& sender, const shm::SubmissionDesc& d,
                         const PeerLink& to, bool may_hold) = 0;
  // kAmReply / kAmAck whose peer is a proxy id (IsProxy).
  virtual void AmReplyOrAck(Endpoint& sender, const shm::SubmissionDesc& d) = 0;
  // A rendezvous chunk of a transfer to another node; false: not one.
  virtual bool RndvData(Endpoint& sender, const shm::SubmissionDesc& d) = 0;
  // `m` came from another node (m.remote_src) and was received or failed:
  // tell its sender.
  virtual void CompleteSync(const Endpoint& receiver, const UnexpectedMsg& m,
                            int32_t error) = 0;
  // A receive matched `m`, a rendezvous from another node: fetch it.
  virtual void StartTransfer(Endpoint& receiver, uint64_t recv_req,
                             uint32_t send_bytes, const UnexpectedMsg& m) = 0;
  // Endpoint `id` left this node: end what the transport keeps for it.
  virtual void EndpointRemoved(uint32_t id) = 0;
};

}  // namespace psmd

#endif  // PSMD_DAEMON_ENGINE_OTHER_NODES_H_
