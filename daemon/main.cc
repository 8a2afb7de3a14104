// psmd: the per-node PSM2 progress daemon. See docs/design.md and, for running
// it as a service, docs/operations.md.
#include <grpcpp/grpcpp.h>
#include <signal.h>
#include <systemd/sd-daemon.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <map>
#include <memory>
#include <set>

#include <spdlog/spdlog.h>

#include "daemon/clock.h"
#include "daemon/config.h"
#include "daemon/control/admission.h"
#include "daemon/control/control_service.h"
#include "daemon/control/registry.h"
#include "daemon/handover/handover.h"
#include "daemon/handover/upgrades.h"
#include "daemon/log.h"
#include "daemon/remote/node_table.h"
#include "daemon/succession.h"
#include "daemon/workers.h"
#include "hw/ofi/ofi_fabric.h"
#include "hw/socket/socket_fabric.h"
#include "version/version.h"

namespace {

// How often the main thread refreshes the STATUS= line systemd shows.
constexpr int kStatusPeriodS = 10;

// SIGHUP: reads the file again (the flags still win) and applies what can
// change without disturbing open endpoints; the rest waits for a restart.
void Reload(const psmd::ConfigLoader& loader, psmd::SharedConfig* shared,
            psmd::Registry* registry, psmd::Workers* worker) {
  psmd::Config running = shared->Get();
  psmd::Config fresh;
  std::vector<std::string> errors;
  if (!loader.Load(&fresh, &errors)) {
    for (const auto& e : errors) spdlog::error("reload: {}", e);
    spdlog::error("reload refused: the configuration in force is unchanged");
    return;
  }
  if (fresh.unexpected_budget_bytes > running.max_unexpected_budget_bytes) {
    spdlog::error(
        "reload refused: unexpected_mib {} exceeds max_unexpected_mib {} in "
        "force (which changes only at restart)",
        fresh.unexpected_budget_bytes >> 20,
        running.max_unexpected_budget_bytes >> 20);
    return;
  }
  static const std::set<std::string> kReloadable = {"log_level", "spin_us",
                                                    "unexpected_mib"};
  psmd::Config next = running;
  next.log_level = fresh.log_level;
  next.spin_us = fresh.spin_us;
  next.unexpected_budget_bytes = fresh.unexpected_budget_bytes;
  // The new level first, so that the lines below follow it.
  spdlog::set_level(spdlog::level::from_str(next.log_level));
  for (const auto& change : psmd::ConfigChanges(running, fresh)) {
    std::string key = change.substr(0, change.find(':'));
    if (kReloadable.count(key) != 0) {
      spdlog::info("reload: {}", psmd::Escaped(change));
    } else {
      spdlog::warn("reload: {} takes effect only when psmd restarts",
                   psmd::Escaped(change));
    }
  }
  worker->SetSpinUs(next.spin_us);
  registry->SetDefaultUnexpectedBudget(next.unexpected_budget_bytes);
  shared->Set(next);
  spdlog::info("reload done");
}

// fabric_nodes_command: the node table it prints (Slurm's node list) into
// fabric_nodes, which the inter-node engine reads again when it changed. A
// failure keeps the table psmd had. `self` is this daemon's host
// description: a table whose row for this node names none of its addresses
// is said loudly, for peers would not reach this node (or would reach
// another): node_id and the command's ids disagree.
void RefreshNodeTable(const psmd::Config& config, const std::string& self) {
  if (config.fabric_nodes_command.empty()) return;
  std::map<uint16_t, psmd::NodeEntry> table;
  bool changed = false;
  std::string error;
  if (!psmd::RunNodeTableCommand(config.fabric_nodes_command,
                                 config.fabric_nodes, &table, &changed,
                                 &error)) {
    spdlog::error(
        "fabric_nodes_command {}: {}; the node table {} stays as it was",
        psmd::Escaped(config.fabric_nodes_command), psmd::Escaped(error),
        psmd::Escaped(config.fabric_nodes));
    return;
  }
  if (!changed) return;
  spdlog::info("fabric_nodes_command: {} nodes, written to {}", table.size(),
               psmd::Escaped(config.fabric_nodes));
  psmd::hw::HostDescription mine, row;
  std::string why;
  auto it = table.find(config.node_id);
  bool found = false;
  if (it != table.end() && psmd::hw::ParseHostDescription(self, &mine, &why) &&
      psmd::hw::ParseHostDescription(it->second.description, &row, &why)) {
    for (const auto& a : row.addresses) {
      for (const auto& b : mine.addresses) {
        found |= a.host == b.host && a.port == b.port;
      }
    }
  }
  if (!found) {
    spdlog::error(
        "fabric_nodes_command: its table has {} for this node (node_id {}), "
        "which is not this daemon ({}): other nodes cannot reach it; set "
        "node_id to this node's id in the table",
        it == table.end() ? "no row" : psmd::Escaped(it->second.description),
        config.node_id, self);
  }
}

// The binary psmd runs from, read at start: the default of psmctl upgrade
// (after a package upgrade the path holds the new binary).
std::string StartedFrom() {
  char buf[4096];
  ssize_t n = readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  return n > 0 ? std::string(buf, static_cast<size_t>(n)) : std::string();
}

}  // namespace

int main(int argc, char** argv) {
  // First, before anything opens a descriptor: what a predecessor handed
  // over (daemon/succession.h), if this psmd succeeds one.
  std::vector<int> inherited = psmd::handover::InheritedFds();
  int state_fd = psmd::handover::TakeStateFd();
  // systemd's sockets and file-descriptor store (the environment cleared).
  psmd::handover::ServiceManagerFds from_systemd =
      psmd::handover::TakeServiceManagerFds();
  const std::vector<int>* handed = nullptr;
  if (state_fd == -1 && from_systemd.state_fd >= 0) {
    // A predecessor stopped by systemctl restart stored its state there.
    state_fd = from_systemd.state_fd;
    handed = &from_systemd.handed;
    inherited.clear();
    for (int fd : from_systemd.handed) {
      if (fd >= 0) inherited.push_back(fd);
    }
  }
  const std::vector<std::string> args(argv, argv + argc);
  psmd::handover::Upgrades upgrades(StartedFrom());
  psmd::ConfigLoader loader;
  if (int code = loader.ParseCommandLine(argc, argv); code >= 0) return code;
  psmd::Config config;
  std::vector<std::string> errors;
  if (!loader.Load(&config, &errors)) {
    for (const auto& e : errors) fprintf(stderr, "psmd: %s\n", e.c_str());
    return 2;
  }
  if (loader.check_config()) {
    printf("%s", psmd::ConfigToToml(config).c_str());
    return 0;
  }
  if (loader.fabric_info()) {
    std::string table;
    const int usable =
        psmd::hw::DescribeOfiProviders(config.fabric_provider, &table);
    printf("%s", table.c_str());
    return usable > 0 ? 0 : 1;
  }
  std::string log_target = psmd::SetUpLogging(config);

  // Signals are taken synchronously by the main thread; every other thread
  // inherits the blocked mask.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGHUP);
  sigaddset(&signals, SIGUSR2);  // psmctl upgrade (handover::Upgrades)
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  signal(SIGPIPE, SIG_IGN);

  psmd::SharedConfig shared(config);
  std::optional<psmd::Inheritance> inheritance;
  if (from_systemd.states > 1) {
    // Each is a predecessor's; the table's entries cannot be matched to one.
    const std::string why =
        "systemd's file-descriptor store held " +
        std::to_string(from_systemd.states) +
        " psmd states (left by a psmd that did not empty it), so none is "
        "adopted; its endpoints have ended: open new ones";
    spdlog::error("handover refused: {}", why);
    psmd::handover::EndStored(from_systemd, why);
  }
  // The successor of a systemctl restart took the state out of the store
  // and ended (killed, crashed) before it took the endpoints over.
  const bool successor_ended =
      state_fd == -1 && psmd::handover::OrphanedTable(from_systemd);
  if (successor_ended) {
    const std::string why =
        "systemd's file-descriptor store held psmd's endpoints without their "
        "state: the psmd started to take them over ended before it had "
        "(killed or crashed), so they have ended: open new ones";
    spdlog::error("{}", why);
    psmd::handover::EndStored(from_systemd, why);
  }
  // The endpoints are served (or ended): systemd's copies of their
  // descriptors would outlive this psmd (handover.h, ServiceManagerFds).
  auto forget_store = [&from_systemd] {
    if (int refused = psmd::handover::ForgetStoredFds(from_systemd)) {
      spdlog::warn(
          "systemd did not confirm removing {} of {} entries from psmd's "
          "file-descriptor store: a crash of this psmd would not end those "
          "endpoints until psmd is stopped",
          refused, from_systemd.table_names.size());
    }
  };
  if (state_fd == -2) {
    spdlog::error("{} is not a descriptor of this process; ignored",
                  psmd::handover::kEnvFd);
  } else if (state_fd >= 0) {
    std::string why;
    inheritance =
        psmd::ReadInheritance(state_fd, config, inherited, handed, &why);
    if (!inheritance) {
      spdlog::error(
          "handover refused: {}; every inherited endpoint ended, psmd "
          "starts empty",
          why);
    }
  }
  uint32_t workers = psmd::WorkerCount(config);
  if (inheritance && inheritance->process.workers != workers) {
    // Endpoint ids name their shards (MqEngine::ShardOf).
    spdlog::warn(
        "workers = {} in the configuration; the endpoints handed over live "
        "on {} shards, which this psmd keeps until it restarts",
        workers, inheritance->process.workers);
    workers = inheritance->process.workers;
  }
  psmd::Workers worker(config, workers);
  std::vector<int> cpus;
  if (!config.worker_cpus.empty()) {
    psmd::ParseCpuList(config.worker_cpus, &cpus);
    worker.SetCpus(cpus);
  }
  uint64_t watchdog_us = 0;
  if (sd_watchdog_enabled(0, &watchdog_us) > 0) {
    worker.EnableWatchdog(watchdog_us);
  }
  psmd::Registry registry(config, &worker);
  psmd::Admission admission(config, &registry);
  std::string error;
  std::string host_description;  // with a fabric
  if (!config.fabric_listen.empty()) {
    psmd::hw::FabricOptions fo;
    fo.node_id = config.node_id;
    fo.listen = psmd::FabricListenAddresses(config);
    fo.auth = config.fabric_auth == "none" ? psmd::hw::AuthMode::kNone
                                           : psmd::hw::AuthMode::kMunge;
    fo.munge_socket = config.munge_socket;
    fo.timeout_ms = config.fabric_timeout_ms;
    fo.sessions = config.fabric_sessions == "on";
    fo.rma = config.fabric_rma == "on";
    // Back-pressure pauses a connection's receiving for as long as a
    // receiver is over its budget; TCP_USER_TIMEOUT would then kill it
    // (zero window). The engine's heartbeats watch liveness instead.
    fo.user_timeout_ms = psmd::hw::FabricOptions::kNoUserTimeout;
    fo.connect_attempt_ms = std::min<uint32_t>(1000, config.fabric_timeout_ms);
    fo.provider = config.fabric_provider;
    // A successor carries on the old psmd's sessions: same incarnation,
    // same ports (docs/design.md, "Handover with a fabric").
    if (inheritance) psmd::InheritFabricOptions(*inheritance, &fo);
    std::unique_ptr<psmd::hw::Fabric> fabric =
        config.fabric == "ofi" ? psmd::hw::OpenOfiFabric(fo, &error)
                               : psmd::hw::OpenSocketFabric(fo, &error);
    if (!fabric) {
      spdlog::critical("fabric: {}", error);
      sd_notifyf(0, "STATUS=failed: fabric: %s", error.c_str());
      return 1;
    }
    if (inheritance) psmd::AdoptFabric(&*inheritance, *fabric);
    // What the node table needs for this node (docs/design.md).
    spdlog::info(
        "fabric: node {} listening, host description {} (backend {}, auth {})",
        config.node_id, fabric->HostDescription(), config.fabric,
        config.fabric_auth);
    host_description = fabric->HostDescription();
    // Before the inter-node engine reads the table.
    RefreshNodeTable(config, host_description);
    worker.EnableFabric(std::move(fabric), config, registry.boot_nonce());
  }
  if (!inheritance) {
    // Before Bind: the store's copy of psmd's own listening socket (one
    // not adopted) would answer its probe, "in use".
    forget_store();
  }
  if (inheritance) {
    // The old psmd's listening socket is the one to serve on; systemd's
    // is the same socket again.
    for (int fd : from_systemd.activated) close(fd);
  } else if (!admission.Bind(from_systemd.activated, from_systemd.error,
                             &error)) {
    spdlog::critical("{}", error);
    sd_notifyf(0, "STATUS=failed: %s", error.c_str());
    return 1;
  }
  if (!worker.Start(&error)) {
    spdlog::critical("{}", error);
    return 1;
  }
  psmd::ControlService service(&registry, &admission, &worker, &shared,
                               loader.config_path(), &upgrades);
  std::unique_ptr<grpc::Server> server;
  psmd::Daemon daemon{config,
                      worker,
                      registry,
                      admission,
                      upgrades,
                      [&] {
                        grpc::ServerBuilder builder;
                        builder.RegisterService(&service);
                        server = builder.BuildAndStart();
                        if (server) admission.Start(server.get());
                        return server != nullptr;
                      },
                      [&] {
                        server->Shutdown(std::chrono::system_clock::now() +
                                         std::chrono::seconds(1));
                        server.reset();
                      }};
  // The endpoint journal (daemon/control/endpoint_journal.h), read once
  // this psmd owns the socket: what a psmd that did not stop left.
  psmd::EndpointJournal journal;
  psmd::EndpointJournal::Previous previous;
  const psmd::Status journal_status =
      journal.Load(config.socket_path + ".journal", &previous);
  if (inheritance) psmd::TakeOver(daemon, *inheritance);
  if (!journal_status.ok()) {
    spdlog::error("{}; a crash of this psmd will not be reported",
                  journal_status.message);
  } else {
    uint64_t crash_restarts = previous.crash_restarts;
    if (state_fd < 0) {  // no handover: the one before stopped, or not
      uint32_t lost = 0;
      crash_restarts = psmd::ReportPrevious(journal.path(), previous,
                                            successor_ended, &lost);
      upgrades.last_crash_lost = lost;
    }
    upgrades.crash_restarts = crash_restarts;
    const psmd::Status s =
        journal.Start(static_cast<uint32_t>(getpid()), psmd::UnixNowNs(),
                      upgrades.generation.load(), crash_restarts);
    if (s.ok()) {
      registry.SetJournal(&journal);
    } else {
      spdlog::error("{}; a crash of this psmd will not be reported", s.message);
    }
  }
  // After the journal names what was taken over: a kill from here on is
  // reported as this psmd's crash.
  if (inheritance) forget_store();
  if (!daemon.start_server()) {
    spdlog::critical("cannot start the gRPC control server");
    return 1;
  }
  spdlog::info(
      "psmd {} (commit {}) serving {}{} (pid {}, {} worker{}{}, spin {} us, "
      "log to {}{})",
      psmd::version::Version(), psmd::version::Commit(),
      psmd::Escaped(config.socket_path),
      admission.activated() ? " from systemd" : "", getpid(), workers,
      workers == 1 ? "" : "s",
      cpus.empty() ? "" : " on CPUs " + psmd::Escaped(config.worker_cpus),
      config.spin_us, log_target,
      watchdog_us ? ", watchdog " + std::to_string(watchdog_us) + " us" : "");
  // The socket is listening and its connections are handled: clients that
  // systemd started after us may connect now.
  sd_notifyf(0, "READY=1\nSTATUS=serving %s, 0 endpoints",
             config.socket_path.c_str());

  int sig = 0;
  auto nodes_refreshed = std::chrono::steady_clock::now();
  for (;;) {
    timespec period{kStatusPeriodS, 0};
    if (config.fabric_nodes_refresh_s > 0 &&
        !config.fabric_nodes_command.empty()) {
      period.tv_sec =
          std::min<time_t>(period.tv_sec, config.fabric_nodes_refresh_s);
    }
    sig = sigtimedwait(&signals, nullptr, &period);
    const auto now = std::chrono::steady_clock::now();
    if (!host_description.empty() &&
        (sig == SIGHUP ||
         (sig <= 0 && config.fabric_nodes_refresh_s > 0 &&
          now - nodes_refreshed >=
              std::chrono::seconds(config.fabric_nodes_refresh_s)))) {
      // Slurm's node list again (a node added, an address changed); the
      // command and its period are the ones psmd started with.
      RefreshNodeTable(config, host_description);
      nodes_refreshed = now;
    }
    if (sig == SIGUSR2) {
      if (std::optional<std::string> path = upgrades.Take()) {
        std::string why;
        psmd::HandOver(daemon, *path, args, &why);  // returns on failure
        spdlog::error("upgrade to {} failed: {}; psmd serves on",
                      psmd::Escaped(*path), why);
        upgrades.Failed(why);
      }
      continue;
    }
    if (sig == SIGHUP) {
      // The log goes to stderr or the journal, never to a file psmd opened,
      // so there is no log file to reopen (docs/operations.md).
      sd_notify(0, "RELOADING=1");
      spdlog::info("SIGHUP: reloading {}", psmd::Escaped(loader.config_path()));
      Reload(loader, &shared, &registry, &worker);
    } else if (sig == SIGTERM && getenv("NOTIFY_SOCKET") != nullptr &&
               psmd::HandoverCarriesFabric(config)) {
      // Under systemd: everything into its file-descriptor store, for the
      // psmd that systemctl restart starts next (a stop discards it, which
      // ends the endpoints as a stop always did).
      std::string why;
      sd_notify(0,
                "STOPPING=1\nSTATUS=stopping: endpoints into systemd's "
                "file-descriptor store");
      if (psmd::HandOverToServiceManager(daemon, &why)) {
        // Not a crash if systemd then discards them (systemctl stop).
        journal.MarkInStore();
        _exit(0);
      }
      spdlog::warn(
          "SIGTERM: could not hand the endpoints to systemd ({}); stopping, "
          "which ends them",
          why);
      break;
    } else if (sig > 0) {
      break;
    }
    sd_notifyf(0, "%sSTATUS=serving %s, %zu endpoints",
               sig == SIGHUP ? "READY=1\n" : "", config.socket_path.c_str(),
               registry.endpoint_count());
  }
  spdlog::info("signal {}: shutting down", sig);
  sd_notify(0, "STOPPING=1\nSTATUS=stopping");
  admission.Stop();  // no new connections; socket file removed
  daemon.stop_server();
  registry.RemoveAll();  // every segment unmapped and closed
  journal.Remove();      // stopped: nothing ended untold
  worker.Stop();
  spdlog::info("psmd stopped");
  return 0;
}
