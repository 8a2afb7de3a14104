// libpsmclient's side of the control plane: the gRPC stub to psmd and the
// attach handshake that brings the segment fds.
//
// Thread-safety: ControlClient is safe to share between threads (each call
// has its own channel); one instance serves the whole process.
//
// Thread cost: gRPC runs about eight threads of its own (executor, resolver,
// timers, event engine) while any gRPC object lives. The control plane is a
// handful of calls at open, connect and close, so each call makes its own
// channel and drops it: with no gRPC object left, gRPC shuts down with its
// threads, and an MPI rank between those calls carries none of them.
#ifndef PSMD_CLIENT_CONTROL_CLIENT_H_
#define PSMD_CLIENT_CONTROL_CLIENT_H_

#include <array>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "proto/control.grpc.pb.h"
#include "shm/attach.h"
#include "shm/status.h"

namespace psmd::client {

inline constexpr const char* kDefaultSocket = shm::kDefaultSocketPath;

// The daemon's socket: $PSMD_SOCKET, else the default.
std::string SocketPath();

struct AttachedFds {
  int segment = -1;
  int pool = -1;
  int doorbell = -1;
  int liveness =
      -1;  // the attach connection, kept open for the endpoint's life
};

class ControlClient {
 public:
  explicit ControlClient(std::string socket_path);

  const std::string& socket_path() const { return socket_path_; }

  Status OpenEndpoint(const std::array<uint8_t, 16>& uuid,
                      const std::string& label, v1::OpenEndpointReply* reply);
  Status Attach(const std::string& token, AttachedFds* fds);
  // Calls that name an endpoint also carry its epid, which psmd checks, so
  // that they never reach an endpoint a later psmd gave the same id to; 0
  // (psmctl close, an operator naming an id) is not checked.
  Status CloseEndpoint(uint32_t endpoint_id, uint64_t epid);
  // `remote_wait`: how long psmd may wait for other nodes' daemons
  // (OpenEndpointReply.fabric_timeout_ms), added to the deadline.
  Status Connect(uint32_t endpoint_id, uint64_t epid,
                 const std::vector<uint64_t>& epids,
                 std::chrono::milliseconds remote_wait,
                 v1::ConnectReply* reply);
  Status Disconnect(uint32_t endpoint_id, uint64_t epid,
                    const std::vector<uint32_t>& slots,
                    v1::DisconnectReply* reply);
  Status GetStats(v1::GetStatsReply* reply);
  Status ListEndpoints(v1::ListEndpointsReply* reply);
  Status ListJobs(v1::ListJobsReply* reply);
  Status Health(v1::HealthReply* reply);
  // Root only: psmctl upgrade (docs/design.md, "Handover").
  Status Upgrade(const std::string& exec_path, v1::UpgradeReply* reply);
  Status GetConfig(v1::GetConfigReply* reply);
  // Slurm's SPANK plugin's calls (through psmctl slurm-register and
  // slurm-end); root only.
  Status RegisterSlurmStep(const v1::RegisterSlurmStepRequest& request);
  Status EndSlurmStep(uint32_t job_id, uint32_t step_id,
                      v1::EndSlurmStepReply* reply);

 private:
  // Converts a gRPC status into a Status that names the socket and the fix.
  // `extra`: what the call's deadline had beyond the usual one.
  Status FromStatus(const grpc::Status& status, const char* what,
                    std::chrono::milliseconds extra = {}) const;
  void Prepare(grpc::ClientContext* ctx,
               std::chrono::milliseconds extra = {}) const;
  // Makes the call `rpc(stub, ctx)`, again while psmd is handing over
  // (docs/design.md, "Handover"): a call its old process's gRPC cancelled
  // before running it (CANCELLED), or whose connection closed under it
  // while something still listens on the socket (UNAVAILABLE: the
  // successor takes the backlog), is made again on a new connection, until
  // the deadline (the usual one plus `extra`). A psmd that is not there is
  // still reported at once.
  template <typename Rpc>
  Status Call(const char* what, Rpc rpc,
              std::chrono::milliseconds extra = {}) const;
  // Whether a process listens on the socket (a connect is accepted or
  // queued).
  bool SomethingListens() const;
  // A stub on a new channel to the daemon, for one call.
  std::unique_ptr<v1::Control::Stub> NewStub() const;

  std::string socket_path_;
};

}  // namespace psmd::client

#endif  // PSMD_CLIENT_CONTROL_CLIENT_H_
