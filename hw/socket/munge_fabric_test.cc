// MUNGE authentication between fabric instances, with real munged daemons
// this test starts (its own keys, sockets, pid and log files in a temp
// directory; ended by PID): good peers connect, a peer with another key, a
// replayed credential, a reused nonce, a non-root credential and an
// unauthenticated peer are refused, and a bystander's traffic goes on.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <munge.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "hw/socket/fabric_test_util.h"
#include "hw/socket/socket_fabric.h"
#include "tests/harness.h"

namespace psmd::hw {
namespace {

using testing::Expect;
using testing::FirstAddress;
using testing::Node;
using testing::OpenNode;
using testing::RawPeer;
using testing::WhilePumping;

using psmd::testing::Munged;  // tests/harness.h

std::string TempDir() {
  const char* base = std::getenv("PSMD_TEST_TMP");
  std::string tmpl = std::string(base ? base : "/tmp") + "/psmd-munge-XXXXXX";
  EXPECT_NE(mkdtemp(tmpl.data()), nullptr);
  chmod(tmpl.c_str(), 0711);
  return tmpl;
}

// A MUNGE credential for `payload`, made through `socket` (as this process,
// or as `uid` in a child when uid != 0).
std::string Credential(const std::string& socket, const std::string& payload,
                       uid_t uid = 0) {
  int pipefd[2];
  EXPECT_EQ(pipe(pipefd), 0);
  pid_t child = fork();
  if (child == 0) {
    close(pipefd[0]);
    if (uid != 0 && setuid(uid) != 0) _exit(1);
    munge_ctx_t ctx = munge_ctx_create();
    munge_ctx_set(ctx, MUNGE_OPT_SOCKET, socket.c_str());
    char* cred = nullptr;
    if (munge_encode(&cred, ctx, payload.data(),
                     static_cast<int>(payload.size())) != EMUNGE_SUCCESS) {
      _exit(1);
    }
    ssize_t n = write(pipefd[1], cred, std::strlen(cred));
    _exit(n > 0 ? 0 : 1);
  }
  close(pipefd[1]);
  std::string cred;
  char buf[512];
  ssize_t n;
  while ((n = read(pipefd[0], buf, sizeof buf)) > 0) cred.append(buf, n);
  close(pipefd[0]);
  int status = 0;
  waitpid(child, &status, 0);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  return cred;
}

class MungeFabric : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = TempDir();
    good_ = std::make_unique<Munged>(dir_ + "/good");
    other_ = std::make_unique<Munged>(dir_ + "/other");
    ASSERT_TRUE(good_->running() && other_->running())
        << "munged did not start";
    a_ = OpenNode(1, {"127.0.0.2"}, With(good_->socket()));
    b_ = OpenNode(2, {"127.0.0.3"}, With(good_->socket()));
    Link();
  }
  void TearDown() override {
    a_.reset();
    b_.reset();
    good_.reset();
    other_.reset();
    std::filesystem::remove_all(dir_);
  }

  static FabricOptions With(const std::string& socket) {
    FabricOptions o;
    o.auth = AuthMode::kMunge;
    o.munge_socket = socket;
    o.timeout_ms = 3000;
    return o;
  }

  void Link() {
    ASSERT_EQ(a_->fabric->Connect(b_->fabric->HostDescription(), 0, &ab_),
              ErrorClass::kOk);
    Event e;
    ASSERT_TRUE(Expect(nodes(), a_.get(), EventType::kConnected, &e));
    ASSERT_EQ(e.error, ErrorClass::kOk) << ErrorClassName(e.error);
    ASSERT_TRUE(Expect(nodes(), b_.get(), EventType::kAccepted, &e));
    EXPECT_EQ(e.peer_node, 1u);
    ba_ = e.conn;
  }

  // The bystander pair a-b still exchanges a frame.
  void ExpectBystanderWorks(uint64_t token) {
    uint64_t got = 0;
    iovec out{&token, 8}, in{&got, 8};
    ASSERT_EQ(b_->fabric->PostRecv(ba_, &in, 1, 0), ErrorClass::kOk);
    ASSERT_EQ(a_->fabric->PostSend(ab_, {}, &out, 1, 0), ErrorClass::kOk);
    Event e;
    ASSERT_TRUE(Expect(nodes(), b_.get(), EventType::kRecvDone, &e));
    EXPECT_EQ(e.error, ErrorClass::kOk);
    EXPECT_EQ(got, token);
  }

  // A raw connection to b: returns b's challenge nonce.
  void Challenge(RawPeer* raw, uint8_t nonce[kNonceSize]) {
    HostAddress at = FirstAddress(*b_->fabric);
    ASSERT_TRUE(raw->Connect(at.host, at.port));
    FrameHeader h;
    std::string payload;
    bool read = false;
    WhilePumping(nodes(), [&] { read = raw->ReadFrame(&h, &payload); });
    ASSERT_TRUE(read);
    ChallengePayload ch;
    ASSERT_EQ(DecodeChallenge(reinterpret_cast<const uint8_t*>(payload.data()),
                              payload.size(), &ch),
              FrameError::kOk);
    EXPECT_EQ(ch.node, 2u);
    std::memcpy(nonce, ch.nonce, kNonceSize);
  }

  // Sends a hello as node `node` with `cred`; returns b's answer (kWelcome
  // or kRefuse) and, for a refusal, whether b then closed the connection.
  FrameType Hello(RawPeer* raw, uint64_t node, const std::string& cred,
                  RefuseReason* reason = nullptr) {
    EXPECT_TRUE(raw->SendFrame(
        FrameType::kHello, EncodeHello({node, 5, 2, AuthMode::kMunge, cred})));
    FrameHeader h;
    std::string payload;
    bool read = false, closed = false;
    WhilePumping(nodes(), [&] {
      read = raw->ReadFrame(&h, &payload);
      if (read && h.type == FrameType::kRefuse) closed = raw->ClosedByPeer();
    });
    EXPECT_TRUE(read);
    if (read && h.type == FrameType::kRefuse) {
      EXPECT_TRUE(closed);
      RefuseReason r;
      EXPECT_EQ(DecodeRefuse(reinterpret_cast<const uint8_t*>(payload.data()),
                             payload.size(), &r),
                FrameError::kOk);
      if (reason != nullptr) *reason = r;
    }
    return read ? h.type : FrameType::kData;
  }

  std::string Payload(const uint8_t challenge[kNonceSize], uint8_t nonce_byte,
                      uint64_t node) {
    CredentialPayload cp;
    std::memcpy(cp.challenge, challenge, kNonceSize);
    std::memset(cp.nonce, nonce_byte, kNonceSize);
    cp.connector_node = node;
    cp.acceptor_node = 2;
    return EncodeCredentialPayload(cp);
  }

  std::vector<Node*> nodes() { return {a_.get(), b_.get()}; }

  std::string dir_;
  std::unique_ptr<Munged> good_, other_;
  std::unique_ptr<Node> a_, b_;
  ConnId ab_ = 0, ba_ = 0;
};

TEST_F(MungeFabric, GoodPeersExchange) { ExpectBystanderWorks(11); }

TEST_F(MungeFabric, WrongKeyAndNoAuthAreRefused) {
  // c's munged has another key: b cannot decode its credential.
  auto c = OpenNode(3, {"127.0.0.4"}, With(other_->socket()));
  ConnId cb;
  ASSERT_EQ(c->fabric->Connect(b_->fabric->HostDescription(), 0, &cb),
            ErrorClass::kOk);
  Event e;
  ASSERT_TRUE(Expect({a_.get(), b_.get(), c.get()}, c.get(),
                     EventType::kConnected, &e));
  EXPECT_EQ(e.error, ErrorClass::kAuthFailed) << ErrorClassName(e.error);
  EXPECT_EQ(b_->Count(EventType::kAccepted), 0u);
  ExpectBystanderWorks(12);

  // d does not authenticate at all.
  FabricOptions none;
  none.auth = AuthMode::kNone;
  auto d = OpenNode(4, {"127.0.0.5"}, none);
  ConnId db;
  ASSERT_EQ(d->fabric->Connect(b_->fabric->HostDescription(), 0, &db),
            ErrorClass::kOk);
  ASSERT_TRUE(Expect({a_.get(), b_.get(), d.get()}, d.get(),
                     EventType::kConnected, &e));
  EXPECT_EQ(e.error, ErrorClass::kAuthFailed) << ErrorClassName(e.error);
  EXPECT_EQ(b_->Count(EventType::kAccepted), 0u);
  ExpectBystanderWorks(13);
  // b counts both under node 0 (they never authenticated); c under b.
  std::vector<PeerStats> rows = b_->fabric->Stats();
  ASSERT_GE(rows.size(), 1u);
  EXPECT_EQ(rows[0].node, 0u);
  EXPECT_EQ(rows[0].auth_failures, 2u);
  rows = c->fabric->Stats();
  ASSERT_EQ(rows.size(), 1u);
  EXPECT_EQ(rows[0].node, 2u);
  EXPECT_EQ(rows[0].auth_failures, 1u);
}

TEST_F(MungeFabric, ReplayedCredentialAndReusedNonceAreRefused) {
  if (!testing::OfiProvider().empty()) {
    GTEST_SKIP() << "ofi: drives raw TCP peers";
  }
  uint8_t challenge[kNonceSize];
  RawPeer first;
  Challenge(&first, challenge);
  std::string cred = Credential(good_->socket(), Payload(challenge, 0x5a, 5));
  ASSERT_FALSE(cred.empty());
  EXPECT_EQ(Hello(&first, 5, cred), FrameType::kWelcome);
  Event e;
  ASSERT_TRUE(Expect(nodes(), b_.get(), EventType::kAccepted, &e));
  EXPECT_EQ(e.peer_node, 5u);

  // The same credential on a new connection (another challenge).
  RawPeer replay;
  Challenge(&replay, challenge);
  RefuseReason reason;
  EXPECT_EQ(Hello(&replay, 5, cred, &reason), FrameType::kRefuse);
  EXPECT_EQ(reason, RefuseReason::kAuth);

  // A fresh credential for the new challenge, but the old nonce.
  RawPeer reuse;
  Challenge(&reuse, challenge);
  std::string again = Credential(good_->socket(), Payload(challenge, 0x5a, 6));
  EXPECT_EQ(Hello(&reuse, 6, again, &reason), FrameType::kRefuse);
  EXPECT_EQ(reason, RefuseReason::kAuth);
  ExpectBystanderWorks(14);
}

TEST_F(MungeFabric, NonRootCredentialIsRefused) {
  if (!testing::OfiProvider().empty()) {
    GTEST_SKIP() << "ofi: drives raw TCP peers";
  }
  uint8_t challenge[kNonceSize];
  RawPeer raw;
  Challenge(&raw, challenge);
  std::string cred =
      Credential(good_->socket(), Payload(challenge, 0x33, 7), 65534);
  ASSERT_FALSE(cred.empty());
  RefuseReason reason;
  EXPECT_EQ(Hello(&raw, 7, cred, &reason), FrameType::kRefuse);
  EXPECT_EQ(reason, RefuseReason::kAuth);
  ExpectBystanderWorks(15);
}

}  // namespace
}  // namespace psmd::hw
