// libpsmclient's side of the control plane: the gRPC stub to psmd and the
// attach handshake that brings the segment fds.
//
// Thread-safety: ControlClient is safe to share between threads (gRPC stubs
// are); one instance serves the whole process.
#ifndef PSMD_CLIENT_CONTROL_CLIENT_H_
#define PSMD_CLIENT_CONTROL_CLIENT_H_

#include <array>
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
  Status CloseEndpoint(uint32_t endpoint_id);
  Status Connect(uint32_t endpoint_id, const std::vector<uint64_t>& epids,
                 v1::ConnectReply* reply);
  Status Disconnect(uint32_t endpoint_id, const std::vector<uint32_t>& slots,
                    v1::DisconnectReply* reply);
  Status GetStats(v1::GetStatsReply* reply);
  Status ListEndpoints(v1::ListEndpointsReply* reply);
  Status ListJobs(v1::ListJobsReply* reply);
  Status Health(v1::HealthReply* reply);
  Status GetConfig(v1::GetConfigReply* reply);

 private:
  // Converts a gRPC status into a Status that names the socket and the fix.
  Status FromStatus(const grpc::Status& status, const char* what) const;
  void Prepare(grpc::ClientContext* ctx) const;

  std::string socket_path_;
  std::unique_ptr<v1::Control::Stub> stub_;
};

}  // namespace psmd::client

#endif  // PSMD_CLIENT_CONTROL_CLIENT_H_
