#include "daemon/control/control_service.h"

#include <spdlog/spdlog.h>

#include "daemon/clock.h"
#include "daemon/log.h"

#include <unistd.h>

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "hw/fabric.h"
#include "proto/counters.h"
#include "shm/attach.h"
#include "version/version.h"

namespace psmd {

namespace {

// Control errors travel as FAILED_PRECONDITION with the psm2_error_t in the
// error details, so the client can return the same code to the application.
grpc::Status ToStatus(const Status& e) {
  if (e.ok()) return grpc::Status::OK;
  return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION, e.message,
                      std::to_string(e.code));
}

void FillCounters(const counters::Values& values,
                  google::protobuf::Map<std::string, uint64_t>* map) {
  for (size_t i = 0; i < counters::kNumCounters; i++) {
    (*map)[counters::kAll[i].name] = values[i];
  }
}

void FillStats(const EndpointSnapshot& s, v1::EndpointStats* out) {
  out->set_endpoint_id(s.id);
  out->set_epid(s.epid);
  out->set_job_uuid(UuidToString(s.uuid));
  out->set_uid(s.uid);
  out->set_pid(static_cast<uint32_t>(s.pid));
  out->set_label(s.label);
  FillCounters(s.counters, out->mutable_counters());
}

void FillSlurm(const std::optional<SlurmStep>& step, v1::SlurmStep* out) {
  out->set_job_id(step->job_id);
  out->set_step_id(step->step_id);
  out->set_uid(step->uid);
  out->set_cgroup(step->cgroup);
  out->set_tasks(step->tasks);
  out->set_memory_mib(step->memory_mib);
  out->set_max_endpoints(step->max_endpoints);
  out->set_unexpected_budget_bytes(step->unexpected_budget_bytes);
}

void FillInfo(const EndpointSnapshot& s, v1::EndpointInfo* info) {
  info->set_endpoint_id(s.id);
  info->set_epid(s.epid);
  info->set_job_uuid(UuidToString(s.uuid));
  info->set_pid(static_cast<uint32_t>(s.pid));
  info->set_uid(s.uid);
  info->set_gid(s.gid);
  info->set_label(s.label);
  info->set_connections(s.connections);
}

// Root only, said before anything else is looked at.
grpc::Status RootOnly(const Credentials& who, const char* what) {
  if (who.is_root()) return grpc::Status::OK;
  return grpc::Status(grpc::StatusCode::PERMISSION_DENIED,
                      std::string(what) +
                          " is root's (psmd's SPANK plugin); "
                          "the caller is uid " +
                          std::to_string(who.uid));
}

std::string VersionText() {
  return std::string(version::Version()) + " (commit " + version::Commit() +
         ")";
}

}  // namespace

ControlService::ControlService(Registry* registry, Admission* admission,
                               Workers* worker, const SharedConfig* config,
                               std::string config_path,
                               handover::Upgrades* upgrades)
    : registry_(registry),
      admission_(admission),
      worker_(worker),
      config_(config),
      config_path_(std::move(config_path)),
      upgrades_(upgrades),
      started_(std::chrono::steady_clock::now()),
      started_unix_ns_(UnixNowNs()) {}

uint64_t ControlService::UptimeNs() const {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now() - started_)
      .count();
}

grpc::Status ControlService::Identify(grpc::ServerContext* ctx,
                                      Credentials* who) {
  if (admission_->CredentialsOf(ctx->peer(), who)) return grpc::Status::OK;
  return grpc::Status(
      grpc::StatusCode::UNAUTHENTICATED,
      "psmd cannot tell who is calling (peer " + ctx->peer() + ")");
}

grpc::Status ControlService::Health(grpc::ServerContext* ctx,
                                    const v1::HealthRequest*,
                                    v1::HealthReply* reply) {
  // Anyone may ask whether psmd is alive (the MTL component does before it
  // opens); how busy the node is only root learns, others count their own.
  Credentials who;
  const bool known = Identify(ctx, &who).ok();
  const bool root = known && who.uid == 0;
  reply->set_version(version::Version());
  reply->set_commit(version::Commit());
  reply->set_worker_last_turn_age_ns(worker_->LastTurnAgeNs());
  reply->set_uptime_ns(UptimeNs());
  reply->set_endpoint_count(
      static_cast<uint32_t>(root    ? registry_->endpoint_count()
                            : known ? registry_->Snapshot(who).size()
                                    : 0));
  reply->set_max_endpoints(registry_->max_endpoints());
  reply->set_daemon_pid(static_cast<uint32_t>(getpid()));
  reply->set_generation(upgrades_->generation.load());
  reply->set_last_blackout_ns(upgrades_->last_blackout_ns.load());
  reply->set_last_carried_endpoints(upgrades_->last_carried.load());
  reply->set_crash_restarts(upgrades_->crash_restarts.load());
  reply->set_last_crash_lost_endpoints(upgrades_->last_crash_lost.load());
  reply->set_upgrades_failed(upgrades_->failed.load());
  reply->set_last_upgrade_failure(upgrades_->LastFailure());
  return grpc::Status::OK;
}

grpc::Status ControlService::GetConfig(grpc::ServerContext*,
                                       const v1::GetConfigRequest*,
                                       v1::GetConfigReply* reply) {
  reply->set_toml(ConfigToToml(config_->Get()));
  reply->set_config_path(config_path_);
  return grpc::Status::OK;
}

grpc::Status ControlService::OpenEndpoint(grpc::ServerContext* ctx,
                                          const v1::OpenEndpointRequest* req,
                                          v1::OpenEndpointReply* reply) {
  Credentials who;
  if (auto s = Identify(ctx, &who); !s.ok()) return s;
  if (req->job_uuid().size() != 16) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                        "job_uuid must be 16 bytes");
  }
  Uuid uuid;
  std::copy(req->job_uuid().begin(), req->job_uuid().end(), uuid.begin());
  OpenedEndpoint opened;
  Status e = registry_->Open(who, uuid, req->label(), &opened);
  if (!e.ok()) return ToStatus(e);
  reply->set_endpoint_id(opened.id);
  reply->set_epid(opened.epid);
  reply->set_attach_token(opened.token.data(), opened.token.size());
  reply->set_segment_bytes(opened.segment_bytes);
  reply->set_pool_bytes(opened.pool_bytes);
  reply->set_daemon_version(VersionText());
  reply->set_fabric_timeout_ms(config_->Get().fabric_timeout_ms);
  return grpc::Status::OK;
}

grpc::Status ControlService::CloseEndpoint(grpc::ServerContext* ctx,
                                           const v1::CloseEndpointRequest* req,
                                           v1::CloseEndpointReply*) {
  Credentials who;
  if (auto s = Identify(ctx, &who); !s.ok()) return s;
  return ToStatus(registry_->Close(who, {req->endpoint_id(), req->epid()}));
}

grpc::Status ControlService::Connect(grpc::ServerContext* ctx,
                                     const v1::ConnectRequest* req,
                                     v1::ConnectReply* reply) {
  Credentials who;
  if (auto s = Identify(ctx, &who); !s.ok()) return s;
  std::vector<uint64_t> epids(req->epids().begin(), req->epids().end());
  if (req->epids_size() > shm::kMaxEpidsPerConnect) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                        "Connect names " + std::to_string(req->epids_size()) +
                            " epids; at most " +
                            std::to_string(shm::kMaxEpidsPerConnect) +
                            " per call (libpsmclient splits larger calls)");
  }
  std::vector<ConnectOutcome> outcomes;
  Status e = registry_->Connect(who, {req->endpoint_id(), req->epid()}, epids,
                                &outcomes);
  if (!e.ok()) return ToStatus(e);
  for (const ConnectOutcome& o : outcomes) {
    v1::ConnectResult* r = reply->add_results();
    r->set_error(o.error);
    r->set_slot(o.slot);
    r->set_message(o.message);
    r->set_host(o.host);
  }
  return grpc::Status::OK;
}

grpc::Status ControlService::Disconnect(grpc::ServerContext* ctx,
                                        const v1::DisconnectRequest* req,
                                        v1::DisconnectReply* reply) {
  Credentials who;
  if (auto s = Identify(ctx, &who); !s.ok()) return s;
  std::vector<uint32_t> slots(req->slots().begin(), req->slots().end());
  std::vector<int> errors;
  Status e = registry_->Disconnect(who, {req->endpoint_id(), req->epid()},
                                   slots, &errors);
  if (!e.ok()) return ToStatus(e);
  for (int err : errors) reply->add_errors(err);
  return grpc::Status::OK;
}

grpc::Status ControlService::GetStats(grpc::ServerContext* ctx,
                                      const v1::GetStatsRequest*,
                                      v1::GetStatsReply* reply) {
  Credentials who;
  if (auto s = Identify(ctx, &who); !s.ok()) return s;
  const StatsSnapshot stats = registry_->Stats(who);
  reply->set_uptime_ns(UptimeNs());
  reply->set_start_time_unix_ns(started_unix_ns_);
  reply->set_generation(upgrades_->generation.load());
  reply->set_last_blackout_ns(upgrades_->last_blackout_ns.load());
  reply->set_last_carried_endpoints(upgrades_->last_carried.load());
  reply->set_crash_restarts(upgrades_->crash_restarts.load());
  reply->set_last_crash_lost_endpoints(upgrades_->last_crash_lost.load());
  reply->set_upgrades_failed(upgrades_->failed.load());
  reply->set_version(version::Version());
  reply->set_commit(version::Commit());
  reply->set_endpoint_count(static_cast<uint32_t>(stats.endpoints.size()));
  for (const EndpointSnapshot& s : stats.endpoints) {
    FillStats(s, reply->add_endpoints());
  }
  for (const JobTotals& j : stats.jobs) {
    v1::JobStats* job = reply->add_jobs();
    job->set_job_uuid(UuidToString(j.key.uuid));
    job->set_uid(j.key.uid);
    job->set_open_endpoints(j.open_endpoints);
    job->set_finished_age_ns(static_cast<uint64_t>(j.finished_age.count()));
    if (j.slurm) FillSlurm(j.slurm, job->mutable_slurm());
    FillCounters(j.counters, job->mutable_counters());
  }
  FillCounters(stats.total, reply->mutable_total()->mutable_counters());
  const refusals::Values refused = registry_->refusals().For(who.uid);
  for (size_t i = 0; i < refusals::kNumCounters; i++)
    (*reply->mutable_refusals())[refusals::kAll[i].name] = refused[i];
  reply->set_fabric_host(worker_->fabric_host());
  reply->set_fabric_backend(worker_->fabric_backend());
  reply->set_fabric_provider(worker_->fabric_provider());
  reply->set_fabric_sessions(worker_->fabric_sessions());
  if (who.uid != 0) return grpc::Status::OK;
  // Node-wide figures, root's only: others' activity shows in them.
  reply->set_doorbells(worker_->doorbells());
  reply->set_sleeps(worker_->sleeps());
  for (uint32_t shard = 0; shard < worker_->count(); shard++) {
    const ProgressWorker& pw = worker_->at(shard);
    const ProgressWorker::Placement where = pw.placement();
    const ProgressWorker::Load load = pw.load();
    v1::WorkerPlacement* w = reply->add_workers();
    w->set_shard(shard);
    w->set_cpu(where.cpu);
    w->set_core_checks(where.core_checks);
    w->set_core_shared(where.core_shared);
    w->set_yields(where.yields);
    w->set_shared_slices(where.slices.slices);
    w->set_shared_slice_ns(where.slices.ns);
    w->set_shared_slices_over_8us(where.slices.over_8us);
    w->set_shared_slices_over_64us(where.slices.over_64us);
    w->set_cpu_ns(load.cpu_ns);
    w->set_endpoints(load.endpoints);
    w->set_submissions(load.submissions);
    w->set_cross_in(load.cross_in);
    w->set_cross_out(load.cross_out);
    w->set_busy_ns(load.busy_ns);
    w->set_wall_ns(load.wall_ns);
    w->set_sleeps(pw.sleeps());
    w->set_doorbells(pw.doorbells());
  }
  *reply->mutable_worker() = reply->workers(0);
  for (const Remote::PeerRow& r : worker_->FabricStats()) {
    v1::PeerNodeStats* row = reply->add_peer_nodes();
    row->set_node(static_cast<uint32_t>(r.fabric.node));
    // A field per counter of the list (proto/counters.h), same name.
#define PSMD_SET_FABRIC(name, column, unit, help) \
  row->set_##name(r.fabric.name);
#define PSMD_SET_REMOTE(name, column, unit, help) \
  row->set_##name(r.counts.name);
    PSMD_FABRIC_PEER_COUNTERS(PSMD_SET_FABRIC)
    PSMD_REMOTE_EVENT_COUNTERS(PSMD_SET_REMOTE)
    PSMD_REMOTE_RMA_COUNTERS(PSMD_SET_REMOTE)
#undef PSMD_SET_FABRIC
#undef PSMD_SET_REMOTE
  }
  return grpc::Status::OK;
}

grpc::Status ControlService::ListEndpoints(grpc::ServerContext* ctx,
                                           const v1::ListEndpointsRequest*,
                                           v1::ListEndpointsReply* reply) {
  Credentials who;
  if (auto s = Identify(ctx, &who); !s.ok()) return s;
  for (const EndpointSnapshot& s : registry_->Snapshot(who)) {
    v1::EndpointInfo* info = reply->add_endpoints();
    FillInfo(s, info);
    info->set_shard(MqEngine::ShardOf(s.id, worker_->count()));
  }
  return grpc::Status::OK;
}

grpc::Status ControlService::ListJobs(grpc::ServerContext* ctx,
                                      const v1::ListJobsRequest*,
                                      v1::ListJobsReply* reply) {
  Credentials who;
  if (auto s = Identify(ctx, &who); !s.ok()) return s;
  const Config& c = registry_->config();
  for (const JobSnapshot& j : registry_->Jobs(who)) {
    v1::JobInfo* info = reply->add_jobs();
    info->set_job_uuid(UuidToString(j.uuid));
    info->set_uid(j.uid);
    for (uint32_t id : j.endpoint_ids) info->add_endpoint_ids(id);
    info->set_pool_bytes(j.pool_bytes);
    info->set_region_bytes(c.region_bytes);
    info->set_max_endpoints(j.max_endpoints);
    info->set_unexpected_budget_bytes(j.unexpected_budget_bytes);
    info->set_max_unexpected_budget_bytes(c.max_unexpected_budget_bytes);
    info->set_job_unexpected_budget_bytes(j.job_unexpected_budget_bytes);
    info->set_uid_unexpected_budget_bytes(c.uid_unexpected_budget_bytes);
    if (j.slurm) FillSlurm(j.slurm, info->mutable_slurm());
  }
  return grpc::Status::OK;
}

grpc::Status ControlService::RegisterSlurmStep(
    grpc::ServerContext* ctx, const v1::RegisterSlurmStepRequest* req,
    v1::RegisterSlurmStepReply*) {
  Credentials who;
  if (auto s = Identify(ctx, &who); !s.ok()) return s;
  if (auto s = RootOnly(who, "RegisterSlurmStep"); !s.ok()) return s;
  if (req->job_uuid().size() != 16) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                        "job_uuid must be 16 bytes");
  }
  Uuid uuid;
  std::copy(req->job_uuid().begin(), req->job_uuid().end(), uuid.begin());
  SlurmStep step;
  step.job_id = req->step().job_id();
  step.step_id = req->step().step_id();
  step.uid = req->step().uid();
  step.cgroup = req->step().cgroup();
  step.tasks = req->step().tasks();
  step.memory_mib = req->step().memory_mib();
  return ToStatus(registry_->RegisterSlurmStep(who, uuid, step));
}

grpc::Status ControlService::EndSlurmStep(grpc::ServerContext* ctx,
                                          const v1::EndSlurmStepRequest* req,
                                          v1::EndSlurmStepReply* reply) {
  Credentials who;
  if (auto s = Identify(ctx, &who); !s.ok()) return s;
  if (auto s = RootOnly(who, "EndSlurmStep"); !s.ok()) return s;
  bool registered = false;
  std::vector<EndpointSnapshot> closed;
  Status e = registry_->EndSlurmStep(who, req->job_id(), req->step_id(),
                                     &registered, &closed);
  if (!e.ok()) return ToStatus(e);
  reply->set_registered(registered);
  for (const EndpointSnapshot& s : closed) FillInfo(s, reply->add_closed());
  return grpc::Status::OK;
}

grpc::Status ControlService::Upgrade(grpc::ServerContext* ctx,
                                     const v1::UpgradeRequest* req,
                                     v1::UpgradeReply* reply) {
  Credentials who;
  if (auto s = Identify(ctx, &who); !s.ok()) return s;
  if (auto s = RootOnly(who, "Upgrade"); !s.ok()) return s;
  if (worker_->has_fabric()) {
    const Config config = config_->Get();
    if (!HandoverCarriesFabric(config)) {
      return ToStatus(
          {PSM2_PARAM_ERR,
           "upgrade: this psmd's connections to other nodes cannot be "
           "handed over: that needs fabric_sessions = \"on\", and over "
           "fabric = \"ofi\" fabric_rma = \"off\" (it has fabric = \"" +
               config.fabric + "\", fabric_sessions = \"" +
               config.fabric_sessions + "\", fabric_rma = \"" +
               config.fabric_rma +
               "\"); drain the node's jobs and restart psmd instead"});
    }
  }
  const uint64_t generation = upgrades_->generation.load();
  std::string path;
  if (Status e = upgrades_->Request(req->exec_path(), &path); !e.ok()) {
    spdlog::warn("upgrade asked by pid {}: {}", who.pid, e.message);
    return ToStatus(e);
  }
  spdlog::info("upgrade asked by pid {}: handing over to {}", who.pid,
               Escaped(path));
  reply->set_generation(generation);
  reply->set_exec_path(path);
  reply->set_endpoint_count(static_cast<uint32_t>(registry_->endpoint_count()));
  return grpc::Status::OK;
}

}  // namespace psmd
