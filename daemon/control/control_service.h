// The gRPC control service (proto/control.proto): translates calls into
// Registry operations, with the caller's identity taken from Admission.
//
// Thread-safety: handlers run on gRPC's threads concurrently; all shared
// state lives in Registry, Admission and Workers, which are safe.
#ifndef PSMD_DAEMON_CONTROL_CONTROL_SERVICE_H_
#define PSMD_DAEMON_CONTROL_CONTROL_SERVICE_H_

#include <chrono>

#include "daemon/config.h"
#include "daemon/control/admission.h"
#include "daemon/control/registry.h"
#include "daemon/handover/upgrades.h"
#include "daemon/workers.h"
#include "proto/control.grpc.pb.h"

namespace psmd {

class ControlService final : public v1::Control::Service {
 public:
  // `config` is the configuration in force (replaced on SIGHUP), read from
  // `config_path`.
  // `upgrades`: psmctl upgrade's requests (daemon/handover/upgrades.h).
  ControlService(Registry* registry, Admission* admission, Workers* worker,
                 const SharedConfig* config, std::string config_path,
                 handover::Upgrades* upgrades);

  grpc::Status Health(grpc::ServerContext* ctx, const v1::HealthRequest* req,
                      v1::HealthReply* reply) override;
  grpc::Status OpenEndpoint(grpc::ServerContext* ctx,
                            const v1::OpenEndpointRequest* req,
                            v1::OpenEndpointReply* reply) override;
  grpc::Status CloseEndpoint(grpc::ServerContext* ctx,
                             const v1::CloseEndpointRequest* req,
                             v1::CloseEndpointReply* reply) override;
  grpc::Status Connect(grpc::ServerContext* ctx, const v1::ConnectRequest* req,
                       v1::ConnectReply* reply) override;
  grpc::Status Disconnect(grpc::ServerContext* ctx,
                          const v1::DisconnectRequest* req,
                          v1::DisconnectReply* reply) override;
  grpc::Status GetStats(grpc::ServerContext* ctx,
                        const v1::GetStatsRequest* req,
                        v1::GetStatsReply* reply) override;
  grpc::Status ListEndpoints(grpc::ServerContext* ctx,
                             const v1::ListEndpointsRequest* req,
                             v1::ListEndpointsReply* reply) override;
  grpc::Status ListJobs(grpc::ServerContext* ctx,
                        const v1::ListJobsRequest* req,
                        v1::ListJobsReply* reply) override;
  grpc::Status GetConfig(grpc::ServerContext* ctx,
                         const v1::GetConfigRequest* req,
                         v1::GetConfigReply* reply) override;
  grpc::Status RegisterSlurmStep(grpc::ServerContext* ctx,
                                 const v1::RegisterSlurmStepRequest* req,
                                 v1::RegisterSlurmStepReply* reply) override;
  grpc::Status EndSlurmStep(grpc::ServerContext* ctx,
                            const v1::EndSlurmStepRequest* req,
                            v1::EndSlurmStepReply* reply) override;
  grpc::Status Upgrade(grpc::ServerContext* ctx, const v1::UpgradeRequest* req,
                       v1::UpgradeReply* reply) override;

 private:
  // Fills *who from the kernel-reported credentials of the caller's
  // connection; an error status when they are unknown.
  grpc::Status Identify(grpc::ServerContext* ctx, Credentials* who);
  uint64_t UptimeNs() const;

  Registry* const registry_;
  Admission* const admission_;
  Workers* const worker_;
  const SharedConfig* const config_;
  const std::string config_path_;
  handover::Upgrades* const upgrades_;
  const std::chrono::steady_clock::time_point started_;
  const uint64_t started_unix_ns_;  // the same instant by the wall clock
};

}  // namespace psmd

#endif  // PSMD_DAEMON_CONTROL_CONTROL_SERVICE_H_
