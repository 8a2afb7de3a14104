// A sender floods a receiver that posts nothing for a while: the test of
// psmd's bounded unexpected-message memory (daemon/engine/mq_engine.h,
// invariant 4).
//
//   flood --rank 0|1 --dir DIR [--small N] [--bytes TOTAL] [--idle-seconds S]
//         [--uuid UUID] [--large BYTES] [--post-first 1] [--am N]
//
// Rank 0 streams N 8 B messages, then BYTES-sized messages (32 KiB unless
// told; TOTAL bytes of them),
// all tagged with their sequence number, with isend and a window of reusable
// buffers. The small ones matter: their payload travels inside the
// descriptor and their sends complete at once, so only psmd's budget (not the
// sender's pool region) stops them from piling up in the daemon. Rank 1
// connects, stays idle for S seconds (psmd must hold the sender back, not
// buffer without bound), then receives everything with a wildcard tag and
// checks order (tags in sequence: MPI non-overtaking) and every byte. With
// --post-first, rank 1 posts every receive before it idles instead (large
// messages are then rendezvous transfers whose chunks arrive while it makes
// no progress, so they fill its job's inbox). With --am N, rank 0 sends N
// active-message requests of 1 KiB instead, and rank 1 handles them after
// its idle time, checking order and bytes. Both
// print a one-line summary; exit 0 only if all is well.
#include <psm2.h>
#include <psm2_am.h>
#include <psm2_mq.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "tests/programs/rendezvous.h"

using psmd::testing::CheckPsm;

namespace {

constexpr uint32_t kSmall = 8;
constexpr int kWindow = 64;
uint64_t g_small_count = 1 << 20;
uint32_t g_large = 32 << 10;

// Active messages (--am): each carries its sequence number and 1 KiB.
constexpr uint32_t kAmBytes = 1024;
uint64_t g_am_next = 0;
uint64_t g_am_bad = 0;

uint32_t SizeOf(uint64_t seq) { return seq < g_small_count ? kSmall : g_large; }

// Byte i of message seq: cheap, and different for every message and offset.
uint8_t PatternByte(uint64_t seq, uint32_t i) {
  return static_cast<uint8_t>(seq * 131 + i * 7 + (i >> 8));
}

void Fill(uint8_t* buf, uint64_t seq) {
  for (uint32_t i = 0; i < SizeOf(seq); i++) buf[i] = PatternByte(seq, i);
}

psm2_mq_tag_t TagOf(uint64_t seq) {
  psm2_mq_tag_t t{};
  t.tag0 = static_cast<uint32_t>(seq);
  t.tag1 = static_cast<uint32_t>(seq >> 32);
  t.tag2 = 0xf100d;
  return t;
}

int OnFloodAm(psm2_am_token_t, psm2_amarg_t* args, int nargs, void* src,
              uint32_t len) {
  const auto* bytes = static_cast<const uint8_t*>(src);
  const uint64_t seq = g_am_next++;
  bool ok = nargs == 1 && args[0].u64 == seq && len == kAmBytes;
  for (uint32_t i = 0; ok && i < len; i++) ok = bytes[i] == PatternByte(seq, i);
  if (!ok && g_am_bad++ < 5) {
    fprintf(stderr, "rank 1: active message %llu wrong\n",
            static_cast<unsigned long long>(seq));
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::string uuid_text = "f100d000f100d000f100d000f100d000";
  int rank = -1;
  std::string dir;
  uint64_t total = 2ull << 30;
  double idle_s = 3;
  bool post_first = false;
  uint64_t am_count = 0;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string a = argv[i];
    if (a == "--rank")
      rank = atoi(argv[i + 1]);
    else if (a == "--dir")
      dir = argv[i + 1];
    else if (a == "--small")
      g_small_count = strtoull(argv[i + 1], nullptr, 0);
    else if (a == "--bytes")
      total = strtoull(argv[i + 1], nullptr, 0);
    else if (a == "--idle-seconds")
      idle_s = atof(argv[i + 1]);
    else if (a == "--uuid")
      uuid_text = argv[i + 1];
    else if (a == "--large")
      g_large = static_cast<uint32_t>(strtoul(argv[i + 1], nullptr, 0));
    else if (a == "--post-first")
      post_first = atoi(argv[i + 1]) != 0;
    else if (a == "--am")
      am_count = strtoull(argv[i + 1], nullptr, 0);
    else {
      fprintf(stderr, "unknown argument %s\n", a.c_str());
      return 2;
    }
  }
  if ((rank != 0 && rank != 1) || dir.empty()) {
    fprintf(stderr,
            "usage: flood --rank 0|1 --dir DIR [--small N] [--bytes N] "
            "[--idle-seconds S]\n");
    return 2;
  }
  const uint64_t messages = g_small_count + (total + g_large - 1) / g_large;

  psm2_uuid_t uuid;
  if (!psmd::testing::ParseUuid(uuid_text, uuid)) {
    fprintf(stderr, "flood: bad --uuid '%s'\n", uuid_text.c_str());
    return 2;
  }
  psmd::testing::ConnectedPair pair =
      psmd::testing::OpenAndConnect(uuid, dir, rank);
  psm2_ep_t ep = pair.ep;
  psm2_mq_t mq = pair.mq;
  psm2_epaddr_t addr = pair.peer;
  psm2_am_handler_fn_t handlers[1] = {OnFloodAm};
  int handler = 0;
  CheckPsm(psm2_am_register_handlers(ep, handlers, 1, &handler),
           "psm2_am_register_handlers");

  if (am_count > 0 && rank == 0) {
    std::vector<uint8_t> buf(kAmBytes);
    for (uint64_t seq = 0; seq < am_count; seq++) {
      for (uint32_t i = 0; i < kAmBytes; i++) buf[i] = PatternByte(seq, i);
      psm2_amarg_t arg;
      arg.u64 = seq;
      CheckPsm(psm2_am_request_short(addr, handler, &arg, 1, buf.data(),
                                     kAmBytes, 0, nullptr, nullptr),
               "psm2_am_request_short");
    }
    printf("rank 0: sent %llu active messages\n",
           static_cast<unsigned long long>(am_count));
  } else if (am_count > 0) {
    usleep(static_cast<useconds_t>(idle_s * 1e6));
    while (g_am_next < am_count) psm2_poll(ep);
    printf("rank 1: received %llu messages, %llu wrong\n",
           static_cast<unsigned long long>(am_count),
           static_cast<unsigned long long>(g_am_bad));
    if (g_am_bad != 0) return 1;
  } else if (rank == 0) {
    std::vector<std::vector<uint8_t>> bufs(
        std::min<uint64_t>(kWindow, messages), std::vector<uint8_t>(g_large));
    std::vector<psm2_mq_req_t> reqs(bufs.size(), PSM2_MQ_REQINVALID);
    for (uint64_t seq = 0; seq < messages; seq++) {
      int slot = static_cast<int>(seq % bufs.size());
      CheckPsm(psm2_mq_wait2(&reqs[slot], nullptr), "psm2_mq_wait2 (send)");
      Fill(bufs[slot].data(), seq);
      psm2_mq_tag_t tag = TagOf(seq);
      CheckPsm(psm2_mq_isend2(mq, addr, 0, &tag, bufs[slot].data(), SizeOf(seq),
                              nullptr, &reqs[slot]),
               "psm2_mq_isend2");
    }
    for (auto& r : reqs)
      CheckPsm(psm2_mq_wait2(&r, nullptr), "psm2_mq_wait2 (send)");
    printf("rank 0: sent %llu messages\n",
           static_cast<unsigned long long>(messages));
  } else {
    // Every receive posted at once (--post-first) or one at a time.
    const uint64_t posted = post_first ? messages : 1;
    std::vector<std::vector<uint8_t>> bufs(posted,
                                           std::vector<uint8_t>(g_large));
    std::vector<psm2_mq_req_t> reqs(posted);
    psm2_mq_tag_t any{}, wild{};  // selector 0: any tag
    auto post = [&](uint64_t i) {
      CheckPsm(psm2_mq_irecv2(mq, PSM2_MQ_ANY_ADDR, &any, &wild, 0,
                              bufs[i].data(), g_large, nullptr, &reqs[i]),
               "psm2_mq_irecv2");
    };
    if (post_first) {
      for (uint64_t i = 0; i < messages; i++) post(i);
    }
    usleep(static_cast<useconds_t>(idle_s * 1e6));
    uint64_t bad = 0;
    for (uint64_t seq = 0; seq < messages; seq++) {
      const uint64_t i = post_first ? seq : 0;
      if (!post_first) post(0);
      std::vector<uint8_t>& buf = bufs[i];
      psm2_mq_status2_t st;
      CheckPsm(psm2_mq_wait2(&reqs[i], &st), "psm2_mq_wait2 (recv)");
      psm2_mq_tag_t want = TagOf(seq);
      bool ok = st.error_code == PSM2_OK && st.nbytes == SizeOf(seq) &&
                memcmp(&st.msg_tag, &want, sizeof(want)) == 0;
      for (uint32_t i = 0; ok && i < st.nbytes; i++)
        ok = buf[i] == PatternByte(seq, i);
      if (!ok && bad++ < 5) {
        fprintf(stderr,
                "rank 1: message %llu wrong (tag0 %u, %u bytes, error %d)\n",
                static_cast<unsigned long long>(seq), st.msg_tag.tag0,
                st.nbytes, st.error_code);
      }
    }
    printf("rank 1: received %llu messages, %llu wrong\n",
           static_cast<unsigned long long>(messages),
           static_cast<unsigned long long>(bad));
    if (bad != 0) return 1;
  }
  // Neither side leaves before the other is done with its requests.
  char byte = 0;
  psm2_mq_tag_t done{};
  done.tag2 = 0xd0e;
  psm2_mq_tag_t all;
  memset(&all, 0xff, sizeof(all));
  psm2_mq_req_t req;
  CheckPsm(psm2_mq_irecv2(mq, addr, &done, &all, 0, &byte, 1, nullptr, &req),
           "irecv done");
  CheckPsm(psm2_mq_send2(mq, addr, 0, &done, &byte, 1), "send done");
  CheckPsm(psm2_mq_wait2(&req, nullptr), "wait done");
  psm2_ep_close(ep, PSM2_EP_CLOSE_GRACEFUL, 0);
  psm2_finalize();
  return 0;
}
