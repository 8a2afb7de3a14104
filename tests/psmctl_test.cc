// psmctl against a real psmd and real clients: every command's output, the
// Prometheus text parsed by prometheus_client's parser, health failing while
// the progress worker is really stopped, and PSM2_IDENTIFY.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include <chrono>
#include <filesystem>
#include <regex>
#include <thread>

#include "tests/harness.h"

namespace psmd::testing {
namespace {

const char kJob[] = "5053d0d0cccccccccccccccccccccccc";
const char kJobText[] = "5053d0d0-cccc-cccc-cccc-cccccccccccc";

class PsmctlTest : public ::testing::Test {
 protected:
  void TearDown() override {
    EXPECT_TRUE(ShmLeftovers().empty())
        << "something of ours was left in /dev/shm";
  }

  RunResult Psmctl(const Daemon& d, const std::vector<std::string>& args) {
    return psmd::testing::Psmctl(dir_, d, args);
  }

  // Both ranks of an exchange of `messages` messages that keep their
  // endpoints open `linger` seconds after it.
  std::vector<Process> StartPair(const Daemon& d, int messages, int linger,
                                 std::map<std::string, std::string> env = {}) {
    std::string rv = dir_.path() + "/rv" + std::to_string(pairs_++);
    mkdir(rv.c_str(), 0755);
    for (const auto& [k, v] : d.ClientEnv()) env[k] = v;
    std::vector<Process> ranks;
    for (int rank = 0; rank < 2; rank++) {
      std::string r = std::to_string(rank);
      ranks.push_back(Process::Start(
          {Runfile("tests/programs/exchange"), "--rank", r, "--dir", rv,
           "--uuid", kJob, "--messages", std::to_string(messages), "--max-size",
           "1000", "--linger-seconds", std::to_string(linger)},
          env, dir_.path() + "/r" + r + ".out",
          dir_.path() + "/r" + r + ".err"));
    }
    return ranks;
  }

  TempDir dir_;
  int pairs_ = 0;  // each pair meets in a fresh rendezvous directory
};

bool Contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

TEST_F(PsmctlTest, EveryCommandDescribesOpenEndpointsAndJobs) {
  Daemon d(dir_, {"--job-unexpected-mib", "100"});
  std::vector<Process> ranks = StartPair(d, 100, 8);
  // 100 messages one way, one acknowledgement back: 101 in the job.
  RunResult json;
  for (int i = 0; i < 100; i++) {
    json = Psmctl(d, {"stats", "--format", "json"});
    if (JsonNumber(json.out, "jobs", "msgs_sent") == 101) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  ASSERT_EQ(JsonNumber(json.out, "jobs", "msgs_sent"), 101) << json.out;
  EXPECT_EQ(JsonNumber(json.out, "jobs", "msgs_received"), 101);
  EXPECT_EQ(JsonNumber(json.out, "total", "msgs_sent"), 101);
  EXPECT_EQ(JsonNumber(json.out, "", "endpoint_count"), 2);
  for (const Process& p : ranks) {
    EXPECT_TRUE(Contains(json.out, "\"pid\": " + std::to_string(p.pid())))
        << json.out;
  }
  EXPECT_TRUE(Contains(json.out, std::string("\"job_uuid\": \"") + kJobText))
      << json.out;
  EXPECT_TRUE(Contains(json.out, "\"uid\": 0,")) << json.out;
  long long bytes = JsonNumber(json.out, "jobs", "bytes_sent");
  EXPECT_GT(bytes, 1024);  // 100 messages of up to 1000 B

  // The table: identities, a column per endpoint and job, human numbers.
  RunResult table = Psmctl(d, {"stats"});
  ASSERT_EQ(table.exit_code, 0) << table.err;
  long long ep = JsonNumber(json.out, "endpoints", "endpoint_id");
  EXPECT_TRUE(Contains(table.out, "ep " + std::to_string(ep))) << table.out;
  EXPECT_TRUE(Contains(table.out, "job 5053d0d0/0")) << table.out;
  EXPECT_TRUE(Contains(table.out, kJobText)) << table.out;
  EXPECT_TRUE(Contains(table.out, std::to_string(ranks[0].pid())));
  EXPECT_TRUE(
      std::regex_search(table.out, std::regex("bytes_sent +.* [0-9.]+ KiB")))
      << table.out;
  EXPECT_TRUE(std::regex_search(table.out, std::regex("msgs_sent +.* 101")))
      << table.out;

  // Prometheus, read by the parser Prometheus' own Python client uses.
  RunResult prom = Psmctl(d, {"stats", "--format", "prometheus"});
  ASSERT_EQ(prom.exit_code, 0) << prom.err;
  std::string prom_path = dir_.path() + "/psmd.prom";
  {
    FILE* f = fopen(prom_path.c_str(), "w");
    fputs(prom.out.c_str(), f);
    fclose(f);
  }
  RunResult parsed = RunToEnd(
      dir_,
      {"/usr/bin/python3", Runfile("tests/parse_prometheus.py"), prom_path},
      {});
  ASSERT_EQ(parsed.exit_code, 0) << parsed.err << prom.out;
  std::string labels = std::string("job=") + kJobText + ",uid=0";
  EXPECT_TRUE(Contains(parsed.out,
                       "sample psmd_sent_messages_total " + labels + " 101"))
      << parsed.out;
  EXPECT_TRUE(Contains(parsed.out, "sample psmd_sent_bytes_total " + labels +
                                       " " + std::to_string(bytes)))
      << parsed.out;
  EXPECT_TRUE(Contains(parsed.out, "family psmd_uptime_seconds gauge"));
  EXPECT_TRUE(Contains(parsed.out, "family psmd_bad_descriptors counter"));

  // Rates: one line per interval.
  RunResult watch =
      Psmctl(d, {"stats", "--watch", "0.2", "--count", "2", "--json"});
  ASSERT_EQ(watch.exit_code, 0) << watch.err;
  EXPECT_EQ(std::count(watch.out.begin(), watch.out.end(), '\n'), 2)
      << watch.out;
  EXPECT_TRUE(Contains(watch.out, "\"total_per_second\": {\"msgs_sent\": "))
      << watch.out;
  // Each interval stamped with when it ended (UTC).
  EXPECT_TRUE(std::regex_search(
      watch.out,
      std::regex("^\\{\"time\": \"20[0-9]{2}-[0-9]{2}-[0-9]{2}T[0-9:.]{12}Z\", "
                 "\"interval_seconds\": ")))
      << watch.out;
  RunResult watch_table =
      Psmctl(d, {"stats", "--watch", "0.2", "--count", "1"});
  ASSERT_EQ(watch_table.exit_code, 0) << watch_table.err;
  EXPECT_TRUE(
      std::regex_search(watch_table.out, std::regex("msgs_sent +.*0 /s")))
      << watch_table.out;
  EXPECT_TRUE(std::regex_search(
      watch_table.out,
      std::regex("^20[0-9]{2}-[0-9]{2}-[0-9]{2}T[0-9:.]{12}Z psmd rates over "
                 "[0-9.]+ s, [0-9]+ endpoints?\n")))
      << watch_table.out;

  // Jobs: endpoints and budgets.
  RunResult jobs = Psmctl(d, {"jobs", "--json"});
  ASSERT_EQ(jobs.exit_code, 0) << jobs.err;
  EXPECT_EQ(JsonNumber(jobs.out, "", "job_unexpected_budget_bytes"),
            100ll << 20)
      << jobs.out;
  EXPECT_EQ(JsonNumber(jobs.out, "", "max_endpoints"), 64);
  EXPECT_TRUE(Contains(jobs.out, kJobText));
  RunResult jobs_table = Psmctl(d, {"jobs"});
  ASSERT_EQ(jobs_table.exit_code, 0);
  EXPECT_TRUE(Contains(jobs_table.out, kJobText)) << jobs_table.out;
  EXPECT_TRUE(Contains(jobs_table.out, "100.0 MiB")) << jobs_table.out;
  EXPECT_TRUE(Contains(jobs_table.out, "(of 64)")) << jobs_table.out;

  // Endpoints, still as before.
  RunResult eps = Psmctl(d, {"endpoints"});
  ASSERT_EQ(eps.exit_code, 0);
  // The identity columns in the order stats shows them.
  EXPECT_TRUE(std::regex_search(
      eps.out, std::regex("^endpoint +epid +job_uuid +uid +pid +conns +label")))
      << eps.out;
  RunResult stats_table = Psmctl(d, {"stats"});
  EXPECT_TRUE(std::regex_search(
      stats_table.out,
      std::regex("\nendpoint +epid +job_uuid +uid +pid +label\n")))
      << stats_table.out;
  EXPECT_TRUE(Contains(eps.out, std::to_string(ranks[1].pid()))) << eps.out;
  EXPECT_TRUE(Contains(eps.out, "exchange")) << eps.out;

  for (Process& p : ranks) EXPECT_EQ(p.Wait(30), 0);
  EXPECT_TRUE(d.Stop());
}

TEST_F(PsmctlTest, UsageErrorsAreNamedBeforeTheSocketIsTried) {
  RunResult r = RunToEnd(
      dir_, {Runfile("tools/psmctl"), "--socket", "/nonexistent/s", "stast"},
      {});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_TRUE(Contains(r.err, "unknown command 'stast'")) << r.err;
  EXPECT_FALSE(Contains(r.err, "socket")) << r.err;

  r = RunToEnd(dir_, {Runfile("tools/psmctl"), "stats", "--bogus"}, {});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_TRUE(Contains(r.err, "unexpected argument '--bogus'")) << r.err;

  r = RunToEnd(dir_, {Runfile("tools/psmctl"), "--format", "xml", "stats"}, {});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_TRUE(Contains(r.err, "xml")) << r.err;

  r = RunToEnd(dir_, {Runfile("tools/psmctl")}, {});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_TRUE(Contains(r.err, "Subcommands:")) << r.err;

  r = RunToEnd(dir_, {Runfile("tools/psmctl"), "--version"}, {});
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_TRUE(std::regex_search(
      r.out, std::regex("^psmctl [0-9]+\\.[0-9]+\\.[0-9]+ \\(commit ")))
      << r.out;

  r = RunToEnd(dir_, {Runfile("tools/psmctl"), "health", "--help"}, {});
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_TRUE(Contains(r.out, "--max-stall SECONDS (default 5)")) << r.out;

  r = RunToEnd(dir_,
               {Runfile("tools/psmctl"), "--socket", "/nonexistent/s", "stats"},
               {});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_TRUE(Contains(r.err, "no psmd socket at /nonexistent/s")) << r.err;
}

TEST_F(PsmctlTest, HealthFailsWhileTheProgressWorkerIsStopped) {
  Daemon d(dir_);
  RunResult ok = Psmctl(d, {"health"});
  ASSERT_EQ(ok.exit_code, 0) << ok.err;
  EXPECT_TRUE(Contains(ok.out, ": healthy")) << ok.out;

  // Stop only the worker thread, as a bug that wedges it would: ptrace stops
  // one thread; the gRPC threads still answer.
  StoppedThread worker(d.pid(), "psmd-progress");
  ASSERT_EQ(worker.error(), "");
  std::this_thread::sleep_for(std::chrono::milliseconds(2500));
  RunResult stalled = Psmctl(d, {"health", "--max-stall", "2"});
  RunResult stalled_json = Psmctl(d, {"health", "--max-stall", "2", "--json"});
  worker.Resume();
  EXPECT_EQ(stalled.exit_code, 1);
  EXPECT_TRUE(Contains(stalled.out, "STALLED")) << stalled.out;
  EXPECT_TRUE(Contains(stalled.err, "has not turned")) << stalled.err;
  EXPECT_TRUE(Contains(stalled_json.out, "\"healthy\": false"))
      << stalled_json.out;
  EXPECT_GE(JsonNumber(stalled_json.out, "", "worker_last_turn_seconds"), 2);

  // Running again, it turns at least once a second even with nothing to do.
  RunResult again;
  for (int i = 0; i < 30; i++) {
    again = Psmctl(d, {"health", "--max-stall", "2"});
    if (again.exit_code == 0) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  EXPECT_EQ(again.exit_code, 0) << again.out << again.err;
  EXPECT_TRUE(d.Stop());
}

TEST_F(PsmctlTest, Psm2IdentifyNamesTheLibraryAndTheDaemon) {
  Daemon d(dir_);
  RunResult version =
      RunToEnd(dir_, {Runfile("tools/psmctl"), "--version"}, {});
  std::smatch m;
  ASSERT_TRUE(std::regex_search(version.out, m, std::regex("psmctl (.*)\n")))
      << version.out;
  const std::string build = m[1];  // "0.6.0 (commit ...)", the same build

  std::vector<Process> ranks = StartPair(d, 10, 0, {{"PSM2_IDENTIFY", "1"}});
  for (Process& p : ranks) EXPECT_EQ(p.Wait(30), 0);
  std::string err = ReadFile(dir_.path() + "/r0.err");
  EXPECT_TRUE(std::regex_search(
      err, std::regex("\\.[0-9]+: PSM2: psmd .* version: 2\\.2, from "
                      "/.*libpsm2\\.so\\.2\n")))
      << err;
  EXPECT_TRUE(Contains(err, "PSM2: psmd " + build)) << err;
  EXPECT_TRUE(Contains(err, "served by psmd " + build + " at " + d.socket()))
      << err;

  // Unset: nothing.
  ranks = StartPair(d, 10, 0);
  for (Process& p : ranks) EXPECT_EQ(p.Wait(30), 0);
  EXPECT_FALSE(Contains(ReadFile(dir_.path() + "/r0.err"), "PSM2:"));
  EXPECT_TRUE(d.Stop());
}

}  // namespace
}  // namespace psmd::testing
