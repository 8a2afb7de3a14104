#include "client/control_client.h"

#include <grpcpp/grpcpp.h>
#include <psm2.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <thread>

namespace psmd::client {

namespace {

// How long any exchange with psmd (a control call, the attach) may take. A
// missing daemon is reported at once, never waited for: no socket file, or a
// connection refused (gRPC calls do not wait for a channel that failed). The
// deadline bounds only a daemon that is there but does not answer, so it
// leaves room for one that is merely slow: psmd's control and admission
// threads share the node's cores with spinning ranks, and under such load an
// endpoint open took longer than the 900 ms this once was. psmd keeps an
// opened endpoint this long for its attach (daemon/control/registry.cc).
constexpr std::chrono::milliseconds kDeadline = std::chrono::seconds(5);

// PSMD_CONNECT_TIMEOUT_MS raises the deadline, for a daemon slower still (a
// sanitizer build). It never shortens it.
std::chrono::milliseconds Deadline() {
  const char* env = getenv("PSMD_CONNECT_TIMEOUT_MS");
  if (env == nullptr || env[0] == '\0') return kDeadline;
  char* end = nullptr;
  long long ms = strtoll(env, &end, 10);
  if (*end != '\0' || ms <= 0) return kDeadline;
  return std::max(kDeadline, std::chrono::milliseconds(ms));
}

}  // namespace

std::string SocketPath() {
  const char* env = getenv("PSMD_SOCKET");
  return env != nullptr && env[0] != '\0' ? env : kDefaultSocket;
}

ControlClient::ControlClient(std::string socket_path)
    : socket_path_(std::move(socket_path)) {}

std::unique_ptr<v1::Control::Stub> ControlClient::NewStub() const {
  grpc::ChannelArguments args;
  // One connection attempt, no long back-off: a dead daemon is an error now.
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 500);
  auto channel = grpc::CreateCustomChannel(
      "unix:" + socket_path_, grpc::InsecureChannelCredentials(), args);
  return v1::Control::NewStub(channel);
}

void ControlClient::Prepare(grpc::ClientContext* ctx,
                            std::chrono::milliseconds extra) const {
  ctx->set_deadline(std::chrono::system_clock::now() + Deadline() + extra);
  ctx->set_wait_for_ready(false);
}

bool ControlClient::SomethingListens() const {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (socket_path_.size() >= sizeof(addr.sun_path)) return false;
  std::memcpy(addr.sun_path, socket_path_.c_str(), socket_path_.size() + 1);
  int sock = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (sock < 0) return false;
  const int rc =
      connect(sock, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  const bool listens = rc == 0 || errno == EAGAIN || errno == EINPROGRESS;
  close(sock);
  return listens;
}

template <typename Rpc>
Status ControlClient::Call(const char* what, Rpc rpc,
                           std::chrono::milliseconds extra) const {
  const auto until = std::chrono::steady_clock::now() + Deadline() + extra;
  for (;;) {
    grpc::ClientContext ctx;
    Prepare(&ctx, extra);
    const grpc::Status s = rpc(*NewStub(), &ctx);
    const bool handing_over =
        s.error_code() == grpc::StatusCode::CANCELLED ||
        (s.error_code() == grpc::StatusCode::UNAVAILABLE && SomethingListens());
    if (!handing_over || std::chrono::steady_clock::now() >= until) {
      return FromStatus(s, what, extra);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

Status ControlClient::FromStatus(const grpc::Status& status, const char* what,
                                 std::chrono::milliseconds extra) const {
  if (status.ok()) return {};
  Status e;
  if (status.error_code() == grpc::StatusCode::FAILED_PRECONDITION) {
    // The daemon puts the psm2_error_t in the details (control_service.cc).
    e.code = static_cast<psm2_error_t>(atoi(status.error_details().c_str()));
    if (e.code == PSM2_OK) e.code = PSM2_INTERNAL_ERR;
    e.message = std::string(what) + ": " + status.error_message();
    return e;
  }
  if (status.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED) {
    e.code = PSM2_EP_NO_DEVICE;
    e.message = std::string(what) + ": psmd at " + socket_path_ +
                " did not answer within " +
                std::to_string((Deadline() + extra).count()) +
                " ms; is it stopped or hung (psmctl health)? If the node is "
                "just that busy, PSMD_CONNECT_TIMEOUT_MS raises the wait";
    return e;
  }
  if (status.error_code() == grpc::StatusCode::UNAVAILABLE) {
    e.code = PSM2_EP_NO_DEVICE;
    e.message =
        std::string(what) + ": cannot reach psmd at " + socket_path_ + " (" +
        status.error_message() +
        "); is psmd running? Start it, or set PSMD_SOCKET to its socket path";
    return e;
  }
  e.code = PSM2_INTERNAL_ERR;
  e.message = std::string(what) + ": " + status.error_message();
  return e;
}

Status ControlClient::OpenEndpoint(const std::array<uint8_t, 16>& uuid,
                                   const std::string& label,
                                   v1::OpenEndpointReply* reply) {
  // Check the socket first: a clear message and no gRPC connect back-off.
  if (access(socket_path_.c_str(), F_OK) != 0) {
    return {PSM2_EP_NO_DEVICE,
            "psm2_ep_open: no psmd socket at " + socket_path_ + " (" +
                strerror(errno) +
                "); is psmd running? Start it, or set PSMD_SOCKET to its "
                "socket path"};
  }
  v1::OpenEndpointRequest req;
  req.set_job_uuid(uuid.data(), uuid.size());
  req.set_label(label);
  req.set_unit(-1);
  return Call("psm2_ep_open", [&](auto& stub, grpc::ClientContext* ctx) {
    return stub.OpenEndpoint(ctx, req, reply);
  });
}

Status ControlClient::Attach(const std::string& token, AttachedFds* fds) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (socket_path_.size() >= sizeof(addr.sun_path)) {
    return {PSM2_PARAM_ERR,
            "PSMD_SOCKET path longer than 107 bytes: " + socket_path_};
  }
  std::memcpy(addr.sun_path, socket_path_.c_str(), socket_path_.size() + 1);
  int sock = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (sock < 0 ||
      connect(sock, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    std::string why = strerror(errno);
    if (sock >= 0) close(sock);
    return {PSM2_EP_NO_DEVICE,
            "psm2_ep_open: cannot connect to " + socket_path_ + ": " + why};
  }
  // Bound the wait for the daemon's answer.
  const auto attach_ms = Deadline().count();
  timeval tv{static_cast<time_t>(attach_ms / 1000),
             static_cast<suseconds_t>(attach_ms % 1000 * 1000)};
  setsockopt(sock, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  shm::AttachRequest req;
  std::memcpy(req.magic, shm::kAttachMagic, sizeof(req.magic));
  if (token.size() != sizeof(req.token)) {
    close(sock);
    return {PSM2_INTERNAL_ERR,
            "psm2_ep_open: daemon sent a malformed attach token"};
  }
  std::memcpy(req.token, token.data(), sizeof(req.token));
  if (send(sock, &req, sizeof(req), MSG_NOSIGNAL) !=
      static_cast<ssize_t>(sizeof(req))) {
    close(sock);
    return {PSM2_EP_NO_DEVICE, "psm2_ep_open: attach request to psmd failed"};
  }
  shm::AttachReply reply{};
  int received[shm::kAttachFdCount];
  int n = 0;
  errno = 0;  // RecvWithFds leaves it so at an end of file
  if (!shm::RecvWithFds(sock, &reply, sizeof(reply), received,
                        shm::kAttachFdCount, &n)) {
    const bool timed_out = errno == EAGAIN || errno == EWOULDBLOCK;
    close(sock);
    for (int i = 0; i < n; i++) close(received[i]);
    return {
        PSM2_EP_NO_DEVICE,
        timed_out
            ? "psm2_ep_open: psmd did not answer the attach request within " +
                  std::to_string(attach_ms) +
                  " ms (PSMD_CONNECT_TIMEOUT_MS): it may be overloaded or "
                  "handing over to a new process; see its log, and open "
                  "the endpoint again"
            : std::string(
                  "psm2_ep_open: psmd closed the attach connection without "
                  "answering (it stopped, or ended the endpoint: a "
                  "restart or a handover it refused); see its log, and "
                  "open the endpoint again")};
  }
  if (reply.status != 0 || n != shm::kAttachFdCount) {
    for (int i = 0; i < n; i++) close(received[i]);
    close(sock);
    return {reply.status != PSM2_OK ? static_cast<psm2_error_t>(reply.status)
                                    : PSM2_INTERNAL_ERR,
            "psm2_ep_open: psmd refused the attach request"};
  }
  tv = {0, 0};
  setsockopt(sock, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  fds->segment = received[0];
  fds->pool = received[1];
  fds->doorbell = received[2];
  fds->liveness = sock;
  return {};
}

Status ControlClient::CloseEndpoint(uint32_t endpoint_id, uint64_t epid) {
  v1::CloseEndpointRequest req;
  req.set_endpoint_id(endpoint_id);
  req.set_epid(epid);
  v1::CloseEndpointReply reply;
  return Call("psm2_ep_close", [&](auto& stub, grpc::ClientContext* ctx) {
    return stub.CloseEndpoint(ctx, req, &reply);
  });
}

Status ControlClient::Connect(uint32_t endpoint_id, uint64_t epid,
                              const std::vector<uint64_t>& epids,
                              std::chrono::milliseconds remote_wait,
                              v1::ConnectReply* reply) {
  reply->Clear();
  for (size_t at = 0; at < epids.size(); at += shm::kMaxEpidsPerConnect) {
    const size_t end =
        std::min(epids.size(), at + size_t{shm::kMaxEpidsPerConnect});
    v1::ConnectRequest req;
    req.set_endpoint_id(endpoint_id);
    req.set_epid(epid);
    for (size_t i = at; i < end; i++) req.add_epids(epids[i]);
    v1::ConnectReply part;
    Status s = Call(
        "psm2_ep_connect",
        [&](auto& stub, grpc::ClientContext* ctx) {
          return stub.Connect(ctx, req, &part);
        },
        remote_wait);
    if (!s.ok()) return s;
    for (v1::ConnectResult& r : *part.mutable_results())
      *reply->add_results() = std::move(r);
  }
  return {};
}

Status ControlClient::Disconnect(uint32_t endpoint_id, uint64_t epid,
                                 const std::vector<uint32_t>& slots,
                                 v1::DisconnectReply* reply) {
  v1::DisconnectRequest req;
  req.set_endpoint_id(endpoint_id);
  req.set_epid(epid);
  for (uint32_t s : slots) req.add_slots(s);
  return Call("psm2_ep_disconnect", [&](auto& stub, grpc::ClientContext* ctx) {
    return stub.Disconnect(ctx, req, reply);
  });
}

Status ControlClient::GetStats(v1::GetStatsReply* reply) {
  return Call("stats", [&](auto& stub, grpc::ClientContext* ctx) {
    return stub.GetStats(ctx, v1::GetStatsRequest(), reply);
  });
}

Status ControlClient::ListEndpoints(v1::ListEndpointsReply* reply) {
  return Call("endpoints", [&](auto& stub, grpc::ClientContext* ctx) {
    return stub.ListEndpoints(ctx, v1::ListEndpointsRequest(), reply);
  });
}

Status ControlClient::ListJobs(v1::ListJobsReply* reply) {
  return Call("jobs", [&](auto& stub, grpc::ClientContext* ctx) {
    return stub.ListJobs(ctx, v1::ListJobsRequest(), reply);
  });
}

Status ControlClient::RegisterSlurmStep(
    const v1::RegisterSlurmStepRequest& request) {
  v1::RegisterSlurmStepReply reply;
  return Call("register the Slurm step",
              [&](auto& stub, grpc::ClientContext* ctx) {
                return stub.RegisterSlurmStep(ctx, request, &reply);
              });
}

Status ControlClient::EndSlurmStep(uint32_t job_id, uint32_t step_id,
                                   v1::EndSlurmStepReply* reply) {
  v1::EndSlurmStepRequest request;
  request.set_job_id(job_id);
  request.set_step_id(step_id);
  return Call("end the Slurm step", [&](auto& stub, grpc::ClientContext* ctx) {
    return stub.EndSlurmStep(ctx, request, reply);
  });
}

Status ControlClient::Health(v1::HealthReply* reply) {
  return Call("health", [&](auto& stub, grpc::ClientContext* ctx) {
    return stub.Health(ctx, v1::HealthRequest(), reply);
  });
}

Status ControlClient::Upgrade(const std::string& exec_path,
                              v1::UpgradeReply* reply) {
  grpc::ClientContext ctx;
  // The new binary is asked its format first (up to 5 s) before the answer.
  ctx.set_deadline(std::chrono::system_clock::now() + Deadline() +
                   std::chrono::seconds(5));
  v1::UpgradeRequest req;
  req.set_exec_path(exec_path);
  return FromStatus(NewStub()->Upgrade(&ctx, req, reply), "upgrade");
}

Status ControlClient::GetConfig(v1::GetConfigReply* reply) {
  return Call("config", [&](auto& stub, grpc::ClientContext* ctx) {
    return stub.GetConfig(ctx, v1::GetConfigRequest(), reply);
  });
}

}  // namespace psmd::client
