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

void ProxyIds::SaveState(handover::StateWriter& w) const {
  w.U32(next_);
  w.U32(static_cast<uint32_t>(by_epid_.size()));
  for (const auto& [epid, id] : by_epid_) {
    w.U64(epid);
    w.U32(id);
  }
}

bool ProxyIds::LoadState(handover::StateReader& r, uint16_t self) {
  auto in_range = [](uint32_t id) {
    return id >= kProxyBase && id < kRemotePeer;
  };
  uint32_t next = 0, n = 0;
  if (!r.U32(&next, "next proxy id") ||
      !r.Count(&n, 12, kRemotePeer - kProxyBase, "proxy ids"))
    return false;
  if (!in_range(next)) return r.Fail("next proxy id", "is out of range");
  ProxyIds loaded;
  loaded.next_ = next;
  for (uint32_t i = 0; i < n; i++) {
    uint64_t epid = 0;
    uint32_t id = 0;
    if (!r.U64(&epid, "proxy epid") || !r.U32(&id, "proxy id")) return false;
    if (!in_range(id) || epid == 0 || shm::NodeIdOf(epid) == self)
      return r.Fail("proxy id", "is out of range or names this node");
    if (!loaded.by_epid_.emplace(epid, id).second ||
        !loaded.epid_of_.emplace(id, epid).second)
      return r.Fail("proxy id", "names an epid twice, or an id twice");
  }
  *this = std::move(loaded);
  return true;
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
