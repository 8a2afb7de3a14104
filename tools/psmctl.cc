// psmctl: the operator's command line for psmd (psmctl(8)). One subcommand
// per question an operator asks; each is an Add* function below, registered
// in main(). Counters are named and formatted from the one list in
// proto/counters.h, so a new counter shows up here without a change.
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <map>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "client/control_client.h"
#include "proto/counters.h"
#include "tools/format.h"
#include "version/version.h"

namespace {

using psmd::Status;
using psmd::client::ControlClient;
using psmd::tools::Counted;
using psmd::tools::Human;
using psmd::tools::HumanRate;
using psmd::tools::JsonString;
using psmd::tools::Printable;
using psmd::tools::PromLabel;
using psmd::tools::UtcTimestamp;
namespace counters = psmd::counters;
namespace refusals = psmd::refusals;

// Exit codes: 0 done, 1 the daemon failed or is unhealthy, 2 bad usage.
constexpr int kFailed = 1;
constexpr int kUsage = 2;

// The command line: where the daemon is and how to write (every command),
// then each command's own options.
struct Options {
  std::string socket = psmd::client::SocketPath();
  std::string format = "table";
  bool json = false;      // --json, kept from psmctl 0.5: --format json
  double watch = 0;       // stats --watch SECONDS (0: totals)
  int count = 0;          // stats --count N
  double max_stall = 5;   // health --max-stall SECONDS
  uint32_t close_id = 0;  // close ID
};

int Fail(const Status& e) {
  fprintf(stderr, "psmctl: %s\n", e.message.c_str());
  return kFailed;
}

std::string Hex(uint64_t v) {
  char buf[24];
  snprintf(buf, sizeof(buf), "0x%016" PRIx64, v);
  return buf;
}

// ---- stats ----

// A row of counters: one endpoint, one job's open endpoints, or the total.
struct Row {
  std::string heading;
  counters::Values values{};
};

counters::Values ValuesOf(const psmd::v1::EndpointStats& s) {
  counters::Values v{};
  for (size_t i = 0; i < counters::kNumCounters; i++) {
    auto it = s.counters().find(counters::kAll[i].name);
    if (it != s.counters().end()) v[i] = it->second;
  }
  return v;
}

// A job as stats shows it: (uuid, uid) and the sum of its open endpoints.
using JobKey = std::pair<std::string, uint32_t>;

std::map<JobKey, counters::Values> JobTotals(const psmd::v1::GetStatsReply& r) {
  std::map<JobKey, counters::Values> jobs;
  for (const auto& e : r.endpoints()) {
    counters::Accumulate(ValuesOf(e), &jobs[{e.job_uuid(), e.uid()}]);
  }
  return jobs;
}

std::string JobHeading(const JobKey& job) {
  return "job " + job.first.substr(0, 8) + "/" + std::to_string(job.second);
}

std::vector<Row> Rows(const psmd::v1::GetStatsReply& r) {
  std::vector<Row> rows;
  for (const auto& e : r.endpoints()) {
    rows.push_back({"ep " + std::to_string(e.endpoint_id()), ValuesOf(e)});
  }
  for (const auto& [job, values] : JobTotals(r)) {
    rows.push_back({JobHeading(job), values});
  }
  rows.push_back({"total", ValuesOf(r.total())});
  return rows;
}

void PrintIdentities(const psmd::v1::GetStatsReply& r) {
  printf("%-8s %-18s %-36s %6s %8s  %s\n", "endpoint", "epid", "job_uuid",
         "uid", "pid", "label");
  for (const auto& e : r.endpoints()) {
    printf("%-8u %-18s %-36s %6u %8u  %s\n", e.endpoint_id(),
           Hex(e.epid()).c_str(), Printable(e.job_uuid()).c_str(), e.uid(),
           e.pid(), Printable(e.label()).c_str());
  }
}

// Counters down, endpoints / jobs / total across: a new counter is one more
// line, however many there are. `rate_seconds` > 0: values are per second.
void PrintCounterTable(const std::vector<Row>& rows, double rate_seconds) {
  printf("\n%-18s", "counter");
  for (const Row& row : rows) printf(" %16s", row.heading.c_str());
  printf("\n");
  for (size_t i = 0; i < counters::kNumCounters; i++) {
    printf("%-18s", counters::kAll[i].name);
    for (const Row& row : rows) {
      double v = static_cast<double>(row.values[i]);
      std::string text =
          rate_seconds > 0 ? HumanRate(v / rate_seconds, counters::kAll[i].unit)
                           : Human(v, counters::kAll[i].unit);
      printf(" %16s", text.c_str());
    }
    printf("\n");
  }
}

std::string CountersJson(const counters::Values& v, double rate_seconds) {
  std::string out;
  for (size_t i = 0; i < counters::kNumCounters; i++) {
    out += i ? ", " : "";
    out += JsonString(counters::kAll[i].name) + ": ";
    if (rate_seconds > 0) {
      char buf[32];
      snprintf(buf, sizeof(buf), "%.3f",
               static_cast<double>(v[i]) / rate_seconds);
      out += buf;
    } else {
      out += std::to_string(v[i]);
    }
  }
  return out;
}

// The refusals of the reply, in list order (0 for any a psmd older than the
// list did not send).
refusals::Values RefusalsOf(const psmd::v1::GetStatsReply& r) {
  refusals::Values v{};
  for (size_t i = 0; i < refusals::kNumCounters; i++) {
    auto it = r.refusals().find(refusals::kAll[i].name);
    if (it != r.refusals().end()) v[i] = it->second;
  }
  return v;
}

std::string RefusalsJson(const psmd::v1::GetStatsReply& r) {
  const refusals::Values v = RefusalsOf(r);
  std::string out;
  for (size_t i = 0; i < refusals::kNumCounters; i++) {
    out += (i ? ", " : "") + JsonString(refusals::kAll[i].name) + ": " +
           std::to_string(v[i]);
  }
  return out;
}

// The counters per peer node, from their list (proto/counters.h), each
// with its field of PeerNodeStats.
struct PeerCounter {
  const char* name;
  const char* column;
  std::string metric;  // the whole Prometheus name
  counters::Unit unit;
  const char* help;
  bool traffic;  // the table writes it human-readable, in a wide column
  uint64_t (psmd::v1::PeerNodeStats::*get)() const;
};
#define PSMD_PEER_COUNTER(name, column, metric, unit, help, traffic)    \
  {#name, #column, "psmd_" #metric "_total",      counters::Unit::unit, \
   help,  traffic, &psmd::v1::PeerNodeStats::name},
#define PSMD_PEER_TRAFFIC(name, column, metric, unit, help) \
  PSMD_PEER_COUNTER(name, column, metric, unit, help, true)
#define PSMD_PEER_EVENT(name, column, metric, unit, help) \
  PSMD_PEER_COUNTER(name, column, metric, unit, help, false)
const PeerCounter kPeerCounters[] = {
    PSMD_FABRIC_TRAFFIC_COUNTERS(PSMD_PEER_TRAFFIC)
        PSMD_FABRIC_EVENT_COUNTERS(PSMD_PEER_EVENT)
            PSMD_REMOTE_EVENT_COUNTERS(PSMD_PEER_EVENT)};
#undef PSMD_PEER_COUNTER
#undef PSMD_PEER_TRAFFIC
#undef PSMD_PEER_EVENT

// The fabric's rows, one per peer node (none without a fabric).
void PrintPeerNodes(const psmd::v1::GetStatsReply& r) {
  if (r.peer_nodes_size() == 0 && r.fabric_host().empty()) return;
  printf("\nfabric %s\n%-5s", Printable(r.fabric_host()).c_str(), "node");
  for (const PeerCounter& c : kPeerCounters) {
    printf(c.traffic ? " %12s" : " %8s", c.column);
  }
  printf("\n");
  for (const auto& p : r.peer_nodes()) {
    printf("%-5u", p.node());
    for (const PeerCounter& c : kPeerCounters) {
      if (c.traffic) {
        printf(" %12s", Human((p.*c.get)(), c.unit).c_str());
      } else {
        printf(" %8" PRIu64, (p.*c.get)());
      }
    }
    printf("\n");
  }
}

std::string PeerNodesJson(const psmd::v1::GetStatsReply& r) {
  std::string out = "[";
  for (int i = 0; i < r.peer_nodes_size(); i++) {
    const auto& p = r.peer_nodes(i);
    out += (i ? ", {\"node\": " : "{\"node\": ") + std::to_string(p.node());
    for (const PeerCounter& c : kPeerCounters) {
      out += ", " + JsonString(c.name) + ": " + std::to_string((p.*c.get)());
    }
    out += "}";
  }
  return out + "]";
}

std::string WorkerJson(const psmd::v1::GetStatsReply& r) {
  if (!r.has_worker()) return "null";
  const auto& w = r.worker();
  char buf[400];
  snprintf(buf, sizeof(buf),
           "{\"cpu\": %d, \"core_checks\": %" PRIu64
           ", \"core_shared\": %" PRIu64 ", \"yields\": %" PRIu64
           ", \"shared_slices\": %" PRIu64 ", \"shared_slice_ns\": %" PRIu64
           ", \"shared_slices_over_8us\": %" PRIu64
           ", \"shared_slices_over_64us\": %" PRIu64 "}",
           w.cpu(), w.core_checks(), w.core_shared(), w.yields(),
           w.shared_slices(), w.shared_slice_ns(), w.shared_slices_over_8us(),
           w.shared_slices_over_64us());
  return buf;
}

void PrintStatsJson(const psmd::v1::GetStatsReply& r) {
  printf(
      "{\"uptime_seconds\": %.3f, \"endpoint_count\": %u, \"doorbells\": "
      "%" PRIu64 ", \"sleeps\": %" PRIu64 ",\n \"endpoints\": [",
      static_cast<double>(r.uptime_ns()) / 1e9, r.endpoint_count(),
      r.doorbells(), r.sleeps());
  for (int i = 0; i < r.endpoints_size(); i++) {
    const auto& e = r.endpoints(i);
    printf(
        "%s\n  {\"endpoint_id\": %u, \"epid\": %s, \"job_uuid\": %s, "
        "\"uid\": %u, \"pid\": %u, \"label\": %s, %s}",
        i ? "," : "", e.endpoint_id(), JsonString(Hex(e.epid())).c_str(),
        JsonString(e.job_uuid()).c_str(), e.uid(), e.pid(),
        JsonString(e.label()).c_str(), CountersJson(ValuesOf(e), 0).c_str());
  }
  printf("],\n \"jobs\": [");
  bool first = true;
  for (const auto& [job, values] : JobTotals(r)) {
    printf("%s\n  {\"job_uuid\": %s, \"uid\": %u, %s}", first ? "" : ",",
           JsonString(job.first).c_str(), job.second,
           CountersJson(values, 0).c_str());
    first = false;
  }
  printf(
      "],\n \"total\": {%s},\n \"refusals\": {%s},\n \"worker\": %s,\n "
      "\"fabric_host\": %s,\n \"peer_nodes\": %s}\n",
      CountersJson(ValuesOf(r.total()), 0).c_str(), RefusalsJson(r).c_str(),
      WorkerJson(r).c_str(), JsonString(r.fabric_host()).c_str(),
      PeerNodesJson(r).c_str());
}

// node_exporter's textfile collector format: one family per counter, a
// sample per job (labels job and uid) summed over its open endpoints, and
// the daemon's own gauges and counters.
void PrintStatsPrometheus(const psmd::v1::GetStatsReply& r) {
  auto family = [](const std::string& name, const char* type,
                   const char* help) {
    printf("# HELP %s %s\n# TYPE %s %s\n", name.c_str(), help, name.c_str(),
           type);
  };
  family("psmd_uptime_seconds", "gauge", "Seconds since psmd started.");
  printf("psmd_uptime_seconds %.3f\n",
         static_cast<double>(r.uptime_ns()) / 1e9);
  // A family of one sample without labels.
  auto single = [&](const char* name, const char* type, const char* help,
                    uint64_t value) {
    family(name, type, help);
    printf("%s %" PRIu64 "\n", name, value);
  };
  single("psmd_endpoints", "gauge", "Endpoints open now.", r.endpoint_count());
  single("psmd_doorbells_total", "counter",
         "Times a client woke the sleeping progress worker.", r.doorbells());
  single("psmd_sleeps_total", "counter",
         "Times the progress worker went to sleep.", r.sleeps());
  if (r.has_worker()) {
    const auto& w = r.worker();
    family("psmd_worker_cpu", "gauge",
           "The CPU the progress worker ran on at its last idle check "
           "(-1: none yet).");
    printf("psmd_worker_cpu %d\n", w.cpu());
    single("psmd_worker_core_checks_total", "counter",
           "The progress worker's idle checks of the pollers on its CPU.",
           w.core_checks());
    single("psmd_worker_core_shared_total", "counter",
           "Idle checks that found a client polling on the worker's CPU.",
           w.core_shared());
    single("psmd_worker_yields_total", "counter",
           "Idle passes on which the progress worker gave its core away.",
           w.yields());
    single("psmd_worker_shared_slices_total", "counter",
           "Turns of jobs with a backlog while another job had work.",
           w.shared_slices());
    family("psmd_worker_shared_slice_seconds_total", "counter",
           "The time those turns took.");
    printf("psmd_worker_shared_slice_seconds_total %.9f\n",
           static_cast<double>(w.shared_slice_ns()) / 1e9);
    single("psmd_worker_shared_slices_over_8us_total", "counter",
           "Those turns that took longer than 8 us.",
           w.shared_slices_over_8us());
    single("psmd_worker_shared_slices_over_64us_total", "counter",
           "Those turns that took longer than 64 us.",
           w.shared_slices_over_64us());
  }
  const refusals::Values refused = RefusalsOf(r);
  for (size_t i = 0; i < refusals::kNumCounters; i++) {
    std::string name =
        std::string("psmd_") + refusals::kAll[i].metric + "_total";
    family(name, "counter", refusals::kAll[i].help);
    printf("%s %" PRIu64 "\n", name.c_str(), refused[i]);
  }
  if (r.peer_nodes_size() > 0) {
    for (const PeerCounter& c : kPeerCounters) {
      family(c.metric, "counter", c.help);
      for (const auto& p : r.peer_nodes()) {
        printf("%s{node=\"%u\"} %" PRIu64 "\n", c.metric.c_str(), p.node(),
               (p.*c.get)());
      }
    }
  }
  auto jobs = JobTotals(r);
  for (size_t i = 0; i < counters::kNumCounters; i++) {
    std::string name =
        std::string("psmd_") + counters::kAll[i].metric + "_total";
    family(name, "counter", counters::kAll[i].help);
    for (const auto& [job, values] : jobs) {
      printf("%s{job=%s,uid=\"%u\"} %" PRIu64 "\n", name.c_str(),
             PromLabel(job.first).c_str(), job.second, values[i]);
    }
  }
}

// One line on where the progress worker runs: a client polling on its CPU
// takes turns with it there (docs/operations.md, "CPU placement").
void PrintWorker(const psmd::v1::WorkerPlacement& w) {
  if (w.core_checks() == 0) {
    printf("worker: no idle check of its CPU yet\n");
    return;
  }
  printf("worker: on CPU %d; a client polled on that CPU at %" PRIu64
         " of its %" PRIu64 " idle checks (%.0f%%); %" PRIu64 " yields\n",
         w.cpu(), w.core_shared(), w.core_checks(),
         100.0 * static_cast<double>(w.core_shared()) /
             static_cast<double>(w.core_checks()),
         w.yields());
}

int ShowStats(ControlClient& control, const std::string& format) {
  psmd::v1::GetStatsReply r;
  if (Status e = control.GetStats(&r); !e.ok()) return Fail(e);
  if (format == "json") {
    PrintStatsJson(r);
  } else if (format == "prometheus") {
    PrintStatsPrometheus(r);
  } else {
    printf("psmd up %.1f s, %s, %s, %s\n",
           static_cast<double>(r.uptime_ns()) / 1e9,
           Counted(r.endpoint_count(), "endpoint").c_str(),
           Counted(r.doorbells(), "doorbell").c_str(),
           Counted(r.sleeps(), "sleep").c_str());
    if (r.has_worker()) PrintWorker(r.worker());
    PrintIdentities(r);
    PrintCounterTable(Rows(r), 0);
    const refusals::Values refused = RefusalsOf(r);
    printf("\n");
    for (size_t i = 0; i < refusals::kNumCounters; i++)
      printf("%-28s %16" PRIu64 "\n", refusals::kAll[i].name, refused[i]);
    PrintPeerNodes(r);
  }
  return 0;
}

// Rates over each interval: per endpoint open at both ends of it, per job,
// and in total. `samples` 0: until interrupted.
int WatchStats(ControlClient& control, const std::string& format,
               double interval, int samples) {
  psmd::v1::GetStatsReply before;
  if (Status e = control.GetStats(&before); !e.ok()) return Fail(e);
  for (int n = 0; samples == 0 || n < samples; n++) {
    std::this_thread::sleep_for(std::chrono::duration<double>(interval));
    psmd::v1::GetStatsReply after;
    if (Status e = control.GetStats(&after); !e.ok()) return Fail(e);
    double seconds =
        static_cast<double>(after.uptime_ns() - before.uptime_ns()) / 1e9;
    std::map<uint32_t, counters::Values> earlier;
    for (const auto& e : before.endpoints()) {
      earlier[e.endpoint_id()] = ValuesOf(e);
    }
    // Deltas: endpoints new in this interval count from zero.
    psmd::v1::GetStatsReply delta = after;
    for (auto& e : *delta.mutable_endpoints()) {
      counters::Values was = earlier[e.endpoint_id()];
      for (size_t i = 0; i < counters::kNumCounters; i++) {
        (*e.mutable_counters())[counters::kAll[i].name] -= was[i];
      }
    }
    counters::Values total_was = ValuesOf(before.total());
    for (size_t i = 0; i < counters::kNumCounters; i++) {
      (*delta.mutable_total()->mutable_counters())[counters::kAll[i].name] -=
          total_was[i];
    }
    // When the interval ended, by this machine's clock: a log of many
    // intervals reads without counting them.
    const std::string at =
        UtcTimestamp(std::chrono::duration_cast<std::chrono::milliseconds>(
                         std::chrono::system_clock::now().time_since_epoch())
                         .count());
    if (format == "json") {
      printf("{\"time\": \"%s\", \"interval_seconds\": %.3f, \"endpoints\": [",
             at.c_str(), seconds);
      for (int i = 0; i < delta.endpoints_size(); i++) {
        const auto& e = delta.endpoints(i);
        printf("%s{\"endpoint_id\": %u, \"per_second\": {%s}}", i ? ", " : "",
               e.endpoint_id(), CountersJson(ValuesOf(e), seconds).c_str());
      }
      printf("], \"total_per_second\": {%s}}\n",
             CountersJson(ValuesOf(delta.total()), seconds).c_str());
    } else {
      printf("%s psmd rates over %.1f s, %s\n", at.c_str(), seconds,
             Counted(after.endpoint_count(), "endpoint").c_str());
      PrintCounterTable(Rows(delta), seconds);
      printf("\n");
    }
    fflush(stdout);
    before = std::move(after);
  }
  return 0;
}

void AddStats(CLI::App& app, Options& opts, std::function<int()>* run) {
  auto* cmd = app.add_subcommand(
      "stats",
      "Counters per endpoint (with its job uuid, uid and pid), per job and in "
      "total since psmd started");
  auto* watch = cmd->add_option(
      "--watch", opts.watch, "Show rates over every SECONDS instead of totals");
  watch->option_text("SECONDS")->check(CLI::Range(0.05, 86400.0));
  cmd->add_option("--count", opts.count,
                  "With --watch: stop after N intervals (0: until interrupted)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber)
      ->needs(watch);
  cmd->callback([&opts, run] {
    *run = [&opts] {
      ControlClient control(opts.socket);
      if (opts.watch == 0) return ShowStats(control, opts.format);
      if (opts.format == "prometheus") {
        fprintf(stderr,
                "psmctl: --watch shows rates; for Prometheus export totals "
                "and let it compute rates (rate())\n");
        return kUsage;
      }
      return WatchStats(control, opts.format, opts.watch, opts.count);
    };
  });
}

// ---- endpoints ----

int ShowEndpoints(ControlClient& control, const std::string& format) {
  psmd::v1::ListEndpointsReply r;
  if (Status e = control.ListEndpoints(&r); !e.ok()) return Fail(e);
  if (format == "json") {
    printf("[");
    for (int i = 0; i < r.endpoints_size(); i++) {
      const auto& e = r.endpoints(i);
      printf(
          "%s\n {\"endpoint_id\": %u, \"epid\": %s, \"job_uuid\": %s, "
          "\"pid\": %u, \"uid\": %u, \"gid\": %u, \"label\": %s, "
          "\"connections\": %u}",
          i ? "," : "", e.endpoint_id(), JsonString(Hex(e.epid())).c_str(),
          JsonString(e.job_uuid()).c_str(), e.pid(), e.uid(), e.gid(),
          JsonString(e.label()).c_str(), e.connections());
    }
    printf("]\n");
    return 0;
  }
  // The columns stats shows first, in its order (PrintIdentities).
  printf("%-8s %-18s %-36s %6s %8s %5s  %s\n", "endpoint", "epid", "job_uuid",
         "uid", "pid", "conns", "label");
  for (const auto& e : r.endpoints()) {
    printf("%-8u %-18s %-36s %6u %8u %5u  %s\n", e.endpoint_id(),
           Hex(e.epid()).c_str(), Printable(e.job_uuid()).c_str(), e.uid(),
           e.pid(), e.connections(), Printable(e.label()).c_str());
  }
  return 0;
}

// ---- config ----

// The daemon's effective configuration, as TOML psmd reads.
int ShowConfig(ControlClient& control, const std::string& /*format*/) {
  psmd::v1::GetConfigReply r;
  if (Status e = control.GetConfig(&r); !e.ok()) return Fail(e);
  printf("# effective configuration of psmd (file: %s)\n%s",
         Printable(r.config_path()).c_str(), r.toml().c_str());
  return 0;
}

// ---- jobs ----

int ShowJobs(ControlClient& control, const std::string& format) {
  psmd::v1::ListJobsReply r;
  if (Status e = control.ListJobs(&r); !e.ok()) return Fail(e);
  auto ids = [](const psmd::v1::JobInfo& j, const char* sep) {
    std::string out;
    for (int i = 0; i < j.endpoint_ids_size(); i++) {
      out += (i ? sep : "") + std::to_string(j.endpoint_ids(i));
    }
    return out;
  };
  if (format == "json") {
    printf("[");
    for (int i = 0; i < r.jobs_size(); i++) {
      const auto& j = r.jobs(i);
      printf(
          "%s\n {\"job_uuid\": %s, \"uid\": %u, \"endpoints\": [%s], "
          "\"pool_bytes\": %" PRIu64 ", \"region_bytes\": %" PRIu64
          ", \"max_endpoints\": %u, \"unexpected_budget_bytes\": %" PRIu64
          ", \"max_unexpected_budget_bytes\": %" PRIu64
          ", \"job_unexpected_budget_bytes\": %" PRIu64
          ", \"uid_unexpected_budget_bytes\": %" PRIu64 "}",
          i ? "," : "", JsonString(j.job_uuid()).c_str(), j.uid(),
          ids(j, ", ").c_str(), j.pool_bytes(), j.region_bytes(),
          j.max_endpoints(), j.unexpected_budget_bytes(),
          j.max_unexpected_budget_bytes(), j.job_unexpected_budget_bytes(),
          j.uid_unexpected_budget_bytes());
    }
    printf("]\n");
    return 0;
  }
  const auto bytes = counters::Unit::kBytes;
  printf("%-36s %6s %-16s %10s %10s %12s %10s %10s\n", "job_uuid", "uid",
         "endpoints", "pool", "ep_budget", "ep_max", "job_budget",
         "uid_budget");
  for (const auto& j : r.jobs()) {
    std::string eps =
        ids(j, ",") + " (of " + std::to_string(j.max_endpoints()) + ")";
    printf("%-36s %6u %-16s %10s %10s %12s %10s %10s\n",
           Printable(j.job_uuid()).c_str(), j.uid(), eps.c_str(),
           Human(j.pool_bytes(), bytes).c_str(),
           Human(j.unexpected_budget_bytes(), bytes).c_str(),
           Human(j.max_unexpected_budget_bytes(), bytes).c_str(),
           Human(j.job_unexpected_budget_bytes(), bytes).c_str(),
           Human(j.uid_unexpected_budget_bytes(), bytes).c_str());
  }
  return 0;
}

// ---- health ----

int ShowHealth(ControlClient& control, const std::string& format,
               double max_stall) {
  psmd::v1::HealthReply r;
  if (Status e = control.Health(&r); !e.ok()) return Fail(e);
  double uptime = static_cast<double>(r.uptime_ns()) / 1e9;
  double age = static_cast<double>(r.worker_last_turn_age_ns()) / 1e9;
  bool healthy = age <= max_stall;
  if (format == "json") {
    printf(
        "{\"healthy\": %s, \"version\": %s, \"commit\": %s, "
        "\"uptime_seconds\": %.3f, \"endpoint_count\": %u, "
        "\"max_endpoints\": %u, \"pid\": %u, "
        "\"worker_last_turn_seconds\": %.3f, \"max_stall_seconds\": %.3f}\n",
        healthy ? "true" : "false", JsonString(r.version()).c_str(),
        JsonString(r.commit()).c_str(), uptime, r.endpoint_count(),
        r.max_endpoints(), r.daemon_pid(), age, max_stall);
  } else {
    printf(
        "psmd %s (commit %s, pid %u): up %.1f s, %u of %u endpoints, "
        "progress worker last turned %.3f s ago: %s\n",
        r.version().c_str(), r.commit().c_str(), r.daemon_pid(), uptime,
        r.endpoint_count(), r.max_endpoints(), age,
        healthy ? "healthy" : "STALLED");
  }
  if (!healthy) {
    fprintf(stderr,
            "psmctl: psmd's progress worker has not turned for %.1f s (bound "
            "%.1f s): clients make no progress\n",
            age, max_stall);
    return kFailed;
  }
  return 0;
}

void AddHealth(CLI::App& app, Options& opts, std::function<int()>* run) {
  auto* cmd = app.add_subcommand(
      "health",
      "Daemon version, uptime, endpoint count; exits 1 when the progress "
      "worker has not turned within --max-stall");
  cmd->add_option("--max-stall", opts.max_stall,
                  "Seconds without a turn of the progress worker after "
                  "which psmd counts as stalled")
      ->option_text("SECONDS (default 5)")
      ->check(CLI::PositiveNumber);
  cmd->callback([&opts, run] {
    *run = [&opts] {
      ControlClient control(opts.socket);
      return ShowHealth(control, opts.format, opts.max_stall);
    };
  });
}

// ---- close ----

void AddClose(CLI::App& app, Options& opts, std::function<int()>* run) {
  auto* cmd = app.add_subcommand(
      "close", "Close endpoint ID (its owner's uid or root only)");
  cmd->add_option("ID", opts.close_id,
                  "Endpoint id, as psmctl endpoints lists it")
      ->required()
      ->check(CLI::Range(1u, 0xffffffffu));
  cmd->callback([&opts, run] {
    *run = [&opts] {
      ControlClient control(opts.socket);
      if (Status e = control.CloseEndpoint(opts.close_id); !e.ok())
        return Fail(e);
      printf("closed endpoint %u\n", opts.close_id);
      return 0;
    };
  });
}

// A subcommand whose only input is the shared options.
void AddSimple(CLI::App& app, Options& opts, std::function<int()>* run,
               const char* name, const char* help,
               int (*show)(ControlClient&, const std::string&)) {
  auto* cmd = app.add_subcommand(name, help);
  cmd->callback([&opts, run, show] {
    *run = [&opts, show] {
      ControlClient control(opts.socket);
      return show(control, opts.format);
    };
  });
}

}  // namespace

int main(int argc, char** argv) {
  Options opts;
  CLI::App app(
      "psmctl: ask psmd, the node's PSM2 daemon, what it is doing (psmctl(8))",
      "psmctl");
  app.set_version_flag("--version", std::string("psmctl ") +
                                        psmd::version::Version() + " (commit " +
                                        psmd::version::Commit() + ")");
  app.add_option("--socket", opts.socket,
                 "psmd's control socket ($PSMD_SOCKET, else " +
                     std::string(psmd::client::kDefaultSocket) + ")")
      ->option_text("PATH")
      ->capture_default_str();
  app.add_option("--format", opts.format,
                 "table (human-readable numbers), json (exact numbers) or "
                 "prometheus (stats only: node_exporter textfile format)")
      ->capture_default_str()
      ->check(CLI::IsMember({"table", "json", "prometheus"}));
  app.add_flag("--json", opts.json, "Same as --format json");

  // The subcommands. Each registers its options and, when chosen, sets `run`.
  std::function<int()> run;
  AddStats(app, opts, &run);
  AddSimple(app, opts, &run, "endpoints",
            "Open endpoints: id, epid, job uuid, pid, uid, connections, label",
            ShowEndpoints);
  AddSimple(app, opts, &run, "jobs",
            "Jobs: their endpoints, payload pool and unexpected-message "
            "budgets",
            ShowJobs);
  AddHealth(app, opts, &run);
  AddClose(app, opts, &run);
  AddSimple(app, opts, &run, "config",
            "The daemon's effective configuration, as the TOML psmd reads",
            ShowConfig);
  for (CLI::App* cmd : app.get_subcommands({})) cmd->fallthrough();
  // Anything unmatched is kept (not an error inside CLI11) so that a
  // mistyped command gets its own message below.
  app.allow_extras();
  app.require_subcommand(0, 1);

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    int code = app.exit(e);
    return code == 0 ? 0 : kUsage;
  }
  std::vector<std::string> extra = app.remaining();
  if (!extra.empty()) {
    const std::string& word = extra.front();
    bool command_missing = app.get_subcommands().empty() && word[0] != '-';
    fprintf(stderr, "psmctl: %s '%s' (see psmctl --help)\n",
            command_missing ? "unknown command" : "unexpected argument",
            word.c_str());
    return kUsage;
  }
  if (!run) {
    fprintf(stderr, "%s", app.help().c_str());
    return kUsage;
  }
  if (opts.json) opts.format = "json";
  if (opts.format == "prometheus" &&
      app.get_subcommands().front()->get_name() != "stats") {
    fprintf(stderr, "psmctl: --format prometheus is for stats only\n");
    return kUsage;
  }
  if (access(opts.socket.c_str(), F_OK) != 0) {
    fprintf(stderr,
            "psmctl: no psmd socket at %s; is psmd running? (--socket or "
            "PSMD_SOCKET)\n",
            opts.socket.c_str());
    return kFailed;
  }
  return run();
}
