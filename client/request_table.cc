#include "client/request_table.h"

#include "client/endpoint.h"

namespace psmd::client {

RequestTable::RequestTable() = default;
RequestTable::~RequestTable() = default;

psm2_mq_req* RequestTable::New() {
  if (free_.empty()) {
    requests_.push_back(std::make_unique<psm2_mq_req>());
    psm2_mq_req* r = requests_.back().get();
    r->index = static_cast<uint32_t>(requests_.size() - 1);
    return r;
  }
  const uint32_t index = free_.back();
  free_.pop_back();
  psm2_mq_req* r = requests_[index].get();
  const uint32_t generation = r->generation + 1;
  *r = psm2_mq_req{};  // plain data: cheap on the hot path
  r->index = index;
  r->generation = generation;
  return r;
}

void RequestTable::Free(psm2_mq_req* req) {
  if (req->freed) return;  // never twice into the free list
  req->freed = true;
  req->generation++;  // stale tokens no longer resolve to it
  req->state = psm2_mq_req::State::kComplete;
  req->free_when_done = false;
  free_.push_back(req->index);
}

psm2_mq_req* RequestTable::Lookup(uint64_t token) const {
  const uint32_t index = static_cast<uint32_t>(token);
  const uint32_t generation = static_cast<uint32_t>(token >> 32);
  if (index >= requests_.size()) return nullptr;
  psm2_mq_req* r = requests_[index].get();
  return (r->generation & kTokenGenerationMask) == generation ? r : nullptr;
}

}  // namespace psmd::client
