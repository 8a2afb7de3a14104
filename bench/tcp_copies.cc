// tcp_copies: what each way of moving a large message through loopback TCP
// costs on this machine, to choose the fabric's data path by numbers
// (docs/perf.md, "Fewer copies through the socket?").
//
//   tcp_copies [--sizes 262144,1048576] [--bytes 1073741824] [--reps 9]
//              [--cpus 0,1]
//
// A sender process (first CPU) streams messages to a receiver process
// (second CPU) over one TCP connection, 256 KiB per step as psmd's
// rendezvous chunks; the receiver answers each whole message with one byte,
// as a rendezvous sender's completion waits for its receiver. Ways:
//
//   direct       send() from the message, recv() into the destination:
//                Open MPI's tcp BTL (2 copies)
//   staged       the message copied into a staging buffer and sent from
//                there; received into a staging buffer and copied out:
//                psmd's fabric today, pool region to pool region (4 copies)
//   vmsplice     sender: vmsplice() of the message into a pipe, splice()
//                to the socket (its pages referenced, not copied); the
//                receiver staged
//   splice-recv  sender staged; receiver: splice() from the socket into a
//                pipe, read() from it into the destination (1 copy)
//   splice-both  vmsplice at the sender, splice-recv at the receiver
//
// The ways run interleaved, each size and way once per repetition; the
// table gives median, min and max GB/s of the repetitions.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sched.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace {

constexpr size_t kChunk = 256 * 1024;

enum Way { kDirect, kStaged, kVmsplice, kSpliceRecv, kSpliceBoth, kWays };
const char* const kWayName[kWays] = {"direct", "staged", "vmsplice",
                                     "splice-recv", "splice-both"};
bool SenderSplices(Way w) { return w == kVmsplice || w == kSpliceBoth; }
bool ReceiverSplices(Way w) { return w == kSpliceRecv || w == kSpliceBoth; }

[[noreturn]] void Die(const char* what) {
  fprintf(stderr, "tcp_copies: %s: %s\n", what, strerror(errno));
  exit(2);
}

void Pin(int cpu) {
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  if (sched_setaffinity(0, sizeof(set), &set) != 0) Die("sched_setaffinity");
}

std::vector<size_t> ParseList(const char* text) {
  std::vector<size_t> out;
  for (const char* p = text; *p != '\0';) {
    char* end = nullptr;
    size_t value = strtoull(p, &end, 10);
    if (end == p) break;  // not a number: the caller sees a short list
    out.push_back(value);
    p = (*end == ',') ? end + 1 : end;
  }
  return out;
}

// One end of the connection with its staging buffer and its pipe.
struct End {
  int sock = -1;
  int pipe_r = -1, pipe_w = -1;
  std::vector<char> staging = std::vector<char>(kChunk);

  explicit End(int fd) : sock(fd) {
    int p[2];
    if (pipe(p) != 0) Die("pipe");
    pipe_r = p[0];
    pipe_w = p[1];
    if (fcntl(pipe_w, F_SETPIPE_SZ, static_cast<int>(kChunk)) < 0)
      Die("F_SETPIPE_SZ");
  }

  void SendAll(const char* p, size_t n) const {
    while (n > 0) {
      ssize_t k = send(sock, p, n, MSG_NOSIGNAL);
      if (k <= 0) Die("send");
      p += k;
      n -= static_cast<size_t>(k);
    }
  }
  void RecvAll(char* p, size_t n) const {
    while (n > 0) {
      ssize_t k = recv(sock, p, n, 0);
      if (k <= 0) Die("recv");
      p += k;
      n -= static_cast<size_t>(k);
    }
  }

  void SendChunk(Way w, char* p, size_t n) {
    if (!SenderSplices(w)) {
      if (w == kDirect) return SendAll(p, n);
      memcpy(staging.data(), p, n);
      return SendAll(staging.data(), n);
    }
    iovec v{p, n};
    while (v.iov_len > 0) {
      ssize_t k = vmsplice(pipe_w, &v, 1, 0);
      if (k <= 0) Die("vmsplice");
      for (ssize_t left = k; left > 0;) {
        ssize_t s = splice(pipe_r, nullptr, sock, nullptr,
                           static_cast<size_t>(left), SPLICE_F_MOVE);
        if (s <= 0) Die("splice to the socket");
        left -= s;
      }
      v.iov_base = static_cast<char*>(v.iov_base) + k;
      v.iov_len -= static_cast<size_t>(k);
    }
  }

  void RecvChunk(Way w, char* p, size_t n) {
    if (!ReceiverSplices(w)) {
      if (w == kDirect) return RecvAll(p, n);
      RecvAll(staging.data(), n);
      memcpy(p, staging.data(), n);
      return;
    }
    while (n > 0) {
      ssize_t k = splice(sock, nullptr, pipe_w, nullptr, n, SPLICE_F_MOVE);
      if (k <= 0) Die("splice from the socket");
      for (ssize_t left = k; left > 0;) {
        ssize_t r = read(pipe_r, p, static_cast<size_t>(left));
        if (r <= 0) Die("read from the pipe");
        p += r;
        left -= r;
      }
      n -= static_cast<size_t>(k);
    }
  }
};

// Streams `count` messages of `size` bytes (after two not timed) and
// returns GB/s, or 0 when the receiver failed.
double Run(Way way, size_t size, size_t count, int cpu_send, int cpu_recv) {
  int listener = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  if (listener < 0 ||
      bind(listener, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      listen(listener, 1) != 0 ||
      getsockname(listener, reinterpret_cast<sockaddr*>(&addr), &len) != 0)
    Die("listen");
  const size_t total = count + 2;
  pid_t child = fork();
  if (child < 0) Die("fork");
  if (child == 0) {
    Pin(cpu_recv);
    int fd = accept(listener, nullptr, nullptr);
    if (fd < 0) Die("accept");
    End end(fd);
    std::vector<char> message(size, 0);
    for (size_t i = 0; i < total; ++i) {
      for (size_t off = 0; off < size; off += kChunk)
        end.RecvChunk(way, message.data() + off, std::min(kChunk, size - off));
      char ack = 1;
      end.SendAll(&ack, 1);
    }
    _exit(0);
  }
  close(listener);
  Pin(cpu_send);
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0 ||
      connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0)
    Die("connect");
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  End end(fd);
  std::vector<char> message(size, 7);
  auto start = std::chrono::steady_clock::now();
  for (size_t i = 0; i < total; ++i) {
    if (i == 2) start = std::chrono::steady_clock::now();
    for (size_t off = 0; off < size; off += kChunk)
      end.SendChunk(way, message.data() + off, std::min(kChunk, size - off));
    char ack;
    end.RecvAll(&ack, 1);
  }
  std::chrono::duration<double> took = std::chrono::steady_clock::now() - start;
  int status = 0;
  waitpid(child, &status, 0);
  close(fd);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) return 0;
  return static_cast<double>(size) * static_cast<double>(count) / took.count() /
         1e9;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<size_t> sizes = {262144, 1048576};
  size_t bytes = size_t{1} << 30;
  int reps = 9;
  std::vector<size_t> cpus = {0, 1};
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string flag = argv[i];
    if (flag == "--sizes") {
      sizes = ParseList(argv[i + 1]);
    } else if (flag == "--bytes") {
      bytes = strtoull(argv[i + 1], nullptr, 10);
    } else if (flag == "--reps") {
      reps = atoi(argv[i + 1]);
    } else if (flag == "--cpus") {
      cpus = ParseList(argv[i + 1]);
    } else {
      fprintf(stderr, "tcp_copies: unknown flag %s\n", argv[i]);
      return 2;
    }
  }
  if (cpus.size() != 2 || sizes.empty() || reps < 1) {
    fprintf(stderr, "tcp_copies: --cpus takes two CPUs, --sizes one or more\n");
    return 2;
  }
  std::vector<std::vector<double>> gbs(sizes.size() * kWays);
  for (int r = 0; r < reps; ++r)
    for (size_t s = 0; s < sizes.size(); ++s)
      for (int w = 0; w < kWays; ++w)
        gbs[s * kWays + w].push_back(
            Run(static_cast<Way>(w), sizes[s],
                std::max<size_t>(bytes / sizes[s] / reps, 10),
                static_cast<int>(cpus[0]), static_cast<int>(cpus[1])));
  printf("sender on CPU %zu, receiver on CPU %zu, %d repetitions\n", cpus[0],
         cpus[1], reps);
  printf("%-10s %-12s %8s %8s %8s  (GB/s)\n", "size", "way", "median", "min",
         "max");
  for (size_t s = 0; s < sizes.size(); ++s)
    for (int w = 0; w < kWays; ++w) {
      std::vector<double> v = gbs[s * kWays + w];
      std::sort(v.begin(), v.end());
      printf("%-10zu %-12s %8.2f %8.2f %8.2f\n", sizes[s], kWayName[w],
             v[v.size() / 2], v.front(), v.back());
    }
  return 0;
}
