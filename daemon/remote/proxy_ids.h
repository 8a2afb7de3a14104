// Proxy endpoint ids: an active-message sender on another node appears to
// the handler with one of these ids (tag[2] of its completion, from
// kProxyBase up, daemon/engine/other_nodes.h), and the client's reply or
// ack names it; the inter-node engine maps it back to the sender's epid.
//
// Invariants: an id names one epid at a time, both maps agree, and an id
// is handed out in a circle over [kProxyBase, kRemotePeer), skipping live
// ones, so a stale id (its epid dropped) finds nothing for as long as
// possible. The engine drops an epid's id when its endpoint is gone (kGone)
// or its node's connection ends, so the map holds only endpoints that may
// still be answered.
//
// Thread-safety: not thread-safe; owned by one progress worker's Remote.
#ifndef PSMD_DAEMON_REMOTE_PROXY_IDS_H_
#define PSMD_DAEMON_REMOTE_PROXY_IDS_H_

#include <cstdint>
#include <unordered_map>

#include "daemon/engine/other_nodes.h"
#include "daemon/handover/state_codec.h"

namespace psmd {

class ProxyIds {
 public:
  // The id of `epid`, made on first use.
  uint32_t For(uint64_t epid);
  // The epid `proxy` names, or 0.
  uint64_t EpidOf(uint32_t proxy) const;
  void Drop(uint64_t epid);
  // Drops the ids of every endpoint of `node`.
  void DropNode(uint16_t node);

  // A handover (daemon/remote/remote_handover.cc): the ids and where the
  // circle goes on. LoadState checks the invariants above and that no id
  // names an epid of `self` (this node); false with r's error.
  void SaveState(handover::StateWriter& w) const;
  bool LoadState(handover::StateReader& r, uint16_t self);

 private:
  std::unordered_map<uint64_t, uint32_t> by_epid_;
  std::unordered_map<uint32_t, uint64_t> epid_of_;
  uint32_t next_ = kProxyBase;
};

}  // namespace psmd

#endif  // PSMD_DAEMON_REMOTE_PROXY_IDS_H_
