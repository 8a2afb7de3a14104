#include "daemon/engine/crossing.h"

#include "shm/doorbell.h"

namespace psmd {

Crossing::Crossing(uint32_t shards)
    : shards_(shards), wake_(new WakeState[shards]) {
  lanes_.reserve(size_t{shards} * shards);
  for (uint32_t i = 0; i < shards * shards; i++) {
    auto lane = std::make_unique<LaneState>();
    lane->control.head.value.store(0, std::memory_order_relaxed);
    // Zeroed slots: no stamp matches lap 0's (shm/ring.h, protocol 3).
    lane->slots.reset(new CrossItem[kLaneItems]());
    lane->producer = shm::RingProducer<CrossItem>(
        &lane->control, lane->slots.get(), kLaneItems);
    lane->consumer = shm::RingConsumer<CrossItem>(
        &lane->control, lane->slots.get(), kLaneItems);
    lanes_.push_back(std::move(lane));
  }
}

void Crossing::Wake(uint32_t shard) {
  // The item before the flag (invariant 2): pairs with the sleeper's fence
  // between its flag and its last look.
  shm::WakeupFence();
  WakeState& w = wake_[shard];
  if (w.sleeping.load(std::memory_order_relaxed) && w.fd >= 0) {
    shm::RingEventFd(w.fd);
  }
}

}  // namespace psmd
