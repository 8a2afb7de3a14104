// The matched-queue engine of one progress worker: the endpoints it owns and
// what happens to each descriptor they submit (send, receive, cancel), i.e.
// matching, unexpected-message queueing and completion posting.
//
// Thread-safety: not thread-safe. Every method runs on the owning progress
// worker's thread (control threads reach it through ProgressWorker::RunSync).
//
// Invariants:
//   1. Messages from one sender are matched in submission order (one worker
//      consumes each submission ring in order), giving MPI non-overtaking.
//   2. Every receive and every sync send gets exactly one completion; an
//      invalid descriptor gets exactly one kError completion.
//   3. A completion that finds the client's completion ring full waits in the
//      endpoint's overflow queue; while that queue is non-empty the endpoint's
//      submissions are not consumed (back-pressure, nothing dropped).
#ifndef PSMD_DAEMON_MQ_ENGINE_H_
#define PSMD_DAEMON_MQ_ENGINE_H_

#include <chrono>
#include <cstdint>
#include <memory>
#include <unordered_map>
#include <vector>

#include "daemon/endpoint.h"

namespace psmd {

class MqEngine {
 public:
  MqEngine() = default;

  void Add(std::shared_ptr<Endpoint> ep);
  // Removes the endpoint and everything queued for it: posted receives are
  // dropped, unexpected payloads released back to their senders.
  void Remove(uint32_t id);
  void SetPeer(uint32_t id, uint32_t slot, const PeerLink& link);
  void ClearPeer(uint32_t id, uint32_t slot);

  // Consumes and handles up to a batch of submissions from every endpoint.
  // Returns true when anything was done.
  bool PollAll();
  // True when some endpoint has a submission waiting (used before sleeping).
  bool AnySubmissionPending();
  // Wakes clients that sleep waiting for completions published since the
  // last call.
  void NotifyClients();

  const std::vector<Endpoint*>& endpoints() const { return order_; }

 private:
  bool Poll(Endpoint& ep);
  void Dispatch(Endpoint& ep, const shm::SubmissionDesc& d);
  void HandleSend(Endpoint& sender, const shm::SubmissionDesc& d);
  void HandleRecv(Endpoint& receiver, const shm::SubmissionDesc& d);
  void HandleCancel(Endpoint& ep, const shm::SubmissionDesc& d);
  void Deliver(Endpoint& receiver, uint64_t recv_req, const MsgKey& key, const UnexpectedMsg& m);
  void CompleteSync(uint32_t sender_id, uint64_t sender_req, int32_t error);
  void Post(Endpoint& ep, const shm::CompletionDesc& c);
  void PostError(Endpoint& ep, uint64_t req, int32_t error);
  bool FlushOverflow(Endpoint& ep);
  void ReleasePayload(const Endpoint& receiver, const UnexpectedMsg& m);
  void ReportBadDescriptor(Endpoint& ep, const char* what);
  Endpoint* Find(uint32_t id);

  std::unordered_map<uint32_t, std::shared_ptr<Endpoint>> by_id_;
  std::vector<Endpoint*> order_;
  std::unordered_map<uint32_t, std::chrono::steady_clock::time_point> last_complaint_;
};

}  // namespace psmd

#endif  // PSMD_DAEMON_MQ_ENGINE_H_
