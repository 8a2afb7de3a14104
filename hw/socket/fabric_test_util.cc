#include "hw/socket/fabric_test_util.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "hw/ofi/ofi_fabric.h"
#include "hw/socket/socket_fabric.h"

namespace psmd::hw::testing {

int Node::Pump(int wait_ms) {
  Event ev[64];
  int n = wait_ms == 0 ? fabric->Poll(ev, 64) : fabric->Wait(ev, 64, wait_ms);
  for (int i = 0; i < n; i++) events.push_back(ev[i]);
  return n;
}

bool Node::Take(EventType type, Event* out) {
  for (auto it = events.begin(); it != events.end(); ++it) {
    if (it->type == type) {
      *out = *it;
      events.erase(it);
      return true;
    }
  }
  return false;
}

size_t Node::Count(EventType type) const {
  size_t n = 0;
  for (const Event& e : events) n += e.type == type;
  return n;
}

std::string OfiProvider() {
  const char* p = std::getenv("PSMD_TEST_OFI_PROVIDER");
  return p == nullptr ? std::string() : std::string(p);
}

std::unique_ptr<Fabric> OpenFabric(FabricOptions options, std::string* error) {
  const std::string provider = OfiProvider();
  if (provider.empty()) return OpenSocketFabric(options, error);
  options.provider = provider;
  return OpenOfiFabric(options, error);
}

std::unique_ptr<Node> OpenNode(uint64_t node_id,
                               std::vector<std::string> listen,
                               FabricOptions options) {
  options.node_id = node_id;
  options.listen = std::move(listen);
  std::string error;
  auto node = std::make_unique<Node>();
  node->fabric = OpenFabric(options, &error);
  EXPECT_NE(node->fabric, nullptr) << error;
  return node;
}

bool PumpUntil(const std::vector<Node*>& nodes,
               const std::function<bool()>& done, int timeout_ms) {
  auto end =
      std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  // As the daemon would: poll every fabric, and when none had anything,
  // sleep in epoll on their event fds.
  int ep = epoll_create1(EPOLL_CLOEXEC);
  for (Node* n : nodes) {
    epoll_event ev{};
    ev.events = EPOLLIN;
    epoll_ctl(ep, EPOLL_CTL_ADD, n->fabric->event_fd(), &ev);
  }
  bool ok = true;
  while (!done()) {
    if (std::chrono::steady_clock::now() > end) {
      ok = false;
      break;
    }
    int got = 0;
    for (Node* n : nodes) got += n->Pump(0);
    if (got == 0) {
      epoll_event ev[8];
      epoll_wait(ep, ev, 8, 1);
      for (Node* n : nodes) {
        uint64_t count;
        ssize_t r = read(n->fabric->event_fd(), &count, sizeof count);
        (void)r;  // EAGAIN when it had not fired
      }
    }
  }
  close(ep);
  return ok;
}

bool Expect(const std::vector<Node*>& nodes, Node* node, EventType type,
            Event* out, int timeout_ms) {
  return PumpUntil(
      nodes, [&] { return node->Take(type, out); }, timeout_ms);
}

void Link(Node* a, Node* b, ConnId* at_a, ConnId* at_b) {
  ASSERT_EQ(a->fabric->Connect(b->fabric->HostDescription(), 42, at_a),
            ErrorClass::kOk);
  Event e;
  ASSERT_TRUE(Expect({a, b}, a, EventType::kConnected, &e));
  EXPECT_EQ(e.error, ErrorClass::kOk) << ErrorClassName(e.error);
  EXPECT_EQ(e.conn, *at_a);
  EXPECT_EQ(e.cookie, 42u);
  ASSERT_TRUE(Expect({a, b}, b, EventType::kAccepted, &e));
  *at_b = e.conn;
}

void WhilePumping(const std::vector<Node*>& nodes,
                  const std::function<void()>& fn) {
  std::atomic<bool> finished{false};
  std::thread worker([&] {
    fn();
    finished = true;
  });
  PumpUntil(
      nodes, [&] { return finished.load(); }, 60000);
  worker.join();
}

RawPeer::~RawPeer() {
  if (fd_ >= 0) close(fd_);
}

bool RawPeer::Connect(const std::string& host, uint16_t port) {
  fd_ = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  // Only a receive timeout: a blocking call with a timeout is not
  // restarted when io_uring task work interrupts this thread (EINTR).
  timeval tv{5, 0};
  setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(port);
  inet_pton(AF_INET, host.c_str(), &sa.sin_addr);
  if (connect(fd_, reinterpret_cast<sockaddr*>(&sa), sizeof sa) == 0) {
    return true;
  }
  ADD_FAILURE() << "connect " << host << ":" << port << ": "
                << std::strerror(errno);
  return false;
}

bool RawPeer::Send(const void* data, size_t n) {
  return send(fd_, data, n, MSG_NOSIGNAL) == static_cast<ssize_t>(n);
}

bool RawPeer::SendFrame(FrameType type, const std::string& payload,
                        const FrameFields& fields) {
  FrameHeader h;
  h.type = type;
  h.length = static_cast<uint32_t>(payload.size());
  h.fields = fields;
  uint8_t bytes[kFrameHeaderSize];
  EncodeFrameHeader(h, bytes);
  std::string all(reinterpret_cast<char*>(bytes), kFrameHeaderSize);
  all += payload;
  return Send(all.data(), all.size());
}

bool RawPeer::ReadAll(void* data, size_t n) {
  return recv(fd_, data, n, MSG_WAITALL) == static_cast<ssize_t>(n);
}

bool RawPeer::ReadFrame(FrameHeader* header, std::string* payload) {
  uint8_t bytes[kFrameHeaderSize];
  if (!ReadAll(bytes, sizeof bytes)) return false;
  if (DecodeFrameHeader(bytes, sizeof bytes, FrameLimits{}, header) !=
      FrameError::kOk) {
    return false;
  }
  payload->assign(header->length, '\0');
  return header->length == 0 || ReadAll(payload->data(), header->length);
}

bool RawPeer::ClosedByPeer() {
  char buf[4096];
  while (true) {
    ssize_t n = recv(fd_, buf, sizeof buf, 0);
    if (n == 0) return true;
    if (n < 0) return errno == ECONNRESET;
  }
}

HostAddress FirstAddress(const Fabric& f) {
  HostDescription d;
  std::string error;
  EXPECT_TRUE(ParseHostDescription(f.HostDescription(), &d, &error)) << error;
  return d.addresses.at(0);
}

}  // namespace psmd::hw::testing
