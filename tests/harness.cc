#include "tests/harness.h"

#include <dirent.h>
#include <fcntl.h>
#include <ftw.h>
#include <signal.h>
#include <sys/ptrace.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <thread>

namespace psmd::testing {

std::string Runfile(const std::string& path) {
  const char* srcdir = getenv("TEST_SRCDIR");
  const char* workspace = getenv("TEST_WORKSPACE");
  if (srcdir != nullptr) {
    return std::string(srcdir) + "/" + (workspace ? workspace : "psmd") + "/" +
           path;
  }
  return path;  // run from the workspace root outside Bazel
}

TempDir::TempDir() {
  char tmpl[] = "/tmp/psmd-test-XXXXXX";
  char* made = mkdtemp(tmpl);
  path_ = made ? made : "/tmp";
  chmod(path_.c_str(), 0755);  // non-root test clients must reach the socket
}

TempDir::~TempDir() {
  if (path_ == "/tmp") return;
  nftw(
      path_.c_str(),
      [](const char* p, const struct stat*, int, struct FTW*) {
        return remove(p);
      },
      16, FTW_DEPTH | FTW_PHYS);
}

Process::~Process() {
  if (pid_ > 0) {
    kill(pid_, SIGKILL);
    waitpid(pid_, &status_, 0);
  }
}

Process::Process(Process&& o) noexcept : pid_(o.pid_), status_(o.status_) {
  o.pid_ = -1;
}

Process& Process::operator=(Process&& o) noexcept {
  if (this != &o) {
    if (pid_ > 0) {
      kill(pid_, SIGKILL);
      waitpid(pid_, &status_, 0);
    }
    pid_ = o.pid_;
    status_ = o.status_;
    o.pid_ = -1;
  }
  return *this;
}

Process Process::Start(const std::vector<std::string>& argv,
                       const std::map<std::string, std::string>& env,
                       const std::string& stdout_path,
                       const std::string& stderr_path, uid_t run_as) {
  Process p;
  pid_t pid = fork();
  if (pid == 0) {
    int out = open(stdout_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    int err = open(stderr_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (out >= 0) dup2(out, 1);
    if (err >= 0) dup2(err, 2);
    for (const auto& [k, v] : env) setenv(k.c_str(), v.c_str(), 1);
    if (run_as != static_cast<uid_t>(-1)) {
      if (setgid(run_as) != 0 || setuid(run_as) != 0) _exit(126);
    }
    std::vector<char*> args;
    for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    execv(args[0], args.data());
    fprintf(stderr, "exec %s: %s\n", args[0], strerror(errno));
    _exit(127);
  }
  p.pid_ = pid;
  return p;
}

int Process::Wait(double timeout_s) {
  if (pid_ <= 0)
    return WIFEXITED(status_) ? WEXITSTATUS(status_) : 128 + WTERMSIG(status_);
  auto deadline = std::chrono::steady_clock::now() +
                  std::chrono::duration<double>(timeout_s * TimeScale());
  for (;;) {
    pid_t r = waitpid(pid_, &status_, WNOHANG);
    if (r == pid_) {
      pid_ = -1;
      return WIFEXITED(status_) ? WEXITSTATUS(status_)
                                : 128 + WTERMSIG(status_);
    }
    if (std::chrono::steady_clock::now() > deadline) return -1;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
}

bool WaitUntil(double timeout_s, const std::function<bool()>& reached) {
  const auto deadline = std::chrono::steady_clock::now() +
                        std::chrono::duration<double>(timeout_s * TimeScale());
  for (;;) {
    if (reached()) return true;
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

void Process::Kill(int sig) {
  if (pid_ > 0) kill(pid_, sig);
}

Daemon::Daemon(const TempDir& dir, std::vector<std::string> extra_flags,
               const std::map<std::string, std::string>& env,
               const std::vector<std::string>& wrapper) {
  socket_ = dir.path() + "/psmd.sock";
  log_path_ = dir.path() + "/psmd.log";
  std::vector<std::string> argv = wrapper;
  argv.insert(argv.end(), {Runfile("daemon/psmd"), "--socket", socket_});
  // The *_workers2 variants of tests/BUILD.bazel: the same test against
  // psmd with engine shards (a test's own flags come after, and win).
  if (const char* workers = getenv("PSMD_TEST_WORKERS")) {
    argv.insert(argv.end(), {"--workers", workers});
  }
  argv.insert(argv.end(), extra_flags.begin(), extra_flags.end());
  process_ = Process::Start(argv, env, log_path_, log_path_);
  // Ready when the socket accepts (a file may be there before: a stale one).
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  strncpy(addr.sun_path, socket_.c_str(), sizeof(addr.sun_path) - 1);
  for (int i = 0; i < 500 * TimeScale(); i++) {
    int probe = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    bool up =
        connect(probe, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
    close(probe);
    if (up) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

Daemon::~Daemon() { Stop(); }

bool Daemon::Stop(double timeout_s) {
  if (!process_.running()) return false;
  process_.Kill(SIGTERM);
  int code = process_.Wait(timeout_s);
  if (code == -1) {
    process_.Kill(SIGKILL);
    process_.Wait(5);
    return false;
  }
  return code == 0;
}

std::string Daemon::Log() const { return ReadFile(log_path_); }

Munged::Munged(const std::string& dir) : dir_(dir) {
  std::filesystem::create_directories(dir_);
  chmod(dir_.c_str(), 0711);
  std::random_device rd;
  std::string key(1024, '\0');
  for (char& c : key) c = static_cast<char>(rd());
  std::ofstream(dir_ + "/key", std::ios::binary) << key;
  chmod((dir_ + "/key").c_str(), 0600);
  socket_ = dir_ + "/socket";
  process_ = Process::Start(
      {"/usr/sbin/munged", "--foreground", "--force", "--socket=" + socket_,
       "--key-file=" + dir_ + "/key", "--pid-file=" + dir_ + "/pid",
       "--log-file=" + dir_ + "/log", "--seed-file=" + dir_ + "/seed"},
      {}, "/dev/null", "/dev/null");
  for (int i = 0; i < 500 && !std::filesystem::exists(socket_); i++) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

bool Munged::running() const {
  return process_.running() && std::filesystem::exists(socket_);
}

Munged::~Munged() {
  process_.Kill(SIGTERM);
  process_.Wait(5);
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

PingPongResult PingPong8(const TempDir& dir, const Daemon& d,
                         const std::string& rendezvous, const std::string& uuid,
                         int iters) {
  auto args = [&](int rank) {
    return std::vector<std::string>{Runfile("bench/pingpong"),
                                    "--rank",
                                    std::to_string(rank),
                                    "--dir",
                                    rendezvous,
                                    "--max-size",
                                    "8",
                                    "--iters",
                                    std::to_string(iters),
                                    "--tail",
                                    "1",
                                    "--uuid",
                                    uuid};
  };
  Process echo = Process::Start(args(1), d.ClientEnv(), rendezvous + "/1.out",
                                rendezvous + "/1.err");
  const RunResult r = RunToEnd(dir, args(0), d.ClientEnv(), 120);
  const int echo_status = echo.Wait(30);
  PingPongResult p;
  unsigned bytes = 0;
  const size_t line = r.out.find('\n');
  const size_t mean = r.out.find("mean ");
  if (r.exit_code != 0 || echo_status != 0) {
    p.error = "pingpong exited " + std::to_string(r.exit_code) + " and " +
              std::to_string(echo_status) + ": " + r.err +
              ReadFile(rendezvous + "/1.err");
  } else if (line == std::string::npos || mean == std::string::npos ||
             sscanf(r.out.c_str() + line + 1, "%u %lf", &bytes, &p.median_us) !=
                 2 ||
             sscanf(r.out.c_str() + mean, "mean %lf", &p.mean_us) != 1) {
    p.error = "pingpong printed: " + r.out;
  }
  return p;
}

std::string Subdir(const TempDir& dir, const std::string& name) {
  std::string p = dir.path() + "/" + name;
  mkdir(p.c_str(), 0755);
  return p;
}

std::vector<std::string> ExchangeArgs(const TempDir&,
                                      const std::string& rendezvous, int rank,
                                      const std::string& uuid, int messages,
                                      int max_size, int hold_seconds) {
  return {Runfile("tests/programs/exchange"),
          "--rank",
          std::to_string(rank),
          "--dir",
          rendezvous,
          "--uuid",
          uuid,
          "--messages",
          std::to_string(messages),
          "--max-size",
          std::to_string(max_size),
          "--hold-seconds",
          std::to_string(hold_seconds)};
}

RunResult RunToEnd(const TempDir& dir, const std::vector<std::string>& argv,
                   const std::map<std::string, std::string>& env,
                   double timeout_s, uid_t run_as) {
  static int counter = 0;
  std::string base = dir.path() + "/run" + std::to_string(counter++);
  auto start = std::chrono::steady_clock::now();
  Process p = Process::Start(argv, env, base + ".out", base + ".err", run_as);
  RunResult r;
  r.exit_code = p.Wait(timeout_s);
  r.seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
          .count();
  r.out = ReadFile(base + ".out");
  r.err = ReadFile(base + ".err");
  return r;
}

long long JsonNumber(const std::string& json, const std::string& object,
                     const std::string& key) {
  size_t from = 0;
  if (!object.empty()) {
    from = json.find("\"" + object + "\"");
    if (from == std::string::npos) return -1;
  }
  size_t at = json.find("\"" + key + "\":", from);
  if (at == std::string::npos) return -1;
  return atoll(json.c_str() + at + key.size() + 3);
}

long long WorkerNumber(const std::string& json, int shard,
                       const std::string& key) {
  const size_t workers = json.find("\"workers\"");
  if (workers == std::string::npos) return -1;
  const size_t at =
      json.find("{\"shard\": " + std::to_string(shard) + ",", workers);
  if (at == std::string::npos) return -1;
  return JsonNumber(json.substr(at), "", key);
}

long long StatusKiB(pid_t pid, const std::string& field) {
  std::string status = ReadFile("/proc/" + std::to_string(pid) + "/status");
  size_t at = status.find(field + ":");
  if (at == std::string::npos) return -1;
  return atoll(status.c_str() + at + field.size() + 1);
}

long long ResidentKiB(pid_t pid) { return StatusKiB(pid, "VmRSS"); }

long long OwnMemoryKiB(pid_t pid) {
  const long long anon = StatusKiB(pid, "RssAnon");
  const long long shmem = StatusKiB(pid, "RssShmem");
  return anon < 0 || shmem < 0 ? -1 : anon + shmem;
}

int OpenFds(pid_t pid) {
  int n = 0;
  for (const auto& e : std::filesystem::directory_iterator(
           "/proc/" + std::to_string(pid) + "/fd")) {
    (void)e;
    n++;
  }
  return n;
}

double CpuSeconds(pid_t pid) {
  std::string stat = ReadFile("/proc/" + std::to_string(pid) + "/stat");
  size_t close_paren = stat.rfind(')');
  if (close_paren == std::string::npos) return -1;
  std::istringstream in(stat.substr(close_paren + 2));
  std::string field;
  unsigned long long utime = 0, stime = 0;
  for (int i = 3; i <= 15 && in >> field; i++) {
    if (i == 14) utime = std::stoull(field);
    if (i == 15) stime = std::stoull(field);
  }
  return static_cast<double>(utime + stime) /
         static_cast<double>(sysconf(_SC_CLK_TCK));
}

StallWatch::StallWatch() {
  thread_ = std::thread([this] {
    using Clock = std::chrono::steady_clock;
    constexpr auto kTick = std::chrono::milliseconds(10);
    constexpr auto kStall = std::chrono::milliseconds(250);
    auto last = Clock::now();
    while (!stop_.load()) {
      std::this_thread::sleep_for(kTick);
      const auto now = Clock::now();
      if (now - last > kStall) {
        stalled_us_ += std::chrono::duration_cast<std::chrono::microseconds>(
                           now - last - kTick)
                           .count();
      }
      last = now;
    }
  });
}

StallWatch::~StallWatch() {
  stop_ = true;
  thread_.join();
}

int StallWatch::Wait(Process& p, double timeout_s) const {
  double granted_ms = stalled_ms();
  int status = p.Wait(timeout_s);
  while (status == -1 && stalled_ms() > granted_ms) {
    const double more_ms = stalled_ms() - granted_ms;
    granted_ms += more_ms;
    status = p.Wait(more_ms / 1000.0);
  }
  return status;
}

int CountMappings(pid_t pid, const std::string& needle) {
  std::istringstream in(ReadFile("/proc/" + std::to_string(pid) + "/maps"));
  std::string line;
  int n = 0;
  while (std::getline(in, line)) n += line.find(needle) != std::string::npos;
  return n;
}

std::vector<std::string> ShmLeftovers() {
  std::vector<std::string> out;
  DIR* d = opendir("/dev/shm");
  if (d == nullptr) return out;
  while (struct dirent* e = readdir(d)) {
    if (strstr(e->d_name, "psm") != nullptr) out.push_back(e->d_name);
  }
  closedir(d);
  return out;
}

RunResult Psmctl(const TempDir& dir, const Daemon& d,
                 const std::vector<std::string>& args) {
  std::vector<std::string> argv = {Runfile("tools/psmctl"), "--socket",
                                   d.socket()};
  argv.insert(argv.end(), args.begin(), args.end());
  return RunToEnd(dir, argv, {}, 10);
}

StoppedThread::StoppedThread(pid_t pid, const std::string& name) {
  std::string tasks = "/proc/" + std::to_string(pid) + "/task";
  if (DIR* d = opendir(tasks.c_str())) {
    while (dirent* e = readdir(d)) {
      if (e->d_name[0] == '.') continue;
      if (ReadFile(tasks + "/" + e->d_name + "/comm") == name + "\n")
        tid_ = atoi(e->d_name);
    }
    closedir(d);
  }
  if (tid_ < 0) {
    error_ = "no thread named " + name + " in pid " + std::to_string(pid);
    return;
  }
  int status = 0;
  if (ptrace(PTRACE_SEIZE, tid_, nullptr, nullptr) != 0 ||
      ptrace(PTRACE_INTERRUPT, tid_, nullptr, nullptr) != 0 ||
      waitpid(tid_, &status, __WALL) != tid_) {
    error_ = std::string("ptrace: ") + strerror(errno);
    return;
  }
  stopped_ = true;
}

void StoppedThread::Resume() {
  if (stopped_) ptrace(PTRACE_DETACH, tid_, nullptr, nullptr);
  stopped_ = false;
}

double TimeScale() {
  static const double scale = [] {
    const char* v = getenv("PSMD_TEST_TIME_SCALE");
    double s = v != nullptr ? atof(v) : 1.0;
    return s >= 1.0 ? s : 1.0;
  }();
  return scale;
}

bool MemoryBoundsMeaningful() {
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  return false;
#else
  return true;
#endif
}

bool CpuBoundsMeaningful() {
#if defined(__SANITIZE_THREAD__)
  return false;
#else
  return true;
#endif
}

}  // namespace psmd::testing
