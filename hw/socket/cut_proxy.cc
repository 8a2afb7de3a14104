#include "hw/socket/cut_proxy.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

namespace psmd::hw::testing {
namespace {

sockaddr_in Address(const std::string& host, uint16_t port) {
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  inet_pton(AF_INET, host.c_str(), &a.sin_addr);
  return a;
}

// One direction of a pair: what was read from `from` and not yet written
// to `to`. Nothing more is read from `from` until it is (back-pressure, as
// a real relay's socket buffers would give).
struct Direction {
  int from = -1, to = -1;
  std::string pending;
  size_t written = 0;
};

struct Pair {
  Direction d[2];
};

void Close(int fd, bool reset) {
  if (reset) {
    linger l{1, 0};
    setsockopt(fd, SOL_SOCKET, SO_LINGER, &l, sizeof l);
  }
  close(fd);
}

}  // namespace

CutProxy::CutProxy(const std::string& listen_host,
                   const std::string& upstream_host, uint16_t upstream_port)
    : upstream_host_(upstream_host), upstream_port_(upstream_port) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a = Address(listen_host, 0);
  socklen_t len = sizeof a;
  if (fd < 0 || bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 ||
      listen(fd, 16) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
    if (fd >= 0) close(fd);
    return;
  }
  listen_fd_ = fd;
  port_ = ntohs(a.sin_port);
  wake_fd_ = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  thread_ = std::thread([this] { Run(); });
}

CutProxy::~CutProxy() {
  if (thread_.joinable()) {
    stop_ = true;
    const uint64_t one = 1;
    (void)!write(wake_fd_, &one, sizeof one);
    thread_.join();
  }
  if (listen_fd_ >= 0) close(listen_fd_);
  if (wake_fd_ >= 0) close(wake_fd_);
}

void CutProxy::Cut() {
  cut_requests_++;
  const uint64_t one = 1;
  (void)!write(wake_fd_, &one, sizeof one);
}

void CutProxy::Run() {
  std::vector<std::unique_ptr<Pair>> pairs;
  int cuts_done = 0;
  auto drop = [&](size_t i, bool reset) {
    Close(pairs[i]->d[0].from, reset);
    Close(pairs[i]->d[0].to, reset);
    pairs.erase(pairs.begin() + static_cast<long>(i));
  };
  char buf[65536];
  while (!stop_) {
    if (cut_requests_.load() > cuts_done) {
      cuts_done = cut_requests_.load();
      const bool reset = cuts_done % 2 == 1;
      cuts_ += static_cast<int>(pairs.size());
      while (!pairs.empty()) drop(0, reset);
    }
    std::vector<pollfd> fds = {{wake_fd_, POLLIN, 0}, {listen_fd_, POLLIN, 0}};
    for (auto& p : pairs) {
      for (Direction& d : p->d) {
        fds.push_back(
            {d.from, static_cast<short>(d.pending.empty() ? POLLIN : 0), 0});
        fds.push_back(
            {d.to, static_cast<short>(d.pending.empty() ? 0 : POLLOUT), 0});
      }
    }
    if (poll(fds.data(), fds.size(), 100) < 0 && errno != EINTR) return;
    if (fds[0].revents & POLLIN) {
      uint64_t n;
      (void)!read(wake_fd_, &n, sizeof n);
    }
    if (fds[1].revents & POLLIN) {
      int in =
          accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
      if (in >= 0) {
        int out = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        sockaddr_in up = Address(upstream_host_, upstream_port_);
        if (out < 0 ||
            connect(out, reinterpret_cast<sockaddr*>(&up), sizeof up) != 0) {
          close(in);
          if (out >= 0) close(out);
        } else {
          fcntl(out, F_SETFL, fcntl(out, F_GETFL) | O_NONBLOCK);
          // As the fabric's own sockets: no Nagle delay on small frames.
          int one = 1;
          setsockopt(in, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
          setsockopt(out, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
          auto p = std::make_unique<Pair>();
          p->d[0].from = in;
          p->d[0].to = out;
          p->d[1].from = out;
          p->d[1].to = in;
          pairs.push_back(std::move(p));
        }
      }
    }
    // Relay; a pair whose either end closed or failed is dropped whole.
    size_t k = 2;
    std::vector<size_t> dead;
    for (size_t i = 0; i < pairs.size(); i++) {
      bool gone = false;
      for (Direction& d : pairs[i]->d) {
        const pollfd& rf = fds[k++];
        const pollfd& wf = fds[k++];
        if (gone) continue;
        if (d.pending.empty() && (rf.revents & (POLLIN | POLLHUP | POLLERR))) {
          ssize_t n = read(d.from, buf, sizeof buf);
          if (n > 0) {
            d.pending.assign(buf, static_cast<size_t>(n));
            d.written = 0;
          } else if (n == 0 || (errno != EAGAIN && errno != EINTR)) {
            gone = true;
            continue;
          }
        }
        if (!d.pending.empty() &&
            (wf.revents & (POLLOUT | POLLERR) || d.written == 0)) {
          ssize_t n = write(d.to, d.pending.data() + d.written,
                            d.pending.size() - d.written);
          if (n > 0) {
            d.written += static_cast<size_t>(n);
            if (d.written == d.pending.size()) d.pending.clear();
          } else if (errno != EAGAIN && errno != EINTR) {
            gone = true;
          }
        }
      }
      if (gone) dead.push_back(i);
    }
    for (size_t j = dead.size(); j-- > 0;) drop(dead[j], false);
  }
  while (!pairs.empty()) drop(0, false);
}

}  // namespace psmd::hw::testing
