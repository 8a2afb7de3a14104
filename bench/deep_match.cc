// deep_match: message rate when every message is matched against a deep
// queue, end to end through the PSM2 API (bench/match_bench measures the
// matcher alone).
//
//   deep_match --rank 0|1 --dir DIR [--depth D] [--reps R]
//
// Each repetition has two phases, each timed by rank 1 until its D-th
// completion (seen with psm2_mq_ipeek), from when it lets rank 0 send
// (posted) or starts posting (unexpected), so the rate is that of matching
// while the queue holds between 2D and D entries:
//   posted:     rank 1 posts 2D receives, each with its own tag, then rank 0
//               sends D messages with tags from a shuffled half of them;
//   unexpected: rank 0 sends 2D messages, then rank 1 posts D receives for
//               a shuffled half of their tags.
// The other half is then sent (or received) untimed, so each repetition
// starts from empty queues. Messages are 4 bytes carrying their tag, checked
// on arrival. Works on psmd's libpsm2.so.2 and on Intel's alike (choose with
// LD_LIBRARY_PATH); rank 1 prints the medians.
#include <psm2.h>
#include <psm2_mq.h>
#include <sched.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "tests/programs/rendezvous.h"

using psmd::testing::CheckPsm;

namespace {

using Clock = std::chrono::steady_clock;

constexpr uint32_t kTagBase = 0x100000;

psm2_mq_tag_t Tag(uint32_t t, uint32_t tag2 = 0) {
  psm2_mq_tag_t tag{};
  tag.tag0 = t;
  tag.tag2 = tag2;
  return tag;
}

struct Rank {
  psm2_ep_t ep;
  psm2_mq_t mq;
  psm2_epaddr_t peer;
  psm2_mq_tag_t exact;

  void Send(uint32_t t, uint32_t tag2 = 0) {
    psm2_mq_tag_t tag = Tag(t, tag2);
    CheckPsm(psm2_mq_send2(mq, peer, 0, &tag, &t, sizeof(t)), "send2");
  }
  psm2_mq_req_t Post(uint32_t t, uint32_t* buf, void* context,
                     uint32_t tag2 = 0) {
    psm2_mq_tag_t tag = Tag(t, tag2);
    psm2_mq_req_t req;
    CheckPsm(psm2_mq_irecv2(mq, PSM2_MQ_ANY_ADDR, &tag, &exact, 0, buf,
                            sizeof(*buf), context, &req),
             "irecv2");
    return req;
  }
  // A control message on tag2 = 1 (never matched by data).
  void Signal(uint32_t what) { Send(what, 1); }
  void Await(uint32_t what) {
    uint32_t got = 0;
    psm2_mq_req_t req = Post(what, &got, nullptr, 1);
    CheckPsm(psm2_mq_wait2(&req, nullptr), "wait signal");
  }
  // Reaps `n` completions through ipeek; returns the seconds from `start`
  // to the last. ok(status) says whether a receive got the right message.
  template <typename Ok>
  double Reap(long n, Ok ok, int* wrong,
              Clock::time_point start = Clock::now()) {
    long done = 0;
    while (done < n) {
      psm2_mq_req_t req;
      psm2_mq_status2_t st;
      if (psm2_mq_ipeek2(mq, &req, &st) != PSM2_OK) {
        psm2_poll(ep);
        continue;
      }
      CheckPsm(psm2_mq_test2(&req, &st), "test2");
      if (!ok(st)) ++*wrong;
      done++;
    }
    return std::chrono::duration<double>(Clock::now() - start).count();
  }
};

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  int rank = -1, reps = 5;
  long depth = 65536;
  std::string dir;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string flag = argv[i], value = argv[i + 1];
    if (flag == "--rank")
      rank = atoi(value.c_str());
    else if (flag == "--dir")
      dir = value;
    else if (flag == "--depth")
      depth = atol(value.c_str());
    else if (flag == "--reps")
      reps = atoi(value.c_str());
  }
  psm2_uuid_t uuid;
  psmd::testing::ParseUuid("5053d0d0000000000000000000000b03", uuid);
  if ((rank != 0 && rank != 1) || dir.empty() || depth < 2 || reps < 1) {
    fprintf(
        stderr,
        "usage: deep_match --rank 0|1 --dir DIR [--depth D>=2] [--reps R]\n");
    return 2;
  }
  psmd::testing::ConnectedPair pair =
      psmd::testing::OpenAndConnect(uuid, dir, rank);
  Rank r{pair.ep, pair.mq, pair.peer, {}};
  r.exact.tag0 = r.exact.tag1 = r.exact.tag2 = ~0u;

  // Tags kTagBase + [0, 2D): receives and messages use two independent
  // shuffles, the same on both ranks.
  std::vector<uint32_t> order(2 * depth), other(2 * depth);
  for (long i = 0; i < 2 * depth; i++)
    order[i] = other[i] = kTagBase + static_cast<uint32_t>(i);
  std::mt19937 rng(7);
  std::shuffle(order.begin(), order.end(), rng);
  std::shuffle(other.begin(), other.end(), rng);
  std::vector<uint32_t> bufs(2 * depth);
  std::vector<double> posted_s, unexpected_s;
  int wrong = 0;
  // Receive i is for tag order[i] into bufs[i], its context; Reap() finds
  // its request through psm2_mq_ipeek.
  auto post_receive = [&](long i) { r.Post(order[i], &bufs[i], &bufs[i]); };
  auto ok = [&](const psm2_mq_status2_t& st) {
    const long i = static_cast<uint32_t*>(st.context) - bufs.data();
    return st.msg_tag.tag0 == order[i] && bufs[i] == order[i];
  };

  for (int rep = 0; rep < reps; rep++) {
    // Posted phase: 2D receives, D messages timed, D more untimed.
    if (rank == 1) {
      for (long i = 0; i < 2 * depth; i++) post_receive(i);
      // A probe is answered after every receive posted before it, so all
      // 2D are queued (in psmd) before the sender starts.
      psm2_mq_status2_t st;
      psm2_mq_tag_t none = Tag(0);
      psm2_mq_iprobe2(r.mq, PSM2_MQ_ANY_ADDR, &none, &r.exact, &st);
      r.Signal(1);
      posted_s.push_back(r.Reap(depth, ok, &wrong));
      r.Reap(depth, ok, &wrong);
    } else {
      r.Await(1);
      for (long i = 0; i < 2 * depth; i++) r.Send(other[i]);
    }

    // Unexpected phase: 2D messages, then D receives timed, D more untimed.
    if (rank == 0) {
      for (long i = 0; i < 2 * depth; i++) r.Send(other[i]);
      r.Signal(2);
      r.Await(3);
    } else {
      r.Await(2);
      // The signal came after every message on the same pair (MPI order), so
      // all 2D are queued now.
      const Clock::time_point start = Clock::now();
      for (long i = 0; i < depth; i++) post_receive(i);
      unexpected_s.push_back(r.Reap(depth, ok, &wrong, start));
      for (long i = depth; i < 2 * depth; i++) post_receive(i);
      r.Reap(depth, ok, &wrong);
      r.Signal(3);
    }
  }
  if (rank == 1) {
    printf(
        "# deep_match: depth %ld (queue between %ld and %ld entries), %d reps, "
        "rank 1 on "
        "CPU %d\n",
        depth, 2 * depth, depth, reps, sched_getcpu());
    printf("posted:     median %.0f ns per message\n",
           Median(posted_s) / depth * 1e9);
    printf("unexpected: median %.0f ns per message\n",
           Median(unexpected_s) / depth * 1e9);
    if (wrong != 0) {
      fprintf(stderr, "deep_match: %d receives got another tag's message\n",
              wrong);
      return 1;
    }
  } else {
    printf("# deep_match: rank 0 on CPU %d\n", sched_getcpu());
  }
  fflush(stdout);
  psm2_ep_close(pair.ep, PSM2_EP_CLOSE_GRACEFUL, 0);
  psm2_finalize();
  return 0;
}
