// psmctl against a real psmd and real clients: every command's output and
// its layout, the JSON schema version, the Prometheus text (parsed by
// prometheus_client's parser and checked by promtool: counters never fall
// while jobs end, psmd_up 0 in an atomically replaced file when psmd is
// gone), health failing while the progress worker is really stopped, and
// PSM2_IDENTIFY.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include <chrono>
#include <filesystem>
#include <map>
#include <regex>
#include <sstream>
#include <thread>

#include "tests/harness.h"

namespace psmd::testing {
namespace {

const char kJob[] = "5053d0d0cccccccccccccccccccccccc";
const char kJobText[] = "5053d0d0-cccc-cccc-cccc-cccccccccccc";
// Debian's prometheus package; the test fails without it (scripts/deps.sh).
const char kPromtool[] = "/usr/bin/promtool";

class PsmctlTest : public ::testing::Test {
 protected:
  void TearDown() override {
    EXPECT_TRUE(ShmLeftovers().empty())
        << "something of ours was left in /dev/shm";
  }

  RunResult Psmctl(const Daemon& d, const std::vector<std::string>& args) {
    return psmd::testing::Psmctl(dir_, d, args);
  }

  // Both ranks of an exchange of `messages` messages in job `uuid` that keep
  // their endpoints open `linger` seconds after it; their output in
  // p<pair>r<rank>.out and .err, pairs counted from 0.
  std::vector<Process> StartPair(const Daemon& d, int messages, int linger,
                                 std::map<std::string, std::string> env = {},
                                 const std::string& uuid = kJob) {
    const std::string pair = std::to_string(pairs_++);
    std::string rv = dir_.path() + "/rv" + pair;
    mkdir(rv.c_str(), 0755);
    for (const auto& [k, v] : d.ClientEnv()) env[k] = v;
    std::vector<Process> ranks;
    for (int rank = 0; rank < 2; rank++) {
      std::string r = std::to_string(rank);
      ranks.push_back(Process::Start(
          {Runfile("tests/programs/exchange"), "--rank", r, "--dir", rv,
           "--uuid", uuid, "--messages", std::to_string(messages), "--max-size",
           "1000", "--linger-seconds", std::to_string(linger)},
          env, dir_.path() + "/p" + pair + "r" + r + ".out",
          dir_.path() + "/p" + pair + "r" + r + ".err"));
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

  // Every JSON answer begins with its schema version; lists are wrapped.
  EXPECT_EQ(json.out.rfind("{\"schema_version\": 1, ", 0), 0u) << json.out;
  EXPECT_EQ(JsonNumber(json.out, "jobs", "open_endpoints"), 2) << json.out;

  // The table: a line per endpoint, job and the total, a column per
  // counter (bytes human-readable), identities in psmctl endpoints' order.
  RunResult table = Psmctl(d, {"stats"});
  ASSERT_EQ(table.exit_code, 0) << table.err;
  std::smatch heading;
  ASSERT_TRUE(std::regex_search(
      table.out, heading,
      std::regex("\nendpoint +job_uuid +uid +pid +msgs_sent +bytes_sent "
                 "[a-z_ ]* recvs_refused  label\n")))
      << table.out;
  long long ep = JsonNumber(json.out, "endpoints", "endpoint_id");
  for (const Process& p : ranks) {
    EXPECT_TRUE(std::regex_search(
        table.out, std::regex("\n[0-9]+ +" + std::string(kJobText) + " +0 +" +
                              std::to_string(p.pid()) +
                              " +[0-9]+ +[0-9.]+ (KiB|B) .* exchange\n")))
        << table.out;
  }
  EXPECT_TRUE(
      std::regex_search(table.out, std::regex("\n" + std::to_string(ep) + " ")))
      << table.out;
  std::smatch job_row;
  ASSERT_TRUE(
      std::regex_search(table.out, job_row,
                        std::regex("\njob +" + std::string(kJobText) +
                                   " +0 +- +101 +[0-9.]+ KiB .* 2 open\n")))
      << table.out;
  EXPECT_TRUE(std::regex_search(
      table.out, std::regex("\ntotal +- +- +- +101 +[0-9.]+ KiB .* since psmd "
                            "started\n")))
      << table.out;
  // Aligned: "101" ends where the heading "msgs_sent" does.
  const std::string head = heading.str(), row = job_row.str();
  EXPECT_EQ(head.find("msgs_sent") + strlen("msgs_sent"),
            row.find(" 101 ") + strlen(" 101"))
      << head << row;

  // Rates: one line per interval, stamped with when it ended (UTC).
  RunResult watch =
      Psmctl(d, {"stats", "--watch", "0.2", "--count", "2", "--json"});
  ASSERT_EQ(watch.exit_code, 0) << watch.err;
  EXPECT_EQ(std::count(watch.out.begin(), watch.out.end(), '\n'), 2)
      << watch.out;
  const std::regex stamped_json(
      "\\{\"schema_version\": 1, \"time\": "
      "\"20[0-9]{2}-[0-9]{2}-[0-9]{2}T[0-9:.]{12}Z\", \"interval_seconds\": "
      "[0-9.]+, \"endpoints\": \\[.*\\], \"total_per_second\": "
      "\\{\"msgs_sent\": [0-9.]+, .*\\}\\}");
  std::istringstream watch_lines(watch.out);
  for (std::string line; std::getline(watch_lines, line);) {
    EXPECT_TRUE(std::regex_match(line, stamped_json)) << line;
  }
  RunResult watch_table =
      Psmctl(d, {"stats", "--watch", "0.2", "--count", "2"});
  ASSERT_EQ(watch_table.exit_code, 0) << watch_table.err;
  EXPECT_TRUE(std::regex_match(
      watch_table.out,
      std::regex("time +seconds +endpoints +msgs_sent +bytes_sent [a-z_ ]* "
                 "recvs_refused  \\(per second\\)\n"
                 "(20[0-9]{2}-[0-9]{2}-[0-9]{2}T[0-9:.]{12}Z +[0-9.]+ +2 +"
                 "[0-9.]+ +[0-9.]+ B[^\n]*\n){2}")))
      << watch_table.out;

  // Jobs: endpoints and budgets.
  RunResult jobs = Psmctl(d, {"jobs", "--json"});
  ASSERT_EQ(jobs.exit_code, 0) << jobs.err;
  EXPECT_EQ(jobs.out.rfind("{\"schema_version\": 1, \"jobs\": [", 0), 0u)
      << jobs.out;
  EXPECT_EQ(JsonNumber(jobs.out, "jobs", "job_unexpected_budget_bytes"),
            100ll << 20)
      << jobs.out;
  EXPECT_EQ(JsonNumber(jobs.out, "jobs", "max_endpoints"), 64);
  EXPECT_TRUE(Contains(jobs.out, kJobText));
  RunResult jobs_table = Psmctl(d, {"jobs"});
  ASSERT_EQ(jobs_table.exit_code, 0);
  EXPECT_TRUE(Contains(jobs_table.out, kJobText)) << jobs_table.out;
  EXPECT_TRUE(Contains(jobs_table.out, "100.0 MiB")) << jobs_table.out;
  EXPECT_TRUE(Contains(jobs_table.out, "(of 64)")) << jobs_table.out;

  // Endpoints: the identity columns in the order stats shows them.
  RunResult eps = Psmctl(d, {"endpoints"});
  ASSERT_EQ(eps.exit_code, 0);
  EXPECT_TRUE(std::regex_search(
      eps.out,
      std::regex("^endpoint +epid +job_uuid +uid +pid +conns +shard +label")))
      << eps.out;
  EXPECT_TRUE(Contains(eps.out, std::to_string(ranks[1].pid()))) << eps.out;
  EXPECT_TRUE(Contains(eps.out, "exchange")) << eps.out;
  RunResult eps_json = Psmctl(d, {"endpoints", "--json"});
  EXPECT_EQ(eps_json.out.rfind("{\"schema_version\": 1, \"endpoints\": [", 0),
            0u)
      << eps_json.out;
  EXPECT_EQ(JsonNumber(eps_json.out, "endpoints", "connections"), 1)
      << eps_json.out;
  RunResult health = Psmctl(d, {"health", "--json"});
  EXPECT_EQ(health.out.rfind("{\"schema_version\": 1, \"healthy\": true", 0),
            0u)
      << health.out;

  for (Process& p : ranks) EXPECT_EQ(p.Wait(30), 0);
  EXPECT_TRUE(d.Stop());
}

// The samples of a Prometheus text, "name{labels}" -> value, as
// prometheus_client's parser reads them (it fails on what it refuses).
std::map<std::string, double> Samples(const TempDir& dir,
                                      const std::string& path) {
  RunResult parsed = RunToEnd(
      dir, {"/usr/bin/python3", Runfile("tests/parse_prometheus.py"), path},
      {});
  EXPECT_EQ(parsed.exit_code, 0) << parsed.err << ReadFile(path);
  std::map<std::string, double> samples;
  std::istringstream lines(parsed.out);
  for (std::string kind, name, labels, value; lines >> kind;) {
    if (kind == "family") {
      std::getline(lines, value);
      continue;
    }
    lines >> name >> labels >> value;
    samples[name + "{" + (labels == "-" ? "" : labels) + "}"] =
        std::stod(value);
  }
  return samples;
}

// promtool's verdict on a Prometheus text: "" when it passes.
std::string Promtool(const TempDir& dir, const std::string& path) {
  if (!std::filesystem::exists(kPromtool)) {
    return std::string(kPromtool) +
           " missing: install prometheus "
           "(scripts/deps.sh)";
  }
  RunResult r = RunToEnd(
      dir,
      {"/bin/sh", "-c", std::string(kPromtool) + " check metrics < " + path},
      {});
  return r.exit_code == 0 && r.out.empty() && r.err.empty()
             ? ""
             : "exit " + std::to_string(r.exit_code) + ": " + r.out + r.err;
}

TEST_F(PsmctlTest, PrometheusCountersNeverFallAndPsmdDownIsExported) {
  Daemon d(dir_);
  const std::string prom = dir_.path() + "/psmd.prom";
  // psmctl stats --format prometheus --output, parsed and checked.
  auto scrape = [&] {
    RunResult r =
        Psmctl(d, {"stats", "--format", "prometheus", "--output", prom});
    EXPECT_EQ(r.exit_code, 0) << r.err;
    EXPECT_EQ(Promtool(dir_, prom), "");
    EXPECT_TRUE(r.out.empty()) << r.out;  // all of it went to the file
    return Samples(dir_, prom);
  };
  // One job of two pairs: the first ends while the second still runs.
  std::vector<Process> first = StartPair(d, 1000, 3);
  std::vector<Process> second = StartPair(d, 10, 8);
  // Each pair's messages and one acknowledgement.
  const std::string job = "job_uuid=" + std::string(kJobText) + ",uid=0";
  const std::string job_sent = "psmd_job_msgs_sent_total{" + job + "}";
  // The first scrape that finds `open` endpoints and the job's messages
  // counted up to `sent`.
  auto scrape_when = [&](double open, double sent) {
    std::map<std::string, double> samples;
    EXPECT_TRUE(WaitUntil(20, [&] {
      samples = scrape();
      return samples["psmd_endpoints{}"] == open && samples[job_sent] >= sent;
    })) << ReadFile(prom);
    return samples;
  };
  std::map<std::string, double> both = scrape_when(4, 1001 + 11);
  for (Process& p : first) EXPECT_EQ(p.Wait(30), 0);
  std::map<std::string, double> one_closed = scrape_when(2, 0);
  for (Process& p : second) EXPECT_EQ(p.Wait(30), 0);
  std::map<std::string, double> ended = scrape_when(0, 0);

  // Every counter of an earlier scrape is there later, never lower: the
  // job's series keep their closed endpoints, and outlive the job.
  for (const auto* later : {&one_closed, &ended}) {
    for (const auto* earlier : {&both, &one_closed}) {
      if (earlier == later) break;
      for (const auto& [series, value] : *earlier) {
        if (series.find("_total{") == std::string::npos) continue;
        ASSERT_EQ(later->count(series), 1u) << series << " gone";
        EXPECT_GE(later->at(series), value) << series << " fell";
      }
    }
  }
  EXPECT_EQ(ended[job_sent], 1012);
  EXPECT_EQ(ended["psmd_job_msgs_received_total{" + job + "}"], 1012);
  // The node's totals, without labels, under the names of table and JSON.
  EXPECT_EQ(ended["psmd_msgs_sent_total{}"], 1012);
  EXPECT_GT(ended["psmd_bytes_sent_total{}"], 1000);
  EXPECT_EQ(ended["psmd_bad_descriptors_total{}"], 0);
  EXPECT_EQ(ended.count("psmd_bad_descriptors_total{}"), 1u);
  // psmd itself: up, its build, when it started (the same in each scrape).
  EXPECT_EQ(ended["psmd_up{}"], 1);
  EXPECT_EQ(both["psmd_start_time_seconds{}"],
            ended["psmd_start_time_seconds{}"]);
  EXPECT_GT(ended["psmd_start_time_seconds{}"], 1.7e9);
  RunResult version =
      RunToEnd(dir_, {Runfile("tools/psmctl"), "--version"}, {});
  std::smatch build;
  ASSERT_TRUE(std::regex_search(
      version.out, build, std::regex("psmctl (\\S+) \\(commit (\\S+)\\)")));
  EXPECT_EQ(ended["psmd_build_info{commit=" + build[2].str() +
                  ",version=" + build[1].str() + "}"],
            1)
      << ReadFile(prom);
  // The label is job_uuid: Prometheus adds its own "job" at scrape time.
  EXPECT_FALSE(std::regex_search(ReadFile(prom), std::regex("[{,]job=")));

  // A file psmctl cannot write is a failure, not a silent stale file.
  RunResult unwritable = Psmctl(d, {"stats", "--format", "prometheus",
                                    "--output", dir_.path() + "/no/psmd.prom"});
  EXPECT_EQ(unwritable.exit_code, 1);
  EXPECT_TRUE(Contains(unwritable.err,
                       "cannot create " + dir_.path() + "/no/psmd.prom."))
      << unwritable.err;

  // psmd gone: the file is replaced (a new inode: renamed over, never
  // rewritten in place) by one that says so, and psmctl exits 1.
  struct stat up_file;
  ASSERT_EQ(stat(prom.c_str(), &up_file), 0);
  ASSERT_TRUE(d.Stop());
  RunResult down =
      Psmctl(d, {"stats", "--format", "prometheus", "--output", prom});
  EXPECT_EQ(down.exit_code, 1);
  EXPECT_FALSE(down.err.empty());
  struct stat down_file;
  ASSERT_EQ(stat(prom.c_str(), &down_file), 0);
  EXPECT_NE(down_file.st_ino, up_file.st_ino);
  EXPECT_EQ(down_file.st_mode & 0777, 0644u);  // node_exporter's to read
  EXPECT_EQ(Promtool(dir_, prom), "");
  std::map<std::string, double> gone = Samples(dir_, prom);
  EXPECT_EQ(gone.size(), 1u) << ReadFile(prom);
  EXPECT_EQ(gone["psmd_up{}"], 0);
  // No temporary file left beside it.
  for (const auto& entry : std::filesystem::directory_iterator(dir_.path())) {
    EXPECT_EQ(entry.path().filename().string().rfind("psmd.prom.", 0),
              std::string::npos)
        << entry.path();
  }
  // The same on standard output.
  RunResult down_stdout = Psmctl(d, {"stats", "--format", "prometheus"});
  EXPECT_EQ(down_stdout.exit_code, 1);
  EXPECT_TRUE(Contains(down_stdout.out, "\npsmd_up 0\n")) << down_stdout.out;
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

  r = RunToEnd(dir_,
               {Runfile("tools/psmctl"), "--socket", "/nonexistent/s", "stats",
                "--output", dir_.path() + "/psmd.prom"},
               {});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_TRUE(Contains(r.err, "--output is for --format prometheus")) << r.err;
  EXPECT_FALSE(std::filesystem::exists(dir_.path() + "/psmd.prom"));

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
  std::string err = ReadFile(dir_.path() + "/p0r0.err");
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
  EXPECT_FALSE(Contains(ReadFile(dir_.path() + "/p1r0.err"), "PSM2:"));
  EXPECT_TRUE(d.Stop());
}

}  // namespace
}  // namespace psmd::testing
