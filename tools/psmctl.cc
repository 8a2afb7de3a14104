// psmctl: the operator's command line for psmd (psmctl(8)). One subcommand
// per question an operator asks; each is an Add* function below, registered
// in main(). Counters are named and formatted from the one list in
// proto/counters.h, so a new counter shows up here without a change.
#include <sys/stat.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <array>
#include <cerrno>
#include <chrono>
#include <cinttypes>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
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
using psmd::tools::JsonString;
using psmd::tools::Printable;
using psmd::tools::PromLabel;
using psmd::tools::UtcTimestamp;
namespace counters = psmd::counters;
namespace refusals = psmd::refusals;

// Exit codes: 0 done, 1 the daemon failed or is unhealthy, 2 bad usage.
constexpr int kFailed = 1;
constexpr int kUsage = 2;

// The shape of every JSON answer, in each as "schema_version" (psmctl(8),
// "JSON"): raised when a key changes meaning or goes, not when one is added.
constexpr int kSchemaVersion = 1;

// The command line: where the daemon is and how to write (every command),
// then each command's own options.
struct Options {
  std::string socket = psmd::client::SocketPath();
  std::string format = "table";
  bool json = false;            // --json, kept from psmctl 0.5: --format json
  double watch = 0;             // stats --watch SECONDS (0: totals)
  int count = 0;                // stats --count N
  double max_stall = 5;         // health --max-stall SECONDS
  uint32_t close_id = 0;        // close ID
  std::string output;           // stats --output FILE
  std::string exec_path;        // upgrade --exec PATH
  double upgrade_timeout = 30;  // upgrade --timeout SECONDS
  // slurm-register and slurm-end (psmd's SPANK plugin).
  std::string job_key;
  uint32_t slurm_job = 0;
  uint32_t slurm_step = 0;
  uint32_t slurm_uid = 0;
  std::string slurm_cgroup;
  uint32_t slurm_tasks = 0;
  uint64_t slurm_memory_mib = 0;
  int64_t check_ended = -1;  // jobs --check-ended JOB (-1: not asked)
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

// A Slurm step as Slurm names it: "7.0", "7.batch"; "" when none.
std::string SlurmText(const psmd::v1::SlurmStep& s, bool has) {
  if (!has) return "";
  std::string step;
  switch (s.step_id()) {
    case 0xfffffffau:
      step = "interactive";
      break;
    case 0xfffffffbu:
      step = "batch";
      break;
    case 0xfffffffcu:
      step = "extern";
      break;
    default:
      step = std::to_string(s.step_id());
  }
  return std::to_string(s.job_id()) + "." + step;
}

// The JSON fields of a job's Slurm step: "slurm_job_id" (null without
// Slurm), "slurm_step" ("7.0") and "slurm", its allocation on this node and
// the budgets psmd gave its job from it ({"tasks", "memory_mib",
// "max_endpoints", "unexpected_budget_bytes"}).
template <typename Job>
std::string SlurmJson(const Job& j) {
  if (!j.has_slurm())
    return "\"slurm_job_id\": null, \"slurm_step\": null, \"slurm\": null";
  const auto& s = j.slurm();
  return "\"slurm_job_id\": " + std::to_string(s.job_id()) +
         ", \"slurm_step\": " + JsonString(SlurmText(s, true)) +
         ", \"slurm\": {\"tasks\": " + std::to_string(s.tasks()) +
         ", \"memory_mib\": " + std::to_string(s.memory_mib()) +
         ", \"max_endpoints\": " + std::to_string(s.max_endpoints()) +
         ", \"unexpected_budget_bytes\": " +
         std::to_string(s.unexpected_budget_bytes()) + "}";
}

// A job's Prometheus label slurm_job_id, after a comma; "" without Slurm
// (an empty label is no label to Prometheus: the series stay as they were).
std::string SlurmLabel(const psmd::v1::JobStats& j) {
  if (!j.has_slurm()) return "";
  return ",slurm_job_id=\"" + std::to_string(j.slurm().job_id()) + "\"";
}

// ---- stats ----

using CounterMap = google::protobuf::Map<std::string, uint64_t>;

// The values of one counter set (proto/counters.h) in a reply's map, in list
// order (0 for any a psmd older than the list did not send).
template <size_t N>
std::array<uint64_t, N> ValuesOf(const CounterMap& map,
                                 const std::array<counters::Info, N>& all) {
  std::array<uint64_t, N> v{};
  for (size_t i = 0; i < N; i++) {
    auto it = map.find(all[i].name);
    if (it != map.end()) v[i] = it->second;
  }
  return v;
}

counters::Values ValuesOf(const CounterMap& map) {
  return ValuesOf(map, counters::kAll);
}

// "name": value, ... of one counter set; per second over `rate_seconds`
// when it is > 0.
template <size_t N>
std::string CountersJson(const std::array<uint64_t, N>& v,
                         const std::array<counters::Info, N>& all,
                         double rate_seconds = 0) {
  std::string out;
  for (size_t i = 0; i < N; i++) {
    out += (i ? ", " : "") + JsonString(all[i].name) + ": ";
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

// The table's counter columns: each as wide as its name or a human number
// ("1023.9 KiB"), so a row is as wide for one endpoint as for a million.
int CounterWidth(size_t i) {
  return std::max(static_cast<int>(strlen(counters::kAll[i].name)), 10);
}

std::string CounterHeadings() {
  std::string out;
  for (size_t i = 0; i < counters::kNumCounters; i++) {
    char buf[64];
    snprintf(buf, sizeof(buf), " %*s", CounterWidth(i), counters::kAll[i].name);
    out += buf;
  }
  return out;
}

// One row's counters, human-readable; per second over `rate_seconds` when it
// is > 0.
std::string CounterCells(const counters::Values& v, double rate_seconds = 0) {
  std::string out;
  for (size_t i = 0; i < counters::kNumCounters; i++) {
    double value = static_cast<double>(v[i]);
    if (rate_seconds > 0) value /= rate_seconds;
    char buf[64];
    snprintf(buf, sizeof(buf), " %*s", CounterWidth(i),
             Human(value, counters::kAll[i].unit).c_str());
    out += buf;
  }
  return out;
}

// A job's state in a word or three: "2 open", "finished 12 s ago".
std::string JobState(const psmd::v1::JobStats& j) {
  const std::string slurm =
      j.has_slurm()
          ? ", Slurm step " + SlurmText(j.slurm(), true) + " (" +
                std::to_string(j.slurm().tasks()) + " tasks here: at most " +
                std::to_string(j.slurm().max_endpoints()) + " endpoints, " +
                Human(static_cast<double>(j.slurm().unexpected_budget_bytes()),
                      counters::Unit::kBytes) +
                " unexpected)"
          : "";
  if (j.open_endpoints() > 0)
    return std::to_string(j.open_endpoints()) + " open" + slurm;
  char buf[48];
  snprintf(buf, sizeof(buf), "finished %.0f s ago",
           static_cast<double>(j.finished_age_ns()) / 1e9);
  return buf + slurm;
}

// A line per endpoint, then per job (open and recently finished) and the
// node's total: identities in the order psmctl endpoints has them, the
// counters across, the label last (its width is the client's to choose).
void PrintCounterTable(const psmd::v1::GetStatsReply& r) {
  const char* const kIdentity = "%-8s %-36s %6s %8s";
  printf(kIdentity, "endpoint", "job_uuid", "uid", "pid");
  printf("%s  label\n", CounterHeadings().c_str());
  for (const auto& e : r.endpoints()) {
    printf(kIdentity, std::to_string(e.endpoint_id()).c_str(),
           Printable(e.job_uuid()).c_str(), std::to_string(e.uid()).c_str(),
           std::to_string(e.pid()).c_str());
    printf("%s  %s\n", CounterCells(ValuesOf(e.counters())).c_str(),
           Printable(e.label()).c_str());
  }
  for (const auto& j : r.jobs()) {
    printf(kIdentity, "job", Printable(j.job_uuid()).c_str(),
           std::to_string(j.uid()).c_str(), "-");
    printf("%s  %s\n", CounterCells(ValuesOf(j.counters())).c_str(),
           JobState(j).c_str());
  }
  printf(kIdentity, "total", "-", "-", "-");
  printf("%s  since psmd started\n",
         CounterCells(ValuesOf(r.total().counters())).c_str());
}

// The counters per peer node, from their list (proto/counters.h), each
// with its field of PeerNodeStats.
struct PeerCounter {
  const char* name;
  const char* column;
  counters::Unit unit;
  const char* help;
  bool traffic;  // the table writes it human-readable, in a wide column
  uint64_t (psmd::v1::PeerNodeStats::*get)() const;
};
#define PSMD_PEER_COUNTER(name, column, unit, help, traffic) \
  {#name, #column, counters::Unit::unit,                     \
   help,  traffic, &psmd::v1::PeerNodeStats::name},
#define PSMD_PEER_TRAFFIC(name, column, unit, help) \
  PSMD_PEER_COUNTER(name, column, unit, help, true)
#define PSMD_PEER_EVENT(name, column, unit, help) \
  PSMD_PEER_COUNTER(name, column, unit, help, false)
// (Byte counts human-readable, counts as events.)
#define PSMD_PEER_BY_UNIT(name, column, unit, help) \
  PSMD_PEER_COUNTER(name, column, unit, help,       \
                    counters::Unit::unit == counters::Unit::kBytes)
const PeerCounter kPeerCounters[] = {
    PSMD_FABRIC_TRAFFIC_COUNTERS(PSMD_PEER_TRAFFIC)
        PSMD_FABRIC_EVENT_COUNTERS(PSMD_PEER_EVENT)
            PSMD_REMOTE_EVENT_COUNTERS(PSMD_PEER_EVENT)
                PSMD_FABRIC_SESSION_COUNTERS(PSMD_PEER_EVENT)
                    PSMD_REMOTE_RMA_COUNTERS(PSMD_PEER_BY_UNIT)};
#undef PSMD_PEER_COUNTER
#undef PSMD_PEER_TRAFFIC
#undef PSMD_PEER_EVENT
#undef PSMD_PEER_BY_UNIT

// The fabric's rows, one per peer node (none without a fabric).
void PrintPeerNodes(const psmd::v1::GetStatsReply& r) {
  if (r.peer_nodes_size() == 0 && r.fabric_host().empty()) return;
  printf("\nfabric %s", Printable(r.fabric_host()).c_str());
  if (!r.fabric_backend().empty()) {
    printf(" over %s", Printable(r.fabric_backend()).c_str());
  }
  if (!r.fabric_provider().empty()) {
    printf(" (%s)", Printable(r.fabric_provider()).c_str());
  }
  if (!r.fabric_backend().empty()) {
    printf(", sessions %s", r.fabric_sessions() ? "on" : "off");
  }
  printf("\n%-5s", "node");
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

std::string WorkerJson(const psmd::v1::WorkerPlacement& w) {
  char buf[800];
  snprintf(buf, sizeof(buf),
           "{\"shard\": %u, \"cpu\": %d, \"core_checks\": %" PRIu64
           ", \"core_shared\": %" PRIu64 ", \"yields\": %" PRIu64
           ", \"shared_slices\": %" PRIu64 ", \"shared_slice_ns\": %" PRIu64
           ", \"shared_slices_over_8us\": %" PRIu64
           ", \"shared_slices_over_64us\": %" PRIu64 ", \"cpu_ns\": %" PRIu64
           ", \"endpoints\": %u, \"submissions\": %" PRIu64
           ", \"cross_in\": %" PRIu64 ", \"cross_out\": %" PRIu64
           ", \"busy_ns\": %" PRIu64 ", \"wall_ns\": %" PRIu64
           ", \"sleeps\": %" PRIu64 ", \"doorbells\": %" PRIu64 "}",
           w.shard(), w.cpu(), w.core_checks(), w.core_shared(), w.yields(),
           w.shared_slices(), w.shared_slice_ns(), w.shared_slices_over_8us(),
           w.shared_slices_over_64us(), w.cpu_ns(), w.endpoints(),
           w.submissions(), w.cross_in(), w.cross_out(), w.busy_ns(),
           w.wall_ns(), w.sleeps(), w.doorbells());
  return buf;
}

std::string WorkerJson(const psmd::v1::GetStatsReply& r) {
  return r.has_worker() ? WorkerJson(r.worker()) : "null";
}

std::string WorkersJson(const psmd::v1::GetStatsReply& r) {
  std::string out = "[";
  for (int i = 0; i < r.workers_size(); i++) {
    out += (i ? ", " : "") + WorkerJson(r.workers(i));
  }
  return out + "]";
}

double Seconds(uint64_t ns) { return static_cast<double>(ns) / 1e9; }

// The line of stats and health on the starts after a crash (none when
// psmd last started clean): both replies carry the same two fields.
template <typename Reply>
void PrintCrashes(const Reply& r) {
  if (r.crash_restarts() == 0) return;
  printf(
      "restarted after a crash %s since the last clean start: the last "
      "crash ended %s\n",
      Counted(r.crash_restarts(), "time").c_str(),
      Counted(r.last_crash_lost_endpoints(), "endpoint").c_str());
}

// The line of stats and health on handovers that failed before the exec
// (none when all succeeded): psmd served on each time.
template <typename Reply>
void PrintFailedUpgrades(const Reply& r) {
  if (r.upgrades_failed() == 0) return;
  printf("%s failed before the exec (psmd served on)\n",
         Counted(r.upgrades_failed(), "upgrade").c_str());
}

void PrintStatsJson(const psmd::v1::GetStatsReply& r) {
  printf(
      "{\"schema_version\": %d, \"version\": %s, \"commit\": %s, "
      "\"start_time_seconds\": %.3f, \"uptime_seconds\": %.3f, "
      "\"endpoint_count\": %u, \"doorbells\": %" PRIu64 ", \"sleeps\": %" PRIu64
      ", \"generation\": %" PRIu64
      ", \"last_blackout_seconds\": %.6f, \"last_carried_endpoints\": %u"
      ", \"crash_restarts\": %" PRIu64
      ", \"last_crash_lost_endpoints\": %u, \"upgrades_failed\": %" PRIu64
      ",\n \"endpoints\": [",
      kSchemaVersion, JsonString(r.version()).c_str(),
      JsonString(r.commit()).c_str(), Seconds(r.start_time_unix_ns()),
      Seconds(r.uptime_ns()), r.endpoint_count(), r.doorbells(), r.sleeps(),
      r.generation(), Seconds(r.last_blackout_ns()), r.last_carried_endpoints(),
      r.crash_restarts(), r.last_crash_lost_endpoints(), r.upgrades_failed());
  for (int i = 0; i < r.endpoints_size(); i++) {
    const auto& e = r.endpoints(i);
    printf(
        "%s\n  {\"endpoint_id\": %u, \"epid\": %s, \"job_uuid\": %s, "
        "\"uid\": %u, \"pid\": %u, \"label\": %s, %s}",
        i ? "," : "", e.endpoint_id(), JsonString(Hex(e.epid())).c_str(),
        JsonString(e.job_uuid()).c_str(), e.uid(), e.pid(),
        JsonString(e.label()).c_str(),
        CountersJson(ValuesOf(e.counters()), counters::kAll).c_str());
  }
  printf("],\n \"jobs\": [");
  for (int i = 0; i < r.jobs_size(); i++) {
    const auto& j = r.jobs(i);
    printf(
        "%s\n  {\"job_uuid\": %s, \"uid\": %u, %s, \"open_endpoints\": %u, "
        "\"finished_seconds_ago\": %.3f, %s}",
        i ? "," : "", JsonString(j.job_uuid()).c_str(), j.uid(),
        SlurmJson(j).c_str(), j.open_endpoints(), Seconds(j.finished_age_ns()),
        CountersJson(ValuesOf(j.counters()), counters::kAll).c_str());
  }
  printf(
      "],\n \"total\": {%s},\n \"refusals\": {%s},\n \"worker\": %s,\n "
      "\"workers\": %s,\n \"fabric_host\": %s,\n \"fabric_backend\": %s,\n "
      "\"fabric_provider\": %s,\n \"fabric_sessions\": %s,\n \"peer_nodes\": "
      "%s}\n",
      CountersJson(ValuesOf(r.total().counters()), counters::kAll).c_str(),
      CountersJson(ValuesOf(r.refusals(), refusals::kAll), refusals::kAll)
          .c_str(),
      WorkerJson(r).c_str(), WorkersJson(r).c_str(),
      JsonString(r.fabric_host()).c_str(),
      JsonString(r.fabric_backend()).c_str(),
      JsonString(r.fabric_provider()).c_str(),
      r.fabric_sessions() ? "true" : "false", PeerNodesJson(r).c_str());
}

// printf onto the end of a string.
void Appendf(std::string* out, const char* format, ...)
    __attribute__((format(printf, 2, 3)));
void Appendf(std::string* out, const char* format, ...) {
  va_list args;
  va_start(args, format);
  char buf[512];
  int n = vsnprintf(buf, sizeof(buf), format, args);
  va_end(args);
  if (n >= static_cast<int>(sizeof(buf))) {
    std::string big(static_cast<size_t>(n) + 1, '\0');
    va_start(args, format);
    vsnprintf(big.data(), big.size(), format, args);
    va_end(args);
    big.pop_back();
    *out += big;
  } else if (n > 0) {
    *out += buf;
  }
}

// Prometheus' text format for node_exporter's textfile collector
// (psmctl(8), "PROMETHEUS"). `r` null: psmd did not answer, and psmd_up 0
// is all there is to say.
std::string PrometheusText(const psmd::v1::GetStatsReply* r) {
  std::string out;
  auto family = [&out](const std::string& name, const char* type,
                       const char* help) {
    Appendf(&out, "# HELP %s %s\n# TYPE %s %s\n", name.c_str(), help,
            name.c_str(), type);
  };
  // A family of one sample without labels.
  auto single = [&](const std::string& name, const char* type, const char* help,
                    uint64_t value) {
    family(name, type, help);
    Appendf(&out, "%s %" PRIu64 "\n", name.c_str(), value);
  };
  single("psmd_up", "gauge", "1 if psmd answered psmctl, else 0.", r ? 1 : 0);
  if (!r) return out;
  family("psmd_build_info", "gauge", "psmd's version and commit; always 1.");
  Appendf(&out, "psmd_build_info{version=%s,commit=%s} 1\n",
          PromLabel(r->version()).c_str(), PromLabel(r->commit()).c_str());
  family("psmd_start_time_seconds", "gauge",
         "When psmd started, in seconds since the Unix epoch.");
  Appendf(&out, "psmd_start_time_seconds %.3f\n",
          Seconds(r->start_time_unix_ns()));
  family("psmd_uptime_seconds", "gauge", "Seconds since psmd started.");
  Appendf(&out, "psmd_uptime_seconds %.3f\n", Seconds(r->uptime_ns()));
  single("psmd_endpoints", "gauge", "Endpoints open now.", r->endpoint_count());
  single("psmd_doorbells_total", "counter",
         "Times a client woke the sleeping progress worker.", r->doorbells());
  single("psmd_sleeps_total", "counter",
         "Times the progress worker went to sleep.", r->sleeps());
  single("psmd_generation", "gauge",
         "Handovers (psmctl upgrade, systemctl restart) since this psmd's "
         "first process started.",
         r->generation());
  family("psmd_last_blackout_seconds", "gauge",
         "The last handover's blackout: the old process's freeze to the new "
         "one's first pass (0: none yet).");
  Appendf(&out, "psmd_last_blackout_seconds %.6f\n",
          Seconds(r->last_blackout_ns()));
  single("psmd_last_handover_endpoints", "gauge",
         "Endpoints the last handover carried over.",
         r->last_carried_endpoints());
  single("psmd_crash_restarts", "gauge",
         "Starts that followed a psmd killed or crashed, since psmd last "
         "started after a clean stop.",
         r->crash_restarts());
  single("psmd_last_crash_lost_endpoints", "gauge",
         "Endpoints that ended with the last psmd killed or crashed.",
         r->last_crash_lost_endpoints());
  single("psmd_upgrades_failed_total", "counter",
         "Handovers that failed before the exec, psmd serving on (psmctl "
         "upgrade says why).",
         r->upgrades_failed());
  // One series per worker (engine shard), labelled worker="N".
  struct WorkerSeries {
    const char* name;  // after psmd_worker_
    const char* type;
    const char* help;
    double (*get)(const psmd::v1::WorkerPlacement&);
  };
  using W = psmd::v1::WorkerPlacement;
  static const WorkerSeries kWorkerSeries[] = {
      {"cpu", "gauge",
       "The CPU the progress worker ran on at its last idle check (-1: none "
       "yet).",
       [](const W& w) { return double(w.cpu()); }},
      {"endpoints", "gauge", "Endpoints the worker serves.",
       [](const W& w) { return double(w.endpoints()); }},
      {"cpu_seconds_total", "counter", "CPU time of the worker's thread.",
       [](const W& w) { return double(w.cpu_ns()) / 1e9; }},
      {"busy_seconds_total", "counter",
       "Time the worker had work (its busy fraction is this over the wall "
       "time).",
       [](const W& w) { return double(w.busy_ns()) / 1e9; }},
      {"wall_seconds_total", "counter", "Time since the worker started.",
       [](const W& w) { return double(w.wall_ns()) / 1e9; }},
      {"submissions_total", "counter",
       "Submissions the worker took from its endpoints' rings.",
       [](const W& w) { return double(w.submissions()); }},
      {"cross_in_total", "counter",
       "Messages the worker took from other workers (engine shards).",
       [](const W& w) { return double(w.cross_in()); }},
      {"cross_out_total", "counter",
       "Messages the worker handed to other workers (engine shards).",
       [](const W& w) { return double(w.cross_out()); }},
      {"sleeps_total", "counter", "Times the worker went to sleep.",
       [](const W& w) { return double(w.sleeps()); }},
      {"doorbells_total", "counter", "Times a client woke the worker.",
       [](const W& w) { return double(w.doorbells()); }},
      {"core_checks_total", "counter",
       "The worker's idle checks of the pollers on its CPU.",
       [](const W& w) { return double(w.core_checks()); }},
      {"core_shared_total", "counter",
       "Idle checks that found a client polling on the worker's CPU.",
       [](const W& w) { return double(w.core_shared()); }},
      {"yields_total", "counter",
       "Idle passes on which the worker gave its core away.",
       [](const W& w) { return double(w.yields()); }},
      {"shared_slices_total", "counter",
       "Turns of jobs with a backlog while another job had work.",
       [](const W& w) { return double(w.shared_slices()); }},
      {"shared_slice_seconds_total", "counter", "The time those turns took.",
       [](const W& w) { return double(w.shared_slice_ns()) / 1e9; }},
      {"shared_slices_over_8us_total", "counter",
       "Those turns that took longer than 8 us.",
       [](const W& w) { return double(w.shared_slices_over_8us()); }},
      {"shared_slices_over_64us_total", "counter",
       "Those turns that took longer than 64 us.",
       [](const W& w) { return double(w.shared_slices_over_64us()); }},
  };
  if (r->workers_size() > 0) {
    for (const WorkerSeries& series : kWorkerSeries) {
      const std::string name = std::string("psmd_worker_") + series.name;
      family(name, series.type, series.help);
      for (const auto& w : r->workers()) {
        Appendf(&out, "%s{worker=\"%u\"} %.9g\n", name.c_str(), w.shard(),
                series.get(w));
      }
    }
  }
  const refusals::Values refused = ValuesOf(r->refusals(), refusals::kAll);
  for (size_t i = 0; i < refusals::kNumCounters; i++) {
    single(std::string("psmd_") + refusals::kAll[i].name + "_total", "counter",
           refusals::kAll[i].help, refused[i]);
  }
  if (!r->fabric_backend().empty()) {
    family("psmd_fabric_info", "gauge",
           "The fabric to other nodes' daemons: its backend, libfabric "
           "provider (empty: not libfabric) and whether it runs sessions "
           "(fabric_sessions); always 1.");
    Appendf(&out,
            "psmd_fabric_info{backend=%s,provider=%s,sessions=\"%s\"} 1\n",
            PromLabel(r->fabric_backend()).c_str(),
            PromLabel(r->fabric_provider()).c_str(),
            r->fabric_sessions() ? "on" : "off");
  }
  if (r->peer_nodes_size() > 0) {
    for (const PeerCounter& c : kPeerCounters) {
      const std::string name = std::string("psmd_fabric_") + c.name + "_total";
      family(name, "counter", c.help);
      for (const auto& p : r->peer_nodes()) {
        Appendf(&out, "%s{node=\"%u\"} %" PRIu64 "\n", name.c_str(), p.node(),
                (p.*c.get)());
      }
    }
  }
  // Each counter twice: for the node (all endpoints since psmd started) and
  // per job (label job_uuid: Prometheus adds its own "job" at scrape time).
  const counters::Values total = ValuesOf(r->total().counters());
  for (size_t i = 0; i < counters::kNumCounters; i++) {
    const counters::Info& c = counters::kAll[i];
    single(std::string("psmd_") + c.name + "_total", "counter", c.help,
           total[i]);
    const std::string name = std::string("psmd_job_") + c.name + "_total";
    family(name, "counter", c.help);
    for (const auto& j : r->jobs()) {
      // slurm_job_id only for a job a Slurm step registered.
      Appendf(&out, "%s{job_uuid=%s%s,uid=\"%u\"} %" PRIu64 "\n", name.c_str(),
              PromLabel(j.job_uuid()).c_str(), SlurmLabel(j).c_str(), j.uid(),
              ValuesOf(j.counters())[i]);
    }
  }
  return out;
}

// Replaces `path` by a file holding `text`, all at once: written to a
// temporary file beside it (same file system), then renamed over it, so a
// collector reading it never sees half a file.
Status WriteAtomically(const std::string& path, const std::string& text) {
  std::string temp = path + ".XXXXXX";  // not *.prom: collectors skip it
  int fd = mkstemp(temp.data());
  if (fd < 0)
    return {PSM2_INTERNAL_ERR,
            "cannot create " + temp + ": " + strerror(errno)};
  // Readable by node_exporter, which runs as another user.
  bool ok = fchmod(fd, 0644) == 0;
  for (size_t done = 0; ok && done < text.size();) {
    ssize_t n = write(fd, text.data() + done, text.size() - done);
    ok = n > 0 || (n < 0 && errno == EINTR);
    if (n > 0) done += static_cast<size_t>(n);
  }
  ok = ok && fsync(fd) == 0;
  ok = close(fd) == 0 && ok;
  if (ok && rename(temp.c_str(), path.c_str()) == 0) return {};
  const std::string error = strerror(errno);
  unlink(temp.c_str());
  return {PSM2_INTERNAL_ERR, "cannot write " + path + ": " + error};
}

// stats --format prometheus [--output FILE]. `control` null: psmd's socket
// is not there. Whatever psmd does, the output is fresh: psmd_up 0 when it
// did not answer, and then exit status 1 too.
int ExportPrometheus(ControlClient* control, const std::string& output) {
  psmd::v1::GetStatsReply r;
  bool up = false;
  if (control) {
    Status asked = control->GetStats(&r);
    up = asked.ok();
    if (!up) Fail(asked);
  }
  const std::string text = PrometheusText(up ? &r : nullptr);
  if (output.empty()) {
    fputs(text.c_str(), stdout);
  } else if (Status e = WriteAtomically(output, text); !e.ok()) {
    return Fail(e);
  }
  return up ? 0 : kFailed;
}

// One line on where the progress worker runs: a client polling on its CPU
// takes turns with it there (docs/operations.md, "CPU placement").
void PrintWorker(const psmd::v1::WorkerPlacement& w) {
  printf("worker %u: %s, %" PRIu64 " submissions, %" PRIu64
         " messages from other workers, %" PRIu64
         " to them; busy %.1f%%, CPU %.3f s; ",
         w.shard(), Counted(w.endpoints(), "endpoint").c_str(), w.submissions(),
         w.cross_in(), w.cross_out(),
         w.wall_ns() ? 100.0 * double(w.busy_ns()) / double(w.wall_ns()) : 0.0,
         double(w.cpu_ns()) / 1e9);
  if (w.core_checks() == 0) {
    printf("no idle check of its CPU yet\n");
    return;
  }
  printf("on CPU %d; a client polled on that CPU at %" PRIu64 " of its %" PRIu64
         " idle checks (%.0f%%); %" PRIu64 " yields\n",
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
    return 0;
  }
  printf("psmd up %.1f s, %s, %s, %s\n", Seconds(r.uptime_ns()),
         Counted(r.endpoint_count(), "endpoint").c_str(),
         Counted(r.doorbells(), "doorbell").c_str(),
         Counted(r.sleeps(), "sleep").c_str());
  if (r.generation() > 0) {
    printf(
        "generation %" PRIu64 ": last handover carried %s, blackout %.1f ms\n",
        r.generation(), Counted(r.last_carried_endpoints(), "endpoint").c_str(),
        static_cast<double>(r.last_blackout_ns()) / 1e6);
  }
  PrintCrashes(r);
  PrintFailedUpgrades(r);
  for (const auto& w : r.workers()) PrintWorker(w);
  printf("\n");
  PrintCounterTable(r);
  const refusals::Values refused = ValuesOf(r.refusals(), refusals::kAll);
  printf("\n");
  for (size_t i = 0; i < refusals::kNumCounters; i++)
    printf("%-28s %16" PRIu64 "\n", refusals::kAll[i].name, refused[i]);
  PrintPeerNodes(r);
  return 0;
}

// Rates over each interval, one line each: in the table the node's (the
// heading once, first), in JSON also each endpoint's that was open at both
// ends of it. `samples` 0: until interrupted.
int WatchStats(ControlClient& control, const std::string& format,
               double interval, int samples) {
  psmd::v1::GetStatsReply before;
  if (Status e = control.GetStats(&before); !e.ok()) return Fail(e);
  if (format != "json") {
    printf("%-24s %8s %9s%s  (per second)\n", "time", "seconds", "endpoints",
           CounterHeadings().c_str());
  }
  for (int n = 0; samples == 0 || n < samples; n++) {
    std::this_thread::sleep_for(std::chrono::duration<double>(interval));
    psmd::v1::GetStatsReply after;
    if (Status e = control.GetStats(&after); !e.ok()) return Fail(e);
    const double seconds = Seconds(after.uptime_ns() - before.uptime_ns());
    // Each delta: what `after` counted beyond `was` (an endpoint new in this
    // interval counts from zero).
    auto delta = [](const CounterMap& now, const counters::Values& was) {
      counters::Values d = ValuesOf(now);
      for (size_t i = 0; i < counters::kNumCounters; i++) d[i] -= was[i];
      return d;
    };
    const counters::Values total =
        delta(after.total().counters(), ValuesOf(before.total().counters()));
    // When the interval ended, by this machine's clock: a log of many
    // intervals reads without counting them.
    const std::string at =
        UtcTimestamp(std::chrono::duration_cast<std::chrono::milliseconds>(
                         std::chrono::system_clock::now().time_since_epoch())
                         .count());
    if (format == "json") {
      std::map<uint32_t, counters::Values> earlier;
      for (const auto& e : before.endpoints()) {
        earlier[e.endpoint_id()] = ValuesOf(e.counters());
      }
      printf(
          "{\"schema_version\": %d, \"time\": \"%s\", \"interval_seconds\": "
          "%.3f, \"endpoints\": [",
          kSchemaVersion, at.c_str(), seconds);
      for (int i = 0; i < after.endpoints_size(); i++) {
        const auto& e = after.endpoints(i);
        printf("%s{\"endpoint_id\": %u, \"per_second\": {%s}}", i ? ", " : "",
               e.endpoint_id(),
               CountersJson(delta(e.counters(), earlier[e.endpoint_id()]),
                            counters::kAll, seconds)
                   .c_str());
      }
      printf("], \"total_per_second\": {%s}}\n",
             CountersJson(total, counters::kAll, seconds).c_str());
    } else {
      printf("%-24s %8.1f %9u%s\n", at.c_str(), seconds, after.endpoint_count(),
             CounterCells(total, seconds).c_str());
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
  cmd->add_option("--output", opts.output,
                  "With --format prometheus: replace FILE atomically "
                  "(psmd_up 0 in it when psmd does not answer)")
      ->option_text("FILE")
      ->excludes(watch);
  cmd->callback([&opts, run] {
    *run = [&opts] {
      if (opts.format == "prometheus") {
        if (opts.watch > 0) {
          fprintf(stderr,
                  "psmctl: --watch shows rates; for Prometheus export totals "
                  "and let it compute rates (rate())\n");
          return kUsage;
        }
        ControlClient control(opts.socket);
        return ExportPrometheus(&control, opts.output);
      }
      ControlClient control(opts.socket);
      if (opts.watch == 0) return ShowStats(control, opts.format);
      return WatchStats(control, opts.format, opts.watch, opts.count);
    };
  });
}

// ---- endpoints ----

int ShowEndpoints(ControlClient& control, const std::string& format) {
  psmd::v1::ListEndpointsReply r;
  if (Status e = control.ListEndpoints(&r); !e.ok()) return Fail(e);
  if (format == "json") {
    printf("{\"schema_version\": %d, \"endpoints\": [", kSchemaVersion);
    for (int i = 0; i < r.endpoints_size(); i++) {
      const auto& e = r.endpoints(i);
      printf(
          "%s\n {\"endpoint_id\": %u, \"epid\": %s, \"job_uuid\": %s, "
          "\"pid\": %u, \"uid\": %u, \"gid\": %u, \"label\": %s, "
          "\"connections\": %u, \"shard\": %u}",
          i ? "," : "", e.endpoint_id(), JsonString(Hex(e.epid())).c_str(),
          JsonString(e.job_uuid()).c_str(), e.pid(), e.uid(), e.gid(),
          JsonString(e.label()).c_str(), e.connections(), e.shard());
    }
    printf("]}\n");
    return 0;
  }
  // The columns stats shows first, in its order (PrintIdentities).
  printf("%-8s %-18s %-36s %6s %8s %5s %5s  %s\n", "endpoint", "epid",
         "job_uuid", "uid", "pid", "conns", "shard", "label");
  for (const auto& e : r.endpoints()) {
    printf("%-8u %-18s %-36s %6u %8u %5u %5u  %s\n", e.endpoint_id(),
           Hex(e.epid()).c_str(), Printable(e.job_uuid()).c_str(), e.uid(),
           e.pid(), e.connections(), e.shard(), Printable(e.label()).c_str());
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
    printf("{\"schema_version\": %d, \"jobs\": [", kSchemaVersion);
    for (int i = 0; i < r.jobs_size(); i++) {
      const auto& j = r.jobs(i);
      printf(
          "%s\n {\"job_uuid\": %s, \"uid\": %u, %s, \"endpoints\": [%s], "
          "\"pool_bytes\": %" PRIu64 ", \"region_bytes\": %" PRIu64
          ", \"max_endpoints\": %u, \"unexpected_budget_bytes\": %" PRIu64
          ", \"max_unexpected_budget_bytes\": %" PRIu64
          ", \"job_unexpected_budget_bytes\": %" PRIu64
          ", \"uid_unexpected_budget_bytes\": %" PRIu64 "}",
          i ? "," : "", JsonString(j.job_uuid()).c_str(), j.uid(),
          SlurmJson(j).c_str(), ids(j, ", ").c_str(), j.pool_bytes(),
          j.region_bytes(), j.max_endpoints(), j.unexpected_budget_bytes(),
          j.max_unexpected_budget_bytes(), j.job_unexpected_budget_bytes(),
          j.uid_unexpected_budget_bytes());
    }
    printf("]}\n");
    return 0;
  }
  const auto bytes = counters::Unit::kBytes;
  printf("%-36s %6s %-12s %-16s %10s %10s %12s %10s %10s\n", "job_uuid", "uid",
         "slurm", "endpoints", "pool", "ep_budget", "ep_max", "job_budget",
         "uid_budget");
  for (const auto& j : r.jobs()) {
    std::string eps =
        ids(j, ",") + " (of " + std::to_string(j.max_endpoints()) + ")";
    const std::string slurm = SlurmText(j.slurm(), j.has_slurm());
    printf("%-36s %6u %-12s %-16s %10s %10s %12s %10s %10s\n",
           Printable(j.job_uuid()).c_str(), j.uid(),
           slurm.empty() ? "-" : slurm.c_str(), eps.c_str(),
           Human(j.pool_bytes(), bytes).c_str(),
           Human(j.unexpected_budget_bytes(), bytes).c_str(),
           Human(j.max_unexpected_budget_bytes(), bytes).c_str(),
           Human(j.job_unexpected_budget_bytes(), bytes).c_str(),
           Human(j.uid_unexpected_budget_bytes(), bytes).c_str());
  }
  return 0;
}

// jobs --check-ended JOB, for an epilog at a Slurm job's end: 0 when psmd
// holds nothing of Slurm job JOB on this node; otherwise a line per step
// left (its open endpoints, or its registration, whose end never reached
// psmd) and kFailed, so that the epilog fails and Slurm drains the node.
// Root sees every uid's jobs; anyone else only their own.
int CheckEnded(ControlClient& control, uint32_t job) {
  psmd::v1::ListJobsReply r;
  if (Status e = control.ListJobs(&r); !e.ok()) return Fail(e);
  int left = 0;
  for (const auto& j : r.jobs()) {
    if (!j.has_slurm() || j.slurm().job_id() != job) continue;
    left++;
    const std::string step = SlurmText(j.slurm(), true);
    if (j.endpoint_ids_size() > 0) {
      std::string ids;
      for (int i = 0; i < j.endpoint_ids_size(); i++) {
        ids += (i ? "," : "") + std::to_string(j.endpoint_ids(i));
      }
      printf(
          "Slurm step %s (uid %u) outlived its job: endpoints %s still open "
          "in psmd\n",
          step.c_str(), j.uid(), ids.c_str());
    } else {
      printf(
          "Slurm step %s (uid %u) outlived its job: still registered with "
          "psmd, its end never reached it (psmctl slurm-end --job %u --step "
          "%u clears it)\n",
          step.c_str(), j.uid(), j.slurm().job_id(), j.slurm().step_id());
    }
  }
  if (left > 0) return kFailed;
  printf("psmd holds nothing of Slurm job %u\n", job);
  return 0;
}

void AddJobs(CLI::App& app, Options& opts, std::function<int()>* run) {
  auto* cmd = app.add_subcommand(
      "jobs",
      "Jobs: their endpoints, payload pool and unexpected-message budgets "
      "(and Slurm steps registered without endpoints)");
  cmd->add_option("--check-ended", opts.check_ended,
                  "Exit 1, naming what is left, when psmd still holds "
                  "anything (endpoints, a step's registration) of this "
                  "Slurm job: the check of deploy/slurm/psmd-epilog")
      ->option_text("SLURM_JOB_ID")
      ->check(CLI::Range(int64_t{0}, int64_t{UINT32_MAX}));
  cmd->callback([&opts, run] {
    *run = [&opts] {
      ControlClient control(opts.socket);
      if (opts.check_ended >= 0) {
        return CheckEnded(control, static_cast<uint32_t>(opts.check_ended));
      }
      return ShowJobs(control, opts.format);
    };
  });
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
        "{\"schema_version\": %d, \"healthy\": %s, \"version\": %s, "
        "\"commit\": %s, "
        "\"uptime_seconds\": %.3f, \"endpoint_count\": %u, "
        "\"max_endpoints\": %u, \"pid\": %u, "
        "\"worker_last_turn_seconds\": %.3f, \"max_stall_seconds\": %.3f, "
        "\"generation\": %" PRIu64
        ", \"last_blackout_seconds\": %.6f, "
        "\"last_carried_endpoints\": %u, \"crash_restarts\": %" PRIu64
        ", \"last_crash_lost_endpoints\": %u, \"upgrades_failed\": %" PRIu64
        ", \"last_upgrade_failure\": %s}\n",
        kSchemaVersion, healthy ? "true" : "false",
        JsonString(r.version()).c_str(), JsonString(r.commit()).c_str(), uptime,
        r.endpoint_count(), r.max_endpoints(), r.daemon_pid(), age, max_stall,
        r.generation(), static_cast<double>(r.last_blackout_ns()) / 1e9,
        r.last_carried_endpoints(), r.crash_restarts(),
        r.last_crash_lost_endpoints(), r.upgrades_failed(),
        JsonString(r.last_upgrade_failure()).c_str());
  } else {
    printf(
        "psmd %s (commit %s, pid %u): up %.1f s, %u of %u endpoints, "
        "progress worker last turned %.3f s ago: %s\n",
        r.version().c_str(), r.commit().c_str(), r.daemon_pid(), uptime,
        r.endpoint_count(), r.max_endpoints(), age,
        healthy ? "healthy" : "STALLED");
    if (r.generation() > 0) {
      printf("handed over %" PRIu64
             " times (psmctl upgrade); the last carried %u endpoints over, "
             "blackout %.1f ms\n",
             r.generation(), r.last_carried_endpoints(),
             static_cast<double>(r.last_blackout_ns()) / 1e6);
    }
    PrintCrashes(r);
    PrintFailedUpgrades(r);
    if (r.upgrades_failed() > 0) {
      printf("the last: %s\n", r.last_upgrade_failure().c_str());
    }
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

// ---- upgrade ----

// Asks psmd to hand over to a new process, then waits until the new one
// answers: a process younger than the request. It succeeded when it counts
// one handover more; one that started empty refused the state (its log says
// why, and so did every client's library). The old psmd counts a handover
// that failed before the exec, serving on: that ends the wait at once.
int Upgrade(ControlClient& control, const std::string& exec_path,
            double timeout_s) {
  psmd::v1::HealthReply before;
  if (Status e = control.Health(&before); !e.ok()) return Fail(e);
  const auto asked = std::chrono::steady_clock::now();
  psmd::v1::UpgradeReply reply;
  if (Status e = control.Upgrade(exec_path, &reply); !e.ok()) return Fail(e);
  const auto deadline =
      asked + std::chrono::microseconds(static_cast<int64_t>(timeout_s * 1e6));
  psmd::v1::HealthReply after;
  for (;;) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    const auto now = std::chrono::steady_clock::now();
    const auto since =
        std::chrono::duration_cast<std::chrono::nanoseconds>(now - asked)
            .count();
    if (control.Health(&after).ok() &&
        (after.generation() > reply.generation() ||
         after.uptime_ns() < static_cast<uint64_t>(since))) {
      break;
    }
    if (after.daemon_pid() == before.daemon_pid() &&
        after.upgrades_failed() > before.upgrades_failed()) {
      fprintf(stderr,
              "psmctl: the upgrade failed, psmd (pid %u) serves on: %s\n",
              after.daemon_pid(), after.last_upgrade_failure().c_str());
      return kFailed;
    }
    if (now > deadline) {
      fprintf(stderr,
              "psmctl: no new psmd answered within %.0f s of the upgrade to "
              "%s; see psmd's log\n",
              timeout_s, reply.exec_path().c_str());
      return kFailed;
    }
  }
  if (after.generation() <= reply.generation()) {
    fprintf(stderr,
            "psmctl: psmd %s (pid %u) started but did not take over the %u "
            "endpoints, which have ended; its log says why\n",
            after.version().c_str(), after.daemon_pid(),
            reply.endpoint_count());
    return kFailed;
  }
  printf("psmd %s -> %s (pid %u, generation %" PRIu64
         "): %u endpoints carried over, blackout %.1f ms\n",
         before.version().c_str(), after.version().c_str(), after.daemon_pid(),
         after.generation(), after.last_carried_endpoints(),
         static_cast<double>(after.last_blackout_ns()) / 1e6);
  return 0;
}

void AddUpgrade(CLI::App& app, Options& opts, std::function<int()>* run) {
  auto* cmd = app.add_subcommand(
      "upgrade",
      "Hand psmd over to a new process without ending any endpoint (root): "
      "the binary psmd started from, or --exec PATH; exits 0 once the new "
      "psmd serves, printing the blackout");
  cmd->add_option("--exec", opts.exec_path,
                  "The new psmd binary (absolute path); it must read this "
                  "psmd's handover format (psmd --handover-format)")
      ->option_text("PATH");
  cmd->add_option("--timeout", opts.upgrade_timeout,
                  "Seconds to wait for the new psmd to answer")
      ->option_text("SECONDS (default 30)")
      ->check(CLI::PositiveNumber);
  cmd->callback([&opts, run] {
    *run = [&opts] {
      ControlClient control(opts.socket);
      return Upgrade(control, opts.exec_path, opts.upgrade_timeout);
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
      // An operator names an id, whichever endpoint has it now (epid 0).
      if (Status e = control.CloseEndpoint(opts.close_id, 0); !e.ok())
        return Fail(e);
      printf("closed endpoint %u\n", opts.close_id);
      return 0;
    };
  });
}

// ---- slurm-register, slurm-end: psmd's SPANK plugin runs them as root ----

// Parses "%016llx-%016llx" (Open MPI's orte_precondition_transports, which
// the plugin sets) into the 16 bytes of a PSM2 job key, as mtl psm2 and
// mtl psmd do (the two words' bytes in memory order).
bool ParseJobKey(const std::string& text, std::string* out) {
  unsigned long long words[2];
  char tail;
  if (text.size() != 33 || sscanf(text.c_str(), "%16llx-%16llx%c", &words[0],
                                  &words[1], &tail) != 2) {
    return false;
  }
  out->assign(reinterpret_cast<const char*>(words), sizeof(words));
  return true;
}

void AddSlurm(CLI::App& app, Options& opts, std::function<int()>* run) {
  auto* reg = app.add_subcommand(
      "slurm-register",
      "Root only, for psmd's SPANK plugin: job key KEY is Slurm step "
      "JOB.STEP's; only its tasks (uid, cgroup) may open endpoints with it");
  reg->add_option("--job-key", opts.job_key,
                  "The step's job key, as orte_precondition_transports")
      ->required();
  reg->add_option("--job", opts.slurm_job, "Slurm job id")->required();
  reg->add_option("--step", opts.slurm_step, "Slurm step id")->required();
  reg->add_option("--uid", opts.slurm_uid, "The step's uid")->required();
  reg->add_option("--cgroup", opts.slurm_cgroup,
                  "The step's cgroup: ID:CONTROLLERS:/path, a line of a "
                  "task's /proc/PID/cgroup cut after the step's directory")
      ->required();
  reg->add_option("--tasks", opts.slurm_tasks,
                  "The step's tasks on this node (its endpoints' bound; 0: "
                  "unknown)");
  reg->add_option("--memory-mib", opts.slurm_memory_mib,
                  "The step's memory on this node in MiB (its unexpected "
                  "budget's base; 0: unknown)");
  reg->callback([&opts, run] {
    *run = [&opts] {
      psmd::v1::RegisterSlurmStepRequest req;
      if (!ParseJobKey(opts.job_key, req.mutable_job_uuid())) {
        fprintf(stderr, "psmctl: --job-key: not HEX16-HEX16: '%s'\n",
                opts.job_key.c_str());
        return kUsage;
      }
      req.mutable_step()->set_job_id(opts.slurm_job);
      req.mutable_step()->set_step_id(opts.slurm_step);
      req.mutable_step()->set_uid(opts.slurm_uid);
      req.mutable_step()->set_cgroup(opts.slurm_cgroup);
      req.mutable_step()->set_tasks(opts.slurm_tasks);
      req.mutable_step()->set_memory_mib(opts.slurm_memory_mib);
      ControlClient control(opts.socket);
      if (Status e = control.RegisterSlurmStep(req); !e.ok()) return Fail(e);
      return 0;
    };
  });
  auto* end = app.add_subcommand(
      "slurm-end",
      "Root only, for psmd's SPANK plugin: Slurm step JOB.STEP ended; psmd "
      "closes the endpoints it left and this names them");
  end->add_option("--job", opts.slurm_job, "Slurm job id")->required();
  end->add_option("--step", opts.slurm_step, "Slurm step id")->required();
  end->callback([&opts, run] {
    *run = [&opts] {
      ControlClient control(opts.socket);
      psmd::v1::EndSlurmStepReply r;
      if (Status e = control.EndSlurmStep(opts.slurm_job, opts.slurm_step, &r);
          !e.ok()) {
        return Fail(e);
      }
      if (!r.registered()) {
        printf("step %u.%u was not registered here\n", opts.slurm_job,
               opts.slurm_step);
      } else {
        printf("step %u.%u ended: %d endpoints left open, closed\n",
               opts.slurm_job, opts.slurm_step, r.closed_size());
      }
      for (const auto& e : r.closed()) {
        printf("closed endpoint %u (pid %u uid %u, %s)\n", e.endpoint_id(),
               e.pid(), e.uid(), Printable(e.label()).c_str());
      }
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
            "Open endpoints: id, epid, job uuid, uid, pid, connections, label",
            ShowEndpoints);
  AddJobs(app, opts, &run);
  AddHealth(app, opts, &run);
  AddClose(app, opts, &run);
  AddUpgrade(app, opts, &run);
  AddSlurm(app, opts, &run);
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
  if (!opts.output.empty() && opts.format != "prometheus") {
    fprintf(stderr, "psmctl: --output is for --format prometheus\n");
    return kUsage;
  }
  if (access(opts.socket.c_str(), F_OK) != 0) {
    fprintf(stderr,
            "psmctl: no psmd socket at %s; is psmd running? (--socket or "
            "PSMD_SOCKET)\n",
            opts.socket.c_str());
    // A Prometheus export says so in its output too (psmd_up 0): a
    // collector must not go on reading the last file psmd was up for.
    if (opts.format == "prometheus" && opts.watch == 0) {
      return ExportPrometheus(nullptr, opts.output);
    }
    return kFailed;
  }
  return run();
}
