// exchange: one rank of a two-rank tagged-message exchange through PSM2.
//
//   exchange --rank 0|1 --dir DIR [--uuid HEX] [--messages N] [--max-size B]
//            [--seed S] [--hold-seconds T] [--linger-seconds T] [--no-ack]
//            [--poll-only]
//
// Rank 0 sends N messages of pseudo-random sizes in [0, B] with tag i and a
// payload derived from (seed, i); rank 1 receives them one by one with exact
// tags and checks length, tag, order and every byte; then rank 1 sends one
// acknowledgement back. Rank 1 completes even-numbered receives with
// psm2_mq_wait2 and odd ones with psm2_mq_test2 + psm2_poll. Exit 0 on success,
// 1 on a data error, 2 on an API error, 3 when psm2_ep_connect fails (printing
// the PSM2 error), 4 when a request ends with an error (its peer died,
// tests/programs/survivor.h: "ended <error> at <ms>").
// --hold-seconds keeps both ranks connected and idle before exchanging (for
// idle-CPU tests), each writing the CLOCK_MONOTONIC ms its hold began to
// DIR/holding.R as it begins; --linger-seconds keeps them open after it (for
// psmctl tests, which look at the counters of open endpoints). --no-ack makes
// rank 0 close its endpoint right after its last send and rank 1 start
// receiving only after that, so every message is received from a sender that
// has already gone. --poll-only makes rank 1 complete every receive with
// psm2_mq_test2 + psm2_poll, never waiting: an application that only polls,
// as Open MPI's progress loop does. A rank still running after 120 s has
// hung: it writes the message it stopped at to stderr and dies of SIGALRM.
#include <psm2.h>
#include <psm2_mq.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "tests/programs/rendezvous.h"
#include "tests/programs/survivor.h"

namespace {

uint64_t Mix(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ull;
  return x ^ (x >> 33);
}

uint32_t SizeOf(uint64_t seed, uint32_t i, uint32_t max_size) {
  return static_cast<uint32_t>(Mix(seed * 1000003 + i) %
                               (uint64_t{max_size} + 1));
}

void Fill(uint64_t seed, uint32_t i, uint8_t* buf, uint32_t len) {
  uint64_t state = Mix(seed ^ (uint64_t{i} << 32));
  for (uint32_t k = 0; k < len; k++) {
    if (k % 8 == 0) state = Mix(state + k);
    buf[k] = static_cast<uint8_t>(state >> (8 * (k % 8)));
  }
}

// Where the exchange is, for the alarm's report: a hang then names the
// message it stopped at (rank 0 at `messages`: waiting for the ack).
std::atomic<uint32_t> g_at{0};
uint32_t g_messages = 0;
int g_rank = -1;

// Appends v in decimal; async-signal-safe, unlike snprintf.
char* PutDecimal(char* out, uint32_t v) {
  char digits[10];
  int n = 0;
  do {
    digits[n++] = static_cast<char>('0' + v % 10);
    v /= 10;
  } while (v != 0);
  while (n > 0) *out++ = digits[--n];
  return out;
}

void ReportHangAndDie(int sig) {
  char line[80];
  char* p = line;
  auto put = [&p](const char* s) {
    while (*s != '\0') *p++ = *s++;
  };
  put("rank ");
  p = PutDecimal(p, static_cast<uint32_t>(g_rank));
  put(": alarm at message ");
  p = PutDecimal(p, g_at.load(std::memory_order_relaxed));
  put(" of ");
  p = PutDecimal(p, g_messages);
  put("\n");
  (void)!write(STDERR_FILENO, line, static_cast<size_t>(p - line));
  signal(sig, SIG_DFL);
  raise(sig);
}

}  // namespace

int main(int argc, char** argv) {
  int rank = -1;
  std::string dir;
  std::string uuid_text = "5053d0d0000000000000000000000001";
  uint32_t messages = 1000, max_size = 8192;
  uint64_t seed = 1;
  unsigned hold_seconds = 0;
  unsigned linger_seconds = 0;
  bool ack = true;
  bool poll_only = false;
  for (int i = 1; i < argc; i += 2) {
    std::string flag = argv[i];
    if (flag == "--no-ack" || flag == "--poll-only") {  // flags without value
      if (flag == "--no-ack") ack = false;
      if (flag == "--poll-only") poll_only = true;
      i--;
      continue;
    }
    std::string value = i + 1 < argc ? argv[i + 1] : "";
    if (flag == "--rank")
      rank = atoi(value.c_str());
    else if (flag == "--dir")
      dir = value;
    else if (flag == "--uuid")
      uuid_text = value;
    else if (flag == "--messages")
      messages = static_cast<uint32_t>(strtoul(value.c_str(), nullptr, 10));
    else if (flag == "--max-size")
      max_size = static_cast<uint32_t>(strtoul(value.c_str(), nullptr, 10));
    else if (flag == "--seed")
      seed = strtoull(value.c_str(), nullptr, 10);
    else if (flag == "--hold-seconds")
      hold_seconds = static_cast<unsigned>(atoi(value.c_str()));
    else if (flag == "--linger-seconds")
      linger_seconds = static_cast<unsigned>(atoi(value.c_str()));
    else {
      fprintf(stderr, "exchange: unknown flag %s\n", flag.c_str());
      return 2;
    }
  }
  psm2_uuid_t uuid;
  if ((rank != 0 && rank != 1) || dir.empty() ||
      !psmd::testing::ParseUuid(uuid_text, uuid)) {
    fprintf(stderr,
            "usage: exchange --rank 0|1 --dir DIR [--uuid HEX32] ...\n");
    return 2;
  }
  g_rank = rank;
  g_messages = messages;
  signal(SIGALRM, ReportHangAndDie);
  alarm(120);  // a hung exchange must fail, not block the test suite

  psm2_ep_t ep;
  psm2_epid_t epid, peer_epid;
  psmd::testing::InitAndOpen(uuid, &ep, &epid);
  if (!psmd::testing::PublishEpid(dir, rank, epid) ||
      !psmd::testing::AwaitEpid(dir, 1 - rank, 30, &peer_epid)) {
    fprintf(stderr, "rank %d: epid exchange through %s failed\n", rank,
            dir.c_str());
    return 2;
  }
  psm2_epaddr_t peer;
  psm2_error_t conn_err;
  psm2_error_t err =
      psm2_ep_connect(ep, 1, &peer_epid, nullptr, &conn_err, &peer, 0);
  // Barrier: neither rank closes before both have tried to connect.
  psm2_epid_t ignored;
  if (!psmd::testing::PublishEpid(dir, 10 + rank, 1) ||
      !psmd::testing::AwaitEpid(dir, 10 + (1 - rank), 30, &ignored)) {
    fprintf(stderr, "rank %d: connect barrier through %s failed\n", rank,
            dir.c_str());
    return 2;
  }
  if (err != PSM2_OK) {
    printf("rank %d: connect failed: %s\n", rank,
           psm2_error_get_string(conn_err));
    fflush(stdout);
    return 3;
  }
  psm2_mq_t mq;
  psmd::testing::CheckPsm(
      psm2_mq_init(ep, PSM2_MQ_ORDERMASK_ALL, nullptr, 0, &mq), "psm2_mq_init");
  if (hold_seconds > 0) {
    const std::string holding = dir + "/holding." + std::to_string(rank);
    FILE* f = fopen((holding + ".tmp").c_str(), "w");
    if (f == nullptr) return 2;
    fprintf(f, "%lld\n", psmd::testing::MonotonicMs());
    // Whole or absent for a reader: written, then renamed.
    if (fclose(f) != 0 || rename((holding + ".tmp").c_str(), holding.c_str()))
      return 2;
    sleep(hold_seconds);
  }

  std::vector<uint8_t> buf(max_size + 1), want(max_size + 1);
  psm2_mq_tag_t ack_tag{};
  ack_tag.tag2 = 0xacc;
  psm2_mq_tag_t all_bits;
  memset(&all_bits, 0xff, sizeof(all_bits));
  uint64_t bytes = 0;
  if (rank == 0) {
    for (uint32_t i = 0; i < messages; i++) {
      g_at.store(i, std::memory_order_relaxed);
      uint32_t len = SizeOf(seed, i, max_size);
      Fill(seed, i, buf.data(), len);
      psm2_mq_tag_t tag{};
      tag.tag0 = i;
      tag.tag1 = 0x5e4d;
      psmd::testing::CheckPsm(psm2_mq_send2(mq, peer, 0, &tag, buf.data(), len),
                              "psm2_mq_send2");
      bytes += len;
    }
    if (!ack) {
      psm2_ep_close(ep, PSM2_EP_CLOSE_GRACEFUL, 0);
      if (!psmd::testing::PublishEpid(dir, 2, 1)) return 2;  // "sender closed"
      printf("rank 0: sent %u messages, %llu bytes\n", messages,
             static_cast<unsigned long long>(bytes));
      return 0;
    }
    g_at.store(messages, std::memory_order_relaxed);
    psm2_mq_req_t req;
    uint32_t acked = 0;
    psmd::testing::CheckPsm(
        psm2_mq_irecv2(mq, peer, &ack_tag, &all_bits, 0, &acked, sizeof(acked),
                       nullptr, &req),
        "psm2_mq_irecv2");
    psm2_mq_status2_t st;
    psmd::testing::CheckPsm(psm2_mq_wait2(&req, &st), "psm2_mq_wait2");
    if (st.error_code != PSM2_OK)
      psmd::testing::EndWithRequestError(st.error_code);
    if (acked != messages) {
      fprintf(stderr, "rank 0: receiver acknowledged %u of %u messages\n",
              acked, messages);
      return 1;
    }
    printf("rank 0: sent %u messages, %llu bytes\n", messages,
           static_cast<unsigned long long>(bytes));
  } else {
    psm2_epid_t closed;
    if (!ack && !psmd::testing::AwaitEpid(dir, 2, 60, &closed)) return 2;
    for (uint32_t i = 0; i < messages; i++) {
      g_at.store(i, std::memory_order_relaxed);
      psm2_mq_tag_t tag{};
      tag.tag0 = i;
      tag.tag1 = 0x5e4d;
      psm2_mq_req_t req;
      psmd::testing::CheckPsm(
          psm2_mq_irecv2(mq, peer, &tag, &all_bits, 0, buf.data(), max_size,
                         nullptr, &req),
          "psm2_mq_irecv2");
      psm2_mq_status2_t st;
      if (i % 2 == 0 && !poll_only) {
        psmd::testing::CheckPsm(psm2_mq_wait2(&req, &st), "psm2_mq_wait2");
      } else {
        // The non-blocking path: test2 until done, polling in between.
        psm2_error_t t;
        while ((t = psm2_mq_test2(&req, &st)) == PSM2_MQ_NO_COMPLETIONS) {
          psm2_error_t p = psm2_poll(ep);
          if (p != PSM2_OK && p != PSM2_OK_NO_PROGRESS)
            psmd::testing::CheckPsm(p, "psm2_poll");
        }
        psmd::testing::CheckPsm(t, "psm2_mq_test2");
        if (req != PSM2_MQ_REQINVALID) {
          fprintf(
              stderr,
              "rank 1: psm2_mq_test2 did not invalidate a completed request\n");
          return 1;
        }
      }
      if (st.error_code != PSM2_OK)
        psmd::testing::EndWithRequestError(st.error_code);
      uint32_t len = SizeOf(seed, i, max_size);
      Fill(seed, i, want.data(), len);
      if (st.msg_length != len || st.nbytes != len || st.msg_tag.tag0 != i ||
          st.msg_peer != peer || memcmp(buf.data(), want.data(), len) != 0) {
        fprintf(stderr,
                "rank 1: message %u wrong: length %u/%u (want %u), "
                "tag %u, data %s\n",
                i, st.msg_length, st.nbytes, len, st.msg_tag.tag0,
                memcmp(buf.data(), want.data(), len) ? "differs" : "same");
        return 1;
      }
      bytes += len;
    }
    if (ack) {
      psmd::testing::CheckPsm(
          psm2_mq_send2(mq, peer, 0, &ack_tag, &messages, sizeof(messages)),
          "psm2_mq_send2");
    }
    printf(
        "rank 1: received %u messages, %llu bytes, all intact and in order\n",
        messages, static_cast<unsigned long long>(bytes));
  }
  fflush(stdout);
  if (linger_seconds > 0) sleep(linger_seconds);
  psm2_mq_finalize(mq);
  psm2_ep_close(ep, PSM2_EP_CLOSE_GRACEFUL, 0);
  psm2_finalize();
  return 0;
}
