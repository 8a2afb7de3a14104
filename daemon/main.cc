// psmd: the per-node PSM2 progress daemon. See docs/design.md.
#include <grpcpp/grpcpp.h>
#include <signal.h>

#include <cstdio>
#include <memory>

#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include "daemon/admission.h"
#include "daemon/config.h"
#include "daemon/control_service.h"
#include "daemon/progress.h"
#include "daemon/registry.h"
#include "version/version.h"

int main(int argc, char** argv) {
  psmd::Config config;
  bool help = false;
  std::string error;
  if (!psmd::ParseFlags(argc, argv, &config, &help, &error)) {
    fprintf(stderr, "psmd: %s\n%s", error.c_str(), psmd::FlagsUsage().c_str());
    return 2;
  }
  if (help) {
    printf("%s", psmd::FlagsUsage().c_str());
    return 0;
  }
  auto logger = spdlog::stderr_color_mt("psmd");
  spdlog::set_default_logger(logger);
  spdlog::set_level(spdlog::level::from_str(config.log_level));
  spdlog::set_pattern("%Y-%m-%dT%H:%M:%S.%e %^%l%$ %v");

  // Signals are taken synchronously by the main thread; every other thread
  // inherits the blocked mask.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGTERM);
  sigaddset(&stop_signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);
  signal(SIGPIPE, SIG_IGN);

  psmd::ProgressWorker worker(config);
  psmd::Registry registry(config, &worker);
  psmd::Admission admission(config, &registry);
  if (!admission.Bind(&error)) {
    spdlog::critical("{}", error);
    return 1;
  }
  if (!worker.Start(&error)) {
    spdlog::critical("{}", error);
    return 1;
  }
  psmd::ControlService service(&registry, &admission, &worker);
  grpc::ServerBuilder builder;
  builder.RegisterService(&service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (!server) {
    spdlog::critical("cannot start the gRPC control server");
    return 1;
  }
  admission.Start(server.get());
  spdlog::info("psmd {} serving {} (pid {}, spin {} us)",
               psmd::version::Version(), config.socket_path, getpid(),
               config.spin_us);

  int sig = 0;
  sigwait(&stop_signals, &sig);
  spdlog::info("signal {}: shutting down", sig);
  admission.Stop();  // no new connections; socket file removed
  server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
  registry.RemoveAll();  // every segment unmapped and closed
  worker.Stop();
  spdlog::info("psmd stopped");
  return 0;
}
