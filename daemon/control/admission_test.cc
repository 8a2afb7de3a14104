// Admission driven directly, with a real socket and a real registry: what
// the handover path (Freeze, then Start in this process or Adopt in the
// next) does with connections accepted but not yet classified.
#include "daemon/control/admission.h"

#include <errno.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

namespace psmd {
namespace {

class AdmissionTest : public ::testing::Test {
 protected:
  AdmissionTest()
      : dir_(MakeDir()),
        config_(Cfg(dir_)),
        worker_(config_, 1),
        registry_(config_, &worker_),
        admission_(config_, &registry_) {}
  ~AdmissionTest() override {
    admission_.Stop();
    registry_.RemoveAll();
    rmdir(dir_.c_str());
  }

  static std::string MakeDir() {
    char tmpl[] = "/tmp/psmd-admission-test-XXXXXX";
    return mkdtemp(tmpl);
  }
  static Config Cfg(const std::string& dir) {
    Config c;
    c.socket_path = dir + "/psmd.sock";
    return c;
  }

  // A client connection to the control socket, or -1.
  int Connect() {
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    config_.socket_path.copy(addr.sun_path, sizeof(addr.sun_path) - 1);
    if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
      close(fd);
      return -1;
    }
    return fd;
  }

  // True when psmd closed `fd` within `ms`: end of file, or a reset (the
  // kernel's answer when psmd closed it with our bytes unread).
  static bool ClosedByPsmd(int fd, int ms) {
    pollfd p{fd, POLLIN, 0};
    if (poll(&p, 1, ms) != 1) return false;
    char c;
    ssize_t n = recv(fd, &c, 1, MSG_DONTWAIT);
    return n == 0 || (n < 0 && errno == ECONNRESET);
  }

  std::string dir_;
  Config config_;
  Workers worker_;
  Registry registry_;
  Admission admission_;
};

// A handover freezes admission with connections accepted and not yet
// classified; their clients may speak before the successor (or this psmd,
// when the handover failed) starts again. Start classifies each of them,
// and classifying one takes it out of the table Start walks: it once
// walked the table itself and read a freed node (a SIGSEGV at an upgrade
// while ranks attached; under ASan, heap-use-after-free in Start).
TEST_F(AdmissionTest, ConnectionsThatSpokeWhileFrozenAreClassifiedAtStart) {
  std::string error;
  ASSERT_TRUE(admission_.Bind({}, 0, &error)) << error;
  admission_.Start(nullptr);
  constexpr int kClients = 8;
  std::vector<int> clients;
  for (int i = 0; i < kClients; i++) {
    int fd = Connect();
    ASSERT_GE(fd, 0);
    clients.push_back(fd);
  }
  // Frozen with every client accepted (the admission thread accepts them
  // in its own time: freeze again until it has).
  std::vector<int> pending;
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::seconds(5);
  for (;;) {
    admission_.Freeze(&pending);
    if (pending.size() == kClients) break;
    ASSERT_LT(std::chrono::steady_clock::now(), deadline)
        << pending.size() << " of " << kClients << " accepted";
    admission_.Start(nullptr);
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  // While frozen: six speak neither gRPC nor attach, two only begin the
  // attach magic (to be waited for, not dropped).
  const char garbage[] = "GARBAGE-GARBAGE-GARBAGE";
  for (int i = 0; i < kClients; i++) {
    const char* what = i < 6 ? garbage : "PSMD";
    ASSERT_GT(send(clients[i], what, i < 6 ? sizeof(garbage) : 4, 0), 0);
  }
  admission_.Start(nullptr);
  for (int i = 0; i < kClients; i++) {
    EXPECT_EQ(ClosedByPsmd(clients[i], i < 6 ? 2000 : 100), i < 6)
        << "client " << i;
    close(clients[i]);
  }
}

}  // namespace
}  // namespace psmd
