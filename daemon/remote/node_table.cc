#include "daemon/remote/node_table.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <utility>

#include <spdlog/spdlog.h>

#include "daemon/log.h"
#include "hw/fabric.h"

namespace psmd {

bool ParseNodeTable(const std::string& text, std::map<uint16_t, NodeEntry>* out,
                    std::string* error) {
  std::istringstream in(text);
  std::string line;
  int n = 0;
  out->clear();
  while (std::getline(in, line)) {
    n++;
    size_t hash = line.find('#');
    if (hash != std::string::npos) line.resize(hash);
    std::istringstream words(line);
    std::string node, host, desc, extra;
    if (!(words >> node)) continue;
    if (!(words >> host >> desc) || (words >> extra)) {
      *error = "line " + std::to_string(n) +
               ": expected NODE HOSTNAME NODE@ADDR:PORT,...";
      return false;
    }
    char* end = nullptr;
    unsigned long id = strtoul(node.c_str(), &end, 10);
    hw::HostDescription parsed;
    std::string why;
    if (*end != '\0' || id == 0 || id > 0xffff) {
      *error = "line " + std::to_string(n) + ": node id 1 to 65535 expected";
      return false;
    }
    if (!hw::ParseHostDescription(desc, &parsed, &why) || parsed.node != id) {
      *error = "line " + std::to_string(n) + ": bad host description (" +
               (why.empty() ? "its node id differs" : why) + ")";
      return false;
    }
    (*out)[static_cast<uint16_t>(id)] = NodeEntry{host, desc};
  }
  return true;
}

namespace {

// A command's output beyond this is not a node table (65535 lines of ~60
// bytes fit).
constexpr size_t kMaxCommandOutput = 8u << 20;

int64_t NowMs() {
  timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return int64_t{t.tv_sec} * 1000 + t.tv_nsec / 1'000'000;
}

// Runs `command` under /bin/sh, collecting stdout and stderr (bounded).
// Returns its wait status, or -1 with *error when it could not run or was
// killed for running past the timeout.
int RunCommand(const std::string& command, std::string* out, std::string* err,
               std::string* error) {
  int out_pipe[2], err_pipe[2];
  if (pipe2(out_pipe, O_CLOEXEC) != 0) {
    *error = std::string("pipe: ") + strerror(errno);
    return -1;
  }
  if (pipe2(err_pipe, O_CLOEXEC) != 0) {
    *error = std::string("pipe: ") + strerror(errno);
    close(out_pipe[0]);
    close(out_pipe[1]);
    return -1;
  }
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, STDIN_FILENO, "/dev/null",
                                   O_RDONLY, 0);
  posix_spawn_file_actions_adddup2(&actions, out_pipe[1], STDOUT_FILENO);
  posix_spawn_file_actions_adddup2(&actions, err_pipe[1], STDERR_FILENO);
  // psmd's threads block SIGTERM, SIGINT and SIGHUP (the main thread takes
  // them with sigtimedwait); the command gets an empty mask, or it and its
  // children would ignore them.
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  sigset_t none;
  sigemptyset(&none);
  posix_spawnattr_setsigmask(&attr, &none);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGMASK);
  const char* argv[] = {"sh", "-c", command.c_str(), nullptr};
  pid_t pid = 0;
  int rc = posix_spawn(&pid, "/bin/sh", &actions, &attr,
                       const_cast<char* const*>(argv), environ);
  posix_spawn_file_actions_destroy(&actions);
  posix_spawnattr_destroy(&attr);
  close(out_pipe[1]);
  close(err_pipe[1]);
  if (rc != 0) {
    *error = std::string("cannot run /bin/sh: ") + strerror(rc);
    close(out_pipe[0]);
    close(err_pipe[0]);
    return -1;
  }
  const int64_t deadline = NowMs() + kNodeTableCommandTimeoutMs;
  pollfd fds[2] = {{out_pipe[0], POLLIN, 0}, {err_pipe[0], POLLIN, 0}};
  std::string* sinks[2] = {out, err};
  bool timed_out = false;
  while (fds[0].fd >= 0 || fds[1].fd >= 0) {
    const int64_t left = deadline - NowMs();
    if (left <= 0) {
      timed_out = true;
      break;
    }
    int n = poll(fds, 2, static_cast<int>(left));
    if (n < 0 && errno != EINTR) break;
    for (int i = 0; i < 2; i++) {
      if (fds[i].fd < 0 || fds[i].revents == 0) continue;
      char buf[4096];
      ssize_t k = read(fds[i].fd, buf, sizeof(buf));
      if (k < 0 && errno == EINTR) continue;
      if (k <= 0) {
        close(fds[i].fd);
        fds[i].fd = -1;
        continue;
      }
      if (sinks[i]->size() < kMaxCommandOutput) sinks[i]->append(buf, k);
    }
  }
  for (pollfd& p : fds) {
    if (p.fd >= 0) close(p.fd);
  }
  if (timed_out) kill(pid, SIGKILL);
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (timed_out) {
    *error = "did not end within " +
             std::to_string(kNodeTableCommandTimeoutMs) + " ms; killed";
    return -1;
  }
  return status;
}

// The last line of a command's stderr, for one log line.
std::string LastLine(std::string text) {
  while (!text.empty() && text.back() == '\n') text.pop_back();
  size_t nl = text.rfind('\n');
  return nl == std::string::npos ? text : text.substr(nl + 1);
}

}  // namespace

bool RunNodeTableCommand(const std::string& command, const std::string& file,
                         std::map<uint16_t, NodeEntry>* table, bool* changed,
                         std::string* error) {
  *changed = false;
  std::string out, err, why;
  const int status = RunCommand(command, &out, &err, &why);
  if (status < 0) {
    *error = why;
    return false;
  }
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    *error = (WIFEXITED(status)
                  ? "exit status " + std::to_string(WEXITSTATUS(status))
                  : "killed by signal " + std::to_string(WTERMSIG(status))) +
             (err.empty() ? "" : ": " + LastLine(err));
    return false;
  }
  if (out.size() >= kMaxCommandOutput) {
    *error =
        "its output exceeds " + std::to_string(kMaxCommandOutput) + " bytes";
    return false;
  }
  if (!ParseNodeTable(out, table, &why)) {
    *error = "its output is not a node table: " + why;
    return false;
  }
  if (table->empty()) {
    *error = "it printed no node";
    return false;
  }
  std::ifstream in(file);
  std::stringstream current;
  current << in.rdbuf();
  if (in && current.str() == out) return true;  // the file's mtime stays
  const std::string temporary = file + ".new";
  {
    std::ofstream write(temporary, std::ios::trunc);
    write << out;
    write.flush();
    if (!write) {
      *error = "cannot write " + temporary + ": " + strerror(errno);
      unlink(temporary.c_str());
      return false;
    }
  }
  if (rename(temporary.c_str(), file.c_str()) != 0) {
    *error =
        "cannot rename " + temporary + " to " + file + ": " + strerror(errno);
    unlink(temporary.c_str());
    return false;
  }
  *changed = true;
  return true;
}

NodeTable::NodeTable(std::string file) : file_(std::move(file)) { Reload(); }

void NodeTable::Reload() {
  struct stat st;
  if (stat(file_.c_str(), &st) != 0) {
    spdlog::warn("fabric: cannot read the node table {}: {}", Escaped(file_),
                 strerror(errno));
    return;
  }
  int64_t mtime =
      int64_t{st.st_mtim.tv_sec} * 1'000'000'000 + st.st_mtim.tv_nsec;
  if (mtime == mtime_ns_) return;
  std::ifstream in(file_);
  std::stringstream text;
  text << in.rdbuf();
  std::map<uint16_t, NodeEntry> table;
  std::string error;
  if (!ParseNodeTable(text.str(), &table, &error)) {
    spdlog::warn("fabric: node table {}: {}; keeping the previous one",
                 Escaped(file_), error);
    return;
  }
  nodes_ = std::move(table);
  mtime_ns_ = mtime;
  spdlog::info("fabric: node table {}: {} nodes", Escaped(file_),
               nodes_.size());
}

const NodeEntry* NodeTable::Find(uint16_t node) const {
  auto entry = nodes_.find(node);
  return entry == nodes_.end() ? nullptr : &entry->second;
}

std::string NodeTable::HostName(uint16_t node) const {
  const NodeEntry* entry = Find(node);
  return entry == nullptr ? std::string() : entry->hostname;
}

std::string NodeTable::NodeName(uint16_t node) const {
  std::string name = "node " + std::to_string(node);
  std::string host = HostName(node);
  if (!host.empty()) name += " (" + host + ")";
  return name;
}

}  // namespace psmd
