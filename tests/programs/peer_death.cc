// peer_death: one side of a rendezvous transfer whose peer the integration
// test kills (tests/integration_test.cc), to show that the survivor's
// requests end with an error and its other traffic goes on.
//
//   peer_death --role ROLE --rank R --dir DIR --uuid UUID
//
// Roles (the two ranks of a test: 0 sends, 1 receives):
//   stalled-sender   posts a 64 MiB send, streams until DIR/streaming
//                    exists, then stops calling PSM2 (to be killed).
//   waiting-receiver posts the 64 MiB receive, writes DIR/posted, writes
//                    DIR/streaming once the first MiB arrived, waits on the
//                    receive; exits 0 if the wait ends with an error.
//   stuck-sender     sends 100 eager 32 KiB messages and a 64 MiB one into
//                    a receiver that never reads, so its send region fills;
//                    writes DIR/stuck and waits on the large send; exits 0
//                    if that ends with an error and 200 messages of 60000 B
//                    to itself (more than its region holds) then go through.
//   idle-receiver    posts receives for all of that, writes DIR/posted and
//                    never calls PSM2 again (to be killed).
//   unexpected-sender  sends 400 eager 60000 B messages, every eighth
//                    synchronous, to a receiver that posts nothing (more
//                    than its send region and the receiving job's inbox
//                    hold); writes DIR/unreceived after a second, waits on
//                    the first synchronous one; exits 0 if that ends with an
//                    error and every other send then ends too.
//   silent-receiver  writes DIR/posted and never calls PSM2 (to be killed).
//   unsent-receiver  once DIR/posted exists, posts a receive naming its
//                    peer, which never sends, writes DIR/waiting and waits
//                    on it; exits 0 if that ends with an error and a new
//                    receive and a new synchronous send naming the peer
//                    then fail too.
//   any-source-waiter  registers an error handler, posts a receive from any
//                    source, writes DIR/waiting and polls; exits 0 once the
//                    handler was called (it prints "handler <error> at
//                    <monotonic ms>: <message>"), the next psm2_poll
//                    returned that error and the receive could be cancelled.
//   posted-receiver  posts the 64 MiB receive, writes DIR/posted and waits
//                    on it; exits 0 if the wait ends with an error (its
//                    peer is the test's own node: tests/fabric_test.cc).
//                    Then prints what its buffer holds, as runs of equal
//                    bytes: "landed 11x262144 00x66846720" (at most 8).
//   quiet-waiter     registers an error handler, writes DIR/waiting and
//                    polls until DIR/stop exists; exits 0 if the handler was
//                    never called and no psm2_poll returned an error.
// A survivor prints "ended <error> at <monotonic ms>" when its wait returns.
#include <psm2.h>
#include <psm2_mq.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "tests/programs/rendezvous.h"

namespace {

using psmd::testing::CheckPsm;
using psmd::testing::ExactSelector;
using psmd::testing::TagOf;

constexpr uint32_t kLarge = 64u << 20;
constexpr uint32_t kEagerCount = 100, kEagerLen = 32u << 10;

void Touch(const std::string& path) { std::ofstream(path) << "1\n"; }

void AwaitFile(const std::string& path) {
  while (access(path.c_str(), F_OK) != 0)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
}

long long NowMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// Waits on req; prints when it ended and how. Returns its error.
psm2_error_t WaitAndReport(psm2_mq_req_t* req) {
  psm2_mq_status2_t st;
  CheckPsm(psm2_mq_wait2(req, &st), "psm2_mq_wait2");
  printf("ended %d at %lld\n", static_cast<int>(st.error_code), NowMs());
  fflush(stdout);
  return st.error_code;
}

void PollFor(psm2_ep_t ep, double seconds) {
  auto end =
      std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  while (std::chrono::steady_clock::now() < end) psm2_poll(ep);
}

int StalledSender(psmd::testing::ConnectedPair& c, const std::string& dir) {
  std::vector<uint8_t> buf(kLarge, 0x5a);
  AwaitFile(dir + "/posted");
  psm2_mq_tag_t tag = TagOf(1);
  psm2_mq_req_t req;
  CheckPsm(
      psm2_mq_isend2(c.mq, c.peer, 0, &tag, buf.data(), kLarge, nullptr, &req),
      "isend2");
  // Streams until the receiver has the first MiB, then stops calling PSM2:
  // the receiver stays in the middle of the message.
  while (access((dir + "/streaming").c_str(), F_OK) != 0) psm2_poll(c.ep);
  pause();
  return 1;
}

// "landed" and the runs of equal bytes in `buf` (hex byte x count), the
// first 8: what reached the receiver, so a test can tell which of its
// peer's bytes did.
void PrintRuns(const std::vector<uint8_t>& buf) {
  printf("landed");
  size_t at = 0;
  for (int runs = 0; at < buf.size() && runs < 8; runs++) {
    size_t end = at;
    while (end < buf.size() && buf[end] == buf[at]) end++;
    printf(" %02xx%zu", buf[at], end - at);
    at = end;
  }
  printf("%s\n", at < buf.size() ? " ..." : "");
  fflush(stdout);
}

// waiting-receiver, and without `streaming` posted-receiver.
int WaitingReceiver(psmd::testing::ConnectedPair& c, const std::string& dir,
                    bool streaming) {
  std::vector<uint8_t> buf(kLarge);
  psm2_mq_tag_t tag = TagOf(1), sel = ExactSelector();
  psm2_mq_req_t req;
  CheckPsm(psm2_mq_irecv2(c.mq, c.peer, &tag, &sel, 0, buf.data(), kLarge,
                          nullptr, &req),
           "irecv2");
  Touch(dir + "/posted");
  if (streaming) {
    // The message's bytes land in order: once the first MiB is in, the
    // transfer is under way.
    while (buf[(1u << 20) - 1] == 0) psm2_poll(c.ep);
    Touch(dir + "/streaming");
  }
  const bool failed = WaitAndReport(&req) != PSM2_OK;
  if (!streaming) PrintRuns(buf);
  return failed ? 0 : 1;
}

int StuckSender(psmd::testing::ConnectedPair& c, const std::string& dir) {
  std::vector<uint8_t> large(kLarge, 0x5a), small(kEagerLen, 0xa5);
  AwaitFile(dir + "/posted");
  psm2_mq_tag_t eager = TagOf(2), big = TagOf(3);
  for (uint32_t i = 0; i < kEagerCount; i++) {
    CheckPsm(psm2_mq_send2(c.mq, c.peer, 0, &eager, small.data(), kEagerLen),
             "send2");
  }
  psm2_mq_req_t req;
  CheckPsm(psm2_mq_isend2(c.mq, c.peer, 0, &big, large.data(), kLarge, nullptr,
                          &req),
           "isend2");
  PollFor(c.ep, 1.0);  // the region fills: the receiver reads nothing
  Touch(dir + "/stuck");
  if (WaitAndReport(&req) == PSM2_OK) return 1;

  // Other traffic: to ourselves, more than the send region holds, so it
  // moves only if the dead receiver's chunks came back.
  psm2_epaddr_t self;
  psm2_error_t conn_err;
  CheckPsm(psm2_ep_connect(c.ep, 1, &c.self_epid, nullptr, &conn_err, &self,
                           10'000'000'000LL),
           "connect to self");
  std::vector<uint8_t> out(60000, 0x11), in(60000);
  psm2_mq_tag_t tag = TagOf(4), sel = ExactSelector();
  for (int i = 0; i < 200; i++) {
    psm2_mq_req_t s, r;
    CheckPsm(psm2_mq_isend2(c.mq, self, 0, &tag, out.data(), out.size(),
                            nullptr, &s),
             "isend2");
    CheckPsm(psm2_mq_irecv2(c.mq, self, &tag, &sel, 0, in.data(), in.size(),
                            nullptr, &r),
             "irecv2");
    CheckPsm(psm2_mq_wait2(&s, nullptr), "wait2");
    CheckPsm(psm2_mq_wait2(&r, nullptr), "wait2");
    if (in != out) {
      fprintf(stderr, "message %d to self arrived wrong\n", i);
      return 1;
    }
  }
  printf("other traffic ok\n");
  return 0;
}

int UnsentReceiver(psmd::testing::ConnectedPair& c, const std::string& dir) {
  AwaitFile(dir + "/posted");
  uint64_t word = 0;
  psm2_mq_tag_t tag = TagOf(5), sel = ExactSelector();
  psm2_mq_req_t req;
  CheckPsm(psm2_mq_irecv2(c.mq, c.peer, &tag, &sel, 0, &word, sizeof(word),
                          nullptr, &req),
           "irecv2");
  Touch(dir + "/waiting");
  if (WaitAndReport(&req) == PSM2_OK) return 1;
  // Nothing can come from that peer now, nor reach it.
  psm2_mq_status2_t st;
  CheckPsm(psm2_mq_irecv2(c.mq, c.peer, &tag, &sel, 0, &word, sizeof(word),
                          nullptr, &req),
           "irecv2");
  CheckPsm(psm2_mq_wait2(&req, &st), "wait2");
  if (st.error_code == PSM2_OK) return 1;
  CheckPsm(psm2_mq_isend2(c.mq, c.peer, PSM2_MQ_FLAG_SENDSYNC, &tag, &word,
                          sizeof(word), nullptr, &req),
           "isend2");
  CheckPsm(psm2_mq_wait2(&req, &st), "wait2");
  if (st.error_code == PSM2_OK) return 1;
  printf("later requests fail\n");
  return 0;
}

int UnexpectedSender(psmd::testing::ConnectedPair& c, const std::string& dir) {
  constexpr uint32_t kCount = 400, kLen = 60000;
  std::vector<uint8_t> buf(size_t{kCount} * kLen, 0x3c);
  AwaitFile(dir + "/posted");
  std::vector<psm2_mq_req_t> reqs(kCount);
  for (uint32_t i = 0; i < kCount; i++) {
    psm2_mq_tag_t tag = TagOf(6 + i);
    CheckPsm(psm2_mq_isend2(
                 c.mq, c.peer, i % 8 == 0 ? PSM2_MQ_FLAG_SENDSYNC : 0, &tag,
                 buf.data() + size_t{i} * kLen, kLen, nullptr, &reqs[i]),
             "isend2");
  }
  PollFor(c.ep, 1.0);
  Touch(dir + "/unreceived");
  if (WaitAndReport(&reqs[0]) == PSM2_OK) return 1;
  // The others: eager ones completed when sent, the synchronous ones and
  // those sent by rendezvous fail now; none may be left waiting.
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  uint32_t open = 0, failed = 1;
  for (uint32_t i = 1; i < kCount; i++) {
    psm2_mq_status2_t st;
    psm2_error_t err;
    while ((err = psm2_mq_test2(&reqs[i], &st)) == PSM2_MQ_NO_COMPLETIONS &&
           std::chrono::steady_clock::now() < end) {
      psm2_poll(c.ep);
    }
    if (err != PSM2_OK) open++;
    if (err == PSM2_OK && st.error_code != PSM2_OK) failed++;
  }
  printf("%u sends failed, %u left open\n", failed, open);
  return open == 0 ? 0 : 1;
}

int SilentReceiver(psmd::testing::ConnectedPair&, const std::string& dir) {
  Touch(dir + "/posted");
  pause();
  return 1;
}

int IdleReceiver(psmd::testing::ConnectedPair& c, const std::string& dir) {
  std::vector<uint8_t> large(kLarge), small(kEagerCount * size_t{kEagerLen});
  psm2_mq_tag_t eager = TagOf(2), big = TagOf(3), sel = ExactSelector();
  psm2_mq_req_t req;
  for (uint32_t i = 0; i < kEagerCount; i++) {
    CheckPsm(psm2_mq_irecv2(c.mq, c.peer, &eager, &sel, 0,
                            small.data() + i * size_t{kEagerLen}, kEagerLen,
                            nullptr, &req),
             "irecv2");
  }
  CheckPsm(psm2_mq_irecv2(c.mq, c.peer, &big, &sel, 0, large.data(), kLarge,
                          nullptr, &req),
           "irecv2");
  Touch(dir + "/posted");
  pause();
  return 1;
}

// What the error handler saw (one endpoint per process).
psm2_error_t handled = PSM2_OK;
int handler_calls = 0;

psm2_error_t RecordError(psm2_ep_t, const psm2_error_t error,
                         const char* message, psm2_error_token_t) {
  if (handler_calls++ == 0) {
    handled = error;
    printf("handler %d at %lld: %s\n", static_cast<int>(error), NowMs(),
           message);
    fflush(stdout);
  }
  return error;
}

int AnySourceWaiter(psmd::testing::ConnectedPair& c, const std::string& dir) {
  CheckPsm(psm2_error_register_handler(c.ep, RecordError), "register handler");
  uint64_t word = 0;
  psm2_mq_tag_t tag = TagOf(6), sel = ExactSelector();
  psm2_mq_req_t req;
  CheckPsm(psm2_mq_irecv2(c.mq, PSM2_MQ_ANY_ADDR, &tag, &sel, 0, &word,
                          sizeof(word), nullptr, &req),
           "irecv2");
  Touch(dir + "/waiting");
  psm2_error_t polled = PSM2_OK;
  auto end = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (polled == PSM2_OK && std::chrono::steady_clock::now() < end) {
    psm2_error_t e = psm2_poll(c.ep);
    if (e != PSM2_OK && e != PSM2_OK_NO_PROGRESS) polled = e;
  }
  printf("poll returned %d\n", static_cast<int>(polled));
  if (handler_calls != 1 || handled == PSM2_OK || polled != handled) return 1;
  // The receive is still the application's to end.
  CheckPsm(psm2_mq_cancel(&req), "cancel");
  psm2_mq_status2_t st;
  CheckPsm(psm2_mq_wait2(&req, &st), "wait2 after cancel");
  return st.error_code == PSM2_OK ? 0 : 1;
}

int QuietWaiter(psmd::testing::ConnectedPair& c, const std::string& dir) {
  CheckPsm(psm2_error_register_handler(c.ep, RecordError), "register handler");
  Touch(dir + "/waiting");
  bool poll_error = false;
  while (access((dir + "/stop").c_str(), F_OK) != 0) {
    psm2_error_t e = psm2_poll(c.ep);
    poll_error |= e != PSM2_OK && e != PSM2_OK_NO_PROGRESS;
  }
  printf("handler calls %d, poll error %d\n", handler_calls, poll_error);
  return handler_calls == 0 && !poll_error ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  std::string role, dir, uuid_text;
  int rank = -1;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string flag = argv[i];
    if (flag == "--role") role = argv[i + 1];
    if (flag == "--rank") rank = atoi(argv[i + 1]);
    if (flag == "--dir") dir = argv[i + 1];
    if (flag == "--uuid") uuid_text = argv[i + 1];
  }
  psm2_uuid_t uuid;
  if (rank < 0 || dir.empty() || !psmd::testing::ParseUuid(uuid_text, uuid)) {
    fprintf(stderr,
            "usage: peer_death --role ROLE --rank R --dir DIR --uuid UUID\n");
    return 2;
  }
  psmd::testing::ConnectedPair c =
      psmd::testing::OpenAndConnect(uuid, dir, rank);
  if (role == "stalled-sender") return StalledSender(c, dir);
  if (role == "waiting-receiver") return WaitingReceiver(c, dir, true);
  if (role == "stuck-sender") return StuckSender(c, dir);
  if (role == "idle-receiver") return IdleReceiver(c, dir);
  if (role == "unexpected-sender") return UnexpectedSender(c, dir);
  if (role == "silent-receiver") return SilentReceiver(c, dir);
  if (role == "unsent-receiver") return UnsentReceiver(c, dir);
  if (role == "any-source-waiter") return AnySourceWaiter(c, dir);
  if (role == "quiet-waiter") return QuietWaiter(c, dir);
  if (role == "posted-receiver") return WaitingReceiver(c, dir, false);
  fprintf(stderr, "peer_death: unknown role '%s'\n", role.c_str());
  return 2;
}
