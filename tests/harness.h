// Test harness for multi-process integration tests: a real psmd on a
// temporary socket, real client processes, helpers to read psmctl output and
// /proc. Every process started here is ended by PID and every file removed.
//
// Thread-safety: use from the test's main thread only.
#ifndef PSMD_TESTS_HARNESS_H_
#define PSMD_TESTS_HARNESS_H_

#include <sys/types.h>

#include <atomic>
#include <functional>
#include <map>
#include <string>
#include <thread>
#include <vector>

namespace psmd::testing {

// Path of a file in the Bazel runfiles tree ("daemon/psmd").
std::string Runfile(const std::string& path);

// A directory under /tmp (short enough for a Unix socket path), removed with
// everything in it on destruction.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// A child process started with fork/exec; killed (SIGKILL) and reaped on
// destruction if still running.
class Process {
 public:
  Process() = default;
  ~Process();
  Process(Process&& o) noexcept;
  Process& operator=(Process&& o) noexcept;

  // Starts argv[0] with extra environment; stdout and stderr go to files.
  static Process Start(const std::vector<std::string>& argv,
                       const std::map<std::string, std::string>& env,
                       const std::string& stdout_path,
                       const std::string& stderr_path,
                       uid_t run_as = static_cast<uid_t>(-1));
  // Waits up to timeout_s; returns the exit code, 128+signal, or -1 on timeout.
  int Wait(double timeout_s);
  void Kill(int sig);
  bool running() const { return pid_ > 0; }
  pid_t pid() const { return pid_; }

 private:
  pid_t pid_ = -1;
  int status_ = 0;
};

// A running psmd on `dir`/psmd.sock, with `env` added to its environment,
// started through `wrapper` (e.g. nsenter into a network namespace; a
// program that execs psmd, so pid() is psmd's) when given.
class Daemon {
 public:
  explicit Daemon(const TempDir& dir, std::vector<std::string> extra_flags = {},
                  const std::map<std::string, std::string>& env = {},
                  const std::vector<std::string>& wrapper = {});
  ~Daemon();                        // SIGTERM, then SIGKILL after 5 s
  bool Stop(double timeout_s = 5);  // true when it exited 0
  // True while psmd runs. Reaps it once it ended: kill(pid, 0) succeeds on
  // a zombie, which a child that died stays until it is waited for.
  bool Running() { return process_.Wait(0) == -1; }
  const std::string& socket() const { return socket_; }
  pid_t pid() const { return process_.pid(); }
  std::string Log() const;
  std::map<std::string, std::string> ClientEnv() const {
    return {{"PSMD_SOCKET", socket_}};
  }

 private:
  std::string socket_;
  std::string log_path_;
  Process process_;
};

// A munged in the foreground with a generated key of its own, its socket
// and files in `dir`; stopped (SIGTERM) on destruction.
class Munged {
 public:
  explicit Munged(const std::string& dir);
  ~Munged();
  const std::string& socket() const { return socket_; }
  bool running() const;

 private:
  std::string dir_;
  std::string socket_;
  Process process_;
};

struct RunResult {
  int exit_code = -1;
  std::string out;
  std::string err;
  double seconds = 0;
};

// Polls `reached` every 10 ms until it returns true, for at most timeout_s
// (times TimeScale()); returns whether it did. How a test waits for the
// state it needs (a file, a counter, a log line) rather than sleeping for
// the time that state usually takes: assert what it returns.
bool WaitUntil(double timeout_s, const std::function<bool()>& reached);

// Runs a program to completion (timeout_s at most) and captures its output.
RunResult RunToEnd(const TempDir& dir, const std::vector<std::string>& argv,
                   const std::map<std::string, std::string>& env,
                   double timeout_s = 60,
                   uid_t run_as = static_cast<uid_t>(-1));

std::string ReadFile(const std::string& path);

// Makes directory `name` in `dir` and returns its path.
std::string Subdir(const TempDir& dir, const std::string& name);

// Runs the built psmctl against `d` with `args`.
RunResult Psmctl(const TempDir& dir, const Daemon& d,
                 const std::vector<std::string>& args);

// Stops one thread of process `pid`, found by its name, with ptrace (its
// other threads run on) until destroyed: how tests wedge psmd's progress
// worker ("psmd-progress") without a backdoor in psmd. Needs root or
// CAP_SYS_PTRACE.
class StoppedThread {
 public:
  StoppedThread(pid_t pid, const std::string& name);
  ~StoppedThread() { Resume(); }
  StoppedThread(const StoppedThread&) = delete;
  StoppedThread& operator=(const StoppedThread&) = delete;
  // Empty when the thread was not found or could not be stopped.
  const std::string& error() const { return error_; }
  void Resume();

 private:
  pid_t tid_ = -1;
  bool stopped_ = false;
  std::string error_;
};

// argv of tests/programs/exchange: rank `rank` of a pair that meets in
// directory `rendezvous` and exchanges `messages` messages of up to
// `max_size` bytes in job `uuid` (32 hex digits), after holding its
// endpoint open and idle for `hold_seconds`.
std::vector<std::string> ExchangeArgs(const TempDir& dir,
                                      const std::string& rendezvous, int rank,
                                      const std::string& uuid, int messages,
                                      int max_size, int hold_seconds = 0);

// bench/pingpong's 8 B ping-pong between two clients of job `uuid` (32 hex
// digits) on `d`, `iters` round trips, meeting in directory `rendezvous`:
// rank 0's median and mean half round trip in microseconds, and what went
// wrong (empty when both ranks exited 0 and rank 0 printed both figures).
struct PingPongResult {
  double median_us = 0;
  double mean_us = 0;
  std::string error;
};
PingPongResult PingPong8(const TempDir& dir, const Daemon& d,
                         const std::string& rendezvous, const std::string& uuid,
                         int iters);

// The integer value of "key": N inside the JSON object that follows "object"
// (or anywhere when object is empty). -1 when absent.
long long JsonNumber(const std::string& json, const std::string& object,
                     const std::string& key);
// The integer value of `key` in the object of worker `shard` of psmctl
// stats --format json (its "workers" list). -1 when absent.
long long WorkerNumber(const std::string& json, int shard,
                       const std::string& key);

// Resident set size of pid in KiB (VmRSS), -1 if unreadable.
long long ResidentKiB(pid_t pid);
// A field of /proc/PID/status in KiB ("RssAnon", "RssShmem", ...); -1 if
// it is not there.
long long StatusKiB(pid_t pid, const std::string& field);
// The memory pid itself holds: anonymous and shared-memory pages resident
// (RssAnon + RssShmem), without the libraries' code and data paged in from
// their files, which varies by megabytes from run to run with what ran.
long long OwnMemoryKiB(pid_t pid);

// File descriptors pid holds (entries of /proc/PID/fd).
int OpenFds(pid_t pid);

// CPU seconds (user + system) consumed so far by pid.
double CpuSeconds(pid_t pid);

// Watches for the whole machine stopping: a thread that wakes every 10 ms
// and adds up the gaps between its wakes beyond 250 ms. A VM its host
// stalls for seconds (the kernel then logs an RCU stall; this VM reports
// no steal time) delays every process alike, psmd's fault or not, so a
// deadline may grant what this counted. Thread-safe.
class StallWatch {
 public:
  StallWatch();
  ~StallWatch();
  StallWatch(const StallWatch&) = delete;
  StallWatch& operator=(const StallWatch&) = delete;
  // Milliseconds of stall seen since construction.
  double stalled_ms() const { return stalled_us_.load() / 1000.0; }
  // p.Wait(timeout_s), extended by every stall seen while it waits: a
  // process the host stopped with the machine has not hung.
  int Wait(Process& p, double timeout_s) const;

 private:
  std::atomic<bool> stop_{false};
  std::atomic<int64_t> stalled_us_{0};
  std::thread thread_;
};

// How many mappings of pid name `needle` (e.g. "memfd:psmd-endpoint").
int CountMappings(pid_t pid, const std::string& needle);

// Entries in /dev/shm whose name contains "psm".
std::vector<std::string> ShmLeftovers();

// How many times slower than a plain build this build runs:
// PSMD_TEST_TIME_SCALE, which the sanitizer configurations of .bazelrc set
// (default 1). Liveness bounds (Process::Wait, Daemon start) are multiplied
// by it; they are bounds on hanging, not timings.
double TimeScale();

// False in a sanitizer build: its allocator keeps freed memory in a
// quarantine and its shadow memory grows with the heap, so bounds on psmd's
// resident memory measure the sanitizer, not psmd.
bool MemoryBoundsMeaningful();

// False under ThreadSanitizer, whose runtime thread wakes on its own (an
// idle psmd built with it used 11% of a core): bounds on psmd's CPU time
// measure the sanitizer.
bool CpuBoundsMeaningful();

}  // namespace psmd::testing

#endif  // PSMD_TESTS_HARNESS_H_
