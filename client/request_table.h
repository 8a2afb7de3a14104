// The requests of one endpoint, by index, recycled through a free list.
// On the wire a request is named by its token, index and generation
// (client/endpoint.h, invariant 3); freeing a request bumps its generation,
// so a completion that still carries the old token resolves to nothing.
// Requests are never deallocated before the table: a pointer the
// application still holds stays valid memory.
//
// Thread-safety: none of its own; the endpoint uses it under its mutex.
#ifndef PSMD_CLIENT_REQUEST_TABLE_H_
#define PSMD_CLIENT_REQUEST_TABLE_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "client/mutex.h"

struct psm2_mq_req;

namespace psmd::client {

class RequestTable {
 public:
  RequestTable();
  ~RequestTable();
  RequestTable(const RequestTable&) = delete;
  RequestTable& operator=(const RequestTable&) = delete;

  // A reset request (all fields zero but index and generation).
  psm2_mq_req* New();
  // Retires `req`: its token goes stale and its slot is reused. Freeing a
  // free request does nothing (its slot must not be handed out twice).
  void Free(psm2_mq_req* req);
  // The live request `token` names, or null.
  psm2_mq_req* Lookup(uint64_t token) const;

  // Calls f(psm2_mq_req*) for every request, live or free (free ones are
  // in state kComplete). f may require the endpoint's mutex: the table is
  // guarded by it, so the caller holds it (the analysis cannot follow f).
  template <typename F>
  void ForEach(F f) const PSMD_NO_THREAD_SAFETY_ANALYSIS {
    for (const auto& r : requests_) f(r.get());
  }

 private:
  std::vector<std::unique_ptr<psm2_mq_req>> requests_;  // by index
  std::vector<uint32_t> free_;                          // free indices
};

}  // namespace psmd::client

#endif  // PSMD_CLIENT_REQUEST_TABLE_H_
