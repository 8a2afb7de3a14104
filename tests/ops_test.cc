// Operations tests: psmd as a systemd service (notify, watchdog, SIGHUP), its
// configuration file and flags, its log under hostile clients, and what it
// does with an existing file at its socket path. Real psmd processes, real
// clients, real sockets throughout (tests/harness.h); this test plays
// systemd's part of the notify protocol itself.
#include <dirent.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <fstream>
#include <regex>
#include <sstream>
#include <thread>

#include "tests/harness.h"

namespace psmd::testing {
namespace {

const char kJob[] = "5053d0d0cccccccccccccccccccccccc";

std::string Psmd() { return Runfile("daemon/psmd"); }

void WriteFile(const std::string& path, const std::string& text) {
  std::ofstream(path) << text;
}

std::vector<std::string> Lines(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

int CountOf(const std::vector<std::string>& items, const std::string& needle) {
  int n = 0;
  for (const auto& item : items) n += item.find(needle) != std::string::npos;
  return n;
}

sockaddr_un UnixAddress(const std::string& path) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  strncpy(addr.sun_path, path.c_str(), sizeof(addr.sun_path) - 1);
  return addr;
}

// Polls psmd's log until it contains `needle` (true) or timeout_s passes.
bool WaitForLog(const Daemon& d, const std::string& needle,
                double timeout_s = 5) {
  return WaitUntil(timeout_s,
                   [&] { return d.Log().find(needle) != std::string::npos; });
}

// systemd's end of sd_notify: a datagram socket psmd finds in NOTIFY_SOCKET.
class NotifySocket {
 public:
  explicit NotifySocket(const std::string& path) : path_(path) {
    fd_ = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    sockaddr_un addr = UnixAddress(path);
    bound_ = bind(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
  }
  ~NotifySocket() {
    close(fd_);
    unlink(path_.c_str());
  }
  bool ok() const { return bound_; }
  const std::string& path() const { return path_; }

  // Every message received for timeout_s, or until one contains `until`.
  std::vector<std::string> Receive(double timeout_s,
                                   const std::string& until = "") {
    std::vector<std::string> got;
    auto deadline = std::chrono::steady_clock::now() +
                    std::chrono::duration<double>(timeout_s);
    for (;;) {
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
                      deadline - std::chrono::steady_clock::now())
                      .count();
      if (left <= 0) break;
      pollfd p{fd_, POLLIN, 0};
      if (poll(&p, 1, static_cast<int>(left)) <= 0) continue;
      char buf[4096];
      ssize_t n = recv(fd_, buf, sizeof(buf), 0);
      if (n <= 0) continue;
      got.emplace_back(buf, static_cast<size_t>(n));
      if (!until.empty() && got.back().find(until) != std::string::npos) break;
    }
    return got;
  }

 private:
  std::string path_;
  int fd_ = -1;
  bool bound_ = false;
};

// The judge of every wait in these tests: a state never reached is reported as
// such once the bound passed (the old waits ran out silently and the test
// went on), one reached at once returns at once.
TEST(HarnessTest, WaitUntilReportsAStateNeverReached) {
  const auto start = std::chrono::steady_clock::now();
  EXPECT_FALSE(WaitUntil(0.05, [] { return false; }));
  EXPECT_GE(std::chrono::steady_clock::now() - start,
            std::chrono::milliseconds(50));
  int calls = 0;
  EXPECT_TRUE(WaitUntil(5, [&] { return ++calls == 3; }));
  EXPECT_EQ(calls, 3);
}

// The id of the thread of `pid` named `name` (pthread_setname_np), or -1.
TEST(ServiceTest, NotifiesReadyStatusAndWatchdogPingsFromTheWorker) {
  TempDir dir;
  NotifySocket notify(dir.path() + "/notify");
  ASSERT_TRUE(notify.ok());
  // 400 ms: psmd pings every 100 ms.
  Daemon d(dir, {},
           {{"NOTIFY_SOCKET", notify.path()}, {"WATCHDOG_USEC", "400000"}});
  auto start = notify.Receive(5, "READY=1");
  ASSERT_GE(CountOf(start, "READY=1"), 1) << d.Log();
  EXPECT_GE(CountOf(start, "STATUS=serving " + d.socket()), 1);
  // READY=1 means the socket accepts: a control call succeeds at once.
  EXPECT_EQ(Psmctl(dir, d, {"health"}).exit_code, 0);
  EXPECT_GE(CountOf(notify.Receive(1.0), "WATCHDOG=1"), 5);

  // Stall the progress worker alone (ptrace stops one thread; the rest of
  // psmd runs on): the pings must stop, since they prove the worker turns.
  StoppedThread worker(d.pid(), "psmd-progress");
  ASSERT_EQ(worker.error(), "");
  notify.Receive(0.05);  // whatever was sent before the stop
  EXPECT_EQ(CountOf(notify.Receive(1.0), "WATCHDOG=1"), 0);
  EXPECT_EQ(Psmctl(dir, d, {"health"}).exit_code, 0)
      << "the control plane should run while the worker is stuck";
  worker.Resume();
  EXPECT_GE(CountOf(notify.Receive(1.0), "WATCHDOG=1"), 3);

  EXPECT_TRUE(d.Stop());
  EXPECT_GE(CountOf(notify.Receive(1.0), "STOPPING=1"), 1);
}

TEST(ServiceTest, SighupUnderTrafficReloadsAndNeverEndsTheDaemon) {
  TempDir dir;
  std::string conf = dir.path() + "/psmd.toml";
  WriteFile(conf, "log_level = \"warn\"\n");
  Daemon d(dir, {"--config", conf});
  std::string rv = dir.path() + "/rv";
  mkdir(rv.c_str(), 0755);
  Process r1 = Process::Start(ExchangeArgs(dir, rv, 1, kJob, 100000, 4000),
                              d.ClientEnv(), rv + "/r1.out", rv + "/r1.err");
  Process r0 = Process::Start(ExchangeArgs(dir, rv, 0, kJob, 100000, 4000),
                              d.ClientEnv(), rv + "/r0.out", rv + "/r0.err");
  // Both endpoints open (at level warn, nothing logged for that): the
  // reloads must come while the traffic runs.
  auto endpoints = [&] {
    return JsonNumber(Psmctl(dir, d, {"health", "--json"}).out, "",
                      "endpoint_count");
  };
  // A connection, not the count alone: the count includes an endpoint
  // whose open is still under way (its "opened endpoint" line not yet
  // written, and then written at the new level). A connection needs both
  // opens returned to their ranks, which is after both lines.
  auto connected = [&] {
    return JsonNumber(Psmctl(dir, d, {"endpoints", "--json"}).out, "endpoints",
                      "connections") >= 1;
  };
  ASSERT_TRUE(WaitUntil(5, [&] { return endpoints() == 2 && connected(); }))
      << "the pair never opened its endpoints: " << d.Log();
  WriteFile(conf,
            "log_level = \"info\"\nspin_us = 50\nsq_slots = 512\n"
            "workers = 2\n");
  for (int i = 0; i < 20; i++) {
    kill(d.pid(), SIGHUP);
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(endpoints(), 2) << "the pair ended before the last reload";
  EXPECT_EQ(r0.Wait(60), 0) << ReadFile(rv + "/r0.err");
  EXPECT_EQ(r1.Wait(60), 0) << ReadFile(rv + "/r1.err");
  ASSERT_TRUE(WaitForLog(d, "reload done"));
  std::string log = d.Log();
  EXPECT_EQ(log.find("opened endpoint"), std::string::npos) << log;
  EXPECT_NE(log.find("reload: log_level: warn -> info"), std::string::npos)
      << log;
  EXPECT_NE(log.find("reload: spin_us: 200 -> 50"), std::string::npos) << log;
  EXPECT_NE(log.find("sq_slots: 256 -> 512 takes effect only when psmd "
                     "restarts"),
            std::string::npos)
      << log;
  EXPECT_NE(log.find("workers: 1 -> 2 takes effect only when psmd restarts"),
            std::string::npos)
      << log;

  // The new level is in force: a new client's endpoint is logged at info.
  std::string rv2 = dir.path() + "/rv2";
  mkdir(rv2.c_str(), 0755);
  Process s1 = Process::Start(ExchangeArgs(dir, rv2, 1, kJob, 10, 100),
                              d.ClientEnv(), rv2 + "/r1.out", rv2 + "/r1.err");
  RunResult s0 = RunToEnd(dir, ExchangeArgs(dir, rv2, 0, kJob, 10, 100),
                          d.ClientEnv(), 30);
  EXPECT_EQ(s0.exit_code, 0) << s0.out << s0.err << "\n" << d.Log();
  EXPECT_EQ(s1.Wait(30), 0) << ReadFile(rv2 + "/r1.err");
  EXPECT_TRUE(WaitForLog(d, "opened endpoint"));
  RunResult config = Psmctl(dir, d, {"config"});
  EXPECT_NE(config.out.find("spin_us = 50\n"), std::string::npos) << config.out;
  EXPECT_NE(config.out.find("sq_slots = 256\n"), std::string::npos)
      << config.out;

  // A broken file is refused whole; the daemon keeps what it had.
  WriteFile(conf, "spin_us = \"fast\"\n");
  kill(d.pid(), SIGHUP);
  EXPECT_TRUE(WaitForLog(d, "reload refused"));
  EXPECT_NE(Psmctl(dir, d, {"config"}).out.find("spin_us = 50\n"),
            std::string::npos);
  EXPECT_TRUE(d.Stop()) << d.Log();  // exit code 0 after SIGTERM
}

TEST(ConfigTest, FileValuesApplyAndFlagsWin) {
  TempDir dir;
  std::string conf = dir.path() + "/psmd.toml";
  WriteFile(conf,
            "# a comment\nspin_us = 50\nmax_endpoints = 10\n"
            "log_level = \"debug\"\n");
  RunResult r = RunToEnd(
      dir, {Psmd(), "--config", conf, "--spin-us=70", "--check-config"}, {});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  // A word where a number setting takes one, from the file and the flags,
  // printed back as a string the file reads again.
  std::string words = dir.path() + "/words.toml";
  WriteFile(words, "workers = \"auto\"\nworker_cpus = \"0-1\"\n");
  RunResult auto_workers =
      RunToEnd(dir, {Psmd(), "--config", words, "--check-config"}, {});
  ASSERT_EQ(auto_workers.exit_code, 0) << auto_workers.err;
  EXPECT_NE(auto_workers.out.find("workers = 'auto'\n"), std::string::npos)
      << auto_workers.out;
  EXPECT_NE(auto_workers.out.find("worker_cpus = '0-1'\n"), std::string::npos)
      << auto_workers.out;
  RunResult bad_cpus =
      RunToEnd(dir, {Psmd(), "--worker-cpus", "1-0", "--check-config"}, {});
  EXPECT_EQ(bad_cpus.exit_code, 2) << bad_cpus.out;
  EXPECT_NE(r.out.find("spin_us = 70\n"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("max_endpoints = 10\n"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("log_level = 'debug'\n"), std::string::npos) << r.out;
  // What --check-config prints is itself a valid file with the same values.
  std::string round = dir.path() + "/round.toml";
  WriteFile(round, r.out);
  RunResult again =
      RunToEnd(dir, {Psmd(), "--config", round, "--check-config"}, {});
  EXPECT_EQ(again.exit_code, 0) << again.err;
  EXPECT_EQ(again.out, r.out);

  // The running daemon reports the same through GetConfig.
  Daemon d(dir, {"--config", conf, "--spin-us", "70"});
  RunResult shown = Psmctl(dir, d, {"config"});
  EXPECT_EQ(shown.exit_code, 0) << shown.err;
  EXPECT_NE(shown.out.find("spin_us = 70\n"), std::string::npos) << shown.out;
  EXPECT_NE(shown.out.find("max_endpoints = 10\n"), std::string::npos);
}

TEST(ConfigTest, BadValuesGetOneLineEachAndExitCode2) {
  TempDir dir;
  std::string conf = dir.path() + "/psmd.toml";
  WriteFile(conf,
            "spin_us = -1\nsq_slots = 100\nlog_level = \"loud\"\n"
            "region_mib = \"big\"\nnode_id = 3\n");
  RunResult r = RunToEnd(dir, {Psmd(), "--config", conf, "--check-config"}, {});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_EQ(r.out, "");
  auto lines = Lines(r.err);
  ASSERT_EQ(lines.size(), 4u) << r.err;
  EXPECT_NE(lines[0].find(conf + ":1: spin_us = -1: expected"),
            std::string::npos)
      << lines[0];
  EXPECT_NE(lines[1].find(":2: sq_slots = 100: expected a power of two"),
            std::string::npos);
  EXPECT_NE(lines[2].find(":3: log_level = loud: expected one of"),
            std::string::npos);
  EXPECT_NE(lines[3].find(":4: region_mib: expected a number"),
            std::string::npos);

  // The same checks for flags, and values that conflict.
  RunResult flag = RunToEnd(dir, {Psmd(), "--spin-us", "abc"}, {});
  EXPECT_EQ(flag.exit_code, 2);
  EXPECT_NE(flag.err.find("--spin-us abc: expected"), std::string::npos)
      << flag.err;
  RunResult both = RunToEnd(
      dir, {Psmd(), "--unexpected-mib", "64", "--max-unexpected-mib", "8"}, {});
  EXPECT_EQ(both.exit_code, 2);
  EXPECT_NE(both.err.find("must not exceed"), std::string::npos) << both.err;
  // A --config file that is not there is an error (a missing default is not).
  RunResult missing = RunToEnd(
      dir, {Psmd(), "--config", dir.path() + "/none.toml", "--check-config"},
      {});
  EXPECT_EQ(missing.exit_code, 2);
  EXPECT_NE(missing.err.find("none.toml: cannot read"), std::string::npos);
  // Not TOML at all.
  WriteFile(conf, "spin_us = = 3\n");
  RunResult syntax =
      RunToEnd(dir, {Psmd(), "--config", conf, "--check-config"}, {});
  EXPECT_EQ(syntax.exit_code, 2);
  EXPECT_NE(syntax.err.find(conf + ":1:"), std::string::npos) << syntax.err;
}

TEST(ConfigTest, UnknownKeysAreErrors) {
  TempDir dir;
  std::string conf = dir.path() + "/psmd.toml";
  WriteFile(conf, "spin_us = 5\nspinus = 5\n[limits]\nmax = 1\n");
  RunResult r = RunToEnd(dir, {Psmd(), "--config", conf, "--check-config"}, {});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find(":2: unknown key 'spinus'"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find(":3: unknown key 'limits'"), std::string::npos) << r.err;
  RunResult flag = RunToEnd(dir, {Psmd(), "--spinus", "5"}, {});
  EXPECT_EQ(flag.exit_code, 2);
  EXPECT_NE(flag.err.find("--spinus"), std::string::npos) << flag.err;
}

TEST(ConfigTest, HelpListsEverySettingWithItsDefaultAndVersionPrints) {
  TempDir dir;
  RunResult help = RunToEnd(dir, {Psmd(), "--help"}, {});
  EXPECT_EQ(help.exit_code, 0);
  for (const char* flag :
       {"--socket TEXT=/run/psmd/psmd.sock", "--log-level TEXT=info",
        "--log-target TEXT=auto", "--spin-us N=200", "--sq-slots N=256",
        "--cq-slots N=1024", "--region-mib N=8", "--max-endpoints-per-job N=64",
        "--max-endpoints N=1024", "--max-endpoints-per-uid N=256",
        "--unexpected-mib N=64", "--max-unexpected-mib N=1024",
        "--job-unexpected-mib N=4096", "--uid-unexpected-mib N=8192",
        "--node-id N=0", "--config PATH=/etc/psmd/psmd.toml", "--check-config",
        "--version"}) {
    EXPECT_NE(help.out.find(flag), std::string::npos) << flag;
  }
  RunResult version = RunToEnd(dir, {Psmd(), "--version"}, {});
  EXPECT_EQ(version.exit_code, 0);
  EXPECT_TRUE(std::regex_search(
      version.out,
      std::regex("^psmd [0-9]+\\.[0-9]+\\.[0-9]+ \\(commit [0-9a-z-]+\\)\n$")))
      << version.out;
}

// Every line psmd writes to stderr has this shape.
const std::regex kPsmdLine(
    "^\\d{4}-\\d\\d-\\d\\dT\\d\\d:\\d\\d:\\d\\d\\.\\d{3} "
    "(trace|debug|info|warning|error|critical) ");

TEST(LogTest, AClientNameCannotForgeLogLinesOrPsmctlRows) {
  TempDir dir;
  Daemon d(dir);
  const std::string forged = "2026-01-01T00:00:00.000 critical node failed";
  const std::string name = "x\n" + forged + "\x1b[2J";
  const std::string program = dir.path() + "/" + name;
  // A copy of the client program under the crafted name (the daemon labels
  // an endpoint with its client's executable name), beside its library.
  ASSERT_EQ(
      system(("cp " + Runfile("tests/programs/exchange") + " '" + program +
              "' && cp " + Runfile("client/libpsm2.so.2") + " " + dir.path())
                 .c_str()),
      0);
  auto env = d.ClientEnv();
  env["LD_LIBRARY_PATH"] = dir.path();
  std::string rv = dir.path() + "/rv";
  mkdir(rv.c_str(), 0755);
  auto args = [&](int rank) {
    auto a = ExchangeArgs(dir, rv, rank, kJob, 10, 100, /*hold_seconds=*/2);
    a[0] = program;
    return a;
  };
  Process r1 = Process::Start(args(1), env, rv + "/r1.out", rv + "/r1.err");
  Process r0 = Process::Start(args(0), env, rv + "/r0.out", rv + "/r0.err");
  ASSERT_TRUE(WaitForLog(d, "opened endpoint 2"));
  RunResult endpoints = Psmctl(dir, d, {"endpoints"});
  EXPECT_EQ(r0.Wait(30), 0) << ReadFile(rv + "/r0.err");
  EXPECT_EQ(r1.Wait(30), 0) << ReadFile(rv + "/r1.err");
  ASSERT_TRUE(WaitForLog(d, "closed endpoint 2"));

  const std::string escaped = "x\\x0a" + forged + "\\x1b[2J";
  std::string log = d.Log();
  EXPECT_NE(log.find(escaped), std::string::npos) << log;
  for (const auto& line : Lines(log)) {
    EXPECT_TRUE(std::regex_search(line, kPsmdLine)) << line;
    EXPECT_NE(line.rfind(forged, 0), 0u) << "forged line: " << line;
    EXPECT_EQ(line.find('\x1b'), std::string::npos) << line;
  }
  // psmctl: a header and one row per endpoint, the label escaped.
  EXPECT_EQ(Lines(endpoints.out).size(), 3u) << endpoints.out;
  EXPECT_NE(endpoints.out.find(escaped), std::string::npos) << endpoints.out;
}

TEST(LogTest, AFloodOfBadConnectionsYieldsABoundedNumberOfLines) {
  TempDir dir;
  Daemon d(dir);
  sockaddr_un addr = UnixAddress(d.socket());
  const char junk[] = "GET / HTTP/1.1\r\nHost: psmd\r\n\r\n";
  std::vector<int> fds;
  for (int i = 0; i < 300; i++) {
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    ASSERT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
    ASSERT_EQ(send(fd, junk, sizeof(junk) - 1, MSG_NOSIGNAL),
              static_cast<ssize_t>(sizeof(junk) - 1));
    fds.push_back(fd);
  }
  // psmd closes each junk connection once it has read it: wait until every
  // one reads as closed (or reset: psmd only peeked at our bytes) from our
  // end, then count what it logged.
  size_t handled = 0;
  auto all_closed = [&] {
    char byte;
    for (; handled < fds.size(); handled++) {
      ssize_t n = recv(fds[handled], &byte, 1, MSG_DONTWAIT | MSG_PEEK);
      if (n > 0 || (n < 0 && errno == EAGAIN)) break;
    }
    return handled == fds.size();
  };
  EXPECT_TRUE(WaitUntil(10, all_closed))
      << handled << " of " << fds.size() << " junk connections closed by psmd";
  for (int fd : fds) close(fd);
  EXPECT_EQ(Psmctl(dir, d, {"health"}).exit_code, 0);
  auto lines = Lines(d.Log());
  int complaints = CountOf(lines, "sent neither gRPC nor an attach request");
  EXPECT_GE(complaints, 1);
  EXPECT_LE(complaints, 5);
  EXPECT_LE(lines.size(), 10u) << d.Log();
  EXPECT_TRUE(d.Stop());
}

TEST(SocketPathTest, ARegularFileIsNeverRemoved) {
  TempDir dir;
  std::string path = dir.path() + "/psmd.sock";
  WriteFile(path, "precious\n");
  RunResult r = RunToEnd(dir, {Psmd(), "--socket", path}, {}, 10);
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find(path + " exists and is not a socket"), std::string::npos)
      << r.err;
  EXPECT_EQ(ReadFile(path), "precious\n");
}

TEST(SocketPathTest, ALiveSocketIsNotTakenOver) {
  TempDir dir;
  std::string path = dir.path() + "/psmd.sock";
  int listener = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_un addr = UnixAddress(path);
  ASSERT_EQ(bind(listener, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)),
            0);
  ASSERT_EQ(listen(listener, 4), 0);
  RunResult r = RunToEnd(dir, {Psmd(), "--socket", path}, {}, 10);
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("is serving " + path), std::string::npos) << r.err;
  // Still ours: a connect reaches our listener.
  int probe = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  EXPECT_EQ(connect(probe, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)),
            0);
  close(probe);
  close(listener);
}

TEST(SocketPathTest, AStaleSocketIsReplaced) {
  TempDir dir;
  std::string path = dir.path() + "/psmd.sock";
  int dead = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_un addr = UnixAddress(path);
  ASSERT_EQ(bind(dead, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  close(dead);  // the file stays; nothing listens
  Daemon d(dir);
  RunResult health = Psmctl(dir, d, {"health"});
  EXPECT_EQ(health.exit_code, 0) << health.err << d.Log();
  EXPECT_TRUE(d.Stop());
}

// systemd-socket-activate (from systemd) plays psmd.socket: it listens, and
// on the first connection execs psmd with LISTEN_FDS/LISTEN_PID set.
TEST(SocketActivationTest, PsmdServesThePassedSocketAndLeavesItsFile) {
  TempDir dir;
  const char kActivate[] = "/usr/bin/systemd-socket-activate";
  ASSERT_EQ(access(kActivate, X_OK), 0) << "scripts/deps.sh installs systemd";
  std::string path = dir.path() + "/psmd.sock";
  std::string log = dir.path() + "/psmd.log";
  Process activate = Process::Start(
      {kActivate, "-l", path, Psmd(), "--socket", path}, {}, log, log);
  struct stat st;
  for (int i = 0; i < 500 && stat(path.c_str(), &st) != 0; i++) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  // The first connection starts psmd, which then answers it.
  RunResult health =
      RunToEnd(dir, {Runfile("tools/psmctl"), "--socket", path, "health"}, {});
  EXPECT_EQ(health.exit_code, 0) << health.err << ReadFile(log);
  EXPECT_NE(ReadFile(log).find("serving " + path + " from systemd"),
            std::string::npos)
      << ReadFile(log);
  activate.Kill(SIGTERM);
  EXPECT_EQ(activate.Wait(10), 0) << ReadFile(log);
  EXPECT_EQ(lstat(path.c_str(), &st), 0) << "the socket file is systemd's";

  // A passed socket on another path than psmd's is refused, naming the fix.
  std::string other = dir.path() + "/other.sock";
  Process wrong = Process::Start(
      {kActivate, "-l", other, Psmd(), "--socket", path}, {}, log, log);
  for (int i = 0; i < 500 && stat(other.c_str(), &st) != 0; i++) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  RunToEnd(dir, {Runfile("tools/psmctl"), "--socket", other, "health"}, {});
  EXPECT_EQ(wrong.Wait(10), 1);
  EXPECT_NE(ReadFile(log).find("make ListenStream= in psmd.socket and socket "
                               "in psmd.toml the same path"),
            std::string::npos)
      << ReadFile(log);
}

// An exchange between two ranks on CPU `rank_cpu`, run to its end.
void ExchangeOn(const TempDir& dir, const Daemon& d, const std::string& name,
                const char* rank_cpu) {
  std::string rv = dir.path() + "/" + name;
  mkdir(rv.c_str(), 0755);
  auto pinned = [&](int rank) {
    std::vector<std::string> argv = {"/usr/bin/taskset", "-c", rank_cpu};
    for (auto& a : ExchangeArgs(dir, rv, rank, kJob, 2000, 64)) {
      argv.push_back(a);
    }
    return argv;
  };
  Process r1 =
      Process::Start(pinned(1), d.ClientEnv(), rv + "/r1.out", rv + "/r1.err");
  RunResult r0 = RunToEnd(dir, pinned(0), d.ClientEnv(), 120);
  EXPECT_EQ(r0.exit_code, 0) << r0.err;
  EXPECT_EQ(r1.Wait(30), 0) << ReadFile(rv + "/r1.err");
}

TEST(PlacementTest, StatsTellWhetherClientsPollOnTheWorkersCpu) {
  cpu_set_t allowed;
  ASSERT_EQ(sched_getaffinity(0, sizeof(allowed), &allowed), 0);
  if (!CPU_ISSET(0, &allowed) || !CPU_ISSET(1, &allowed)) {
    GTEST_SKIP() << "needs CPUs 0 and 1";
  }
  if (geteuid() != 0) GTEST_SKIP() << "the worker's placement is root's view";
  TempDir dir;
  auto worker = [&](const Daemon& d, const char* key) {
    return JsonNumber(Psmctl(dir, d, {"stats", "--format", "json"}).out,
                      "worker", key);
  };
  {
    // psmd on a CPU of its own: no client ever polls beside the worker.
    Daemon d(dir, {}, {}, {"/usr/bin/taskset", "-c", "1"});
    ExchangeOn(dir, d, "apart", "0");
    EXPECT_EQ(worker(d, "cpu"), 1);
    EXPECT_GT(worker(d, "core_checks"), 0);
    EXPECT_EQ(worker(d, "core_shared"), 0);
    RunResult text = Psmctl(dir, d, {"stats"});
    EXPECT_NE(text.out.find("on CPU 1; a client polled on that CPU at 0 of "
                            "its "),
              std::string::npos)
        << text.out;
    EXPECT_TRUE(d.Stop()) << d.Log();
  }
  {
    // psmd beside the ranks: its idle checks find them polling there.
    Daemon d(dir, {}, {}, {"/usr/bin/taskset", "-c", "0"});
    ExchangeOn(dir, d, "together", "0");
    EXPECT_EQ(worker(d, "cpu"), 0);
    EXPECT_GT(worker(d, "core_shared"), 0);
    EXPECT_GT(worker(d, "yields"), 0);
    RunResult prom = Psmctl(dir, d, {"stats", "--format", "prometheus"});
    EXPECT_NE(prom.out.find("\npsmd_worker_cpu{worker=\"0\"} 0\n"),
              std::string::npos)
        << prom.out;
    EXPECT_TRUE(d.Stop()) << d.Log();
  }
}

}  // namespace
}  // namespace psmd::testing
