#include "daemon/remote/proxy_ids.h"

#include "daemon/engine/endpoint.h"
#include "shm/epid.h"

namespace psmd {

uint32_t ProxyIds::For(uint64_t epid) {
  auto [it, fresh] = by_epid_.try_emplace(epid, 0);
  if (!fresh) return it->second;
  // Live proxies are bounded by the endpoints of connected nodes, far
  // fewer than the 2^31 ids, so this finds a free one quickly.
  do {
    it->second = next_;
    next_ = next_ + 1 == kRemotePeer ? kProxyBase : next_ + 1;
  } while (epid_of_.count(it->second) != 0);
  epid_of_[it->second] = epid;
  return it->second;
}

uint64_t ProxyIds::EpidOf(uint32_t proxy) const {
  auto it = epid_of_.find(proxy);
  return it == epid_of_.end() ? 0 : it->second;
}

void ProxyIds::Drop(uint64_t epid) {
  auto it = by_epid_.find(epid);
  if (it == by_epid_.end()) return;
  epid_of_.erase(it->second);
  by_epid_.erase(it);
}

void ProxyIds::DropNode(uint16_t node) {
  for (auto it = by_epid_.begin(); it != by_epid_.end();) {
    if (shm::NodeIdOf(it->first) != node) {
      ++it;
      continue;
    }
    epid_of_.erase(it->second);
    it = by_epid_.erase(it);
  }
}

}  // namespace psmd
