// tcp_pt2pt: bench/pingpong's ping-pong and bench/msg_rate's stream over
// one plain TCP connection (bench/pt2pt.h): the floor the fabric between
// psmd daemons is measured against.
//
//   tcp_pt2pt --rank 0|1 --dir DIR [--addr0 IP] [--addr1 IP] [--poll
//             block|spin] [pt2pt.h flags]
//
// Rank 1 listens on --addr1 (default 127.0.0.3; the port goes to
// DIR/tcp.port), rank 0 connects from --addr0 (default 127.0.0.2), as two
// daemons on those addresses do. Both set TCP_NODELAY, as Open MPI's and
// UCX's tcp transports do. A message is one send() of its bytes; a
// receiver reads through a 64 KiB staging buffer (and straight into the
// destination past it), as psmd's fabric does, so back-to-back small
// messages cost it one recv() per batch. --poll block (default) waits in
// recv(); --poll spin keeps the socket non-blocking and retries on EAGAIN,
// as a busy-polling MPI progress loop does.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "bench/pt2pt.h"

namespace {

[[noreturn]] void Die(const char* what) {
  fprintf(stderr, "tcp_pt2pt: %s: %s\n", what, strerror(errno));
  exit(2);
}

sockaddr_in Address(const std::string& ip, uint16_t port) {
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  if (inet_pton(AF_INET, ip.c_str(), &a.sin_addr) != 1) {
    fprintf(stderr, "tcp_pt2pt: bad address %s\n", ip.c_str());
    exit(2);
  }
  return a;
}

class TcpTransport {
 public:
  TcpTransport(int fd, bool spin) : fd_(fd), spin_(spin), staging_(65536) {
    int one = 1;
    if (setsockopt(fd_, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one)) != 0)
      Die("TCP_NODELAY");
    if (spin_ && fcntl(fd_, F_SETFL, fcntl(fd_, F_GETFL) | O_NONBLOCK) != 0)
      Die("O_NONBLOCK");
  }

  void Send(const char* p, size_t n) {
    while (n > 0) {
      ssize_t k = send(fd_, p, n, MSG_NOSIGNAL);
      if (k < 0) {
        if (errno == EINTR || errno == EAGAIN) continue;
        Die("send");
      }
      p += k;
      n -= static_cast<size_t>(k);
    }
  }

  void Recv(char* p, size_t n) {
    size_t take = std::min(n, end_ - begin_);
    memcpy(p, staging_.data() + begin_, take);
    begin_ += take;
    p += take;
    n -= take;
    while (n >= staging_.size()) {
      size_t k = Read(p, n);
      p += k;
      n -= k;
    }
    while (n > 0) {
      begin_ = 0;
      end_ = Read(staging_.data(), staging_.size());
      take = std::min(n, end_);
      memcpy(p, staging_.data(), take);
      begin_ = take;
      p += take;
      n -= take;
    }
  }

  void Isend(int, const char* p, size_t n) { Send(p, n); }
  void WaitSend(int) {}
  void Irecv(int slot, char* p, size_t n) { posted_[slot] = {p, n}; }
  void WaitRecv(int slot) { Recv(posted_[slot].first, posted_[slot].second); }
  void PostAck() {}
  void WaitAck() {
    char b;
    Recv(&b, 1);
  }
  void SendAck() { Send("a", 1); }

 private:
  size_t Read(char* p, size_t n) {
    for (;;) {
      ssize_t k = recv(fd_, p, n, 0);
      if (k > 0) return static_cast<size_t>(k);
      if (k == 0) {
        fprintf(stderr, "tcp_pt2pt: peer closed\n");
        exit(2);
      }
      if (errno != EINTR && errno != EAGAIN) Die("recv");
    }
  }

  int fd_;
  bool spin_;
  std::vector<char> staging_;
  size_t begin_ = 0, end_ = 0;
  std::pair<char*, size_t> posted_[psmd::bench::kWindow];
};

// Rank 1: listens, publishes its port under dir, accepts one connection.
int Accept(const std::string& dir, const std::string& ip) {
  int l = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a = Address(ip, 0);
  socklen_t len = sizeof(a);
  if (l < 0 || bind(l, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 ||
      listen(l, 1) != 0 ||
      getsockname(l, reinterpret_cast<sockaddr*>(&a), &len) != 0)
    Die("listen");
  std::string path = dir + "/tcp.port";
  {
    std::ofstream out(path + ".tmp");
    out << ntohs(a.sin_port) << "\n";
  }
  if (rename((path + ".tmp").c_str(), path.c_str()) != 0) Die("rename");
  int fd = accept(l, nullptr, nullptr);
  if (fd < 0) Die("accept");
  close(l);
  return fd;
}

// Rank 0: waits up to 60 s for rank 1's port, connects from ip.
int Connect(const std::string& dir, const std::string& ip,
            const std::string& peer_ip) {
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  unsigned port = 0;
  while (!(std::ifstream(dir + "/tcp.port") >> port)) {
    if (std::chrono::steady_clock::now() > deadline) {
      fprintf(stderr, "tcp_pt2pt: no port from rank 1 in %s\n", dir.c_str());
      exit(2);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in self = Address(ip, 0), peer = Address(peer_ip, port);
  if (fd < 0 || bind(fd, reinterpret_cast<sockaddr*>(&self), sizeof(self)) ||
      connect(fd, reinterpret_cast<sockaddr*>(&peer), sizeof(peer)) != 0)
    Die("connect");
  return fd;
}

}  // namespace

int main(int argc, char** argv) {
  psmd::bench::Options o = psmd::bench::ParseOptions(argc, argv);
  int rank = -1;
  std::string dir, addr0 = "127.0.0.2", addr1 = "127.0.0.3", poll = "block";
  for (auto& [flag, value] : o.extra) {
    if (flag == "--rank") {
      rank = atoi(value.c_str());
    } else if (flag == "--dir") {
      dir = value;
    } else if (flag == "--addr0") {
      addr0 = value;
    } else if (flag == "--addr1") {
      addr1 = value;
    } else if (flag == "--poll") {
      poll = value;
    } else {
      rank = -1;
      break;
    }
  }
  if ((rank != 0 && rank != 1) || dir.empty() ||
      (poll != "block" && poll != "spin")) {
    fprintf(stderr,
            "usage: tcp_pt2pt --rank 0|1 --dir DIR [--addr0 IP] [--addr1 IP] "
            "[--poll block|spin] [--min-size B] [--max-size B] [--iters N] "
            "[--tail 1] "
            "[--stream SIZE:MESSAGES,...] [--reps R] [--overlap B]\n");
    return 2;
  }
  int fd = rank == 1 ? Accept(dir, addr1) : Connect(dir, addr0, addr1);
  TcpTransport t(fd, poll == "spin");
  psmd::bench::Run(t, rank, o);
  close(fd);
  return 0;
}
