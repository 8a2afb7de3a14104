// For tests of the engine and of what runs beside it: an endpoint made as
// the registry makes one, and a look at the match state only MqEngine
// reaches in the daemon (daemon/engine/endpoint.h, thread-safety 2).
//
// Thread-safety: as the engine's (the test's thread plays the worker).
#ifndef PSMD_DAEMON_ENGINE_TEST_ENDPOINT_H_
#define PSMD_DAEMON_ENGINE_TEST_ENDPOINT_H_

#include <sys/syscall.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>

#include "daemon/engine/endpoint.h"

namespace psmd {

// Endpoint `id` (`epid`) of `job`, of this process, in `region` (one the
// job handed out), with rings of `ring_capacity` descriptors in a fresh
// segment; counted among the job's endpoints. Aborts when the segment
// cannot be made.
inline std::shared_ptr<Endpoint> MakeTestEndpoint(
    const std::shared_ptr<Job>& job, const SendRegion& region, uint32_t id,
    uint64_t epid, uint32_t ring_capacity, uint64_t unexpected_budget) {
  Endpoint::Identity identity;
  identity.id = id;
  identity.epid = epid;
  identity.job = job;
  identity.uid = geteuid();
  identity.pid = getpid();
  identity.region = region;
  identity.geometry = shm::ComputeGeometry(ring_capacity, ring_capacity);
  std::string error;
  if (!shm::Mapping::Create("test-endpoint", identity.geometry.bytes, geteuid(),
                            getegid(), &identity.segment, &error)) {
    fprintf(stderr, "test endpoint segment: %s\n", error.c_str());
    abort();
  }
  job->endpoints++;
  return std::make_shared<Endpoint>(std::move(identity), unexpected_budget);
}

// Names this process as `ep`'s client for copies in place, as the registry
// stores the pidfd of the process that attached (mq_engine.h, invariant
// 10): the engine's copier then reads and writes this process's own
// memory. Aborts when no pidfd can be had.
inline void AttachThisProcess(Endpoint& ep) {
  const int pidfd = static_cast<int>(syscall(SYS_pidfd_open, getpid(), 0));
  if (pidfd < 0) {
    perror("pidfd_open");
    abort();
  }
  ep.pidfd.store(pidfd, std::memory_order_release);
}

// Another mapping of the memfd `m` maps (as a second process would map it,
// or the successor of a handover, issue 33). Aborts on failure.
inline shm::Mapping DupMapping(const shm::Mapping& m) {
  shm::Mapping out;
  std::string error;
  if (!shm::Mapping::Attach(dup(m.fd()), m.size(), &out, &error)) {
    fprintf(stderr, "dup mapping: %s\n", error.c_str());
    abort();
  }
  return out;
}

// Endpoint `old` as a successor's registry re-creates it after a handover:
// the same identity over its segment mapped anew, in `job` (the successor's
// job object for the same pool), counted among its endpoints; empty match
// state, for MqEngine::LoadState.
inline std::shared_ptr<Endpoint> RemakeTestEndpoint(
    const Endpoint& old, const std::shared_ptr<Job>& job,
    uint64_t unexpected_budget) {
  Endpoint::Identity identity;
  identity.id = old.id();
  identity.epid = old.epid();
  identity.job = job;
  identity.uid = old.uid();
  identity.gid = old.gid();
  identity.pid = old.pid();
  identity.label = old.label();
  identity.region = old.region();
  identity.geometry = old.geometry();
  identity.segment = DupMapping(old.segment());
  job->endpoints++;
  return std::make_shared<Endpoint>(std::move(identity), unexpected_budget);
}

// The match state of an endpoint, for a test's checks.
class EndpointTestPeer {
 public:
  explicit EndpointTestPeer(Endpoint& ep) : ep_(ep) {}

  const PostedQueue<PostedRecv>& posted() const { return ep_.posted; }
  const UnexpectedQueue<UnexpectedMsg>& unexpected() const {
    return ep_.unexpected;
  }
  const std::deque<shm::CompletionDesc>& cq_overflow() const {
    return ep_.cq_overflow;
  }
  uint64_t unexpected_cost() const { return ep_.unexpected_cost; }
  const std::deque<shm::SubmissionDesc>& held_sends() const {
    return ep_.held_sends;
  }
  size_t claimed() const { return ep_.claimed.size(); }
  uint32_t cross_in_flight() const { return ep_.cross_in_flight; }
  // As the client's PSM2_MQ_MAX_SYSBUF_MBYTES option would set it.
  void set_unexpected_budget(uint64_t bytes) { ep_.unexpected_budget = bytes; }

 private:
  Endpoint& ep_;
};

}  // namespace psmd

#endif  // PSMD_DAEMON_ENGINE_TEST_ENDPOINT_H_
