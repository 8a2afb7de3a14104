// link_flap: one of two ranks that stream tagged messages at each other
// until the link between their daemons breaks (tests/fabric_netns_test.cc).
//
//   link_flap --rank R --dir DIR --uuid UUID
//
// Each rank keeps kWindow sends and kWindow receives in flight, message i
// of size kSizes[i % 3] (inline, pool-eager, rendezvous) with tag i, and
// checks every received byte. Once it has completed kAnnounce messages each
// way it writes DIR/streamingR. When a request ends with an error it posts
// nothing more, waits for every request still in flight to end, then posts
// one more rendezvous send and one receive naming the peer (both must fail
// within 10 s: the peer's node is unreachable now) and prints
//   ended first <monotonic ms> last <monotonic ms> ok <n> failed <n> codes
//   <c>:<n>... after <send error> <recv error>
// where first/last are when the first and the last failing request ended.
// Exit 0 when every request ended, every error was PSM2_EPID_UNREACHABLE or
// PSM2_TIMEOUT and the two late requests failed too; 1 otherwise.
#include <psm2.h>
#include <psm2_mq.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "tests/programs/rendezvous.h"

namespace {

using psmd::testing::CheckPsm;

constexpr int kWindow = 8;
constexpr uint32_t kSizes[3] = {8, 32u << 10, 512u << 10};
constexpr uint32_t kMaxSize = 512u << 10;
constexpr uint32_t kAnnounce = 300;

long long NowMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

psm2_mq_tag_t Tag(uint32_t i) {
  psm2_mq_tag_t t;
  memset(&t, 0, sizeof(t));
  t.tag0 = i;
  t.tag1 = 0xf1a9;
  return t;
}

uint8_t ByteOf(uint32_t msg, uint32_t k) {
  return static_cast<uint8_t>(msg * 131 + k * 7);
}

struct Slot {
  psm2_mq_req_t req = PSM2_MQ_REQINVALID;
  uint32_t msg = 0;
  std::vector<uint8_t> buf = std::vector<uint8_t>(kMaxSize);
};

bool Allowed(psm2_error_t e) {
  return e == PSM2_EPID_UNREACHABLE || e == PSM2_TIMEOUT;
}

// Waits up to 10 s for req; its error, or PSM2_OK_NO_PROGRESS if pending.
psm2_error_t EndOf(psm2_ep_t ep, psm2_mq_req_t* req) {
  auto end = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  psm2_mq_status2_t st;
  while (std::chrono::steady_clock::now() < end) {
    if (psm2_mq_test2(req, &st) == PSM2_OK) return st.error_code;
    psm2_poll(ep);
  }
  return PSM2_OK_NO_PROGRESS;
}

}  // namespace

int main(int argc, char** argv) {
  std::string dir, uuid_text;
  int rank = -1;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string flag = argv[i];
    if (flag == "--rank") rank = atoi(argv[i + 1]);
    if (flag == "--dir") dir = argv[i + 1];
    if (flag == "--uuid") uuid_text = argv[i + 1];
  }
  psm2_uuid_t uuid;
  if (rank < 0 || dir.empty() || !psmd::testing::ParseUuid(uuid_text, uuid)) {
    fprintf(stderr, "usage: link_flap --rank R --dir DIR --uuid UUID\n");
    return 2;
  }
  alarm(120);  // the test bounds the run; this only stops an orphan
  psmd::testing::ConnectedPair c =
      psmd::testing::OpenAndConnect(uuid, dir, rank);
  psm2_mq_tag_t exact;
  memset(&exact, 0xff, sizeof(exact));

  Slot sends[kWindow], recvs[kWindow];
  uint32_t next_send = 0, next_recv = 0, sends_done = 0, recvs_done = 0;
  auto post_send = [&](Slot& s) {
    s.msg = next_send++;
    const uint32_t len = kSizes[s.msg % 3];
    for (uint32_t k = 0; k < len; k++) s.buf[k] = ByteOf(s.msg, k);
    psm2_mq_tag_t t = Tag(s.msg);
    CheckPsm(
        psm2_mq_isend2(c.mq, c.peer, 0, &t, s.buf.data(), len, nullptr, &s.req),
        "isend2");
  };
  auto post_recv = [&](Slot& s) {
    s.msg = next_recv++;
    psm2_mq_tag_t t = Tag(s.msg);
    CheckPsm(psm2_mq_irecv2(c.mq, c.peer, &t, &exact, 0, s.buf.data(), kMaxSize,
                            nullptr, &s.req),
             "irecv2");
  };
  for (int i = 0; i < kWindow; i++) {
    post_send(sends[i]);
    post_recv(recvs[i]);
  }

  bool broken = false, announced = false;
  long long first_ms = 0, last_ms = 0;
  int ok = 0, failed = 0, pending = 2 * kWindow;
  std::map<int, int> codes;
  while (pending > 0) {
    psm2_poll(c.ep);
    for (int i = 0; i < 2 * kWindow; i++) {
      Slot& s = i < kWindow ? sends[i] : recvs[i - kWindow];
      if (s.req == PSM2_MQ_REQINVALID) continue;
      psm2_mq_status2_t st;
      if (psm2_mq_test2(&s.req, &st) != PSM2_OK) continue;
      if (st.error_code != PSM2_OK) {
        if (!broken) first_ms = NowMs();
        broken = true;
        last_ms = NowMs();
        failed++;
        codes[st.error_code]++;
        pending--;
        continue;
      }
      ok++;
      if (i >= kWindow) {
        const uint32_t len = kSizes[s.msg % 3];
        bool intact = st.msg_length == len;
        for (uint32_t k = 0; intact && k < len; k++)
          intact = s.buf[k] == ByteOf(s.msg, k);
        if (!intact) {
          fprintf(stderr, "rank %d: message %u arrived wrong\n", rank, s.msg);
          return 1;
        }
        recvs_done++;
      } else {
        sends_done++;
      }
      if (broken) {
        pending--;
      } else if (i < kWindow) {
        post_send(s);
      } else {
        post_recv(s);
      }
    }
    if (!announced && sends_done >= kAnnounce && recvs_done >= kAnnounce) {
      announced = true;
      std::ofstream(dir + "/streaming" + std::to_string(rank)) << "1\n";
    }
  }

  // New operations to the peer after the break.
  psm2_mq_tag_t late = Tag(0xffff);
  psm2_mq_req_t late_send, late_recv;
  CheckPsm(psm2_mq_isend2(c.mq, c.peer, 0, &late, sends[0].buf.data(),
                          kSizes[2], nullptr, &late_send),
           "late isend2");
  CheckPsm(psm2_mq_irecv2(c.mq, c.peer, &late, &exact, 0, recvs[0].buf.data(),
                          kMaxSize, nullptr, &late_recv),
           "late irecv2");
  const psm2_error_t late_send_error = EndOf(c.ep, &late_send);
  const psm2_error_t late_recv_error = EndOf(c.ep, &late_recv);

  printf("ended first %lld last %lld ok %d failed %d codes", first_ms, last_ms,
         ok, failed);
  bool all_allowed = true;
  for (const auto& [code, n] : codes) {
    printf(" %d:%d", code, n);
    all_allowed = all_allowed && Allowed(static_cast<psm2_error_t>(code));
  }
  printf("\nafter %d %d\n", late_send_error, late_recv_error);
  fflush(stdout);
  // The endpoint closes with the process: the daemon takes back its chunks.
  return all_allowed && Allowed(late_send_error) && Allowed(late_recv_error)
             ? 0
             : 1;
}
