#include "daemon/handover/upgrades.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "daemon/handover/handover.h"

extern char** environ;

namespace psmd::handover {

int AskFormat(const std::string& path, std::string* why) {
  int out[2];
  if (pipe2(out, O_CLOEXEC) != 0) {
    *why = std::string("pipe: ") + strerror(errno);
    return -1;
  }
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, out[1], 1);
  char* const argv[] = {const_cast<char*>(path.c_str()),
                        const_cast<char*>("--handover-format"), nullptr};
  pid_t pid = -1;
  const int rc =
      posix_spawn(&pid, path.c_str(), &actions, nullptr, argv, environ);
  posix_spawn_file_actions_destroy(&actions);
  close(out[1]);
  if (rc != 0) {
    close(out[0]);
    *why = "cannot run " + path + ": " + strerror(rc);
    return -1;
  }
  std::string text;
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::seconds(5);
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) break;
    pollfd p{out[0], POLLIN, 0};
    if (poll(&p, 1, static_cast<int>(left.count())) <= 0) break;
    char buf[64];
    ssize_t n = read(out[0], buf, sizeof(buf));
    if (n <= 0 || text.size() > 64) break;
    text.append(buf, static_cast<size_t>(n));
  }
  close(out[0]);
  kill(pid, SIGKILL);  // a binary that hangs (or already exited: harmless)
  int status = 0;
  waitpid(pid, &status, 0);
  char* end = nullptr;
  const long format = strtol(text.c_str(), &end, 10);
  if (text.empty() || end == text.c_str() || (*end != '\n' && *end != '\0') ||
      format <= 0) {
    *why = path +
           " --handover-format printed no format: it is not a psmd that can "
           "take over running jobs";
    return -1;
  }
  return static_cast<int>(format);
}

Status TrustedBinary(const std::string& path, std::string* real) {
  char buf[PATH_MAX];
  if (realpath(path.c_str(), buf) == nullptr) {
    return {PSM2_PARAM_ERR, "upgrade: " + path + ": " + strerror(errno)};
  }
  *real = buf;
  const uid_t self = geteuid();
  auto refuse = [&](const std::string& what, const std::string& fix) {
    return Status{PSM2_PARAM_ERR,
                  "upgrade refused: " + what +
                      ": psmd hands its jobs over only to a binary that no "
                      "one but root or psmd's own user can change (" +
                      fix + "); psmd serves on"};
  };
  // The file, then each directory above it up to /.
  std::string at = *real;
  for (bool file = true;; file = false) {
    struct stat st;
    if (stat(at.c_str(), &st) != 0) {
      return {PSM2_PARAM_ERR, "upgrade: " + at + ": " + strerror(errno)};
    }
    if (file && !S_ISREG(st.st_mode)) {
      return refuse(at + " is not a regular file", "name the psmd binary");
    }
    if (st.st_uid != 0 && st.st_uid != self) {
      return refuse(at + " is owned by uid " + std::to_string(st.st_uid),
                    "chown root " + at);
    }
    const bool sticky_dir = !file && (st.st_mode & S_ISVTX) != 0;
    if ((st.st_mode & (S_IWGRP | S_IWOTH)) != 0 && !sticky_dir) {
      char mode[8];
      snprintf(mode, sizeof mode, "%04o", st.st_mode & 07777);
      return refuse(
          at + " is writable by its group or others (mode " + mode + ")",
          "chmod go-w " + at);
    }
    if (at == "/") return {};
    const size_t slash = at.rfind('/');
    at = slash == 0 ? "/" : at.substr(0, slash);
  }
}

Status Upgrades::Request(const std::string& exec_path, std::string* resolved) {
  const std::string path = exec_path.empty() ? started_from_ : exec_path;
  if (path.empty() || path[0] != '/') {
    return {PSM2_PARAM_ERR,
            "upgrade: name the new binary by an absolute path (--exec)"};
  }
  std::string real;
  if (Status e = TrustedBinary(path, &real); !e.ok()) return e;
  if (access(real.c_str(), X_OK) != 0) {
    return {PSM2_PARAM_ERR,
            "upgrade: " + path + " is not executable: " + strerror(errno)};
  }
  {
    MutexLock lock(&mu_);
    if (busy_) {
      return {PSM2_PARAM_ERR, "upgrade: a handover is already under way"};
    }
    busy_ = true;
  }
  std::string why;
  const int format = AskFormat(real, &why);
  if (format != static_cast<int>(kFormatVersion)) {
    Release();  // (the call itself says why)
    if (format < 0) return {PSM2_PARAM_ERR, "upgrade refused: " + why};
    return {PSM2_PARAM_ERR,
            "upgrade refused: " + path + " reads handover format " +
                std::to_string(format) + ", this psmd writes " +
                std::to_string(kFormatVersion) +
                "; psmd serves on. To change to it, stop the jobs and "
                "restart psmd"};
  }
  {
    MutexLock lock(&mu_);
    pending_ = real;
  }
  *resolved = real;
  kill(getpid(), SIGUSR2);  // the main thread waits for it (sigtimedwait)
  return {};
}

std::optional<std::string> Upgrades::Take() {
  MutexLock lock(&mu_);
  std::optional<std::string> p = pending_;
  pending_.reset();
  return p;
}

void Upgrades::Release() {
  MutexLock lock(&mu_);
  busy_ = false;
  pending_.reset();
}

void Upgrades::Failed(const std::string& why) {
  {
    MutexLock lock(&mu_);
    last_failure_ = why;
  }
  Release();
  failed.fetch_add(1);
}

std::string Upgrades::LastFailure() {
  MutexLock lock(&mu_);
  return last_failure_;
}

}  // namespace psmd::handover
